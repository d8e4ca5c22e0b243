"""Linears with quantised operands: ``out = act(x @ weight^T + bias) + residual`` on int8 or
float8 e4m3 tiles, inference only.

Math, per output element (m, n), with x's rows quantised per token at run time and weight's
per output channel once, by the caller (:func:`fastbert.kernels.reference.quantize_weight`)::

    s_x[m]    = max_k |x[m, k] * c[k]| / q_max        (c: input_scale, 1 without one)
    q_x[m, k] = round(x[m, k] * c[k] / s_x[m])        (to an integer, or to the nearest e4m3)
    y[m, n]   = (sum_k q_x[m, k] * q_w[n, k]) * s_x[m] * s_w[n]   (+ bias[n])
    out[m, n] = act(y[m, n])                          (+ residual[m, n])

q_max is 127 (int8) or 448 (e4m3), rounding is half to even, and a row of zeros quantises to
zeros with scale 0. The row quantisation is :func:`quantize_rows`, a row-wise kernel of its own
(its absolute maximum needs the whole row before any element can be rounded: fused into the
GEMM, every column tile would read its rows twice); its float32 arithmetic is the reference's
(:func:`fastbert.kernels.reference.quantize_rows`), so both quantise to the same bits. e4m3
rounding is done in float32 arithmetic (``_round_to_e4m3``), so the conversion that follows is
exact whatever the converter's own rounding.

The product runs on the one GEMM kernel of fused_linear.py, its ``QUANT`` flag set:

- int8 (``QUANT`` 1, :func:`linear_int8`): int8 tiles multiplied into an int32 accumulator
  (``tl.dot`` on int8: IMMA on sm_80, the integer warpgroup MMA IGMMA on sm_90), exact sums.
- float8 e4m3 (``QUANT`` 2, :func:`linear_fp8`, sm_89 / sm_90 and newer): e4m3 tiles into
  float32 (``tl.dot`` on e4m3: the FP8 warpgroup MMA QGMMA on sm_90), each K tile's partial
  sum added into the float32 accumulator (``max_num_imprecise_acc``: inside one MMA chain
  sm_90 adds e4m3 products with a narrower adder).

Either way the epilogue starts by dequantising, ``acc * (s_x[m] * s_w[n])`` in float32, before
the bias, activation, residual and the store in the output's dtype.

Shapes and dtypes: x is [..., K] float16 / bfloat16 / float32, any strides (flattened to
[M, K] rows); weight int8 or float8_e4m3fn [N, K], weight_scale float32 [N]; bias [N] and
residual [..., N] in x's dtype; input_scale float32 [K]. The output is a new contiguous
[..., N] tensor in x's dtype. The quantised rows are contiguous int8 / float8_e4m3fn [M, K]
with float32 [M] scales.

Limits: no backward (gradients are refused); the row quantisation loads at most
QUANTIZE_MAX_BLOCK_K columns at once and loops over wider rows; the GEMM's configs and limits
are fused_linear's. M == 0 or N == 0 returns an empty output without a launch.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import reference, torch_ops
from .checks import LINEAR_QUANTIZED_CHECKS, check_fp8_device, check_linear_quantized_call
from .fused_linear import linear_rows
from .launch import UNFUSED, check_triton_device, next_power_of_2
from .op import Kernel, Op, implements

# Widest K tile the row quantisation loads at once.
QUANTIZE_MAX_BLOCK_K = 1024
# The quantised formats: their QUANT codes and element dtypes.
QUANT_CODES = {None: 0, "int8": 1, "fp8": 2}
QUANT_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}


@triton.jit
def _round_to_e4m3(y):
    """float32 ``y`` (|y| <= 448) rounded to the nearest float8 e4m3 value, ties to even, in
    float32 arithmetic: e4m3 keeps 3 fraction bits, so the spacing of its values around y is
    2^(e - 3) for y's exponent e, at least 2^-9 (the subnormals below 2^-6 share the spacing
    of 2^-6). Adding and removing 1.5 * 2^23 * spacing rounds to a multiple of the spacing
    (float32's own rounding, as the int8 path's 1.5 * 2^23 rounds to integers)."""
    bits = y.to(tl.int32, bitcast=True)
    exponent = tl.maximum((bits >> 23) & 0xFF, 127 - 6)
    # 1.5 * 2^(e + 20): biased exponent e + 20, fraction 0.5.
    magic = (((exponent + 20) << 23) | 0x400000).to(tl.float32, bitcast=True)
    rounded = (tl.abs(y) + magic) - magic
    # The sign bit put back afterwards: a negative y (or -0) that rounds to zero stays -0, as
    # PyTorch's conversion keeps it. Times -1, not a unary minus: Triton 3.6 compiles -x as
    # 0 - x, which is +0 for x = +0.
    return tl.where(bits < 0, rounded * -1.0, rounded)


@triton.jit
def _quantize_rows_kernel(
    x_ptr,  # [M, K] float rows, any strides
    input_scale_ptr,  # [K] float32 multipliers of x's columns (None unless HAS_INPUT_SCALE)
    q_ptr,  # [M, K] int8 (QUANT 1) or float8 e4m3 (QUANT 2) output, contiguous
    scale_ptr,  # [M] float32 output: max |row| / 127 (int8) or / 448 (fp8)
    K,
    stride_x_m,
    stride_x_k,
    HAS_INPUT_SCALE: tl.constexpr,
    QUANT: tl.constexpr,  # 1: int8, 2: float8 e4m3
    BLOCK_K: tl.constexpr,
):
    """One row per program (times the input scale, HAS_INPUT_SCALE): its absolute maximum a
    (a first pass over K), then q = x * (q_max / a) (q_max 127 or 448) rounded half to even
    (a second pass), to an integer (int8) or to the nearest e4m3 value (fp8), 0 for a row of
    zeros; the float32 operations of fastbert.kernels.reference.quantize_rows, bit for bit."""
    if QUANT == 1:
        q_max = 127.0
    else:
        q_max = 448.0
    row = tl.program_id(0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    x_row = x_ptr + row * stride_x_m
    absmax = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k_start in range(0, K, BLOCK_K):
        cols = k_start + offs_k
        x = tl.load(x_row + cols * stride_x_k, mask=cols < K, other=0.0).to(tl.float32)
        if HAS_INPUT_SCALE:
            x *= tl.load(input_scale_ptr + cols, mask=cols < K, other=0.0)
        absmax = tl.maximum(absmax, tl.abs(x))
    a = tl.max(absmax, axis=0)
    # IEEE divisions (a plain / compiles to an approximate one), as PyTorch divides.
    inv = tl.where(a > 0, tl.math.div_rn(q_max, tl.maximum(a, 1e-30)), 0.0)
    tl.store(scale_ptr + row, tl.math.div_rn(a, q_max))
    for k_start in range(0, K, BLOCK_K):
        cols = k_start + offs_k
        x = tl.load(x_row + cols * stride_x_k, mask=cols < K, other=0.0).to(tl.float32)
        if HAS_INPUT_SCALE:
            x *= tl.load(input_scale_ptr + cols, mask=cols < K, other=0.0)
        y = x * inv
        if QUANT == 1:
            # Adding and removing 1.5 * 2**23 rounds |y| <= 127 to the nearest integer, ties
            # to even (float32's own rounding), as torch.round does.
            y = (y + 12582912.0) - 12582912.0
        else:
            # Rounded here, so that the conversion below is exact whatever its own rounding
            # (the interpreter's rounds half away from zero); clamped as e4m3 saturates.
            y = tl.minimum(tl.maximum(_round_to_e4m3(y), -q_max), q_max)
        tl.store(q_ptr + row * K + cols, y.to(q_ptr.dtype.element_ty), mask=cols < K)


def quantize_rows(
    x: torch.Tensor, input_scale: torch.Tensor | None = None, quantize: str = "int8"
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fastbert.kernels.reference.quantize_rows` of [M, K] float ``x`` on a Triton
    kernel (one program per row): (int8 or float8_e4m3fn [M, K] contiguous, float32 [M]) for
    ``quantize`` "int8" or "fp8"."""
    m, k = x.shape
    q = torch.empty((m, k), dtype=QUANT_DTYPES[quantize], device=x.device)
    scale = torch.zeros(m, dtype=torch.float32, device=x.device)
    if m == 0 or k == 0:
        q.zero_()
        return q, scale
    block_k = min(next_power_of_2(k), QUANTIZE_MAX_BLOCK_K)
    _quantize_rows_kernel[(m,)](
        x,
        input_scale,
        q,
        scale,
        k,
        x.stride(0),
        x.stride(1),
        HAS_INPUT_SCALE=input_scale is not None,
        QUANT=QUANT_CODES[quantize],
        BLOCK_K=block_k,
        **UNFUSED,
    )
    return q, scale


def _forward(quantize, x, weight, weight_scale, bias, activation, residual, input_scale, save):
    """Launch the forward: x's rows quantised (:func:`quantize_rows`), then the GEMM's QUANT
    variant; out [..., N] in x's dtype. Inputs are checked by the caller; ``save`` is the
    wiring's (there is no backward)."""
    n, k = weight.shape
    out = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    m = out.numel() // n if n else 0
    if m == 0 or n == 0:
        return out
    x_q, x_scale = quantize_rows(x.reshape(m, k), input_scale, quantize)
    scales = (x_scale, weight_scale)
    quant = QUANT_CODES[quantize]
    linear_rows(x_q, weight, out, bias, activation, residual, scales=scales, quant=quant)
    return out


SCHEMA = (
    "(Tensor x, Tensor weight, Tensor weight_scale, Tensor? bias, str? activation, "
    "Tensor? residual, Tensor? input_scale, bool save) -> Tensor"
)


def _prepare(
    quantize, x, weight, weight_scale, bias=None, activation=None, residual=None, input_scale=None
) -> tuple:
    """Raise as :func:`linear_int8` / :func:`linear_fp8` (``quantize``) document, before
    anything runs; the forward's arguments."""
    check_linear_quantized_call(
        quantize, x, weight, weight_scale, bias, activation, residual, input_scale
    )
    check_triton_device("x", x)
    if quantize == "fp8":
        check_fp8_device("x", x)
    # The kernels read a scale vector as contiguous (an expanded per-tensor scale has stride
    # 0); a copy of a few hundred floats where one is not.
    weight_scale = weight_scale.contiguous()
    input_scale = None if input_scale is None else input_scale.contiguous()
    return x, weight, weight_scale, bias, activation, residual, input_scale


def _forward_fake(quantize, x, weight, weight_scale, bias, activation, residual, input_scale, save):
    LINEAR_QUANTIZED_CHECKS[quantize](
        x, weight, weight_scale, bias, activation, residual, input_scale
    )
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


# The format's arguments bound: the functions its declaration names.
_prepare_int8 = functools.partial(_prepare, "int8")
linear_int8_forward = functools.partial(_forward, "int8")
_int8_forward_fake = functools.partial(_forward_fake, "int8")

LINEAR_INT8 = Op(
    name="linear_int8",
    reference=reference.linear_int8,
    torch=torch_ops.linear_int8_unchecked,
    prepare=_prepare_int8,
    forward=Kernel(
        linear_int8_forward,
        SCHEMA,
        _int8_forward_fake,
    ),
)


@implements(reference.linear_int8)
def linear_int8(x, weight, weight_scale, bias, activation, residual, input_scale):
    """``act(x @ weight.T + bias) + residual`` with int8 operands: x quantised per token at
    run time (one Triton kernel), then one Triton GEMM multiplying int8 tiles into int32
    (the integer tensor cores) whose epilogue dequantises, adds the bias, applies the
    activation and adds the residual (:func:`fastbert.kernels.reference.linear_int8`).

    Args:
        x: [..., K] input, float16 / bfloat16 / float32, any strides.
        weight: int8 [N, K], one row per output channel
            (:func:`fastbert.kernels.reference.quantize_weight`).
        weight_scale: float32 [N], the scales of weight's rows.
        bias: optional [N], x's dtype.
        activation: None, "gelu" (exact erf GELU, BERT's) or "gelu_tanh".
        residual: optional [..., N] (x's leading shape), x's dtype, added after the activation.
        input_scale: optional float32 [K] multiplying x's columns before the quantisation
            (SmoothQuant; the weight was quantised with its columns divided by it).

    Returns:
        A new contiguous [..., N] tensor in x's dtype. Inference only.

    Raises:
        TypeError: a non-tensor argument or an unsupported / mismatched dtype.
        ValueError: mismatched shapes or devices, an unknown activation, or tensors the Triton
            kernels cannot reach (not CUDA, and not the CPU under TRITON_INTERPRET=1).
        RuntimeError: grad mode is on and an input requires grad (there is no backward).
    """
    return LINEAR_INT8(x, weight, weight_scale, bias, activation, residual, input_scale)


# The format's arguments bound: the functions its declaration names.
_prepare_fp8 = functools.partial(_prepare, "fp8")
linear_fp8_forward = functools.partial(_forward, "fp8")
_fp8_forward_fake = functools.partial(_forward_fake, "fp8")

LINEAR_FP8 = Op(
    name="linear_fp8",
    reference=reference.linear_fp8,
    torch=torch_ops.linear_fp8_unchecked,
    prepare=_prepare_fp8,
    forward=Kernel(
        linear_fp8_forward,
        SCHEMA,
        _fp8_forward_fake,
    ),
)


@implements(reference.linear_fp8)
def linear_fp8(x, weight, weight_scale, bias, activation, residual, input_scale):
    """``act(x @ weight.T + bias) + residual`` with float8 e4m3 operands: x quantised per token
    at run time (one Triton kernel), then one Triton GEMM multiplying e4m3 tiles into float32
    (the FP8 tensor cores of sm_89 and sm_90) whose epilogue dequantises, adds the bias,
    applies the activation and adds the residual
    (:func:`fastbert.kernels.reference.linear_fp8`).

    Args:
        x: [..., K] input, float16 / bfloat16 / float32, any strides.
        weight: float8_e4m3fn [N, K], one row per output channel
            (:func:`fastbert.kernels.reference.quantize_weight` with ``quantize="fp8"``).
        weight_scale: float32 [N], the scales of weight's rows.
        bias: optional [N], x's dtype.
        activation: None, "gelu" (exact erf GELU, BERT's) or "gelu_tanh".
        residual: optional [..., N] (x's leading shape), x's dtype, added after the activation.
        input_scale: optional float32 [K] multiplying x's columns before the quantisation
            (the weight was quantised with its columns divided by it).

    Returns:
        A new contiguous [..., N] tensor in x's dtype. Inference only.

    Raises:
        TypeError: a non-tensor argument or an unsupported / mismatched dtype.
        ValueError: mismatched shapes or devices, an unknown activation, tensors the Triton
            kernels cannot reach (not CUDA, and not the CPU under TRITON_INTERPRET=1), or a
            GPU older than sm_89 (no FP8 tensor cores).
        RuntimeError: grad mode is on and an input requires grad (there is no backward).
    """
    return LINEAR_FP8(x, weight, weight_scale, bias, activation, residual, input_scale)
