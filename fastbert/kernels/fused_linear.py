"""Linear layer with a fused epilogue: ``out = act(x @ weight^T + bias) + residual``.

Math, per output element (m, n), accumulated in float32::

    y[m, n]   = sum_k x[m, k] * weight[n, k]          (+ bias[n]           if HAS_BIAS)
    y[m, n]   = act(y[m, n])                          (ACTIVATION, see below)
    out[m, n] = y[m, n]                               (+ residual[m, n]    if HAS_RESIDUAL)

and rounded once to x's dtype. ``ACTIVATION`` is 0 (none), 1 (exact GELU,
``0.5 * y * (1 + erf(y / sqrt(2))) = y * Phi(y)``, BERT's, computed as the identical
``max(y, 0) - |y| * Phi(-|y|)`` with Phi(-|y|) from one exp2 of a fitted polynomial, see
``_normal_tail``: no 1 + erf cancelling for y < 0) or 2 (tanh GELU,
``0.5 * y * (1 + tanh(sqrt(2 / pi) * (y + 0.044715 * y^3)))``, computed as the identical
``y * sigmoid(2 * sqrt(2 / pi) * (y + 0.044715 * y^3))``).

Backward, with dY the output gradient and dY' = dY * act'(pre) (pre = x @ weight^T + bias,
dY' = dY without an activation)::

    dx = dY' @ weight,   dweight = dY'^T @ x,   dbias = column sums of dY',   dresidual = dY

Both products run on the kernel below with its operands read transposed through their strides
(dx: A = dY [M, N], B = weight read as [N, K]; dweight: A = dY^T read as [N, M], B = x read as
[M, K]); for a transposed operand the unit stride lies along the other dimension, which the
JIT specialises to the constant 1, so its loads stay contiguous along that dimension. act' is
applied to the A tile as it is loaded (GRAD_ACTIVATION, a prologue), from a
tile of the pre-activation read with A's strides, and the dweight product also sums each A row
(HAS_ROW_SUM) for dbias. The forward stores the pre-activation (STORE_PRE_ACTIVATION) when
gradients are needed, rather than the backward recomputing it: storing costs one extra M x N
write in the forward and two reads in the backward, recomputing costs a whole M x N x K GEMM
(for BERT's FFN, K = 768 or 1024 multiply-adds per element against 2 bytes written and read).

Gated (GATED, a GLU such as ModernBERT's GeGLU): weight is [2N, K], its rows [:N] the input and
[N:] the gate, ``out = act(x W[:N]^T + b[:N]) * (x W[N:]^T + b[N:])`` from two accumulators of
one GEMM; the stored pre-activation [M, 2N] holds both halves. The backward runs the same two
products on dY' [M, 2N], formed in their prologue (GATED_GRAD) rather than in memory: column j
of dY' reads dY's column j mod N and the input's and gate's pre-activations at j mod N and
j mod N + N, and is ``dY * gate * act'(input)`` for j < N, ``dY * act(input)`` for j >= N, in
float32 (act the forward's GELU, act' the plain prologue's derivative; the identity and 1
without an activation), rounded to the operand's dtype as the plain prologue rounds. j runs
along A's K in the dx product (K = 2N) and along A's rows in the dweight product (M = 2N),
whose row sums give dbias of both halves. N need not be a multiple of the tile: a tile holding
both halves selects each element's.

Shapes and layouts: x is [..., K], flattened to [M, K] rows (a view when the strides allow,
otherwise a copy); weight is [N, K] in nn.Linear layout and is read transposed through its
strides, never copied; bias is [N]; residual is [..., N] and is read through its strides. The
output is a new contiguous [..., N] tensor. Every tensor may have any strides.

Dtypes: float16, bfloat16 and float32, all tensors alike. The product is accumulated in float32;
float32 inputs multiply in IEEE float32 (``input_precision="ieee"``, not TF32). Gradients are
in their input's dtype; dY' is rounded to it before the product, as PyTorch's autograd does.

Quantised operands (``QUANT``, the launches of quantized_linear.py: ``linear_int8`` and
``linear_fp8``): int8 tiles multiplied into an int32 accumulator (1) or float8 e4m3 tiles
into float32 (2), dequantised at the start of the epilogue, ``acc * (x_scale[m] *
weight_scale[n])`` in float32, before the bias, activation, residual and the store in the
output's dtype.

Programs: one output tile per program, or (the persistent configs, a ``PERSISTENT`` flag on
the same kernel) a fixed number of programs per SM, each walking output tiles, with its operand
tiles loaded by TMA through host tensor descriptors. Those run on sm_90 and newer (and the
interpreter) for 16-bit inputs whose K is the unit-stride dimension of both operands and whose
bases and row strides are 16-byte aligned (see :func:`descriptors`); the autotuner times them
beside the one-tile-per-program configs, which run everywhere. Either way tiles are ordered
in groups of ``GROUP_M`` row tiles so that tiles running together share weight columns in L2.

Limits: row offsets are int64 (M * K reaches 65536 * 4096 and strides may be larger still).
The autotuner keys on N, K, the dtypes, a power-of-two bucket of M, whether descriptors are
given, and the variant (ACTIVATION, HAS_RESIDUAL and the training flags: some tiles are kept
only for the light variants, see linear_configs.py), so a new batch x sequence length
does not re-tune. M == 0 or N == 0 returns an empty output without a launch.
"""

from __future__ import annotations

import functools
import math
import threading

import torch
import triton
import triton.language as tl

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # a Triton without host tensor descriptors: no persistent configs
    TensorDescriptor = None

from . import reference, torch_ops
from .checks import check_linear
from .launch import (
    FUSED,
    cdiv,
    check_triton_device,
    interpreting,
    launch_lock,
    launch_tuned,
    time_config,
)
from .linear_configs import PERSISTENT_MIN_BLOCK_M, configs, kept_candidates, m_bucket, prune
from .op import Kernel, Op, implements, placeholder

ACTIVATION_CODES = {None: 0, "gelu": 1, "gelu_tanh": 2}


@triton.jit
def _added_apart(partial, acc):
    """``partial + acc`` (float32 tiles), one rounding, kept apart from the tl.dot that made
    ``partial``: Triton's combine pass rewrites ``acc + tl.dot(a, b)`` (a zero accumulator)
    as ``tl.dot(a, b, acc)``, which sums every K of a row in one chain; it does not look
    through an FMA, and FMA(partial, 1, acc) rounds partial + acc once, as the addition would."""
    return tl.fma(partial, 1.0, acc)


@triton.jit
def _normal_tail(y):
    """Two float32 factors (half_uw, e) whose product is |y| * Phi(-|y|), Phi the standard
    normal CDF.

    With u = |y| clamped to 14.4 (where |y| * Phi(-|y|) < 2^-150 rounds to 0, so that +-inf
    stay finite inside; NaN propagates through the clamp), w = 1 / (1 + A u), A = 0.3,
    v = rsqrt(2 + 2 A u) and half_uw = u * v * v = u * w / 2::

        Phi(-u) = (w / 2) * 2^(r(x) - K u^2),   K = log2(e) / 2,   x = -2 S * half_uw

    where r(x) = x * P(x), P of degree 8, is a minimax fit on x in [-1, 0]
    (S = (1 + 14.4 A) / 14.4) of r = log2(2 Phi(-u)) + K u^2 - log2(w): w takes out the 1/u of
    the Mills ratio, so r stays within [-1.77, 0] and is smooth enough for one polynomial over
    every u (log2 Phi(-u) as a polynomial in u alone needs degree ~18 for the same error).
    benchmarks/fit_gelu.py fits and prints the coefficients; the largest error of r with them
    rounded to float32 is 5.5e-8, a relative error of Phi(-u) of 3.8e-8.
    """
    u = tl.minimum(tl.abs(y), 14.4, propagate_nan=tl.PropagateNan.ALL)
    v = tl.math.rsqrt(tl.fma(u, 0.6, 2.0))
    half_uw = u * v * v
    x = half_uw * -0.7388888888888889
    p = tl.fma(x, 0.031627822667360306, 0.10114237666130066)
    p = tl.fma(p, x, 0.05572381615638733)
    p = tl.fma(p, x, -0.08475125581026077)
    p = tl.fma(p, x, 0.020302170887589455)
    p = tl.fma(p, x, 0.11633070558309555)
    p = tl.fma(p, x, -0.2841259241104126)
    p = tl.fma(p, x, -0.13413619995117188)
    p = tl.fma(p, x, 1.9442540407180786)
    e = tl.exp2(tl.fma(u, u * -0.7213475204444817, p * x))
    return half_uw, e


@triton.jit
def _gelu_erf(y):
    # y * Phi(y) = max(y, 0) - |y| * Phi(-|y|) for either sign: no 1 + erf cancelling for
    # y < 0, so the result keeps its relative accuracy down to float32's smallest values.
    # Measured against float64 with IEEE rsqrt / exp2 (tests/test_gelu_accuracy.py): at most
    # 2^-22 + 5.1e-11 absolute (0.5 * y * (1 + erf(y / sqrt(2))): 4.5e-7), and 5.3 ulps for
    # y >= -1, 12 on [-4, -1), 44 on [-8, -4), 116 below (the erf form: 2.4 ulps for y >= -1,
    # 4091 on [-4, -1), 2^24 below -5.9 where it returns 0); every float16 and bfloat16
    # output within one unit in the last place of the rounded float64 GELU. The float32
    # exponent passed to exp2 (~ -y^2 / (2 ln 2)) sets the growth with |y|. Compiled, rsqrt
    # and exp2 are the GPU's approximations (MUFU, about 2 ulps each) and outputs below
    # 2^-126 flush to zero (y below about -13.1).
    half_uw, e = _normal_tail(y)
    return tl.fma(-half_uw, e, tl.maximum(y, 0.0))


@triton.jit
def _gelu_tanh(y):
    # 0.5 * (1 + tanh(u)) == sigmoid(2u), u = sqrt(2 / pi) * (y + 0.044715 y^3); the sigmoid
    # from exp(-|2u|) <= 1 so that nothing overflows.
    two_u = 1.5957691216057308 * (y + 0.044715 * y * y * y)
    t = tl.exp(-tl.abs(two_u))
    sigmoid = tl.where(two_u >= 0, 1.0, t) / (1.0 + t)  # approximate, as its exp
    return y * sigmoid


@triton.jit
def _gelu_erf_grad(y):
    # d/dy [y * Phi(y)] = Phi(y) + y * phi(y), phi the standard normal density.
    cdf = 0.5 * (1.0 + tl.math.erf(y * 0.7071067811865476))
    return cdf + y * 0.3989422804014327 * tl.exp(-0.5 * y * y)


@triton.jit
def _gelu_tanh_grad(y):
    # d/dy [y * sigmoid(2u)] = s + y * s * (1 - s) * 2u', s = sigmoid(2u), computed as above.
    two_u = 1.5957691216057308 * (y + 0.044715 * y * y * y)
    t = tl.exp(-tl.abs(two_u))
    s = tl.where(two_u >= 0, 1.0, t) / (1.0 + t)  # (IEEE, it spilled on sm_80 under 3.6)
    two_du = 1.5957691216057308 * (1.0 + 0.134145 * y * y)
    return s + y * s * (1.0 - s) * two_du


@triton.jit
def _gated_output_grad(dout, value, gate, is_value, GRAD_ACTIVATION: tl.constexpr):
    """float32 tile of dY' of a gated linear: ``dout * gate * act'(value)`` where ``is_value``
    (the input half's columns), ``dout * act(value)`` elsewhere (the gate half's), from float32
    tiles of the output gradient and of the stored input and gate pre-activations at the
    same (folded) positions. act is GRAD_ACTIVATION's GELU (1 erf, 2 tanh; the forward's
    functions) or, for 0, the identity (a plain GLU product), act' its derivative as the
    plain prologue computes it."""
    if GRAD_ACTIVATION == 1:
        slope = _gelu_erf_grad(value)
        activated = _gelu_erf(value)
    elif GRAD_ACTIVATION == 2:
        slope = _gelu_tanh_grad(value)
        activated = _gelu_tanh(value)
    else:
        slope = 1.0
        activated = value
    return dout * tl.where(is_value, gate * slope, activated)


@triton.jit
def _tile_position(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row tile, column tile) of output tile number ``tile`` in grouped order: GROUP_M row
    tiles sweep the column tiles together, so that tiles running at once share weight columns
    in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (tile // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (tile % num_pid_in_group) % group_size_m
    pid_n = (tile % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _tile_indices(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Output tile number ``tile`` (:func:`_tile_position`'s order): (pid_m, pid_n, its rows
    offs_m, its columns offs_n, and their int64 indices wrapped into [0, M) and [0, N)). Rows
    past M / columns past N re-read valid ones through the wrapped indices, so that the operand
    loads need no mask."""
    pid_m, pid_n = _tile_position(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    return pid_m, pid_n, offs_m, offs_n, rows, cols


@triton.jit
def _product_from_descriptors(
    x_desc,
    weight_desc,
    off_m,
    off_n,
    K,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """[BLOCK_M, BLOCK_N] float32 tile of x @ weight^T at (off_m, off_n), its operand tiles
    loaded by TMA through host tensor descriptors (rows, columns and K past the ends read as
    zeros, so nothing is masked)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = x_desc.load([off_m, k])
        b = weight_desc.load([off_n, k])
        acc = tl.dot(a, b.T, acc)
    return acc


@triton.jit
def _epilogue(
    acc,
    gate,  # [BLOCK_M, BLOCK_N] float32 product with the gate rows (GATED only)
    pid_m,
    pid_n,
    M,
    N,
    bias_ptr,
    residual_ptr,
    out_ptr,
    pre_ptr,
    stride_bias_n,
    stride_residual_m,
    stride_residual_n,
    stride_out_m,
    stride_out_n,
    stride_pre_m,
    stride_pre_k,
    x_scale_ptr,
    weight_scale_ptr,
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_PRE_ACTIVATION: tl.constexpr,
    QUANT: tl.constexpr,
    GATED: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Dequantisation (QUANT), bias, pre-activation store, activation, the gate (GATED: times
    ``gate`` + its bias, columns N.. of the bias and of the stored pre-activation), residual
    and the store of one output tile."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    if QUANT:
        # int32 sums of int8 products (or float32 sums of e4m3 ones) -> float32, times the
        # row's and the column's scales.
        x_scale = tl.load(x_scale_ptr + offs_m, mask=offs_m < M, other=0.0)
        weight_scale = tl.load(weight_scale_ptr + offs_n, mask=n_mask, other=0.0)
        acc = acc.to(tl.float32) * (x_scale[:, None] * weight_scale[None, :])
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n * stride_bias_n, mask=n_mask, other=0.0)
        acc += bias.to(tl.float32)[None, :]
        if GATED:
            gate_bias = tl.load(bias_ptr + (offs_n + N) * stride_bias_n, mask=n_mask, other=0.0)
            gate += gate_bias.to(tl.float32)[None, :]
    out_rows = offs_m.to(tl.int64)
    out_cols = offs_n.to(tl.int64)
    mask = (offs_m < M)[:, None] & n_mask[None, :]
    if STORE_PRE_ACTIVATION:
        pre_out = pre_ptr + out_rows[:, None] * stride_pre_m + out_cols[None, :] * stride_pre_k
        tl.store(pre_out, acc.to(pre_ptr.dtype.element_ty), mask=mask)
        if GATED:
            pre_gate = pre_out + N * stride_pre_k
            tl.store(pre_gate, gate.to(pre_ptr.dtype.element_ty), mask=mask)
    if ACTIVATION == 1:
        acc = _gelu_erf(acc)
    elif ACTIVATION == 2:
        acc = _gelu_tanh(acc)
    if GATED:
        acc = acc * gate
    if HAS_RESIDUAL:
        r_ptrs = (
            residual_ptr
            + out_rows[:, None] * stride_residual_m
            + out_cols[None, :] * stride_residual_n
        )
        acc += tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
    out_ptrs = out_ptr + out_rows[:, None] * stride_out_m + out_cols[None, :] * stride_out_n
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.autotune(
    configs=configs(),
    key=[
        "N",
        "K",
        "M_BUCKET",
        "HAS_DESCRIPTORS",
        "ACTIVATION",
        "HAS_RESIDUAL",
        "STORE_PRE_ACTIVATION",
        "GRAD_ACTIVATION",
        "HAS_ROW_SUM",
        "QUANT",
        "GATED",
        "GATED_GRAD",
    ],
    prune_configs_by={"early_config_prune": prune},
    do_bench=time_config,
)
@triton.jit
def _linear_fwd_kernel(
    x_ptr,  # [M, K] input rows, any strides
    weight_ptr,  # [N, K] nn.Linear weight, read as its transpose [K, N]
    x_desc,  # TMA descriptor of x [M, K] (unit stride along K), or None; PERSISTENT reads it
    weight_desc,  # TMA descriptor of weight [N, K] (unit stride along K), or None
    bias_ptr,  # [N] bias (None unless HAS_BIAS)
    residual_ptr,  # [M, N] added after the activation (None unless HAS_RESIDUAL)
    out_ptr,  # [M, N] output, x's dtype
    pre_ptr,  # [M, N] pre-activation stored (STORE_PRE_ACTIVATION) / read as A's (GRAD_ACTIVATION,
    # GATED_GRAD): [M, K], or with GATED_GRAD its input and gate halves [M, 2N'] (dx) / [2N', K]
    row_sum_ptr,  # [M] float32 sums of A's rows over K (None unless HAS_ROW_SUM)
    x_scale_ptr,  # [M] float32 scales of x's quantised rows (None unless QUANT)
    weight_scale_ptr,  # [N] float32 scales of the quantised weight's rows (None unless QUANT)
    M,
    N,
    K,
    M_BUCKET,  # autotune key only: power-of-two bucket of M
    HAS_DESCRIPTORS,  # autotune key only: 1 when x_desc and weight_desc are given
    stride_x_m,
    stride_x_k,
    stride_weight_n,
    stride_weight_k,
    stride_bias_n,
    stride_residual_m,
    stride_residual_n,
    stride_out_m,
    stride_out_n,
    stride_pre_m,
    stride_pre_k,  # the column stride of pre: along N when stored, along K when read
    HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr,
    STORE_PRE_ACTIVATION: tl.constexpr,  # store acc + bias before the activation to pre_ptr
    GRAD_ACTIVATION: tl.constexpr,  # 0, or multiply the A tile by act'(pre tile): 1 erf, 2 tanh
    HAS_ROW_SUM: tl.constexpr,  # store the sums of A's rows (after the prologue) to row_sum_ptr
    QUANT: tl.constexpr,  # 0, or int8 (1) / e4m3 (2) x and weight, dequantised in the epilogue
    GATED: tl.constexpr,  # GLU: out [M, N] = act(x @ W[:N]^T) * (x @ W[N:2N]^T), two accumulators
    # 0, or A is dY' of a gated linear formed in the prologue from x = dout [.., N'] and pre's
    # two halves (GRAD_ACTIVATION its act): 1 along A's K (dx: K = 2N'), 2 along its rows
    # (dweight: M = 2N')
    GATED_GRAD: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PERSISTENT: tl.constexpr,  # 0, or programs per SM looping over tiles, operands by TMA
):
    if PERSISTENT:
        tl.static_assert(not GATED, "the gated product runs one tile per program")
        tl.static_assert(GATED_GRAD == 0, "the gated prologue runs one tile per program")
        # A fixed number of programs walk the output tiles. (Flattening the tile and K loops,
        # so that the next tile's loads overlap this one's epilogue, compiled to 163 to 180 KB
        # of shared memory and a loop body holding the epilogue; not offered until measured.)
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0)):
            pid_m, pid_n = _tile_position(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc = _product_from_descriptors(
                x_desc, weight_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, K, BLOCK_M, BLOCK_N, BLOCK_K
            )
            _epilogue(
                acc,
                acc,
                pid_m,
                pid_n,
                M,
                N,
                bias_ptr,
                residual_ptr,
                out_ptr,
                pre_ptr,
                stride_bias_n,
                stride_residual_m,
                stride_residual_n,
                stride_out_m,
                stride_out_n,
                stride_pre_m,
                stride_pre_k,
                x_scale_ptr,
                weight_scale_ptr,
                HAS_BIAS,
                ACTIVATION,
                HAS_RESIDUAL,
                STORE_PRE_ACTIVATION,
                QUANT,
                False,
                BLOCK_M,
                BLOCK_N,
            )
    else:
        pid_m, pid_n, offs_m, offs_n, rows, cols = _tile_indices(
            tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M
        )
        offs_k = tl.arange(0, BLOCK_K)
        x_ptrs = x_ptr + rows[:, None] * stride_x_m + offs_k[None, :] * stride_x_k
        w_ptrs = weight_ptr + offs_k[:, None] * stride_weight_k + cols[None, :] * stride_weight_n
        if GATED:
            gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        else:
            gate = tl.zeros((1, 1), dtype=tl.float32)
        if GATED_GRAD == 1:
            # dY' [M, 2N'] along K: column j reads dout's column j mod N', the input's
            # pre-activation there and the gate's N' columns further (one K tile may hold both
            # halves: j < N' selects per column).
            half = K // 2
            gate_offset = half.to(tl.int64) * stride_pre_k
            x_rows = x_ptr + rows[:, None] * stride_x_m
            pre_rows = pre_ptr + rows[:, None] * stride_pre_m
        elif GATED_GRAD == 2:
            # dY'^T [2N', M] along the rows: row j reads dout^T's row j mod N' (and the input's
            # and gate's pre-activations there), fixed over the K loop.
            half = M // 2
            is_value = (rows < half)[:, None]
            folded = rows % half
            gate_offset = half.to(tl.int64) * stride_pre_m
            x_ptrs = x_ptr + folded[:, None] * stride_x_m + offs_k[None, :] * stride_x_k
            pre_ptrs = pre_ptr + folded[:, None] * stride_pre_m + offs_k[None, :] * stride_pre_k
        elif GRAD_ACTIVATION != 0:
            pre_ptrs = pre_ptr + rows[:, None] * stride_pre_m + offs_k[None, :] * stride_pre_k
        if HAS_ROW_SUM:
            row_sum = tl.zeros((BLOCK_M,), dtype=tl.float32)

        if QUANT == 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k_start in range(0, K, BLOCK_K):
            k_left = K - k_start
            a_mask = offs_k[None, :] < k_left
            if GATED_GRAD == 1:
                columns = k_start + offs_k
                is_value = (columns < half)[None, :]
                folded = (columns % half).to(tl.int64)
                a = tl.load(x_rows + folded[None, :] * stride_x_k, mask=a_mask, other=0.0)
                pre_ptrs = pre_rows + folded[None, :] * stride_pre_k
            else:
                a = tl.load(x_ptrs, mask=a_mask, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            if GATED_GRAD != 0:
                value = tl.load(pre_ptrs, mask=a_mask, other=0.0).to(tl.float32)
                gate_pre = tl.load(pre_ptrs + gate_offset, mask=a_mask, other=0.0).to(tl.float32)
                a = _gated_output_grad(
                    a.to(tl.float32), value, gate_pre, is_value, GRAD_ACTIVATION
                ).to(a.dtype)
                if GATED_GRAD == 2:
                    pre_ptrs += BLOCK_K * stride_pre_k
            elif GRAD_ACTIVATION != 0:
                pre = tl.load(pre_ptrs, mask=offs_k[None, :] < k_left, other=0.0).to(tl.float32)
                if GRAD_ACTIVATION == 1:
                    a = (a.to(tl.float32) * _gelu_erf_grad(pre)).to(a.dtype)
                else:
                    a = (a.to(tl.float32) * _gelu_tanh_grad(pre)).to(a.dtype)
                pre_ptrs += BLOCK_K * stride_pre_k
            if HAS_ROW_SUM:
                row_sum += tl.sum(a.to(tl.float32), axis=1)
            if a.dtype == tl.float32:
                # IEEE products, each K tile summed apart and then added: the error grows with
                # BLOCK_K + K / BLOCK_K additions, not K (one row of K=4096 summed in one chain
                # was 9x PyTorch's error, whose single-row product sums in a tree). Added by an
                # FMA with 1: Triton folds `acc + tl.dot(a, b)` into `tl.dot(a, b, acc)`, one
                # chain again (see _added_apart).
                acc = _added_apart(tl.dot(a, b, input_precision="ieee"), acc)
            elif QUANT == 2:
                # e4m3 into float32, each K tile's partial sum added to the float32 accumulator
                # (sm_90's FP8 warpgroup MMA otherwise keeps adding in reduced precision).
                acc = tl.dot(a, b, acc, max_num_imprecise_acc=BLOCK_K)
            elif QUANT == 1:
                # int8 into int32. Named: Triton 3.6 does not take out_dtype from acc (3.9 does)
                # and asserts that acc's type is out_dtype, float32 by default.
                acc = tl.dot(a, b, acc, out_dtype=tl.int32)
            else:  # float16 / bfloat16 into float32
                acc = tl.dot(a, b, acc)
            if GATED:
                # The gate rows N.. of the weight: the same A tile, a second B tile.
                g = tl.load(w_ptrs + N * stride_weight_n, mask=offs_k[:, None] < k_left, other=0.0)
                if a.dtype == tl.float32:
                    gate = _added_apart(tl.dot(a, g, input_precision="ieee"), gate)
                else:
                    gate = tl.dot(a, g, gate)
            if GATED_GRAD != 1:
                x_ptrs += BLOCK_K * stride_x_k
            w_ptrs += BLOCK_K * stride_weight_k

        if HAS_ROW_SUM:
            if pid_n == 0:
                tl.store(row_sum_ptr + offs_m.to(tl.int64), row_sum, mask=offs_m < M)
        _epilogue(
            acc,
            gate,
            pid_m,
            pid_n,
            M,
            N,
            bias_ptr,
            residual_ptr,
            out_ptr,
            pre_ptr,
            stride_bias_n,
            stride_residual_m,
            stride_residual_n,
            stride_out_m,
            stride_out_n,
            stride_pre_m,
            stride_pre_k,
            x_scale_ptr,
            weight_scale_ptr,
            HAS_BIAS,
            ACTIVATION,
            HAS_RESIDUAL,
            STORE_PRE_ACTIVATION,
            QUANT,
            GATED,
            BLOCK_M,
            BLOCK_N,
        )


# Programs of a persistent launch under the interpreter: fewer than the tests' tiles, so that
# each program walks several.
INTERPRETER_PROGRAMS = 3
TMA_ALIGNMENT = 16  # bytes: TMA descriptors need a 16-byte-aligned base and row strides


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def persistent_programs(device: torch.device, per_sm: int) -> int:
    """Programs of a persistent launch: ``per_sm`` per SM of a CUDA device, or
    INTERPRETER_PROGRAMS."""
    if device.type != "cuda":
        return INTERPRETER_PROGRAMS
    return per_sm * _multiprocessors(device.index if device.index is not None else 0)


@functools.cache
def _tma_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def _tma_device(device: torch.device) -> bool:
    if device.type == "cuda":
        return _tma_capable(device.index if device.index is not None else 0)
    return interpreting()


def _tma_operand(t: torch.Tensor, rows: int, strides: tuple[int, int]) -> bool:
    """Whether operand ``t`` read as ``rows`` x K with ``strides`` suits a TMA descriptor."""
    size = t.element_size()
    return (
        strides[1] == 1
        and (strides[0] * size) % TMA_ALIGNMENT == 0
        and t.data_ptr() % TMA_ALIGNMENT == 0
        and rows > 0
    )


def descriptors(
    a: torch.Tensor,
    a_strides: tuple[int, int],
    b: torch.Tensor,
    b_strides: tuple[int, int],
    m: int,
    n: int,
    k: int,
) -> tuple[object, object]:
    """Host TMA descriptors (TensorDescriptor) of A [M, K] and B [N, K] for the persistent
    configs, or Nones where those configs do not apply: a Triton without host descriptors,
    not sm_90 or newer (or the interpreter), not float16 / bfloat16 (float32 keeps its IEEE
    FMA product), K not the unit-stride dimension of both operands, a base or row stride not
    16-byte aligned, or fewer rows than the smallest persistent row tile. The block shapes
    are set per config by the autotuner's pre-hook."""
    if (
        TensorDescriptor is None
        or a.dtype not in (torch.float16, torch.bfloat16)
        or k == 0
        or m_bucket(m) < PERSISTENT_MIN_BLOCK_M
        or not _tma_device(a.device)
        or not _tma_operand(a, m, a_strides)
        or not _tma_operand(b, n, b_strides)
    ):
        return None, None
    _bind_context(a.device)
    placeholder = [16, 16]
    return (
        TensorDescriptor(a, [m, k], list(a_strides), placeholder),
        TensorDescriptor(b, [n, k], list(b_strides), placeholder),
    )


_BOUND = threading.local()


def _bind_context(device: torch.device) -> None:
    """Make ``device``'s CUDA context current on this thread, once per thread: the launch
    encodes host descriptors before Triton's launcher binds a context, so in a thread whose
    first CUDA work is this launch the encoding failed ("invalid device context"). A
    synchronisation is a runtime call, which binds it."""
    if device.type != "cuda":
        return  # the interpreter's descriptors need no context
    bound = _BOUND.__dict__.setdefault("devices", set())
    if device.index not in bound:
        torch.cuda.synchronize(device)
        bound.add(device.index)


def kept_configs(
    x: torch.Tensor,
    weight: torch.Tensor,
    activation: str | None = None,
    residual: torch.Tensor | None = None,
) -> list[triton.Config]:
    """The configs the autotuner times for the inference launch of :func:`linear` on these
    inputs, in its order (``FASTBERT_AUTOTUNE=i`` pins the i-th), before any pinning."""
    n, k = weight.shape
    m = x.numel() // k if k else 0
    x2 = x.reshape(m, k)
    x_desc, _ = descriptors(x2, x2.stride(), weight, weight.stride(), m, n, k)
    return kept_candidates(
        _linear_fwd_kernel.configs,
        x.element_size(),
        m_bucket(m),
        n,
        k,
        activation=ACTIVATION_CODES[activation],
        has_residual=residual is not None,
        has_descriptors=x_desc is not None,
    )


_LAUNCH_LOCK = launch_lock()  # one launch at a time across threads (its pre-hook reads nargs)


def gemm(
    a: torch.Tensor,
    a_strides: tuple[int, int],
    b: torch.Tensor,
    b_strides: tuple[int, int],
    out: torch.Tensor,
    k: int,
    *,
    bias: torch.Tensor | None = None,
    activation: int = 0,
    residual: torch.Tensor | None = None,
    pre: torch.Tensor | None = None,
    pre_strides: tuple[int, int] = (0, 0),
    store_pre: bool = False,
    grad_activation: int = 0,
    row_sum: torch.Tensor | None = None,
    scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    quant: int = 0,
    gated: bool = False,
    gated_grad: int = 0,
) -> None:
    """Launch the kernel for out [M, N] (contiguous) = A @ B^T, a K-long product, with the
    given variants.

    A is [M, K] read from ``a`` with ``a_strides`` (along M, along K); B is [N, K] read from
    ``b`` with ``b_strides`` (along N, along K). ``pre`` is the [M, N] pre-activation to store
    (``store_pre``) or the [M, K] one whose ``grad_activation`` derivative multiplies A;
    ``row_sum`` is a float32 [M] tensor for the sums of A's rows. bias [N], residual [M, N].
    ``scales``: float32 ([M], [N]) scales of A and B's quantised rows, ``quant`` their format
    (1 int8, 2 float8 e4m3: quantized_linear.py's QUANT_CODES).
    ``gated``: B is [2N, K], its rows N.. the gate (GATED; bias [2N], ``pre`` [M, 2N]).
    ``gated_grad``: A is dY' of a gated linear, formed from ``a`` = dout [M', N'] and ``pre``
    [M', 2N'] (read with ``pre_strides`` as A's) with ``grad_activation``'s derivative:
    1 along A's K (the dx product, K = 2N'), 2 along A's rows (the dweight product, M = 2N').
    """
    m, n = out.shape
    plain_operands = grad_activation == 0 and row_sum is None and not gated and not gated_grad
    a_desc, b_desc = (
        descriptors(a, a_strides, b, b_strides, m, n, k) if plain_operands else (None, None)
    )

    def grid(meta: dict) -> tuple[int]:
        tiles = cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"])
        if meta["PERSISTENT"]:
            return (min(tiles, persistent_programs(out.device, meta["PERSISTENT"])),)
        return (tiles,)

    with _LAUNCH_LOCK:
        launch_tuned(
            _linear_fwd_kernel,
            grid,
            a,
            b,
            a_desc,
            b_desc,
            bias,
            residual,
            out,
            pre,
            row_sum,
            scales[0] if scales is not None else None,
            scales[1] if scales is not None else None,
            m,
            n,
            k,
            m_bucket(m),
            int(a_desc is not None),
            *a_strides,
            *b_strides,
            bias.stride(0) if bias is not None else 0,
            residual.stride(0) if residual is not None else 0,
            residual.stride(1) if residual is not None else 0,
            out.stride(0),
            out.stride(1),
            *pre_strides,
            HAS_BIAS=bias is not None,
            ACTIVATION=activation,
            HAS_RESIDUAL=residual is not None,
            STORE_PRE_ACTIVATION=store_pre,
            GRAD_ACTIVATION=grad_activation,
            HAS_ROW_SUM=row_sum is not None,
            QUANT=quant,
            GATED=gated,
            GATED_GRAD=gated_grad,
            **FUSED,
        )


def linear_rows(
    a: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    residual: torch.Tensor | None,
    **variant: object,
) -> None:
    """Launch ``act(a @ weight^T + bias) + residual`` into ``out``: the forward of the float and
    the quantised linears.

    a: [M, K] rows of the input (any strides; int8 / e4m3 with ``variant``'s ``scales`` and
    ``quant``); weight: [N, K] ([2N, K] with ``gated``); out: a new contiguous [..., N] tensor
    holding M rows; residual: [..., N] or None. ``variant``: :func:`gemm`'s other flags."""
    m, k = a.shape
    n = out.shape[-1]
    rows_of_residual = residual.reshape(m, n) if residual is not None else None
    gemm(
        a,
        a.stride(),
        weight,
        weight.stride(),
        out.view(m, n),
        k,
        bias=bias,
        activation=ACTIVATION_CODES[activation],
        residual=rows_of_residual,
        **variant,
    )


def linear_forward(x, weight, bias, activation, residual, gated, save):
    """Launch the forward: (out [..., N] ([..., N / 2] when ``gated``), pre-activation [M, N]
    or None); the pre-activation is stored only when ``save`` and there is an activation or a
    gate (its last N / 2 columns are then the gate's). Inputs are checked by the caller."""
    rows, k = weight.shape
    n = rows // 2 if gated else rows
    out = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    m = out.numel() // n if n else 0
    code = ACTIVATION_CODES[activation]
    keep_pre = save and (code or gated)
    pre = torch.empty((m, rows), dtype=x.dtype, device=x.device) if keep_pre else None
    if m == 0 or n == 0:
        return out, pre
    pre_strides = (rows, 1) if pre is not None else (0, 0)
    linear_rows(
        x.reshape(m, k),
        weight,
        out,
        bias,
        activation,
        residual,
        pre=pre,
        pre_strides=pre_strides,
        store_pre=pre is not None,
        gated=gated,
    )
    return out, pre


def linear_backward(dout, x, weight, pre, activation, gated, needs):
    """Launch the backward: (dx, dweight, dbias) for the ``needs`` flags (x, weight, bias)
    (None where not needed); dY' = dout * act'(pre) is formed in the GEMMs' prologue (``pre``
    is read only with an activation). ``gated``: the prologue forms dY' [M, 2N'] of both
    halves from dout [..., N'] and the stored input and gate pre-activations (GATED_GRAD),
    with or without an activation."""
    rows, k = weight.shape
    n = rows // 2 if gated else rows
    m = dout.numel() // n if n else 0
    dy = dout.reshape(m, n)
    code = ACTIVATION_CODES[activation]
    pre = pre if code or gated else None
    x2 = x.reshape(m, k)
    dx = dweight = dbias = None
    # The GEMMs write every element; only an empty product (n == 0 or m == 0) leaves zeros.
    new = torch.empty if m and n and k else torch.zeros
    if needs[0]:
        dx = new(x.shape, dtype=x.dtype, device=x.device)
        if m and n and k:
            gemm(
                dy,
                (dy.stride(0), dy.stride(1)),
                weight,
                (weight.stride(1), weight.stride(0)),
                dx.view(m, k),
                rows,
                pre=pre,
                pre_strides=(pre.stride(0), pre.stride(1)) if pre is not None else (0, 0),
                grad_activation=code,
                gated_grad=1 if gated else 0,
            )
    if needs[1] or needs[2]:
        dweight = new(weight.shape, dtype=weight.dtype, device=weight.device)
        row_sum = torch.zeros(rows, dtype=torch.float32, device=x.device)
        # With no input features, a product with a column of ones still sums dY' for dbias.
        ones = None if k else torch.ones((m, 1), dtype=x.dtype, device=x.device)
        operand = x2 if k else ones
        if m and n:
            gemm(
                dy,
                (dy.stride(1), dy.stride(0)),
                operand,
                (operand.stride(1), operand.stride(0)),
                dweight if k else torch.empty((rows, 1), dtype=x.dtype, device=x.device),
                m,
                pre=pre,
                pre_strides=(pre.stride(1), pre.stride(0)) if pre is not None else (0, 0),
                grad_activation=code,
                row_sum=row_sum,
                gated_grad=2 if gated else 0,
            )
        dbias = row_sum.to(weight.dtype) if needs[2] else None
    return dx, dweight, dbias


def _prepare(x, weight, bias=None, activation=None, residual=None, gated=False) -> tuple:
    """Raise as :func:`linear` documents, before anything runs; the forward's arguments."""
    check_linear(x, weight, bias, activation, residual, gated)
    check_triton_device("x", x)
    return x, weight, bias, activation, residual, gated


def _forward_fake(x, weight, bias, activation, residual, gated, save):
    check_linear(x, weight, bias, activation, residual, gated)
    rows = weight.shape[0]
    out = x.new_empty((*x.shape[:-1], rows // 2 if gated else rows))
    if not (save and (activation is not None or gated)):
        return out, placeholder(x)
    return out, x.new_empty((math.prod(x.shape[:-1]), rows))


def _backward_fake(dout, x, weight, pre, activation, gated, needs):
    grads = (
        x.new_empty(x.shape),
        weight.new_empty(weight.shape),
        weight.new_empty(weight.shape[0]),
    )
    return tuple(g if need else placeholder(x) for g, need in zip(grads, needs))


def _save(ctx, inputs, outputs) -> None:
    x, weight, bias, activation, residual, gated, _ = inputs
    ctx.save_for_backward(x, weight, outputs[1])
    ctx.activation, ctx.gated = activation, gated


def _gradients(ctx, backward, dout, _dpre):
    x, weight, pre = ctx.saved_tensors
    needs = ctx.needs_input_grad
    dx, dweight, dbias = backward(dout, x, weight, pre, ctx.activation, ctx.gated, list(needs[:3]))
    return (
        dx if needs[0] else None,
        dweight if needs[1] else None,
        dbias if needs[2] else None,
        None,
        dout if needs[4] else None,
        None,
    )


LINEAR = Op(
    name="linear",
    reference=reference.linear,
    torch=torch_ops.linear_unchecked,
    prepare=_prepare,
    forward=Kernel(
        linear_forward,
        "(Tensor x, Tensor weight, Tensor? bias, str? activation, Tensor? residual, bool gated,"
        " bool save) -> (Tensor, Tensor)",
        _forward_fake,
    ),
    backward=Kernel(
        linear_backward,
        "(Tensor dout, Tensor x, Tensor weight, Tensor pre, str? activation, bool gated,"
        " bool[] needs) -> (Tensor, Tensor, Tensor)",
        _backward_fake,
    ),
    save=_save,
    gradients=_gradients,
)


@implements(reference.linear)
def linear(x, weight, bias, activation, residual, *, gated):
    """``act(x @ weight.T + bias) + residual`` in one Triton GEMM with a fused epilogue
    (:func:`fastbert.kernels.reference.linear`).

    Args:
        x: [..., K] input, float16 / bfloat16 / float32, any strides.
        weight: [N, K] (nn.Linear layout), x's dtype.
        bias: optional [N], x's dtype.
        activation: None, "gelu" (exact erf GELU, BERT's) or "gelu_tanh".
        residual: optional [..., N] (x's leading shape), x's dtype, added after the activation.
        gated: the GLU act(input) * gate (:func:`fastbert.kernels.reference.linear`): weight's
            rows [:N / 2] give the input and [N / 2:] the gate, two accumulators of one GEMM
            whose epilogue multiplies them (the output and residual are then [..., N / 2]).

    Returns:
        A new contiguous [..., N] tensor in x's dtype (float32 accumulation, one rounding).
        When grad mode is on and a floating input requires grad, it carries gradients to x,
        weight, bias and residual (Triton GEMMs with the GELU derivative, and for ``gated``
        the gradient of both halves, formed in their prologue).

    Raises:
        TypeError: a non-tensor argument or an unsupported / mismatched dtype.
        ValueError: mismatched shapes or devices, an unknown activation, or tensors the Triton
            kernels cannot reach (not CUDA, and not the CPU under TRITON_INTERPRET=1).
    """
    return LINEAR(x, weight, bias, activation, residual, gated=gated)
