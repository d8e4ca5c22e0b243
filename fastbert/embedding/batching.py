"""Batching for the forward passes: rows are sorted by token count inside a bounded window of
consecutive rows (so memory is bounded whatever the corpus size), then grouped into batches
whose size in rows of the forward pass stays within a token budget: the rows' tokens on the
packed path, rows x longest row on the padded one."""

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


def pass_rows(lengths: list[int], packed: bool) -> int:
    """The rows a forward pass runs for inputs of ``lengths`` tokens: their sum when ``packed``,
    inputs x longest input when padded (what :func:`token_batches` keeps within its budget)."""
    return sum(lengths) if packed else len(lengths) * max(lengths, default=0)


def token_batches(lengths: list[int], batch_tokens: int, packed: bool = False) -> list[list[int]]:
    """Positions into ``lengths`` grouped into batches, longest rows first, so that each
    batch's rows in the forward pass stay within ``batch_tokens``: the sum of its lengths when
    ``packed`` (a packed batch runs one row per token), ``len(batch) * max(length)`` when not
    (a padded batch runs its longest row's length for every row). A row longer than the budget
    runs alone."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    used = 0
    for i in order:
        # Longest first: every row of a padded batch costs its first row's length.
        cost = lengths[current[0]] if current and not packed else lengths[i]
        if current and used + cost > batch_tokens:
            batches.append(current)
            current, used, cost = [], 0, lengths[i]
        current.append(i)
        used += cost
    if current:
        batches.append(current)
    return batches
