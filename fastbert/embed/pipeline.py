"""The one-process embedding job: rows -> tokenise ahead -> length-sorted windows ->
token-budget batches -> the model -> Parquet shards (or an array), with a progress bar and a
summary."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from fastbert.embed import manifest, model, readers
from fastbert.embed.batching import Window, token_batches, windows
from fastbert.embed.options import DTYPES, EmbedOptions
from fastbert.embed.shards import EmbeddedRows, ShardWriter
from fastbert.embed.tokenize import Tokenise, tokenise_ahead
from fastbert.model.encoder import BertModel
from fastbert.version import __version__


@dataclass
class Summary:
    """What a job did. ``docs``, ``tokens``, ``truncated``, ``skipped``: counts of this run;
    ``seconds``: its wall-clock time; ``output``/``manifest``: where it wrote and the final
    manifest (totals over every run of the job, a resumed one included)."""

    docs: int = 0
    tokens: int = 0
    truncated: int = 0
    skipped: int = 0
    seconds: float = 0.0
    output: Path | None = None
    manifest: dict | None = None

    def line(self) -> str:
        rate = self.docs / self.seconds if self.seconds > 0 else 0.0
        return (
            f"embedded {self.docs} docs ({self.tokens} tokens, {self.truncated} truncated, "
            f"{self.skipped} skipped) in {self.seconds:.1f} s: {rate:.1f} docs/s"
        )


@dataclass
class Loaded:
    """The model side of a job: the encoder, the tokeniser and the options, resolved (device,
    dtype, batch_tokens, max_length, pooling and normalize all set)."""

    encoder: model.Encoder
    tokenise: Tokenise
    options: EmbedOptions


def resolve(
    options: EmbedOptions, tokenizer: Any, device: torch.device | None = None
) -> tuple[EmbedOptions, int]:
    """(``options`` with every default resolved from the device (``device``, else this
    machine's) and the model folder: device, dtype, batch_tokens, max_length, pooling,
    normalize; the embedding width). Reads the folder's configs only. ValueError for settings
    the model cannot run."""
    options = options.with_defaults(device)
    folder = Path(options.model)
    settings = model.folder_settings(folder)
    config = model.read_config(folder)
    limit = model.model_max_length(config, tokenizer)
    max_length = options.max_length or min(settings.max_length or limit, limit)
    if max_length > config.max_sequence_length:
        raise ValueError(
            f"max_length {max_length} exceeds the model's {config.max_sequence_length} positions"
        )
    normalize = options.normalize if options.normalize is not None else bool(settings.normalize)
    resolved = replace(
        options,
        max_length=max_length,
        normalize=normalize,
        pooling=options.pooling or settings.pooling or "mean",
    )
    return resolved, config.hidden_size


def load(options: EmbedOptions, tokenizer: Any = None) -> Loaded:
    """Load the model and tokenizer of ``options.model`` (the tokenizer may be given) and
    resolve the defaults (see :func:`resolve`)."""
    tokenizer = tokenizer or model.load_tokenizer(Path(options.model))
    options, _ = resolve(options, tokenizer)
    device = options.resolved_device()
    encoder_model = BertModel.from_pretrained(
        options.model,
        dtype=DTYPES[options.dtype],
        device=device,
        backend=options.backend,
        quantize=options.quantize,
        # On CUDA the packed path skips the padding; on the CPU the length-sorted batches hold
        # little padding and the dense path is the faster one.
        padding_free=True if device.type == "cuda" else "auto",
    )
    encoder = model.Encoder(
        encoder_model,
        tokenizer.pad_token_id or 0,
        options.pooling,
        options.normalize,
        np.dtype(options.store_dtype),
    )
    return Loaded(encoder, Tokenise(tokenizer, options.max_length), options)


class Sink(Protocol):
    """Where embedded rows go (a ShardWriter, an ArraySink): rows added or skipped, then told
    that every row before ``end`` is in (``advance``) and that the input ended (``finish``)."""

    def add(self, embedded: EmbeddedRows) -> None: ...
    def skip(self, rows: list[int]) -> None: ...
    def advance(self, end: int) -> None: ...
    def finish(self, end: int) -> None: ...


def job_record(inputs: Sequence[Path], options: EmbedOptions, dimensions: int) -> dict:
    """The manifest's description of a job: what decides its embeddings and shard layout
    (``quantize`` only when set, so that the records of earlier exact runs still match)."""
    record = {
        "format": manifest.FORMAT,
        "fastbert_version": __version__,
        "model": str(Path(options.model).resolve()),
        "inputs": [str(p.resolve()) for p in inputs],
        "text_field": options.text_field,
        "id_field": options.id_field,
        "pooling": options.pooling,
        "normalize": options.normalize,
        "max_length": options.max_length,
        "dimensions": dimensions,
        "dtype": options.dtype,
        "store_dtype": options.store_dtype,
        "rows_per_shard": options.rows_per_shard,
        "skip_bad": options.skip_bad,
    }
    if options.quantize is not None:
        record["quantize"] = options.quantize
    return record


@dataclass
class Job:
    """A job writing Parquet shards, started: its resolved options, output folder and manifest
    record; the shard writer, which starts after the shards an earlier run finished; and the
    first input row still to embed."""

    options: EmbedOptions
    output: Path
    record: dict
    writer: ShardWriter
    first_row: int

    def finish(self, summary: Summary) -> Summary:
        """``summary`` of the run, with the output folder and the final manifest written."""
        summary.output = self.output
        summary.manifest = manifest.finish_output(self.output, self.record)
        return summary


def start_job(
    files: Sequence[Path],
    output: str | Path,
    options: EmbedOptions,
    tokenizer: Any,
    device: torch.device | None = None,
) -> Job:
    """Resolve ``options`` (see :func:`resolve`) and start the job's output in ``output``, or
    continue an unfinished run of the same job there. Called before the model loads, so that
    an output it must not write (manifest.OutputError) costs nothing."""
    options, dimensions = resolve(options, tokenizer, device)
    output = Path(output)
    record = job_record(files, options, dimensions)
    start = manifest.start_output(output, record, options.overwrite)
    store_dtype = np.dtype(options.store_dtype)
    writer = ShardWriter(output, options.rows_per_shard, dimensions, store_dtype, start)
    return Job(options, output, record, writer, start * options.rows_per_shard)


def embed_files(inputs: Sequence[str | Path], output: str | Path, options: EmbedOptions) -> Summary:
    """Embed the rows of ``inputs`` (files or folders) into Parquet shards in ``output``,
    continuing an unfinished run of the same job. Raises readers.InputError for unreadable input
    or a bad row (without skip_bad), manifest.OutputError for an output it must not write."""
    files = readers.list_inputs(inputs)
    tokenizer = model.load_tokenizer(Path(options.model))
    job = start_job(files, output, options, tokenizer)
    loaded = load(job.options, tokenizer)
    rows = (
        r
        for r in readers.read_rows(files, job.options.text_field, job.options.id_field)
        if r.index >= job.first_row
    )
    return job.finish(run_rows(rows, loaded, job.writer, job.first_row))


def embed_texts(texts: Sequence[str], options: EmbedOptions) -> np.ndarray:
    """Embeddings [len(texts), dim] of in-memory texts, in order (store_dtype). ValueError
    naming the first bad text (not a string, or empty)."""
    if options.skip_bad:
        raise ValueError("skip_bad applies to files; an array needs a row for every text")
    loaded = load(replace(options, progress=options.progress and len(texts) > 1000))
    rows = (
        readers.Row(i, i, t, readers.LIST_SOURCE, i, readers.text_problem(t, "text"))
        for i, t in enumerate(texts)
    )
    sink = ArraySink(len(texts), loaded.encoder.dimensions, np.dtype(loaded.options.store_dtype))
    run_rows(rows, loaded, sink, 0)
    return sink.array


class ArraySink:
    """A sink that fills an array [n, dim] by row index."""

    def __init__(self, rows: int, dimensions: int, dtype: np.dtype):
        self.array = np.zeros((rows, dimensions), dtype)

    def add(self, embedded: EmbeddedRows) -> None:
        self.array[embedded.rows] = embedded.vectors

    def skip(self, rows: list[int]) -> None:
        raise AssertionError("in-memory texts are never skipped")

    def advance(self, end: int) -> None:
        pass

    def finish(self, end: int) -> None:
        pass


def run_rows(rows: Iterable[readers.Row], loaded: Loaded, sink: Sink, first_row: int) -> Summary:
    """Embed ``rows`` (input indices from ``first_row``) into ``sink``; the summary of the run."""
    options = loaded.options
    summary = Summary()
    start = time.perf_counter()
    end = first_row
    bar = progress_bar(options.progress)
    try:
        chunks = tokenise_ahead(rows, loaded.tokenise)
        for window in windows(chunks, options.window_rows):
            _check_bad(window, options.skip_bad)
            if window.bad:
                sink.skip([r.index for r in window.bad])
            summary.skipped += len(window.bad)
            summary.truncated += sum(window.cut)
            _embed_window(window, loaded, sink, summary, bar, start)
            end = window.end
            sink.advance(end)
        sink.finish(end)
    finally:
        bar.close()
    summary.seconds = time.perf_counter() - start
    return summary


def _check_bad(window: Window, skip_bad: bool) -> None:
    if window.bad and not skip_bad:
        row = window.bad[0]
        raise bad_row_error(row.where(), row.problem)


def bad_row_error(where: str, problem: str) -> readers.InputError:
    """The error that stops a job at a bad row (without skip_bad): where, what, how to skip."""
    return readers.InputError(f"{where}: {problem} (skip bad rows with --skip-bad)")


def embed_sorted(
    encoder: model.Encoder, tokens: list[list[int]], batch_tokens: int
) -> Iterator[tuple[list[int], np.ndarray]]:
    """Token ids of n rows -> (positions into ``tokens``, their embeddings [len, dim]) per
    forward pass, rows sorted by length into batches of at most ``batch_tokens`` tokens."""
    lengths = [len(t) for t in tokens]
    for batch in token_batches(lengths, batch_tokens):
        yield batch, encoder([tokens[i] for i in batch])


def _embed_window(
    window: Window, loaded: Loaded, sink: Sink, summary: Summary, bar: Any, start: float
) -> None:
    for batch, vectors in embed_sorted(loaded.encoder, window.tokens, loaded.options.batch_tokens):
        tokens = [len(window.tokens[i]) for i in batch]
        rows = [window.rows[i] for i in batch]
        sink.add(
            EmbeddedRows(
                rows=[row.index for row in rows],
                ids=[row.output_id() for row in rows],
                vectors=vectors,
                tokens=tokens,
                truncated=[window.cut[i] for i in batch],
            )
        )
        summary.docs += len(batch)
        summary.tokens += sum(tokens)
        bar.update(len(batch))
        elapsed = time.perf_counter() - start
        if elapsed > 0:
            bar.set_postfix_str(f"{summary.tokens / elapsed:,.0f} tokens/s", refresh=False)


def progress_bar(enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(
        unit=" docs", file=sys.stderr, disable=not enabled, dynamic_ncols=True, desc="embed"
    )
