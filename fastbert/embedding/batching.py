"""Batching for the forward passes: rows are sorted by token count inside a bounded window of
consecutive rows (so memory is bounded whatever the corpus size), then packed into batches
whose padded size (rows x longest row) stays within a token budget."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from fastbert.embedding.readers import Row
from fastbert.embedding.tokenize import Chunk


@dataclass
class Window:
    """Consecutive tokenised rows: ``rows``/``tokens`` the good ones, ``bad`` the others,
    ``cut`` whether each good one was truncated, ``end`` the index after the last row read."""

    rows: list[Row] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    bad: list[Row] = field(default_factory=list)
    cut: list[bool] = field(default_factory=list)
    end: int = 0

    def add(self, chunk: Chunk) -> None:
        self.rows += chunk.rows
        self.tokens += chunk.tokens
        self.bad += chunk.bad
        self.cut += chunk.cut
        self.end = max(self.end, chunk.end)

    def __len__(self) -> int:
        return len(self.rows) + len(self.bad)


def windows(chunks: Iterable[Chunk], window_rows: int) -> Iterator[Window]:
    """Group chunks into windows of at least ``window_rows`` rows (the last may hold fewer)."""
    window = Window()
    for chunk in chunks:
        window.add(chunk)
        if len(window) >= window_rows:
            yield window
            window = Window()
    if len(window):
        yield window


def token_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Positions into ``lengths`` grouped into batches, longest rows first, so that within a
    batch ``len(batch) * max(length)`` <= ``batch_tokens`` (a row longer than the budget runs
    alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in order:
        longest_if_added = max(longest, lengths[i])
        if current and (len(current) + 1) * longest_if_added > batch_tokens:
            batches.append(current)
            current, longest_if_added = [], lengths[i]
        current.append(i)
        longest = longest_if_added
    if current:
        batches.append(current)
    return batches
