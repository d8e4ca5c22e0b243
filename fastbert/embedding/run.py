"""The embedding loop: rows -> tokenised ahead in a thread -> length-sorted windows ->
token-budget batches -> the model -> a sink (Parquet shards, an array), with a progress bar and
a summary. Shared by the one-process job, ``fastbert.embed`` of a list and
:meth:`~fastbert.embedding.text_model.TextModel.embed`."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fastbert.embedding import model, readers
from fastbert.embedding.batching import Window, token_batches, windows
from fastbert.embedding.options import EmbedOptions
from fastbert.embedding.shards import EmbeddedRows
from fastbert.embedding.tokenize import CHUNK_ROWS, tokenise_ahead


@dataclass
class Summary:
    """What a job did. ``docs``, ``tokens``, ``truncated``, ``skipped``: counts of this run;
    ``seconds``: its wall-clock time (see :class:`Meter`); ``output``/``manifest``: where it
    wrote and the final manifest (totals over every run of the job, a resumed one included).
    ``already_complete``: the output held this job complete, so nothing ran; the counts are
    then that run's totals and ``seconds`` is 0."""

    docs: int = 0
    tokens: int = 0
    truncated: int = 0
    skipped: int = 0
    seconds: float = 0.0
    output: Path | None = None
    manifest: dict | None = None
    already_complete: bool = False

    def tokens_per_second(self) -> float:
        """Tokens embedded per wall-clock second: what the progress bar ended on."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def line(self) -> str:
        """The summary for people: counts, time, docs/s and tokens/s, or that there was
        nothing to do."""
        if self.already_complete:
            return (
                f"nothing to do: {self.output} already holds this job, complete ({self.docs:,} "
                f"docs, {self.tokens:,} tokens); --overwrite (overwrite=True) embeds it again"
            )
        rate = self.docs / self.seconds if self.seconds > 0 else 0.0
        return (
            f"embedded {self.docs:,} docs ({self.tokens:,} tokens, {self.truncated} truncated, "
            f"{self.skipped} skipped) in {self.seconds:.1f} s: {rate:,.1f} docs/s, "
            f"{rate_text(self.tokens, self.seconds)} ({Meter.MEASURES})"
        )


def rate_text(tokens: int, seconds: float) -> str:
    """``tokens`` over ``seconds`` as the progress bar and the summary both show it."""
    return f"{tokens / seconds if seconds > 0 else 0.0:,.0f} tokens/s"


class Meter:
    """The one measure of speed of a run, which the progress bar shows as it goes and the
    summary ends on: the tokens embedded so far (real tokens of the inputs, after truncation,
    the prompt included) over the wall-clock seconds on ``clock`` since the run started (its
    reading, tokenising, forwards and shard writes included)."""

    MEASURES = "tokens embedded over wall-clock time, shard writes included"

    def __init__(self, bar: Any, clock: Callable[[], float] = time.perf_counter):
        self.bar, self.clock = bar, clock
        self.start = clock()

    def update(self, summary: Summary, docs: int) -> None:
        """Advance the bar by ``docs`` and show the rate so far."""
        self.bar.update(docs)
        self.bar.set_postfix_str(
            rate_text(summary.tokens, self.clock() - self.start), refresh=False
        )

    def finish(self, summary: Summary) -> None:
        """Set the run's ``seconds`` and show the bar's last rate from the same figures."""
        summary.seconds = self.clock() - self.start
        self.bar.set_postfix_str(rate_text(summary.tokens, summary.seconds), refresh=False)


class Loaded(Protocol):
    """What the loop runs: a model's encoder, a tokeniser (texts -> (token ids, whether each
    was truncated)) and the resolved options (a :class:`~fastbert.embedding.text_model.TextModel`
    is one)."""

    encoder: model.FolderPipeline
    tokenise: Callable[[list[str]], tuple[list[list[int]], list[bool]]]
    options: EmbedOptions


class Sink(Protocol):
    """Where embedded rows go (a ShardWriter, an ArraySink): rows added or skipped, then told
    that every row before ``end`` is in (``advance``) and that the input ended (``finish``)."""

    def add(self, embedded: EmbeddedRows) -> None: ...
    def skip(self, rows: list[int]) -> None: ...
    def advance(self, end: int) -> None: ...
    def finish(self, end: int) -> None: ...


class _InMemory:
    """What in-memory sinks share: every text has a row, none is skipped, nothing to flush."""

    def skip(self, rows: list[int]) -> None:
        raise AssertionError("in-memory texts are never skipped")

    def advance(self, end: int) -> None:
        pass

    def finish(self, end: int) -> None:
        pass


class ArraySink(_InMemory):
    """A sink that fills an array [n, dim] by row index."""

    def __init__(self, rows: int, dimensions: int, dtype: np.dtype):
        self.array = np.zeros((rows, dimensions), dtype)

    def add(self, embedded: EmbeddedRows) -> None:
        self.array[embedded.rows] = embedded.vectors


class ListSink(_InMemory):
    """A sink that keeps each row's output (a sparse row's (indices, values), a multi-vector
    row's array) in ``items``, by row index."""

    def __init__(self, rows: int):
        self.items: list[Any] = [None] * rows

    def add(self, embedded: EmbeddedRows) -> None:
        for row, item in zip(embedded.rows, embedded.vectors):
            self.items[row] = item


def run_rows(
    rows: Iterable[readers.Row],
    loaded: Loaded,
    sink: Sink,
    first_row: int,
    clock: Callable[[], float] = time.perf_counter,
) -> Summary:
    """Embed ``rows`` (input indices from ``first_row``) into ``sink``; the summary of the run,
    timed on ``clock`` as the progress bar is (:class:`Meter`)."""
    options = loaded.options
    summary = Summary()
    end = first_row
    bar = progress_bar(options.progress)
    meter = Meter(bar, clock)
    try:
        # Windows smaller than a tokeniser chunk get chunks of their own size.
        chunks = tokenise_ahead(rows, loaded.tokenise, min(CHUNK_ROWS, options.window_rows))
        for window in windows(chunks, options.window_rows):
            _check_bad(window, options.skip_bad)
            if window.bad:
                sink.skip([r.index for r in window.bad])
            summary.skipped += len(window.bad)
            summary.truncated += sum(window.cut)
            _embed_window(window, loaded, sink, summary, meter)
            end = window.end
            sink.advance(end)
        sink.finish(end)
        meter.finish(summary)
    finally:
        bar.close()
    return summary


def _check_bad(window: Window, skip_bad: bool) -> None:
    if window.bad and not skip_bad:
        row = window.bad[0]
        raise bad_row_error(row.where(), row.problem)


def bad_row_error(where: str, problem: str) -> readers.InputError:
    """The error that stops a job at a bad row (without skip_bad): where, what, how to skip
    (the command's flag and the Python argument)."""
    return readers.InputError(
        f"{where}: {problem} (bad rows are skipped with --skip-bad, or skip_bad=True)"
    )


def embed_sorted(
    encoder: model.FolderPipeline, tokens: list[list[int]], batch_tokens: int
) -> Iterator[tuple[list[int], np.ndarray]]:
    """Token ids of n rows -> (positions into ``tokens``, what the encoder gives for them:
    embeddings [len, dim], sparse or per-token vectors) per forward pass, rows sorted by length
    into batches of at most ``batch_tokens`` tokens (the rows' own on the encoder's packed
    path, rows x longest on its padded one)."""
    lengths = [len(t) for t in tokens]
    for batch in token_batches(lengths, batch_tokens, encoder.packed):
        yield batch, encoder([tokens[i] for i in batch])


def _embed_window(
    window: Window, loaded: Loaded, sink: Sink, summary: Summary, meter: Meter
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
        meter.update(summary, len(batch))


def progress_bar(enabled: bool) -> Any:
    """The job's progress bar on stderr (a disabled one when not ``enabled``): docs done, and
    the :class:`Meter`'s tokens/s."""
    from tqdm import tqdm

    # smoothing=0: tqdm's docs/s is the average since the start, as the summary's is.
    return tqdm(
        unit=" docs",
        file=sys.stderr,
        disable=not enabled,
        dynamic_ncols=True,
        desc="embed",
        smoothing=0,
    )
