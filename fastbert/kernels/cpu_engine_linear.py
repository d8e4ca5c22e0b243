"""The CPU engine's linear: one oneDNN call with its post-op, on packed weights where given.

``torch.ops.mkldnn._linear_pointwise`` (what ``torch.compile`` emits on a CPU) runs the GEMM
with GELU or the residual add as its post-op, on a CPU in float32 or bfloat16 when autograd does
not record the call: faster than MKL's addmm there (docs/results.md, "Measurements behind the
code's choices"). In bfloat16 GELU runs by table (fastbert.kernels.cpu_gelu) on the product
rounded to bfloat16, as PyTorch's eager bfloat16 computes it, where the CPU has the table's
kernel: oneDNN's GELU post-op cost as much as the product. Otherwise (another device or dtype,
while ``torch.compile`` traces, which cannot trace oneDNN's availability check, with no input
features, which oneDNN refuses, or under autograd) the plain backend's linear
(fastbert.kernels.torch_ops). bfloat16 on a CPU without what oneDNN's bfloat16 needs (AVX2
only), where PyTorch's bfloat16 GEMM is a slow loop, runs as a float32 oneDNN product of the
bfloat16 values rounded once to bfloat16 (:func:`widened_linear`), then the plain epilogue.
Given ``packs`` (fastbert.kernels.packed_weights), the oneDNN call reads each weight's copy in
oneDNN's blocked layout, made once, instead of reordering the weight on every call.
"""

from __future__ import annotations

import functools

import torch

from . import cpu_gelu, reference, torch_ops
from .op import implements
from .packed_weights import PackedWeights, onednn_serves, openmp_dynamic


# oneDNN's GEMM with its post-ops (PyTorch's own inference op, what torch.compile emits on a
# CPU): faster than MKL's addmm in float32, by less in bfloat16 (docs/results.md,
# "Measurements behind the code's choices"). It has no derivative, so a call autograd records
# takes F.linear. Which dtypes it takes on this CPU: packed_weights.onednn_serves.
@functools.cache
def has_onednn_linear() -> bool:
    return (
        not openmp_dynamic()
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    )


def onednn_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """linear on a CPU in one oneDNN call: GELU or the residual add as its post-op; in
    bfloat16, where the table's kernel runs, GELU by table on the rounded product instead."""
    pointwise = torch.ops.mkldnn._linear_pointwise
    if activation is not None:
        approximate = "tanh" if activation == "gelu_tanh" else "none"
        if x.dtype == torch.bfloat16 and cpu_gelu.available():
            y = cpu_gelu.gelu_(pointwise(x, weight, bias, "none", [], ""), approximate)
        else:
            y = pointwise(x, weight, bias, "gelu", [], approximate)
        return y if residual is None else y.add_(residual)
    if residual is not None:
        return pointwise.binary(x, residual, weight, bias, "add")
    return pointwise(x, weight, bias, "none", [], "")


def takes_onednn(x: torch.Tensor, *tensors: torch.Tensor | None) -> bool:
    """Whether linear runs on oneDNN: a CPU tensor of a dtype it serves with input features,
    no autograd record, not while torch.compile traces."""
    return onednn_serves(x.dtype) and _inference_on_onednn(x, *tensors)


def takes_widened(x: torch.Tensor, *tensors: torch.Tensor | None) -> bool:
    """Whether a bfloat16 linear runs as a float32 product (:func:`widened_linear`): on a CPU
    without what oneDNN's bfloat16 needs, where PyTorch's bfloat16 GEMM falls to a loop
    (1.2 GFLOP/s against float32's 100 on an AVX2-only CPU), otherwise as
    :func:`takes_onednn`."""
    return (
        x.dtype == torch.bfloat16
        and not onednn_serves(x.dtype)
        and _inference_on_onednn(x, *tensors)
    )


def _inference_on_onednn(x: torch.Tensor, *tensors: torch.Tensor | None) -> bool:
    if x.device.type != "cpu" or x.shape[-1] == 0:
        return False
    if torch.compiler.is_compiling() or not has_onednn_linear():
        return False
    grad = torch.is_grad_enabled()
    return not (grad and any(t is not None and t.requires_grad for t in (x, *tensors)))


def widened_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    packs: PackedWeights | None,
) -> torch.Tensor:
    """bfloat16 x [..., K] @ weight [N, K]^T + bias as one float32 oneDNN product rounded once
    to bfloat16 [..., N]: what a bfloat16 GEMM computes (bfloat16 operands, float32 sums, one
    rounding), on the float32 units. The weight's float32 copy is kept in ``packs`` where
    given (:meth:`PackedWeights.widened_for`), else converted here."""
    copies = None if packs is None else packs.widened_for(weight, weight.shape[1])
    wide = weight.float() if copies is None else copies[0]
    wide_bias = None if bias is None else bias.float()
    product = torch.ops.mkldnn._linear_pointwise(x.float(), wide, wide_bias, "none", [], "")
    return product.to(x.dtype)


@implements(reference.linear)
def linear_unchecked(
    x, weight, bias, activation, residual, gated, *, packs: PackedWeights | None = None
):
    """:func:`fastbert.kernels.torch_ops.linear_unchecked` on oneDNN where
    :func:`takes_onednn`; ``packs``: where the oneDNN call reads its weight's packed copy
    (see fastbert.kernels.packed_weights); None reads ``weight`` as it is."""
    if bias is not None:  # oneDNN reads a bias as dense, whatever its strides
        bias = bias.contiguous()
    if takes_widened(x, weight, bias, residual):
        y = widened_linear(x, weight, bias, packs)
        return torch_ops.finish_linear(y, activation, residual, gated)
    if not takes_onednn(x, weight, bias, residual):
        return torch_ops.linear_unchecked(x, weight, bias, activation, residual, gated=gated)
    onednn_weight = weight if packs is None else packs.weight_for(weight)
    if not gated:
        return onednn_linear(x, onednn_weight, bias, activation, residual)
    y = onednn_linear(x, onednn_weight, bias, None, None)
    return torch_ops.finish_linear(y, activation, residual, gated)
