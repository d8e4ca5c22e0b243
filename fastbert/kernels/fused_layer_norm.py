"""Fused dropout + residual add + LayerNorm over the last dimension, forward and backward:
``out = LayerNorm(dropout(x) + residual)``.

Math, per row r of N elements, in float32::

    s[r, :]   = dropout(x[r, :]) (+ residual[r, :] if HAS_RESIDUAL)
    mean      = sum(s[r, :]) / N, then + sum(s[r, :] - mean) / N (the float32 sum's error)
    var       = sum((s[r, :] - mean)^2) / N          (biased, of the centred values)
    xhat      = (s[r, :] - mean) * rstd,  rstd = 1 / sqrt(var + eps)
    out[r, :] = xhat * weight + bias

and rounded once to x's dtype. This is ``torch.nn.functional.layer_norm`` of the float32 sum,
as :func:`kernels.reference.layer_norm` computes it. Dropout (HAS_DROPOUT, BERT's hidden
dropout before the residual add) keeps x[r, c] with probability 1 - p and scales it by
1 / (1 - p); its keep mask comes from the call's seed and the element offset r * N + c
(dropout.py) and is regenerated, never stored.

Backward, per row, with g = dout * weight::

    ds        = rstd * (g - mean(g) - xhat * mean(g * xhat))
    dresidual = ds,  dx = dropout(ds) (the forward's mask and scale)
    dweight   = sum over rows of dout * xhat,  dbias = sum over rows of dout

The forward stores each row's mean and rstd (float32, 8 bytes a row) only when gradients are
needed (SAVE_STATS); the backward re-reads x and residual to rebuild xhat. Each backward
program takes a block of rows and writes its float32 partial sums of dweight and dbias
([programs, N], at most MAX_PARTIALS rows), which a second small step adds up: no float32 copy
of the activation is made.

Shapes and layouts: x and residual are [..., N], flattened to [rows, N] (a view when the
strides allow, otherwise a copy) and read through their strides; weight and bias are [N]; the
output and the gradients are new contiguous tensors.

Dtypes: float16, bfloat16 and float32, all tensors alike; statistics in float32.

Limits: one program per row holds the whole row (BLOCK = next power of two of N), so N may be
at most MAX_HIDDEN = 4096 (BERT's hidden sizes are 128 to 4096); a wider row raises ValueError.
Row offsets are int64; dropout element offsets are int32, so a dropout call holds fewer than
2^31 elements. An empty input returns an empty output without a launch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import reference, torch_ops
from .checks import check_layer_norm
from .dropout import check_dropout_p, dropped, seed_value
from .launch import FUSED, UNFUSED, cdiv, check_triton_device, next_power_of_2
from .op import Kernel, Op, dropout_seed, implements, placeholder

MAX_HIDDEN = 4096
MIN_BLOCK = 16
# The most backward programs (rows of float32 dweight / dbias partial sums) per call.
MAX_PARTIALS = 512


def block_size(hidden: int) -> int:
    """The row tile: the next power of two of ``hidden``, at least MIN_BLOCK."""
    return max(MIN_BLOCK, next_power_of_2(hidden))


def num_warps(block: int, heavy: bool = False) -> int:
    """Warps per row: about 256 elements per warp, between 1 and 8; ``heavy`` (dropout's
    Philox draws, the backward's extra row vectors): about 64, between 1 and 32, so that every
    row tile compiles without register spills on sm_80 and sm_90 (with 8 warps ptxas holds
    the 1024-wide backward to 64 registers a thread, and spills)."""
    if heavy:
        return min(32, max(1, block // 64))
    return min(8, max(1, block // 256))


def rows_per_program(rows: int) -> int:
    """Rows each backward program reduces, so that at most MAX_PARTIALS programs run."""
    return max(1, cdiv(rows, MAX_PARTIALS))


def partial_sums(rows: int, hidden: int, device: torch.device) -> tuple[int, int, torch.Tensor]:
    """The backward's row blocks for ``rows`` rows of ``hidden``: (rows per program, programs,
    zeroed float32 [2, programs, hidden] partial sums of dweight and dbias)."""
    per_program = rows_per_program(rows)
    programs = cdiv(rows, per_program)
    partials = torch.zeros((2, max(programs, 1), hidden), dtype=torch.float32, device=device)
    return per_program, programs, partials


def weight_gradients(
    partials: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dweight, dbias) in ``dtype``: the programs' float32 partial sums added up."""
    # Two separate sums: the gradients must not share storage.
    dweight, dbias = (p.sum(dim=0).to(dtype) for p in partials)
    return dweight, dbias


def check_hidden(hidden: int) -> None:
    if hidden > MAX_HIDDEN:
        raise ValueError(
            f"hidden size {hidden} is larger than the {MAX_HIDDEN} the fused LayerNorm kernels "
            "support (one row per program); use backend='torch' for wider rows"
        )


@triton.jit
def normalize_row(s, mask, cols, N, eps, weight_ptr, bias_ptr, stride_weight, stride_bias):
    """LayerNorm of one float32 row ``s`` of N valid elements (``mask``; zero elsewhere):
    (output row, mean, rstd)."""
    # IEEE divisions throughout: a plain / compiles to an approximate one on the GPU (2 units
    # in the last place: at a mean of 1000, 1.2e-4 off in every centred value).
    n = tl.cast(N, tl.float32)
    mean = tl.math.div_rn(tl.sum(s, axis=0), n)
    # The float32 sum rounds at the scale of the sum (rows of 768 at 1000: 0.03 an addition,
    # ~1e-4 in the mean); the centred values' own mean, small numbers summed almost exactly,
    # corrects it to about a unit of the mean's last place.
    mean += tl.math.div_rn(tl.sum(tl.where(mask, s - mean, 0.0), axis=0), n)
    centred = tl.where(mask, s - mean, 0.0)
    var = tl.math.div_rn(tl.sum(centred * centred, axis=0), n)
    rstd = tl.math.div_rn(1.0, tl.sqrt_rn(var + eps))
    w = tl.load(weight_ptr + cols * stride_weight, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(bias_ptr + cols * stride_bias, mask=mask, other=0.0).to(tl.float32)
    return centred * rstd * w + b, mean, rstd


@triton.jit
def normalize_row_backward(dy, s, mask, N, mean, rstd, w):
    """Gradient of a LayerNorm row's input: (ds, xhat) from the float32 output gradient ``dy``,
    the row ``s``, its saved statistics and the float32 scale ``w`` (zero past N)."""
    xhat = tl.where(mask, (s - mean) * rstd, 0.0)
    g = dy * w
    # Approximate divisions (2 units in the last place of the two means): IEEE ones, or one
    # IEEE reciprocal, spilled registers in the widest rows' backward (sm_80 and sm_90, under
    # Triton 3.6 and 3.9 both).
    mean_g = tl.sum(g, axis=0) / N
    mean_gx = tl.sum(g * xhat, axis=0) / N
    ds = tl.where(mask, rstd * (g - mean_g - xhat * mean_gx), 0.0)
    return ds, xhat


@triton.jit
def _layer_norm_input(
    x_ptr,
    residual_ptr,
    row,
    cols,
    mask,
    N,
    seed,
    dropout_p,
    stride_x_row,
    stride_x_col,
    stride_residual_row,
    stride_residual_col,
    HAS_RESIDUAL: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
):
    """Row ``row`` of dropout(x) + residual in float32, zero past N."""
    s = tl.load(x_ptr + row * stride_x_row + cols * stride_x_col, mask=mask, other=0.0)
    s = s.to(tl.float32)
    if HAS_DROPOUT:
        s = dropped(s, seed, (row * N + cols).to(tl.int32), dropout_p)
    if HAS_RESIDUAL:
        r_ptrs = residual_ptr + row * stride_residual_row + cols * stride_residual_col
        s += tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
    return s


@triton.jit
def _layer_norm_fwd_kernel(
    x_ptr,  # [rows, N] input
    residual_ptr,  # [rows, N] added to x before the statistics (None unless HAS_RESIDUAL)
    weight_ptr,  # [N] scale (gamma)
    bias_ptr,  # [N] shift (beta)
    out_ptr,  # [rows, N] output, x's dtype
    mean_ptr,  # [rows] float32 row means (None unless SAVE_STATS)
    rstd_ptr,  # [rows] float32 row 1 / sqrt(var + eps) (None unless SAVE_STATS)
    N,
    eps,
    seed,  # Philox seed of the dropout mask (unused unless HAS_DROPOUT)
    dropout_p,
    stride_x_row,
    stride_x_col,
    stride_residual_row,
    stride_residual_col,
    stride_weight,
    stride_bias,
    stride_out_row,
    stride_out_col,
    HAS_RESIDUAL: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    SAVE_STATS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    s = _layer_norm_input(
        x_ptr,
        residual_ptr,
        row,
        cols,
        mask,
        N,
        seed,
        dropout_p,
        stride_x_row,
        stride_x_col,
        stride_residual_row,
        stride_residual_col,
        HAS_RESIDUAL,
        HAS_DROPOUT,
    )
    y, mean, rstd = normalize_row(
        s, mask, cols, N, eps, weight_ptr, bias_ptr, stride_weight, stride_bias
    )
    out_ptrs = out_ptr + row * stride_out_row + cols * stride_out_col
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)
    if SAVE_STATS:
        tl.store(mean_ptr + row, mean)
        tl.store(rstd_ptr + row, rstd)


@triton.jit
def _layer_norm_bwd_kernel(
    dout_ptr,  # [rows, N] gradient of the output, contiguous
    x_ptr,  # [rows, N] the forward's input
    residual_ptr,  # [rows, N] the forward's residual (None unless HAS_RESIDUAL)
    weight_ptr,  # [N] scale (gamma)
    mean_ptr,  # [rows] float32 row means of the forward
    rstd_ptr,  # [rows] float32 row rstd of the forward
    dx_ptr,  # [rows, N] contiguous gradient of x, x's dtype
    dresidual_ptr,  # [rows, N] contiguous gradient of residual (None unless HAS_RESIDUAL)
    dweight_partial_ptr,  # [programs, N] float32 partial sums of dweight
    dbias_partial_ptr,  # [programs, N] float32 partial sums of dbias
    rows,
    N,
    rows_per_program,  # rows each program reduces (the last program may have fewer)
    seed,
    dropout_p,
    stride_x_row,
    stride_x_col,
    stride_residual_row,
    stride_residual_col,
    stride_weight,
    HAS_RESIDUAL: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    program = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    w = tl.load(weight_ptr + cols * stride_weight, mask=mask, other=0.0).to(tl.float32)
    dweight = tl.zeros((BLOCK,), dtype=tl.float32)
    dbias = tl.zeros((BLOCK,), dtype=tl.float32)
    first = program * rows_per_program
    last = tl.minimum(first + rows_per_program, rows)
    for row in range(first, last):
        s = _layer_norm_input(
            x_ptr,
            residual_ptr,
            row,
            cols,
            mask,
            N,
            seed,
            dropout_p,
            stride_x_row,
            stride_x_col,
            stride_residual_row,
            stride_residual_col,
            HAS_RESIDUAL,
            HAS_DROPOUT,
        )
        dy = tl.load(dout_ptr + row * N + cols, mask=mask, other=0.0).to(tl.float32)
        ds, xhat = normalize_row_backward(
            dy, s, mask, N, tl.load(mean_ptr + row), tl.load(rstd_ptr + row), w
        )
        dweight += dy * xhat
        dbias += dy
        if HAS_RESIDUAL:
            tl.store(dresidual_ptr + row * N + cols, ds.to(dx_ptr.dtype.element_ty), mask=mask)
        if HAS_DROPOUT:
            ds = dropped(ds, seed, (row * N + cols).to(tl.int32), dropout_p)
        tl.store(dx_ptr + row * N + cols, ds.to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(dweight_partial_ptr + program * N + cols, dweight, mask=mask)
    tl.store(dbias_partial_ptr + program * N + cols, dbias, mask=mask)


def _rows(
    x: torch.Tensor, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, int, int, int]]:
    """x and residual ([..., N]) as [rows, N] (views where the strides allow, otherwise copies),
    and their (row, column) strides in the kernels' order (zeros without a residual)."""
    hidden = x.shape[-1]
    x2 = x.reshape(-1, hidden)
    res2 = None if residual is None else residual.reshape(-1, hidden)
    return x2, res2, (*x2.stride(), *(res2.stride() if res2 is not None else (0, 0)))


def layer_norm_forward(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None,
    dropout_p: float,
    seed: torch.Tensor | None,
    save: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Launch the forward: (out, mean, rstd); the float32 [rows] statistics only when
    ``save``. ``seed``: the dropout's (see dropout.py). Inputs are checked by the
    caller."""
    hidden = x.shape[-1]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    x2, res2, row_strides = _rows(x, residual)
    rows = x2.shape[0]
    mean = rstd = None
    if save:
        mean, rstd = (torch.empty(rows, dtype=torch.float32, device=x.device) for _ in range(2))
    if out.numel() == 0:
        return out, mean, rstd
    out2 = out.view(-1, hidden)
    block = block_size(hidden)
    _layer_norm_fwd_kernel[(rows,)](
        x2,
        res2,
        weight,
        bias,
        out2,
        mean,
        rstd,
        hidden,
        float(eps),
        seed_value(seed),
        dropout_p,
        *row_strides,
        weight.stride(0),
        bias.stride(0),
        out2.stride(0),
        out2.stride(1),
        HAS_RESIDUAL=residual is not None,
        HAS_DROPOUT=dropout_p > 0.0,
        SAVE_STATS=save,
        BLOCK=block,
        num_warps=num_warps(block, heavy=dropout_p > 0.0),
        **UNFUSED,
    )
    return out, mean, rstd


def layer_norm_backward(
    dout: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor | None,
    mean: torch.Tensor,
    rstd: torch.Tensor,
    dropout_p: float,
    seed: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Launch the backward: (dx, dweight, dbias, dresidual), each in its input's dtype."""
    seed = seed_value(seed)
    hidden = x.shape[-1]
    x2, res2, row_strides = _rows(x, residual)
    rows = x2.shape[0]
    dout2 = dout.reshape(-1, hidden).contiguous()
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dres = None if residual is None else torch.empty_like(dx)
    per_program, programs, partials = partial_sums(rows, hidden, x.device)
    if rows:
        block = block_size(hidden)
        _layer_norm_bwd_kernel[(programs,)](
            dout2,
            x2,
            res2,
            weight,
            mean,
            rstd,
            dx,
            dres,
            partials[0],
            partials[1],
            rows,
            hidden,
            per_program,
            seed,
            dropout_p,
            *row_strides,
            weight.stride(0),
            HAS_RESIDUAL=residual is not None,
            HAS_DROPOUT=dropout_p > 0.0,
            BLOCK=block,
            num_warps=num_warps(block, heavy=True),
            **FUSED,
        )
    return dx, *weight_gradients(partials, weight.dtype), dres


def _prepare(x, weight, bias, eps, residual=None, dropout_p=0.0) -> tuple:
    """Raise as :func:`layer_norm` documents, before anything runs; the forward's arguments."""
    check_layer_norm(x, weight, bias, eps, residual)
    dropout_p = check_dropout_p(dropout_p)
    check_triton_device("x", x)
    check_hidden(x.shape[-1])
    return x, weight, bias, float(eps), residual, dropout_p, dropout_seed(dropout_p)


def _forward_fake(x, weight, bias, eps, residual, dropout_p, seed, save):
    check_layer_norm(x, weight, bias, eps, residual)
    if not save:
        return x.new_empty(x.shape), placeholder(x), placeholder(x)
    rows = math.prod(x.shape[:-1])
    stats = (x.new_empty(rows, dtype=torch.float32) for _ in range(2))
    return x.new_empty(x.shape), *stats


def _backward_fake(dout, x, weight, residual, mean, rstd, dropout_p, seed):
    dres = x.new_empty(x.shape) if residual is not None else placeholder(x)
    return (
        x.new_empty(x.shape),
        weight.new_empty(weight.shape),
        weight.new_empty(weight.shape),
        dres,
    )


def _save(ctx, inputs, outputs) -> None:
    x, weight, _, _, residual, dropout_p, seed, _ = inputs
    ctx.save_for_backward(x, weight, residual, outputs[1], outputs[2], seed)
    ctx.dropout_p = dropout_p


def _gradients(ctx, backward, dout, _dmean, _drstd):
    x, weight, residual, mean, rstd, seed = ctx.saved_tensors
    dx, dweight, dbias, dres = backward(dout, x, weight, residual, mean, rstd, ctx.dropout_p, seed)
    return dx, dweight, dbias, None, dres if residual is not None else None, None, None


LAYER_NORM = Op(
    name="layer_norm",
    reference=reference.layer_norm,
    torch=torch_ops.layer_norm_unchecked,
    prepare=_prepare,
    forward=Kernel(
        layer_norm_forward,
        "(Tensor x, Tensor weight, Tensor bias, float eps, Tensor? residual, float dropout_p,"
        " Tensor? seed, bool save) -> (Tensor, Tensor, Tensor)",
        _forward_fake,
    ),
    backward=Kernel(
        layer_norm_backward,
        "(Tensor dout, Tensor x, Tensor weight, Tensor? residual, Tensor mean, Tensor rstd,"
        " float dropout_p, Tensor? seed) -> (Tensor, Tensor, Tensor, Tensor)",
        _backward_fake,
    ),
    save=_save,
    gradients=_gradients,
)


@implements(reference.layer_norm)
def layer_norm(x, weight, bias, eps, residual, dropout_p):
    """``LayerNorm(dropout(x) + residual)`` over the last dimension in one Triton pass per row
    (:func:`fastbert.kernels.reference.layer_norm`).

    Args:
        x: [..., N] input, float16 / bfloat16 / float32, any strides; N <= 4096.
        weight: [N] scale, x's dtype.
        bias: [N] shift, x's dtype.
        eps: the non-negative number added to the variance.
        residual: optional tensor of x's shape and dtype, added to x before normalising.
        dropout_p: probability of zeroing an element of x (the kept ones are scaled by
            1 / (1 - dropout_p)); 0.0 (the default) runs no dropout.

    Returns:
        A new contiguous tensor of x's shape and dtype (float32 statistics, one rounding). When
        grad mode is on and a floating input requires grad, the output carries gradients to x,
        weight, bias and residual (Triton backward kernels).

    Raises:
        TypeError: a non-tensor argument or an unsupported / mismatched dtype.
        ValueError: mismatched shapes or devices, a negative eps, N > 4096, dropout_p outside
            [0, 1), or tensors the Triton kernels cannot reach (not CUDA, and not the CPU
            under TRITON_INTERPRET=1).
    """
    return LAYER_NORM(x, weight, bias, eps, residual, dropout_p)
