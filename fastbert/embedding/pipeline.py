"""The one-process job over files: rows -> the embedding loop
(:mod:`~fastbert.embedding.run`) -> Parquet shards with a manifest, continuing an unfinished run
of the same job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastbert.embedding import manifest, model, readers
from fastbert.embedding.loading import load_options, model_files, resolve
from fastbert.embedding.options import CALIBRATION_ROWS, EmbedOptions
from fastbert.embedding.quantized import RANGED, Quantizer, check_ranges, quantization_ranges
from fastbert.embedding.run import ArraySink, Summary, run_rows
from fastbert.embedding.shards import ShardWriter
from fastbert.embedding.text_model import TextModel, task_of
from fastbert.model.sentence_folder import CLASSIFICATION, MULTI_VECTOR, FolderSpec
from fastbert.version import __version__


def job_record(
    inputs: Sequence[Path], options: EmbedOptions, spec: FolderSpec, dimensions: int | None
) -> dict:
    """The manifest's description of a job: what decides its embeddings and shard layout
    (``quantize``, ``prompt``, ``max_active_dims`` and ``precision`` only when set, so that the
    records of earlier runs without them still match; with int8 / uint8, where the ranges come
    from, and the ``ranges`` themselves once known), each input's size and modification time
    (an input changed since a run makes another job), and ``model_name``, the name the model
    was given by, when it was (``model`` is always its folder). ``spec``: the model folder as
    read (its kind: "embedding", "sparse", "multi-vector"); ``dimensions``: the output's width
    (None when only the loaded model tells it)."""
    record = {
        "format": manifest.FORMAT,
        "fastbert_version": __version__,
        "model": str(Path(options.model).resolve()),
        "kind": spec.kind,
        "inputs": [str(p.resolve()) for p in inputs],
        manifest.INPUT_STATE: [[p.stat().st_size, p.stat().st_mtime_ns] for p in inputs],
        "text_field": options.text_field,
        "id_field": options.id_field,
        "pooling": model.pooling_name(spec, options.pooling),
        "normalize": options.normalize,
        "max_length": options.max_length,
        "dimensions": dimensions,
        "dtype": options.dtype,
        "store_dtype": options.store_dtype,
        "rows_per_shard": options.rows_per_shard,
        "skip_bad": options.skip_bad,
    }
    if options.name is not None:  # the name it was given by (not a setting of the job)
        record["model_name"] = options.name
    if options.quantize is not None:
        record["quantize"] = options.quantize
    for name in ("prompt", "max_active_dims"):
        if getattr(options, name):
            record[name] = getattr(options, name)
    if options.precision != "float32":
        record["precision"] = options.precision
    if options.precision in RANGED:
        record["calibration"] = _calibration_source(options)
        if options.ranges is not None:
            record["ranges"] = [list(row) for row in options.ranges]
    return record


def _calibration_source(options: EmbedOptions) -> str:
    if options.ranges is not None:
        return "ranges given"
    if options.calibration is not None:
        return f"the texts of {Path(options.calibration).resolve()}"
    return f"the first {CALIBRATION_ROWS} rows of the inputs"


@dataclass
class Job:
    """A job writing Parquet shards, started: its resolved options, output folder and manifest
    record; the shard writer, which starts after the shards an earlier run finished; and the
    first input row still to embed. ``finished``: the manifest of a complete run of this job
    that the output already holds (then there is nothing to do, and no writer).
    ``model_options``: the options as given, on the job's device, which the model loads with
    (:func:`~fastbert.embedding.loading.load_options` resolves them: resolved twice, a folder's
    own truncate_dim would read as a width given). ``tokens``: the most tokens an input keeps
    (a multi-vector model's query or document length, for the task its prompt names);
    ``static_route``: the folder of the SparseStaticEmbedding the inputs run through (an
    inference-free SPLADE model's queries: tokenised by its own tokenizer), else None."""

    options: EmbedOptions
    output: Path
    record: dict
    writer: ShardWriter | None
    first_row: int
    finished: dict | None = None
    model_options: EmbedOptions | None = None
    tokens: int | None = None
    static_route: Path | None = None

    def finished_summary(self) -> Summary:
        """The summary of the complete run found in the output: its totals, no time spent."""
        done = self.finished or {}
        counts = {key: done.get(key, 0) for key in manifest.TOTALS}
        docs = counts.pop("rows")
        summary = Summary(docs=docs, **counts, already_complete=True)
        summary.output, summary.manifest = self.output, self.finished
        return summary

    def quantize(self, loaded: TextModel | None, files: Sequence[Path]) -> None:
        """Set the writer's quantizer (with ``precision``): int8 / uint8 buckets span the
        ranges given, else those an earlier run of the job recorded, else those of the
        calibration texts' embeddings by ``loaded`` (the calibration file's, else the inputs'
        first :data:`~fastbert.embedding.options.CALIBRATION_ROWS` rows), recorded in the manifest
        before any shard is written, so that a resumed run uses the same."""
        precision = self.options.precision
        if precision == "float32":
            return
        ranges = None
        if precision in RANGED:
            if "ranges" not in self.record:
                if loaded is None:
                    raise ValueError(f"precision {precision} here needs ranges: give ranges")
                width = self.writer.dimensions
                sample = calibration_rows(self.options, files)
                found = quantization_ranges(embed_rows(loaded, sample, width), precision)
                self.record["ranges"] = found.astype(np.float64).tolist()
                manifest.write_manifest(self.output, {**self.record, "complete": False})
            given = self.record["ranges"]
            ranges = check_ranges(given, self.writer.dimensions or len(given[0]))
        self.writer.quantizer = Quantizer(precision, ranges)

    def finish(self, summary: Summary) -> Summary:
        """``summary`` of the run, with the output folder and the final manifest written."""
        summary.output = self.output
        summary.manifest = manifest.finish_output(self.output, self.record)
        return summary


def check_output_place(inputs: Sequence[str | Path], output: str | Path) -> None:
    """ValueError when ``output`` cannot be the job's folder: it (or a folder above it) is a
    file, or it is one of the ``inputs`` given as folders (its shards would be read as inputs
    by the next run)."""
    output = Path(output)
    place = output
    while not place.exists() and place != place.parent:
        place = place.parent
    if place.exists() and not place.is_dir():
        raise ValueError(f"output {output}: {place} exists and is not a folder")
    if any(Path(p).is_dir() and Path(p).resolve() == output.resolve() for p in inputs):
        raise ValueError(
            f"output {output} is an input folder: the shards written there would be read as "
            "inputs by the next run; write them to a folder of their own"
        )


def start_job(
    files: Sequence[Path],
    output: str | Path,
    options: EmbedOptions,
    tokenizer: Any,
    device: torch.device | None = None,
    calibrates: bool = True,
) -> Job:
    """Resolve ``options`` (see :func:`resolve`) and start the job's output in ``output``, or
    continue an unfinished run of the same job there, or find it complete there (``finished``;
    unless ``options.overwrite``). Called before the model loads, so that an output it must
    not write (manifest.OutputError) or a job already done costs nothing. ``calibrates``
    False: int8 / uint8 ranges must be given or recorded by an earlier run of the job
    (ValueError, before anything is written)."""
    given = options
    options, spec, dimensions = resolve(options, tokenizer, device)
    model_options = replace(given, device=options.device)
    task = task_of(given.prompt_name)
    tokens = spec.transformer.task_length(task) or options.max_length
    if spec.kind == CLASSIFICATION:
        raise ValueError(
            f"{options.model} is a classification model (a cross-encoder): it scores text "
            "pairs, it does not embed (serve it with fastbert serve for /rerank)"
        )
    output = Path(output)
    record = job_record(files, options, spec, dimensions)
    # The model folder's files as they are: weights saved over it since a run make another job.
    record[manifest.MODEL_STATE] = [list(f) for f in model_files(options.model, outside=output)]
    routed = spec.router is not None
    if task is not None and (spec.kind == MULTI_VECTOR or routed):  # query, document differ
        record["task"] = task
    static = spec.router.static_folder if routed and spec.router.is_static(task) else None
    if options.precision in RANGED and "ranges" not in record and not options.overwrite:
        # A resumed run keeps the ranges it recorded (a run of another job in the folder
        # calibrated on other rows: never its).
        earlier = manifest.read_manifest(output)
        if earlier is not None and earlier.get("ranges") is not None:
            if manifest.same_job(earlier, {**record, "ranges": earlier["ranges"]}):
                record["ranges"] = earlier["ranges"]
    finished = None if options.overwrite else manifest.finished_run(output, record)
    if finished is not None:
        return Job(options, output, record, None, 0, finished, model_options, tokens, static)
    if not calibrates and options.precision in RANGED and "ranges" not in record:
        raise ValueError(
            f"precision {options.precision} on Ray needs the ranges given (fastbert.embed's "
            "ranges=, min and max per dimension; the command line has no option for them) or "
            "recorded by an earlier run of the job in the output: the driver runs no model to "
            "calibrate them (a calibration file is not read on Ray); run without Ray"
        )
    start = manifest.start_output(output, record, options.overwrite)
    store_dtype = np.dtype(options.store_dtype)
    writer = ShardWriter(output, options.rows_per_shard, spec.kind, dimensions, store_dtype, start)
    first = start * options.rows_per_shard
    return Job(options, output, record, writer, first, None, model_options, tokens, static)


def embed_files(inputs: Sequence[str | Path], output: str | Path, options: EmbedOptions) -> Summary:
    """Embed the rows of ``inputs`` (files or folders) into Parquet shards in ``output``,
    continuing an unfinished run of the same job; when ``output`` holds this job complete,
    nothing is done and the summary is that run's (``already_complete``). Raises
    readers.InputError for unreadable input or a bad row (without skip_bad),
    manifest.OutputError for an output it must not write."""
    files = readers.list_inputs(inputs)
    check_output_place(inputs, output)
    tokenizer = model.load_tokenizer(Path(options.model))
    job = start_job(files, output, options, tokenizer)
    if job.finished is not None:
        return job.finished_summary()
    loaded = load_options(job.model_options, tokenizer)
    if job.options.id_field is not None:
        job.writer.id_kind = readers.IdKind()
    rows = (
        r
        for r in readers.read_rows(
            files, job.options.text_field, job.options.id_field, ids=job.writer.id_kind
        )
        if r.index >= job.first_row
    )
    job.writer.dimensions = job.options.dimensions or loaded.dimensions
    job.quantize(loaded, files)
    return job.finish(run_rows(rows, loaded.job(job.options.progress), job.writer, job.first_row))


def calibration_rows(options: EmbedOptions, files: Sequence[Path]) -> list[readers.Row]:
    """The rows whose embeddings give int8 / uint8 ranges: every good row of
    ``options.calibration``, else the first :data:`~fastbert.embedding.options.CALIBRATION_ROWS`
    good rows of ``files``; numbered from 0. InputError when there are fewer than two."""
    if options.calibration is not None:
        source, limit = readers.list_inputs([options.calibration]), None
    else:
        source, limit = files, CALIBRATION_ROWS
    texts = []
    # The inputs' rows as the job reads them: one bad for its id is no good row either.
    id_field = options.id_field if options.calibration is None else None
    for row in readers.read_rows(source, options.text_field, id_field):
        if row.problem is None:
            texts.append(row.text)
        if limit is not None and len(texts) == limit:
            break
    if len(texts) < 2:
        where = options.calibration or "the inputs"
        raise readers.InputError(
            f"{where}: {len(texts)} text(s) to calibrate {options.precision} ranges on; give "
            "at least two (a few hundred or more make stable ranges), or give the ranges"
        )
    return [readers.Row(i, None, t, readers.LIST_SOURCE, i) for i, t in enumerate(texts)]


def embed_rows(loaded: TextModel, rows: list[readers.Row], width: int) -> np.ndarray:
    """The job's float32 embeddings [len(rows), width] of ``rows`` (numbered from 0), as its
    shards would hold them before quantization."""
    sink = ArraySink(len(rows), width, np.dtype(np.float32))
    run_rows(rows, loaded.job(progress=False), sink, 0)
    return sink.array
