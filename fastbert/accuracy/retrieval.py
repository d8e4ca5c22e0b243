"""A retrieval sample of real English text, and how much a precision moves its neighbours.

The text is Python's documentation as the standard library ships it (``pydoc_data.topics``,
the help pages of the language reference): no download. Its paragraphs (five words or more,
whitespace collapsed, duplicates dropped) are shuffled with a seed; the first ``corpus`` are
the corpus, and the first sentence of each of the next ``queries`` paragraphs is a query, so a
query's own paragraph is never in the corpus (the question is which paragraphs come near it).

The neighbours of a query are the ``k`` corpus texts of highest cosine similarity; the overlap
of two neighbour lists is the fraction of one's ``k`` texts that the other holds (1.0: the same
set, in any order).
"""

from __future__ import annotations

import dataclasses
import random
import re

import torch
import torch.nn.functional as F

TOP_K = 10
MIN_PARAGRAPH_WORDS = 5
SOURCE = "paragraphs of Python's documentation (pydoc_data.topics)"


@dataclasses.dataclass(frozen=True)
class Sample:
    queries: list[str]
    corpus: list[str]


def documentation_paragraphs() -> list[str]:
    """The distinct paragraphs of ``pydoc_data.topics`` of five words or more, one line each,
    in the order of the sorted topic names."""
    try:
        from pydoc_data.topics import topics
    except ImportError as exc:  # some distributions strip pydoc_data from the standard library
        raise ValueError(
            "the retrieval sample needs Python's pydoc_data.topics, which this Python lacks"
        ) from exc
    seen: dict[str, None] = {}
    for name in sorted(topics):
        for paragraph in re.split(r"\n\s*\n", topics[name]):
            text = " ".join(paragraph.split())
            if len(text.split()) >= MIN_PARAGRAPH_WORDS:
                seen.setdefault(text)
    return list(seen)


def first_sentence(paragraph: str) -> str:
    """Up to the first '.', '!' or '?' followed by a space (the paragraph if there is none)."""
    return re.split(r"(?<=[.!?])\s+", paragraph, maxsplit=1)[0]


def retrieval_sample(queries: int, corpus: int, seed: int = 0) -> Sample:
    """``queries`` query sentences and ``corpus`` paragraphs (see the module docstring).

    Raises ValueError when the two together need more paragraphs than the text has, or when
    ``corpus`` is not more than :data:`TOP_K` (every query needs ``TOP_K`` neighbours)."""
    if queries < 1:
        raise ValueError(f"queries must be at least 1, got {queries}")
    if corpus <= TOP_K:
        raise ValueError(f"corpus must hold more than {TOP_K} texts, got {corpus}")
    paragraphs = documentation_paragraphs()
    if queries + corpus > len(paragraphs):
        raise ValueError(
            f"queries + corpus = {queries + corpus}, but the text has {len(paragraphs)} paragraphs"
        )
    random.Random(seed).shuffle(paragraphs)
    held_out = paragraphs[corpus : corpus + queries]
    return Sample([first_sentence(p) for p in held_out], paragraphs[:corpus])


def neighbours(queries: torch.Tensor, corpus: torch.Tensor, k: int = TOP_K) -> torch.Tensor:
    """queries [Q, D], corpus [N, D] (any float dtype): the indices [Q, k] (int64) of each
    query's ``k`` most cosine-similar corpus rows, most similar first."""
    if corpus.shape[0] < k:
        raise ValueError(f"the corpus has {corpus.shape[0]} rows, fewer than k={k}")
    scores = F.normalize(queries.float(), dim=-1) @ F.normalize(corpus.float(), dim=-1).T
    return scores.topk(k, dim=-1).indices


def overlap(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """got, ref: [Q, k] neighbour indices; the fraction [Q] of each row of ``ref``
    that the same row of ``got`` holds, in float64 (so 9 of 10 prints as 0.9)."""
    if got.shape != ref.shape:
        raise ValueError(f"neighbour lists of shapes {tuple(got.shape)} and {tuple(ref.shape)}")
    shared = (got[:, :, None] == ref[:, None, :]).any(dim=-1)
    return shared.double().sum(dim=-1) / ref.shape[-1]
