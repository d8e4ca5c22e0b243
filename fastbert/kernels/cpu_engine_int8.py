"""The CPU engine's int8 linear: the compiled passes around the integer product, which runs on
oneDNN's quantised linear where the weights are packed for it (AMX-INT8), on ``torch._int_mm``
where the CPU has VNNI, and on a CPU without int8 dot products on the byte multiply-adds of
AVX-512 BW or, without AVX-512, of AVX2 (:class:`PanelProduct`,
fastbert.kernels.cpu_int8_product: exact, faster than float32's GEMMs), else as float32
GEMMs on the weights' kept float32 copies (:class:`WidenedProduct`: exact, as fast as
float32; there ``torch._int_mm`` is oneDNN's reference loop, about 50x slower).

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

from . import cpu_engine_linear, cpu_int8, cpu_int8_product, reference, torch_ops
from .cpu_library import has_int8_dot_products
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


class _KeptWeightProduct:
    """The compiled passes (fastbert.kernels.cpu_int8), with the integer product reading a
    copy of the weight kept in fastbert.kernels.packed_weights: a subclass's
    :meth:`multiply`."""

    takes = staticmethod(cpu_int8.takes)
    dequantize = staticmethod(cpu_int8.dequantize)

    def product(
        self, x: torch.Tensor, weight: torch.Tensor, input_scale: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`fastbert.kernels.cpu_int8.product`: x's rows quantised by the compiled pass,
        then :meth:`multiply`."""
        q, scale = cpu_int8.quantize_rows(x, input_scale)
        return self.multiply(q, weight), scale

    def multiply(self, q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """int8 q [M, K] times the weight: the exact integers, int32 or float32 [M, N]."""
        raise NotImplementedError


class OneDNNProduct(_KeptWeightProduct):
    """The integer product on oneDNN's quantised linear reading ``packed``, the weight's
    packed copy (the integers in a float32 [M, N])."""

    def __init__(self, packed: torch.Tensor, out_features: int):
        self.packed = packed
        self.out_features = out_features

    def multiply(self, q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        n = self.out_features
        unit = torch.ones(n)
        zeros = torch.zeros(n, dtype=torch.int32)
        return torch.ops.onednn.qlinear_pointwise(
            q, 1.0, 0, self.packed, unit, zeros, None, 1.0, 0, torch.float32, "none", [], ""
        )


class WidenedProduct(_KeptWeightProduct):
    """The integer product as float32 GEMMs on oneDNN reading ``copies``, the weight's float32
    copies of at most :data:`~fastbert.kernels.torch_ops.FLOAT32_EXACT_TERMS` columns each
    (packed): exact, for a CPU without int8 dot products
    (fastbert.kernels.torch_ops.int_product_in_float32; float32 or int32 [M, N])."""

    def __init__(self, copies: tuple[torch.Tensor, ...]):
        self.copies = copies

    def multiply(self, q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        pointwise = torch.ops.mkldnn._linear_pointwise

        def product(block: torch.Tensor, start: int) -> torch.Tensor:
            copy = self.copies[start // torch_ops.FLOAT32_EXACT_TERMS]
            return pointwise(block, copy, None, "none", [], "")

        return torch_ops.int_product_in_float32(q, weight, product)


class PanelProduct(_KeptWeightProduct):
    """The integer product on the byte multiply-adds reading ``panels``, the weight packed for
    them (fastbert.kernels.cpu_int8_product): exact, for a CPU without int8 dot products
    (int32 [M, N])."""

    def __init__(self, panels: cpu_int8_product.Panels):
        self.panels = panels

    def multiply(self, q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return cpu_int8_product.product(q, self.panels)


def _product_passes(x: torch.Tensor, weight: torch.Tensor, packs: PackedWeights | None) -> object:
    """Where the int8 linear's passes and product run (see :func:`linear_int8_unchecked`)."""
    k = weight.shape[1]
    if packs is None or _paused or not k or not cpu_engine_linear.has_onednn_linear():
        return cpu_int8
    if not has_int8_dot_products():
        build = cpu_int8_product.chosen()
        panels = None if build is None else packs.int8_panels_for(weight, build)
        if panels is not None:
            return PanelProduct(panels)
        if not cpu_engine_linear.has_onednn_linear():
            return cpu_int8
        copies = packs.widened_for(weight, torch_ops.FLOAT32_EXACT_TERMS)
        return cpu_int8 if copies is None else WidenedProduct(copies)
    if x.numel() // k < ONEDNN_MIN_ROWS:
        return cpu_int8
    packed = packs.int8_weight_for(weight)
    return cpu_int8 if packed is None else OneDNNProduct(packed, weight.shape[0])


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
    passes = _product_passes(x, weight, packs)
    return torch_ops.linear_quantized_unchecked(
        "int8", x, weight, weight_scale, bias, activation, residual, input_scale, passes=passes
    )
