"""The CPU engine's int8 linear: the compiled passes around the integer product, which runs on
oneDNN's quantised linear where the weights are packed for it, else on ``torch._int_mm``.

oneDNN's ``qlinear_pointwise`` on a weight packed once (fastbert.kernels.packed_weights, on a
CPU with AMX-INT8) ran the products level with ``torch._int_mm`` (which reorders the weight
on every call) or faster from :data:`ONEDNN_MIN_ROWS` rows, most at the larger counts, and
the int8 model faster end to end; below that ``torch._int_mm`` was as fast or faster
(docs/results.md, "int8 on oneDNN's quantised linear"). The op takes one activation
scale per tensor, not fastbert's per-token scales, so it is used for the integer product only:
signed int8 rows with zero point 0, unit scales and a float32 output, which holds the exact
int32 product converted to float32 as ``acc.float()`` does; the compiled epilogue then
applies the scales, bias and residual. The results are the plain backend's bits
(tests/test_cpu_int8.py). Two choices keep them so: AMX multiplies signed rows directly, while
uint8 rows with zero point 128 (what oneDNN wants without AMX, where signed rows fall to its
reference kernel) have the zero point's correction applied after the conversion to float32,
a last-unit error once the uncorrected sum passes 2**24.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from . import cpu_int8, reference, torch_ops
from .op import implements
from .packed_weights import PackedWeights

# Below this many rows (tokens) torch._int_mm ran all-MiniLM-L6-v2's products as fast as the
# packed oneDNN product or faster on a CPU with AMX; from it the packed one was level or faster.
ONEDNN_MIN_ROWS = 128

_paused = False


@contextlib.contextmanager
def turned_off() -> Iterator[None]:
    """Inside the block the integer product runs on ``torch._int_mm`` even where oneDNN's
    would (to compare the two, as the benchmarks do; the same bits); not for use from
    several threads."""
    global _paused
    before, _paused = _paused, True
    try:
        yield
    finally:
        _paused = before


class OneDNNProduct:
    """The compiled passes (fastbert.kernels.cpu_int8), with the integer product on oneDNN's
    quantised linear reading ``packed``, the weight's packed copy."""

    takes = staticmethod(cpu_int8.takes)
    dequantize = staticmethod(cpu_int8.dequantize)

    def __init__(self, packed: torch.Tensor, out_features: int):
        self.packed = packed
        self.out_features = out_features

    def product(
        self, x: torch.Tensor, weight: torch.Tensor, input_scale: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`fastbert.kernels.cpu_int8.product`, the integers in a float32 [M, N]."""
        q, scale = cpu_int8.quantize_rows(x, input_scale)
        n = self.out_features
        unit = torch.ones(n)
        zeros = torch.zeros(n, dtype=torch.int32)
        acc = torch.ops.onednn.qlinear_pointwise(
            q, 1.0, 0, self.packed, unit, zeros, None, 1.0, 0, torch.float32, "none", [], ""
        )
        return acc, scale


@implements(reference.linear_int8)
def linear_int8_unchecked(
    x,
    weight,
    weight_scale,
    bias,
    activation,
    residual,
    input_scale,
    *,
    packs: PackedWeights | None = None,
):
    """:func:`fastbert.kernels.torch_ops.linear_int8_unchecked` with the compiled passes
    (fastbert.kernels.cpu_int8) where they take the call; the integer product on oneDNN's
    quantised linear where ``packs`` (fastbert.kernels.packed_weights.PackedWeights) holds a
    packed copy of ``weight`` and the call has at least :data:`ONEDNN_MIN_ROWS` rows."""
    passes = cpu_int8
    k = weight.shape[1]
    if packs is not None and not _paused and k and x.numel() // k >= ONEDNN_MIN_ROWS:
        packed = packs.int8_weight_for(weight)
        passes = passes if packed is None else OneDNNProduct(packed, weight.shape[0])
    return torch_ops.linear_quantized_unchecked(
        "int8", x, weight, weight_scale, bias, activation, residual, input_scale, passes=passes
    )
