"""The embedding job as a Ray Data pipeline: read (tasks) -> tokenise (tasks) -> embed (an
actor pool: one actor per GPU, or on a CPU-only cluster one per two CPUs) -> the driver, which
writes the same Parquet shards and manifest as the one-process job (fastbert.embedding.pipeline),
so resuming, ids and the output layout are the same.

Reading is Ray Data's: a dataset of input files, each read by a task with fastbert's readers
(fastbert.embedding.readers), so that every row keeps its row number across all inputs and a bad
row is named by file and row, as in one process. The input paths must be readable from the
workers (a shared file system); the output is written by the driver. The order of rows is
preserved, so the driver completes shards as rows arrive.

This is the only module of fastbert.embed that imports ray (inside its functions);
fastbert.serve.ray_serve, the other, shares :func:`connect` and :func:`worker_device`.
"""

from __future__ import annotations

import functools
import json
import pickle
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastbert.embedding import model, pipeline, readers, run
from fastbert.embedding.loading import load_options
from fastbert.embedding.options import EmbedOptions
from fastbert.embedding.shards import EmbeddedRows, ShardWriter
from fastbert.embedding.static_sparse import load_static_tokenizer
from fastbert.model.sentence_folder import EMBEDDING

READ_ROWS = 1024  # rows per block out of a read task
TOKENISE_ROWS = 256  # rows per tokenise task call


def embed_files(
    inputs: Sequence[str | Path],
    output: str | Path,
    options: EmbedOptions,
    address: str | None = None,
) -> run.Summary:
    """Embed ``inputs`` into Parquet shards in ``output`` on Ray: the cluster at ``address``,
    else the Ray instance this process has started (ray.init), else a new local one. Same
    arguments, output and errors as :func:`fastbert.embedding.pipeline.embed_files`, but int8 /
    uint8 precision needs ``ranges``, or those an earlier run of the job recorded (no model
    runs here to calibrate them)."""
    ray = _import_ray()
    files = readers.list_inputs(inputs)
    pipeline.check_output_place(inputs, output)
    counts = [readers.count_rows(f) for f in files]
    tokenizer = model.load_tokenizer(Path(options.model))
    started = connect(ray, address)
    try:
        gpus = int(ray.cluster_resources().get("GPU", 0))
        cpus = ray.cluster_resources().get("CPU", 1)
        device = worker_device(options, gpus)
        job = pipeline.start_job(files, output, options, tokenizer, device, calibrates=False)
        if job.finished is not None:
            return job.finished_summary()
        job.quantize(None, files)
        id_kind = None
        if job.options.id_field is not None:
            # Files are read apart: each reader starts from the job's id kind, so that a row
            # is bad exactly where it is in one process, and every block's id column has one
            # type (Ray cannot join blocks of two).
            id_kind = readers.first_id_kind(files, job.options.text_field, job.options.id_field)
            job.writer.id_kind = readers.IdKind(id_kind)
        dataset = _dataset(ray, files, counts, job, gpus, cpus, id_kind)
        summary = _drain(dataset, job.writer, job.options, job.first_row, sum(counts))
    finally:
        if started:
            ray.shutdown()
    return job.finish(summary)


def _import_ray() -> Any:
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"--ray needs Ray Data: {exc}") from exc
    return ray


def connect(ray: Any, address: str | None) -> bool:
    """Connect to Ray: the cluster at ``address``, else the instance this process started,
    else a new local one. True when this call started it (and must shut it down)."""
    if ray.is_initialized():
        return False
    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    return True


def worker_device(options: EmbedOptions, gpus: int) -> torch.device:
    """The device the actors (or Ray Serve replicas) run on: ``options.device``'s type, else
    CUDA when the cluster has GPUs. ValueError for CUDA on a cluster without."""
    if options.device is None:
        return torch.device("cuda" if gpus else "cpu")
    device = torch.device(options.device)
    if device.type == "cuda" and not gpus:
        raise ValueError(f"device {options.device!r}, but the Ray cluster has no GPU")
    return torch.device(device.type)


def _dataset(
    ray: Any,
    files: list[Path],
    counts: list[int],
    job: pipeline.Job,
    gpus: int,
    cpus: float,
    id_kind: type | None = None,
) -> Any:
    """The Ray dataset of ``job``'s embedded rows (pandas batches, in input order) from its
    first row still to embed on; ``id_kind``: the kind of the job's ids
    (:func:`readers.first_id_kind`)."""
    options, first_row = job.options, job.first_row
    context = ray.data.DataContext.get_current()
    context.execution_options.preserve_order = True
    context.enable_progress_bars = False  # the driver shows its own
    offsets = np.cumsum([0, *counts[:-1]]).tolist()
    items = [
        {"file": str(f), "offset": o}
        for f, o, n in zip(files, offsets, counts)
        if o + n > first_row
    ]
    if not items:
        return None
    on_gpu = options.device.startswith("cuda")
    actors = gpus if on_gpu else max(1, int(cpus) // 2)
    # Leave CPUs for the read and tokenise tasks, whatever the cluster's size.
    task_cpus = 0.5 if cpus >= 1 else cpus / 2
    actor_cpus = 0 if on_gpu else min(1.0, max(cpus - task_cpus, 0.5) / actors)
    threads = max(1, int(cpus) // actors)
    read = functools.partial(
        _read_file,
        text_field=options.text_field,
        id_field=options.id_field,
        first_row=first_row,
        id_kind=id_kind,
    )
    return (
        ray.data.from_items(items, override_num_blocks=len(items))
        .map_batches(read, batch_size=1, batch_format="pandas", num_cpus=task_cpus)
        .map_batches(
            _tokenise,
            fn_kwargs={
                "folder": options.model,
                "max_length": job.tokens,
                "prompt": options.prompt or "",
                "static_route": job.static_route,
            },
            batch_size=TOKENISE_ROWS,
            batch_format="pandas",
            num_cpus=task_cpus,
        )
        .map_batches(
            EmbedActor,
            fn_constructor_kwargs={"options": job.model_options, "threads": threads},
            batch_size=options.window_rows,
            batch_format="pandas",
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_gpus=1 if on_gpu else 0,
            num_cpus=actor_cpus,
        )
    )


def _read_file(
    batch: Any, text_field: str, id_field: str | None, first_row: int, id_kind: type | None
) -> Iterator[Any]:
    """A one-row batch naming a file and its first row's index -> its rows from ``first_row``
    on, as pandas batches with index, id (None for a bad row), text, problem and where;
    ``id_kind``: the kind of the job's ids."""
    import pandas as pd

    path, offset = Path(batch["file"].iloc[0]), int(batch["offset"].iloc[0])
    ids = readers.IdKind(id_kind)
    rows = []
    for row in readers.read_rows([path], text_field, id_field, first_index=offset, ids=ids):
        if row.index < first_row:
            continue
        rows.append(
            {
                "index": row.index,
                # As JSON text: a column of ints with a None (a bad row's) would turn float
                # in pandas, and ids past 2**53 would change.
                "id": json.dumps(row.output_id()) if row.problem is None else None,
                "text": row.text,
                "problem": row.problem,
                "where": row.where(),
            }
        )
        if len(rows) == READ_ROWS:
            yield pd.DataFrame(rows)
            rows = []
    if rows:
        yield pd.DataFrame(rows)


@functools.lru_cache(maxsize=2)
def _tokenizer(folder: str) -> Any:
    return model.load_tokenizer(Path(folder))


@functools.lru_cache(maxsize=2)
def _static_tokenizer(folder: Path) -> Any:
    return load_static_tokenizer(folder)


def _tokenise(
    batch: Any, folder: str, max_length: int, prompt: str, static_route: Path | None = None
) -> Any:
    """Add ``input_ids`` (a list per row, after ``prompt``; empty for bad rows) and ``cut``
    (truncated); ``static_route``: the SparseStaticEmbedding whose tokenizer the rows take
    (see pipeline.Job), else the model's."""
    from fastbert.embedding.tokenize import TextTokenizer

    good = batch["problem"].isna().to_numpy()
    texts = batch["text"][good].tolist()
    if static_route is not None:
        tokenise = _static_tokenizer(static_route)
    else:
        tokenise = TextTokenizer(_tokenizer(folder), max_length)
    tokens, cut = tokenise(texts, prompt) if texts else ([], [])
    all_tokens: list[list[int]] = [[] for _ in range(len(batch))]
    all_cut = [False] * len(batch)
    for position, ids, was_cut in zip(np.flatnonzero(good), tokens, cut):
        all_tokens[position], all_cut[position] = ids, was_cut
    return batch.drop(columns=["text"]).assign(input_ids=all_tokens, cut=all_cut)


class EmbedActor:
    """Holds the model on its device; batches of tokenised rows -> their embeddings and token
    counts. The embeddings travel pickled, each row's as bytes (b"" for a bad row): a column
    of arrays would be a tensor column in a batch of good rows and an object column in one
    with a bad row, and Ray cannot join the two."""

    def __init__(self, options: EmbedOptions, threads: int):
        if options.device.startswith("cpu"):
            torch.set_num_threads(threads)
        else:  # the GPU Ray gave this actor
            options = replace(options, device="cuda")
        self.loaded = load_options(options, _tokenizer(options.model)).job(progress=False)

    def __call__(self, batch: Any) -> Any:
        good = np.flatnonzero(batch["problem"].isna().to_numpy())
        tokens = [list(batch["input_ids"].iloc[i]) for i in good]
        vectors: list[bytes] = [b""] * len(batch)
        for positions, embedded in run.embed_sorted(
            self.loaded.encoder, tokens, self.loaded.options.batch_tokens
        ):
            for position, vector in zip(positions, embedded):
                vectors[good[position]] = pickle.dumps(vector, protocol=pickle.HIGHEST_PROTOCOL)
        counts = [len(ids) if ids is not None else 0 for ids in batch["input_ids"]]
        return batch.drop(columns=["input_ids"]).assign(embedding=vectors, tokens=counts)


def _drain(
    dataset: Any, writer: ShardWriter, options: EmbedOptions, first_row: int, end: int
) -> run.Summary:
    """Feed the dataset's rows, in order, to the shard writer; the run's summary."""
    summary = run.Summary()
    bar = run.progress_bar(options.progress)
    meter = run.Meter(bar)
    try:
        for batch in _batches(dataset):
            bad = batch[batch["problem"].notna()]
            if len(bad) and not options.skip_bad:
                row = bad.iloc[0]
                raise run.bad_row_error(row["where"], row["problem"])
            writer.skip(bad["index"].tolist())
            good = batch[batch["problem"].isna()]
            if len(good):
                outputs = [pickle.loads(vector) for vector in good["embedding"]]
                writer.add(
                    EmbeddedRows(
                        rows=good["index"].tolist(),
                        ids=[json.loads(i) for i in good["id"]],
                        vectors=np.stack(outputs) if writer.kind == EMBEDDING else outputs,
                        tokens=good["tokens"].tolist(),
                        truncated=good["cut"].tolist(),
                    )
                )
            writer.advance(int(batch["index"].iloc[-1]) + 1)
            summary.docs += len(good)
            summary.tokens += int(good["tokens"].sum())
            summary.truncated += int(good["cut"].sum())
            summary.skipped += len(bad)
            meter.update(summary, len(good))
        writer.finish(max(end, first_row))
        meter.finish(summary)
    finally:
        bar.close()
    return summary


def _batches(dataset: Any) -> Iterator[Any]:
    """The dataset's pandas batches; an error raised in a Ray task (a reader's InputError) is
    raised here as itself."""
    if dataset is None:
        return
    try:
        yield from dataset.iter_batches(batch_format="pandas", batch_size=None)
    except Exception as exc:
        cause = _user_error(exc)
        if cause is None:
            raise
        raise cause from exc


def _user_error(exc: BaseException) -> ValueError | None:
    """The ValueError (an InputError, ...) a Ray task raised, found in the chain of ``exc``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ValueError):
            return exc
        exc = getattr(exc, "cause", None) or exc.__cause__
    return None
