"""The int8 / uint8 ranges of a server's dense embeddings, fixed once at start.

int8 and uint8 embeddings map each dimension onto 256 buckets between its min and max
(:mod:`fastbert.embedding.quantized`). sentence-transformers takes those ranges from the batch it
quantizes, but a server's requests are batches of their own, and the same text would get other
buckets in each: a server fixes the ranges once, from the embeddings of a calibration sample
(``--calibration FILE``, one text per line, else :data:`SAMPLE_SIZE` sentences of real English
that ship with Python: the help texts of ``pydoc_data.topics``), and reports them in
``GET /info`` so that clients can map buckets back to values.

The sample's embeddings are kept as computed (pooled, before normalisation and any cut), so a
request that cuts its embeddings (``output_dimension``) gets the ranges of the cut, normalised
embeddings, computed once per width.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

from fastbert.embedding.model import finish_embeddings
from fastbert.embedding.quantized import quantization_ranges
from fastbert.embedding.text_model import TextModel

# Sentences of the built-in sample: spread evenly over Python's help texts.
SAMPLE_SIZE = 512
SAMPLE_SOURCE = "sentences of Python's help texts (pydoc_data.topics)"


def help_sentences(count: int | None = SAMPLE_SIZE) -> list[str]:
    """``count`` English sentences of Python's help texts (``pydoc_data.topics``, in the
    standard library): prose only (4 to 60 words, at least 90% letters and spaces), spread
    evenly over the topics in their sorted order (None: every one, in that order)."""
    from pydoc_data.topics import topics

    text = " ".join(" ".join(topics[name].split()) for name in sorted(topics))
    found = re.split(r"(?<=[.!?])\s+(?=[A-Z])", text)
    prose = [
        s
        for s in found
        if 4 <= len(s.split()) <= 60 and sum(c.isalpha() or c == " " for c in s) / len(s) > 0.9
    ]
    if count is None or len(prose) <= count:
        return prose
    return [prose[i] for i in np.linspace(0, len(prose) - 1, count).astype(int)]


def read_texts(path: str | Path) -> list[str]:
    """The non-blank lines of a text file (UTF-8). ValueError for fewer than two."""
    texts = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines()]
    texts = [t for t in texts if t]
    if len(texts) < 2:
        raise ValueError(f"calibration: {path} has {len(texts)} texts; give at least two")
    return texts


class Calibration:
    """The pooled float32 embeddings [n, d] of a calibration sample (before normalisation),
    and the int8 / uint8 ranges they give, per output width."""

    def __init__(self, pooled: np.ndarray, source: str):
        self.pooled = pooled
        self.source = source
        self._ranges: dict[int | None, np.ndarray] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, model: TextModel, path: str | None = None) -> Calibration:
        """Embed the sample (the lines of ``path``, else :func:`help_sentences`) with
        ``model`` (its default prompt; run on the calling thread)."""
        texts = read_texts(path) if path is not None else help_sentences()
        source = str(Path(path).resolve()) if path is not None else SAMPLE_SOURCE
        return cls(model.embed(texts, normalize=False), source)

    def ranges(self, dimensions: int | None = None) -> np.ndarray:
        """float32 [2, width]: per dimension the min and max of the sample's normalised
        embeddings, cut to their first ``dimensions`` values (None: all) first."""
        with self._lock:
            found = self._ranges.get(dimensions)
            if found is None:
                finished = finish_embeddings(self.pooled, True, dimensions, np.dtype(np.float32))
                found = quantization_ranges(finished).astype(np.float32)
                self._ranges[dimensions] = found
            return found

    def describe(self) -> dict:
        """What GET /info reports: the sample, its size, and the full-width ranges (exact
        float32 values, as numbers)."""
        return {
            "source": self.source,
            "texts": len(self.pooled),
            "ranges": self.ranges().astype(np.float64).tolist(),
        }
