"""Quantized dense embeddings, as sentence-transformers' ``quantize_embeddings`` gives them from
release 6.2 on (the same values, bit for bit, for the same inputs and ranges; 6.2 rounds the
ranges to float32 first, so on float64 embeddings earlier releases can put a value near a
bucket's edge one bucket over):

- ``float32``: the embeddings as float32;
- ``int8`` / ``uint8``: each value mapped onto 256 buckets per dimension between that
  dimension's ``ranges[0]`` (min) and ``ranges[1]`` (max): ``floor((x - min) / step)`` clipped to
  0..255 with ``step = (max - min) / 255`` (1 where max == min), minus 128 for int8;
- ``binary`` / ``ubinary``: one bit per dimension (``x > 0``), packed 8 to a byte, the first
  dimension in the high bit ([n, ceil(d / 8)]); uint8 bytes, or for ``binary`` each byte minus
  128 as int8.

int8 / uint8 need ranges: given (``ranges``, float [2, d]), else the per-dimension min and max of
``calibration_embeddings``, else of the embeddings themselves (at least two of them). A corpus
or a server quantizes many batches, so it fixes the ranges once and keeps them
(:func:`quantization_ranges`); see docs/embedding.md, Quantized embeddings.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

PRECISIONS = ("float32", "int8", "uint8", "binary", "ubinary")
# The precisions whose buckets need ranges.
RANGED = ("int8", "uint8")
# Fewer calibration embeddings than this make unstable ranges (sentence-transformers warns too).
FEW = 100

log = logging.getLogger("fastbert.embedding")


def check_precision(precision: Any) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`; ValueError naming them otherwise."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    return precision


def check_ranges_apply(precision: str, **given: Any) -> None:
    """ValueError when one of ``given`` (the ranges, or where they come from, by the caller's
    parameter name) is set for a precision whose buckets need no ranges: a float or binary
    result would silently ignore it. An unknown precision is left to :func:`check_precision`."""
    for name, value in given.items():
        if value is not None and precision in PRECISIONS and precision not in RANGED:
            raise ValueError(
                f"{name} applies to precision int8 or uint8 (their buckets' ranges), not "
                f"{precision}"
            )


def dtype(precision: str) -> np.dtype:
    """The numpy dtype of embeddings in ``precision``."""
    return np.dtype(
        {"float32": np.float32, "int8": np.int8, "binary": np.int8}.get(precision, np.uint8)
    )


def width(precision: str, dimensions: int) -> int:
    """The values per embedding of ``dimensions`` dimensions in ``precision`` (packed bits:
    ``ceil(dimensions / 8)``)."""
    return (dimensions + 7) // 8 if precision.endswith("binary") else dimensions


def quantization_ranges(embeddings: Any, precision: str = "int8") -> np.ndarray:
    """[2, d]: the per-dimension min (row 0) and max (row 1) of ``embeddings`` [n, d], the
    ranges int8 / uint8 buckets span. ValueError for a single embedding (its ranges would be
    empty); a warning (logged) for fewer than 100."""
    embeddings = _numpy(embeddings)
    if embeddings.ndim == 1 or embeddings.shape[0] == 1:
        raise ValueError(
            f"cannot compute {precision} quantization ranges from a single embedding: give "
            "ranges, or calibration embeddings of a representative set of texts"
        )
    if embeddings.shape[0] < FEW:
        log.warning(
            "%s quantization ranges from %d embeddings: ranges from more embeddings (or "
            "calibration embeddings) are more stable",
            precision,
            embeddings.shape[0],
        )
    return _min_max(embeddings)


def quantize_embeddings(
    embeddings: Any,
    precision: str,
    ranges: Any = None,
    calibration_embeddings: Any = None,
) -> np.ndarray | list[np.ndarray]:
    """``embeddings`` (float [n, d], or [d]; numpy, torch or a list of either) in
    ``precision`` (see the module docstring). ``ranges``: float [2, d], the per-dimension min
    and max int8 / uint8 buckets span (None: from ``calibration_embeddings``, else from
    ``embeddings``). A list of [tokens, d] matrices (a multi-vector model's) is quantized
    matrix by matrix with ranges shared by all of them. ValueError for an unknown precision,
    integer embeddings, or ranges that must come from a single embedding."""
    check_precision(precision)
    if isinstance(embeddings, list | tuple):
        if not embeddings:
            return []
        items = [_numpy(e) for e in embeddings]
        if items[0].ndim == 2:
            return _quantize_matrices(items, precision, ranges, calibration_embeddings)
        embeddings = np.array(items)
    embeddings = _numpy(embeddings)
    if embeddings.dtype in (np.uint8, np.int8):
        raise ValueError("embeddings to quantize must be float, not int8 or uint8")
    if embeddings.ndim == 2 and embeddings.shape[0] == 0:
        return np.zeros((0, width(precision, embeddings.shape[1])), dtype(precision))
    if precision == "float32":
        return embeddings.astype(np.float32)
    if precision in RANGED:
        if ranges is None and calibration_embeddings is not None:
            ranges = _calibration_ranges(calibration_embeddings, precision, embeddings.shape[-1])
        elif ranges is None:
            ranges = quantization_ranges(embeddings, precision)
        ranges = check_ranges(ranges, embeddings.shape[-1])
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)
        buckets = np.clip(np.floor((embeddings - starts) / steps), 0, 255)
        if precision == "uint8":
            return buckets.astype(np.uint8)
        return (buckets - 128).astype(np.int8)
    packed = np.packbits(embeddings > 0, axis=-1)
    if precision == "ubinary":
        return packed
    return (packed.astype(np.int16) - 128).astype(np.int8)


def check_ranges(ranges: Any, dimensions: int) -> np.ndarray:
    """``ranges`` as float32 [2, dimensions], each min <= its max and every value finite;
    ValueError naming what is wrong."""
    try:
        array = np.asarray(ranges, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"ranges must be numbers [2, {dimensions}]: {exc}") from exc
    if array.shape != (2, dimensions):
        raise ValueError(
            f"ranges must be [2, {dimensions}] (min and max per dimension), got shape "
            f"{list(array.shape)}"
        )
    if not np.isfinite(array).all():
        raise ValueError("ranges must be finite numbers")
    if (array[0] > array[1]).any():
        dimension = int(np.argmax(array[0] > array[1]))
        raise ValueError(f"ranges: dimension {dimension} has its min above its max")
    return array.astype(np.float32)


@dataclass(frozen=True, eq=False)
class Quantizer:
    """Dense embeddings -> ``precision`` with fixed ``ranges`` (float32 [2, d]; int8 / uint8
    only): what a corpus job or a server applies to every batch, so that all of them share
    one set of buckets."""

    precision: str
    ranges: np.ndarray | None = None

    def __post_init__(self) -> None:
        check_precision(self.precision)
        if (self.ranges is None) != (self.precision not in RANGED):
            raise ValueError(f"precision {self.precision} needs ranges exactly when int8 / uint8")

    def __call__(self, embeddings: np.ndarray) -> np.ndarray:
        return quantize_embeddings(embeddings, self.precision, self.ranges)

    @property
    def dtype(self) -> np.dtype:
        return dtype(self.precision)

    def width(self, dimensions: int) -> int:
        return width(self.precision, dimensions)


def _quantize_matrices(
    matrices: Sequence[np.ndarray], precision: str, ranges: Any, calibration: Any
) -> list[np.ndarray]:
    """Multi-vector matrices, each [tokens, d], quantized with one set of ranges."""
    if precision in RANGED and ranges is None:
        if calibration is not None:
            ranges = _calibration_ranges(calibration, precision, matrices[0].shape[-1])
        else:
            data = np.concatenate(matrices, axis=0)
            if len(data):
                ranges = quantization_ranges(data, precision)
    return [quantize_embeddings(m, precision, ranges, calibration) for m in matrices]


def _calibration_ranges(calibration: Any, precision: str, width: int) -> np.ndarray:
    """The ranges of ``calibration`` [n, width] embeddings (n >= 2); ValueError otherwise (one
    embedding's ranges are empty: every value would fall in the first or the last bucket)."""
    data = _numpy(calibration)
    if data.ndim != 2 or data.shape[1] != width:
        raise ValueError(
            f"calibration_embeddings must be [n, {width}] (the embeddings' width), got shape "
            f"{list(data.shape)}"
        )
    if data.shape[0] < 2:
        raise ValueError(
            f"calibration_embeddings hold {data.shape[0]} embedding(s): {precision} ranges need "
            "several, of a representative set of texts"
        )
    return quantization_ranges(data, precision)


def _min_max(embeddings: np.ndarray) -> np.ndarray:
    return np.vstack((np.min(embeddings, axis=0), np.max(embeddings, axis=0)))


def _numpy(embeddings: Any) -> np.ndarray:
    """A numpy array of ``embeddings`` (a torch tensor: detached, on the CPU; bfloat16 as
    float32, which numpy lacks)."""
    if hasattr(embeddings, "detach"):  # a torch tensor: this module does not import torch
        tensor = embeddings.detach().cpu()
        if str(tensor.dtype) == "torch.bfloat16":
            tensor = tensor.float()
        return tensor.numpy()
    return np.asarray(embeddings)


__all__ = [
    "PRECISIONS",
    "RANGED",
    "Quantizer",
    "check_precision",
    "check_ranges",
    "dtype",
    "quantization_ranges",
    "quantize_embeddings",
    "width",
]
