"""Fused residual add + LayerNorm over the last dimension: ``out = LayerNorm(x + residual)``.

Math, per row r of N elements, in float32::

    s[r, :]   = x[r, :] (+ residual[r, :]   if HAS_RESIDUAL)
    mean      = sum(s[r, :]) / N
    var       = sum((s[r, :] - mean)^2) / N          (biased, of the centred values)
    out[r, :] = (s[r, :] - mean) / sqrt(var + eps) * weight + bias

and rounded once to x's dtype. This is ``torch.nn.functional.layer_norm`` of the float32 sum,
as :func:`kernels.reference.layer_norm` computes it.

Shapes and layouts: x and residual are [..., N], flattened to [rows, N] (a view when the
strides allow, otherwise a copy) and read through their strides; weight and bias are [N]; the
output is a new contiguous tensor of x's shape.

Dtypes: float16, bfloat16 and float32, all tensors alike; statistics in float32.

Limits: one program per row holds the whole row (BLOCK = next power of two of N), so N may be
at most MAX_HIDDEN = 4096 (BERT's hidden sizes are 128 to 4096); a wider row raises ValueError.
Row offsets are int64. An empty input returns an empty output without a launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import check_layer_norm
from ._runtime import check_triton_device, next_power_of_2, refuse_gradients

MAX_HIDDEN = 4096
MIN_BLOCK = 16


def block_size(hidden: int) -> int:
    """The row tile: the next power of two of ``hidden``, at least MIN_BLOCK."""
    return max(MIN_BLOCK, next_power_of_2(hidden))


def num_warps(block: int) -> int:
    """Warps per row: about 256 elements per warp, between 1 and 8."""
    return min(8, max(1, block // 256))


def check_hidden(hidden: int) -> None:
    if hidden > MAX_HIDDEN:
        raise ValueError(
            f"hidden size {hidden} is larger than the {MAX_HIDDEN} the fused LayerNorm kernels "
            "support (one row per program); use backend='torch' for wider rows"
        )


@triton.jit
def normalize_row(s, mask, cols, N, eps, weight_ptr, bias_ptr, stride_weight, stride_bias):
    """LayerNorm of one float32 row ``s`` of N valid elements (``mask``; zero elsewhere)."""
    mean = tl.sum(s, axis=0) / N
    centred = tl.where(mask, s - mean, 0.0)
    var = tl.sum(centred * centred, axis=0) / N
    rstd = tl.math.div_rn(1.0, tl.sqrt_rn(var + eps))
    w = tl.load(weight_ptr + cols * stride_weight, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(bias_ptr + cols * stride_bias, mask=mask, other=0.0).to(tl.float32)
    return centred * rstd * w + b


@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr,  # [rows, N] input
    residual_ptr,  # [rows, N] added to x before the statistics (None unless HAS_RESIDUAL)
    weight_ptr,  # [N] scale (gamma)
    bias_ptr,  # [N] shift (beta)
    out_ptr,  # [rows, N] output, x's dtype
    N,
    eps,
    stride_x_row,
    stride_x_col,
    stride_residual_row,
    stride_residual_col,
    stride_weight,
    stride_bias,
    stride_out_row,
    stride_out_col,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    s = tl.load(x_ptr + row * stride_x_row + cols * stride_x_col, mask=mask, other=0.0)
    s = s.to(tl.float32)
    if HAS_RESIDUAL:
        r_ptrs = residual_ptr + row * stride_residual_row + cols * stride_residual_col
        s += tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)

    y = normalize_row(s, mask, cols, N, eps, weight_ptr, bias_ptr, stride_weight, stride_bias)
    out_ptrs = out_ptr + row * stride_out_row + cols * stride_out_col
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """``LayerNorm(x + residual)`` over the last dimension in one Triton pass per row.

    Args:
        x: [..., N] input, float16 / bfloat16 / float32, any strides; N <= 4096.
        weight: [N] scale, x's dtype.
        bias: [N] shift, x's dtype.
        eps: the non-negative number added to the variance.
        residual: optional tensor of x's shape and dtype, added to x before normalising.

    Returns:
        A new contiguous tensor of x's shape and dtype (float32 statistics, one rounding).

    Raises:
        TypeError: a non-tensor argument or an unsupported / mismatched dtype.
        ValueError: mismatched shapes or devices, a negative eps, N > 4096, or tensors the
            Triton kernels cannot reach (not CUDA, and not the CPU under TRITON_INTERPRET=1).
    """
    check_layer_norm(x, weight, bias, eps, residual)
    check_triton_device("x", x)
    refuse_gradients("layer_norm", x, weight, bias, residual)
    hidden = x.shape[-1]
    check_hidden(hidden)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if out.numel() == 0:
        return out
    x2 = x.reshape(-1, hidden)
    out2 = out.view(-1, hidden)
    res2 = residual.reshape(-1, hidden) if residual is not None else None
    block = block_size(hidden)
    _layer_norm_fwd_kernel[(x2.shape[0],)](
        x2,
        res2,
        weight,
        bias,
        out2,
        hidden,
        float(eps),
        x2.stride(0),
        x2.stride(1),
        res2.stride(0) if res2 is not None else 0,
        res2.stride(1) if res2 is not None else 0,
        weight.stride(0),
        bias.stride(0),
        out2.stride(0),
        out2.stride(1),
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        num_warps=num_warps(block),
    )
    return out
