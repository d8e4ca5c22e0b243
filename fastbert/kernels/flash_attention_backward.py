"""Backward of the fused attention (flash_attention.py), FlashAttention-2 style.

Math, per (batch, head), with the forward's scaled scores s_ij = scale * <q_i, k_j> (masked keys
excluded), probabilities P_ij = exp(s_ij - lse_i), the dropout keep mask M_ij and factor
c = 1 / (1 - dropout_p) (M = 1, c = 1 without dropout), and the output O = (c M * P) V::

    dV   = (c M * P)^T dO
    dP   = c M * (dO V^T)
    D_i  = sum_d dO_id O_id                   (= sum_j P_ij dP_ij)
    dS   = P * (dP - D)
    dQ   = scale * dS K,   dK = scale * dS^T Q

The probabilities are recomputed from q, k and the forward's per-row log2-sum-exp2 (fp32,
stored by the forward only when gradients are needed), and the dropout mask is regenerated
from the forward's Philox seed and the same element offsets (``dropout_origin``), so nothing
of size S_q x S_k is ever stored. One kernel (``_attention_bwd_kernel``) launched twice, its
constexpr ``DKDV`` choosing the pass, each with its own autotuner; no atomics, deterministic:

- dK / dV (``_attention_bwd_dkdv_kernel``): one program per BLOCK_N keys of a (sequence,
  head) holds their dK and dV accumulators and streams the queries in BLOCK_M blocks. Its
  products are written key-major (k @ q^T, v @ dO^T) so that every MMA has BLOCK_N rows.
- dQ (``_attention_bwd_dq_kernel``): one program per BLOCK_M queries holds dQ and streams the
  keys.

D (the row sums of dO * O) is computed beforehand in fp32 by PyTorch.

With a relative position bias (HAS_BIAS) both passes add it to the recomputed scores, and the
dQ pass also sums dS per bucket: d bias[h, b] = sum of dS_ij over the (i, j) of head h whose
key - query distance falls in bucket b. Each dQ program keeps 32 fp32 running sums (one masked
reduction of the tile per bucket the tile touches: one far from the diagonal, more near it)
and writes them to its own row of a [B, H, programs, 32] buffer, which PyTorch then sums in a
fixed order. Partial sums instead of ``tl.atomic_add``: atomics on 32 x H addresses from every
program would contend, and their order (so the fp32 result) would change from run to run; this
way the table's gradient is deterministic, like dQ, dK and dV.

Rotary positions (ROTARY) and the sliding window (WINDOW) as in the forward: the scores are
recomputed from rotated tiles (``attention_tiles.rotate_rows``, the key block once and each
query tile in the dK / dV pass, the query block once and each key tile in the dQ pass), which
gives dQ and dK with respect to the rotated rows; they are turned back by the transposed
rotation once per program (``unrotate_rows``) before the store. With a window each pass loops
only over the tiles within it (``window_keys``; the window is symmetric, so a key block's
query tiles are found the same way) and masks the scores outside it.

Masked keys (and keys past the sequence) are loaded as zeros in K and V and their scores
replaced by -inf, so they get dK = dV = 0 and send nothing to dQ, whatever K and V hold there,
NaN and Inf included. A query row with no real key has lse = +inf: its probabilities are 0 and
so are its gradients. Shapes, layouts, dtypes and head dims are the forward's; the gradients
are contiguous (dense: [B, S, H, D] buffers returned as their [B, H, S, D] views, like the
forward's output; varlen: [T, H, D]) in the inputs' dtype, accumulated in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import dropout
from .attention_configs import backward_load as load
from .attention_configs import keep_backward as keep
from .attention_launch import (
    AUTOTUNE_KEY,
    Sequences,
    checked_grid,
    dense,
    head_strides,
    packed,
    pruner,
    rotary_factors,
    row_strides,
    scaled_bias_table,
    trailing_scalars,
    tune_configs,
    variant_flags,
)
from .attention_tiles import (
    LOG2_E,
    dropout_origin,
    head_base,
    load_rows,
    relative_bucket,
    rotate_rows,
    unrotate_rows,
    window_keys,
)
from .checks import RELATIVE_BUCKETS
from .dropout import seed_value
from .launch import FUSED, TRITON_3_6, cdiv, launch_tuned, time_config

# (BLOCK_M, BLOCK_N, num_warps, num_stages). dK / dV: BLOCK_N keys per program (the MMAs' rows);
# dQ: BLOCK_M queries per program.
_DKDV_TUNE_SPACE = ((16, 64, 8, 2), (32, 64, 8, 1), (32, 64, 4, 2), (16, 128, 8, 2))
_DQ_TUNE_SPACE = ((64, 32, 4, 2), (128, 64, 8, 2), (32, 32, 4, 2))
# Triton 3.6 (launch.py): a 16x32 dK / dV tile on one stage, first, for rotary positions
# (keep() leaves them no other there) and so for what keeps no config; at two stages it spilled
# 20 bytes on sm_90 with dropout at D=64. 32x64 on 4 warps on one stage (on two it spilled 4
# bytes on sm_80 with dropout at D=32). dQ: a 64x16 tile on 8 warps, for what keep() no longer
# gives 64x32 on 4 (a bias needs 64 rows; 64x32 on 8 warps spilled 4 bytes there on sm_80).
_DKDV_TUNE_SPACE_TRITON_3_6 = (
    (16, 32, 8, 1),
    (16, 64, 8, 2),
    (32, 64, 8, 1),
    (32, 64, 4, 1),
    (16, 128, 8, 2),
)
_DQ_TUNE_SPACE_TRITON_3_6 = (*_DQ_TUNE_SPACE, (64, 16, 8, 2))


def configs(is_dkdv: bool) -> list[triton.Config]:
    """Autotune configs of one kernel; a single one under the interpreter."""
    if TRITON_3_6:
        return tune_configs(_DKDV_TUNE_SPACE_TRITON_3_6 if is_dkdv else _DQ_TUNE_SPACE_TRITON_3_6)
    return tune_configs(_DKDV_TUNE_SPACE if is_dkdv else _DQ_TUNE_SPACE)


@triton.jit
def _real_keys(mask_base, offs_n, stride_mask_s, seq_k, HAS_MASK: tl.constexpr):
    """Bool [BLOCK_N]: which keys ``offs_n`` exist and are not masked."""
    real = offs_n < seq_k
    if HAS_MASK:
        token = tl.load(mask_base + offs_n * stride_mask_s, mask=real, other=0)
        real = real & (token != 0)
    return real


@triton.jit
def _kept_scaled(x, keep, dropout_p):
    """``x`` / (1 - p) where the dropout mask ``keep`` is True, 0 elsewhere (the approximate
    division of dropout.py's ``dropped``: the IEEE one spilled registers in the dK / dV
    loop under Triton 3.6 on sm_90)."""
    return tl.where(keep, x * (1.0 / (1.0 - dropout_p)), 0.0)


@triton.jit
def _dkdv_block(
    q_base,
    k_base,
    v_base,
    do_base,
    dk_base,
    dv_base,
    mask_base,
    lse_base,
    delta_base,
    stride_q_s,
    stride_k_s,
    stride_v_s,
    stride_do_s,
    stride_dk_s,
    stride_dv_s,
    stride_mask_s,
    start_n,
    seq_q,
    seq_k,
    qk_scale,
    sm_scale,
    drop_origin,
    drop_row_step,
    dropout_p,
    seed,
    bias_base,
    rotary,  # float32 [L, HEAD_DIM] cos and sin of each position (ROTARY only)
    window,  # the sliding window (WINDOW only)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROTARY: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """dK and dV of keys start_n .. start_n + BLOCK_N - 1 (those < seq_k), over all queries
    (WINDOW: over the query blocks whose window holds one of the keys). ROTARY: the key block
    and each query block are rotated as they are loaded, and dK, the gradient with respect to
    the rotated keys, is turned back at the end."""
    offs_n = start_n + tl.arange(0, BLOCK_N)
    real = _real_keys(mask_base, offs_n, stride_mask_s, seq_k, HAS_MASK)
    # Zeros at masked keys: their scores are replaced below, but 0 * NaN would still be NaN.
    k = load_rows(k_base, offs_n, stride_k_s, real, HEAD_DIM, BLOCK_D)
    if ROTARY:
        k = rotate_rows(k, k_base, offs_n, stride_k_s, real, offs_n, rotary, HEAD_DIM, BLOCK_D)
    v = load_rows(v_base, offs_n, stride_v_s, real, HEAD_DIM, BLOCK_D)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    lo, hi = 0, seq_q
    if WINDOW:
        lo, hi = window_keys(start_n, window, seq_q, BLOCK_N, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + tl.arange(0, BLOCK_M)
        rows = offs_m < seq_q
        q = load_rows(q_base, offs_m, stride_q_s, rows, HEAD_DIM, BLOCK_D)
        if ROTARY:
            q = rotate_rows(q, q_base, offs_m, stride_q_s, rows, offs_m, rotary, HEAD_DIM, BLOCK_D)
        do = load_rows(do_base, offs_m, stride_do_s, rows, HEAD_DIM, BLOCK_D)
        # Rows past the sequence get lse = +inf: probability 0.
        lse = tl.load(lse_base + offs_m, mask=rows, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=rows, other=0.0)
        # Key-major [BLOCK_N, BLOCK_M] tiles: P^T, dP^T, dS^T.
        qk_t = tl.dot(k, tl.trans(q), input_precision="ieee") * qk_scale
        if HAS_BIAS:
            qk_t += tl.load(bias_base + relative_bucket(offs_n[:, None] - offs_m[None, :]))
        keep_t = real[:, None]
        if WINDOW:
            keep_t = keep_t & (tl.abs(offs_n[:, None] - offs_m[None, :]) <= window)
        qk_t = tl.where(keep_t, qk_t, float("-inf"))
        p_t = tl.math.exp2(qk_t - lse[None, :])
        dp_t = tl.dot(v, tl.trans(do), input_precision="ieee")
        p_used_t = p_t
        if HAS_DROPOUT:
            offsets = drop_origin + offs_m[None, :] * drop_row_step + offs_n[:, None]
            kept_t = dropout.keep_mask(seed, offsets, dropout_p)
            p_used_t = _kept_scaled(p_t, kept_t, dropout_p)
            dp_t = _kept_scaled(dp_t, kept_t, dropout_p)
        dv = tl.dot(p_used_t.to(do.dtype), do, dv, input_precision="ieee")
        ds_t = p_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk, input_precision="ieee")
    if ROTARY:
        dk = unrotate_rows(dk, offs_n < seq_k, offs_n, rotary, HEAD_DIM, BLOCK_D)
    offs_d = tl.arange(0, BLOCK_D)
    inside = (offs_n[:, None] < seq_k) & (offs_d[None, :] < HEAD_DIM)
    dk_ptrs = dk_base + offs_n[:, None] * stride_dk_s + offs_d[None, :]
    dv_ptrs = dv_base + offs_n[:, None] * stride_dv_s + offs_d[None, :]
    tl.store(dk_ptrs, (dk * sm_scale).to(dk_base.dtype.element_ty), mask=inside)
    tl.store(dv_ptrs, dv.to(dv_base.dtype.element_ty), mask=inside)


@triton.jit
def _dq_block(
    q_base,
    k_base,
    v_base,
    do_base,
    dq_base,
    mask_base,
    lse_base,
    delta_base,
    stride_q_s,
    stride_k_s,
    stride_v_s,
    stride_do_s,
    stride_dq_s,
    stride_mask_s,
    start_m,
    seq_q,
    seq_k,
    qk_scale,
    sm_scale,
    drop_origin,
    drop_row_step,
    dropout_p,
    seed,
    bias_base,
    dbias,  # fp32 [RELATIVE_BUCKETS]: this program's running sums of dS per bucket (HAS_BIAS)
    rotary,  # float32 [L, HEAD_DIM] cos and sin of each position (ROTARY only)
    window,  # the sliding window (WINDOW only)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROTARY: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """dQ of queries start_m .. start_m + BLOCK_M - 1 (those < seq_q), over all keys (WINDOW:
    the key tiles within the window); returns ``dbias`` plus, per bucket, the sum of dS over
    these queries' scores (HAS_BIAS). ROTARY: the query block is rotated once, each key tile as
    it is loaded, and dQ is turned back at the end."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    rows = offs_m < seq_q
    q = load_rows(q_base, offs_m, stride_q_s, rows, HEAD_DIM, BLOCK_D)
    if ROTARY:
        q = rotate_rows(q, q_base, offs_m, stride_q_s, rows, offs_m, rotary, HEAD_DIM, BLOCK_D)
    do = load_rows(do_base, offs_m, stride_do_s, rows, HEAD_DIM, BLOCK_D)
    lse = tl.load(lse_base + offs_m, mask=rows, other=float("inf"))
    delta = tl.load(delta_base + offs_m, mask=rows, other=0.0)
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    lo, hi = 0, seq_k
    if WINDOW:
        lo, hi = window_keys(start_m, window, seq_k, BLOCK_M, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        real = _real_keys(mask_base, offs_n, stride_mask_s, seq_k, HAS_MASK)
        k = load_rows(k_base, offs_n, stride_k_s, real, HEAD_DIM, BLOCK_D)
        if ROTARY:
            k = rotate_rows(k, k_base, offs_n, stride_k_s, real, offs_n, rotary, HEAD_DIM, BLOCK_D)
        v = load_rows(v_base, offs_n, stride_v_s, real, HEAD_DIM, BLOCK_D)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        bucket = offs_n[None, :] - offs_m[:, None]  # the buckets (HAS_BIAS only)
        if HAS_BIAS:
            bucket = relative_bucket(bucket)
            qk += tl.load(bias_base + bucket)
        keep = real[None, :]
        if WINDOW:
            keep = keep & (tl.abs(offs_n[None, :] - offs_m[:, None]) <= window)
        qk = tl.where(keep, qk, float("-inf"))
        p = tl.math.exp2(qk - lse[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision="ieee")
        if HAS_DROPOUT:
            offsets = drop_origin + offs_m[:, None] * drop_row_step + offs_n[None, :]
            dp = _kept_scaled(dp, dropout.keep_mask(seed, offsets, dropout_p), dropout_p)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision="ieee")
        if HAS_BIAS:
            dbias = _bucket_sums(dbias, ds, bucket)
    if ROTARY:
        dq = unrotate_rows(dq, rows, offs_m, rotary, HEAD_DIM, BLOCK_D)
    offs_d = tl.arange(0, BLOCK_D)
    inside = rows[:, None] & (offs_d[None, :] < HEAD_DIM)
    dq_ptrs = dq_base + offs_m[:, None] * stride_dq_s + offs_d[None, :]
    tl.store(dq_ptrs, (dq * sm_scale).to(dq_base.dtype.element_ty), mask=inside)
    return dbias


@triton.jit
def _bucket_sums(dbias, ds, bucket):
    """``dbias`` (fp32 [RELATIVE_BUCKETS]) plus the sum of the ``ds`` tile's entries in each
    of their buckets (``bucket``, the tile's): one masked reduction per bucket present in the
    tile (one far from the diagonal, up to all of them near it)."""
    buckets = tl.arange(0, BUCKETS)
    for b in range(tl.min(tl.min(bucket, 1), 0), tl.max(tl.max(bucket, 1), 0) + 1):
        part = tl.sum(tl.sum(tl.where(bucket == b, ds, 0.0), 1), 0)
        dbias = tl.where(buckets == b, dbias + part, dbias)
    return dbias


BUCKETS = tl.constexpr(RELATIVE_BUCKETS)


def _autotuned(is_dkdv: bool):
    """The autotuner of one pass: its configs, pruned by ``keep`` for the launch's variant."""
    variant = lambda args: (is_dkdv, bool(args["HAS_BIAS"]), bool(args["ROTARY"]))
    return triton.autotune(
        configs=configs(is_dkdv),
        key=list(AUTOTUNE_KEY),
        prune_configs_by={"early_config_prune": pruner(keep, variant, load)},
        do_bench=time_config,
    )


@triton.jit(do_not_specialize=["seq_q_bucket", "seq_k_bucket"])
def _attention_bwd_kernel(
    Q,  # queries: [B, H, S_q, D] (dense) or [T, H, D] (varlen), unit stride on D
    K,  # keys: [B, H, S_k, D] or [T, H, D], unit stride on D
    V,  # values: like K
    DO,  # gradient of the output: like Q, unit stride on D
    DX,  # written: the gradient of K (DKDV, like K) or of Q (like Q)
    DV,  # written: the gradient of V, like V (DKDV only)
    Mask,  # key-padding mask [B, S_k], bool or integer, nonzero = real token (HAS_MASK only)
    CuSeqlens,  # int32 [B + 1] sequence boundaries in the packed tokens (IS_VARLEN only)
    Lse,  # fp32 forward log2-sum-exp2 per query: [B, H, S_q] or [H, T]
    Delta,  # fp32 row sums of DO * Out: laid out like Lse
    Bias,  # fp32 [H, RELATIVE_BUCKETS] relative position bias times log2(e) (HAS_BIAS only)
    DBias,  # written (dQ pass): fp32 [B, H, programs, RELATIVE_BUCKETS] partial sums of dS
    Rotary,  # fp32 [L, D]: cos then sin of each position's RoPE angles (ROTARY only)
    stride_q_b,
    stride_q_h,
    stride_q_s,
    stride_k_b,
    stride_k_h,
    stride_k_s,
    stride_v_b,
    stride_v_h,
    stride_v_s,
    stride_do_b,
    stride_do_h,
    stride_do_s,
    stride_dx_b,
    stride_dx_h,
    stride_dx_s,
    stride_dv_b,
    stride_dv_h,
    stride_dv_s,
    stride_mask_b,
    stride_mask_s,
    stride_lse_b,
    stride_lse_h,
    stride_bias_h,
    dbias_programs,  # DBias' third dim: at least the dQ grid's axis 0
    seq_q,  # dense query length (varlen: read from CuSeqlens)
    seq_k,  # dense key length (varlen: read from CuSeqlens)
    qk_scale,  # scale * log2(e)
    sm_scale,  # scale
    dropout_p,  # the forward's dropout probability (HAS_DROPOUT only)
    seed,  # the forward's Philox seed (HAS_DROPOUT only)
    window,  # the sliding window (WINDOW only)
    seq_q_bucket,  # autotune key only
    seq_k_bucket,  # autotune key only
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_MASK: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROTARY: tl.constexpr,
    WINDOW: tl.constexpr,
    DKDV: tl.constexpr,  # dK and dV, a key block per step; otherwise dQ, a query block per step
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    head = tl.program_id(1)
    batch = tl.program_id(2)
    first = 0
    if IS_VARLEN:
        first = tl.load(CuSeqlens + batch).to(tl.int64)
        seq_q = (tl.load(CuSeqlens + batch + 1) - first).to(tl.int32)
        seq_k = seq_q
    q_base = head_base(Q, batch, first, head, stride_q_b, stride_q_h, stride_q_s, IS_VARLEN)
    k_base = head_base(K, batch, first, head, stride_k_b, stride_k_h, stride_k_s, IS_VARLEN)
    v_base = head_base(V, batch, first, head, stride_v_b, stride_v_h, stride_v_s, IS_VARLEN)
    do_base = head_base(DO, batch, first, head, stride_do_b, stride_do_h, stride_do_s, IS_VARLEN)
    dx_base = head_base(DX, batch, first, head, stride_dx_b, stride_dx_h, stride_dx_s, IS_VARLEN)
    lse_offset = first + batch.to(tl.int64) * stride_lse_b + head * stride_lse_h
    mask_base = Mask
    if HAS_MASK:
        mask_base = Mask + batch.to(tl.int64) * stride_mask_b
    bias_base = Bias
    if HAS_BIAS:
        bias_base = Bias + head * stride_bias_h
    drop_origin, drop_row_step = 0, 0
    if HAS_DROPOUT:
        drop_origin, drop_row_step = dropout_origin(
            CuSeqlens, batch, head, first, seq_q, seq_k, IS_VARLEN
        )
    # Grid-stride over key (DKDV) or query blocks (the dense grid covers them in one step).
    if DKDV:
        dv_base = head_base(
            DV, batch, first, head, stride_dv_b, stride_dv_h, stride_dv_s, IS_VARLEN
        )
        for start_n in range(tl.program_id(0) * BLOCK_N, seq_k, tl.num_programs(0) * BLOCK_N):
            _dkdv_block(
                q_base,
                k_base,
                v_base,
                do_base,
                dx_base,
                dv_base,
                mask_base,
                Lse + lse_offset,
                Delta + lse_offset,
                stride_q_s,
                stride_k_s,
                stride_v_s,
                stride_do_s,
                stride_dx_s,
                stride_dv_s,
                stride_mask_s,
                start_n,
                seq_q,
                seq_k,
                qk_scale,
                sm_scale,
                drop_origin,
                drop_row_step,
                dropout_p,
                seed,
                bias_base,
                Rotary,
                window,
                HEAD_DIM,
                BLOCK_D,
                BLOCK_M,
                BLOCK_N,
                HAS_MASK,
                HAS_DROPOUT,
                HAS_BIAS,
                ROTARY,
                WINDOW,
            )
    else:
        dbias = tl.zeros([BUCKETS], tl.float32)
        for start_m in range(tl.program_id(0) * BLOCK_M, seq_q, tl.num_programs(0) * BLOCK_M):
            dbias = _dq_block(
                q_base,
                k_base,
                v_base,
                do_base,
                dx_base,
                mask_base,
                Lse + lse_offset,
                Delta + lse_offset,
                stride_q_s,
                stride_k_s,
                stride_v_s,
                stride_do_s,
                stride_dx_s,
                stride_mask_s,
                start_m,
                seq_q,
                seq_k,
                qk_scale,
                sm_scale,
                drop_origin,
                drop_row_step,
                dropout_p,
                seed,
                bias_base,
                dbias,
                Rotary,
                window,
                HEAD_DIM,
                BLOCK_D,
                BLOCK_M,
                BLOCK_N,
                HAS_MASK,
                HAS_DROPOUT,
                HAS_BIAS,
                ROTARY,
                WINDOW,
            )
        if HAS_BIAS:
            row = (batch.to(tl.int64) * tl.num_programs(1) + head) * dbias_programs
            offs_b = tl.arange(0, BUCKETS)
            tl.store(DBias + (row + tl.program_id(0)) * BUCKETS + offs_b, dbias)


# One kernel, two autotuners: the two passes tune their tiles apart.
_attention_bwd_dkdv_kernel = _autotuned(is_dkdv=True)(_attention_bwd_kernel)
_attention_bwd_dq_kernel = _autotuned(is_dkdv=False)(_attention_bwd_kernel)


def _launch_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    grad_out: torch.Tensor,
    dq: torch.Tensor,
    dk: torch.Tensor,
    dv: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    bias: torch.Tensor | None,
    sequences: Sequences,
    scale: float,
    dropout_p: float,
    seed: int,
    rotary: torch.Tensor | None,
    window: int | None,
) -> torch.Tensor | None:
    """Launch the dK / dV pass and the dQ pass of the backward kernel on ``sequences``;
    with a bias table (fp32, log2 units: ``scaled_bias_table``), return its fp32 [H, buckets]
    gradient: the dQ programs' partial sums, reduced here in a fixed order. ``rotary`` and
    ``window``: as the forward's launcher takes them."""
    heads, head_dim = q.shape[1], q.shape[-1]  # q is [B, H, S, D] or [T, H, D]
    checked_grid(sequences, heads)
    count, max_seqlen_q, max_seqlen_k = sequences.count, *sequences[3:5]
    common = variant_flags(sequences, head_dim, dropout_p, bias, rotary, window)
    factors = rotary_factors(rotary, sequences)
    partials, programs = None, 0
    if bias is not None:
        # One row of partial sums per dQ program: enough for the smallest BLOCK_M tried.
        programs = max(1, cdiv(max_seqlen_q, min(c.kwargs["BLOCK_M"] for c in configs(False))))
        partials = torch.zeros(
            (count, heads, programs, bias.shape[1]), dtype=torch.float32, device=q.device
        )
    tensors = (sequences.mask, sequences.cu_seqlens, lse, delta, bias, partials, factors)
    scalars = (
        *row_strides(sequences, lse),
        0 if bias is None else bias.stride(0),
        programs,
        sequences.seq_q,
        sequences.seq_k,
        scale * LOG2_E,
        scale,
        dropout_p,
        seed,
        *trailing_scalars(sequences, window),
    )
    dkdv_grid = lambda meta: (max(1, cdiv(max_seqlen_k, meta["BLOCK_N"])), heads, count)
    launch_tuned(
        _attention_bwd_dkdv_kernel,
        dkdv_grid,
        q,
        k,
        v,
        grad_out,
        dk,
        dv,
        *tensors,
        *head_strides(q, k, v, grad_out, dk, dv),
        *scalars,
        DKDV=True,
        **common,
        **FUSED,
    )
    dq_grid = lambda meta: (max(1, cdiv(max_seqlen_q, meta["BLOCK_M"])), heads, count)
    launch_tuned(
        _attention_bwd_dq_kernel,
        dq_grid,
        q,
        k,
        v,
        grad_out,
        dq,
        None,
        *tensors,
        *head_strides(q, k, v, grad_out, dq),
        0,
        0,
        0,
        *scalars,
        DKDV=False,
        **common,
        **FUSED,
    )
    return None if partials is None else partials.sum((0, 2))


def _unit_stride_on_d(grad_out: torch.Tensor) -> torch.Tensor:
    """The output gradient as the kernels read it: any strides with unit stride on D."""
    return grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()


def attention_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    scale: float,
    dropout_p: float,
    seed: torch.Tensor | None,
    relative_bias: torch.Tensor | None = None,
    rotary: torch.Tensor | None = None,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dq, dk, dv, d relative_bias) of the dense attention: contiguous [B, S, H, D] buffers
    in q's dtype, whose ``.transpose(1, 2)`` are the [B, H, S, D] gradients, and the table's
    gradient in its dtype (None without a table).

    grad_out and out: [B, S_q, H, D] (the forward's layout, any strides); lse: the forward's
    fp32 [B, H, S_q]; the other arguments are the forward's (scale resolved, dropout_p and
    seed as the forward used them).
    """
    batch, heads, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    buffers = [
        torch.empty((batch, s, heads, head_dim), dtype=q.dtype, device=q.device)
        for s in (seq_q, seq_k, seq_k)
    ]
    if q.numel() == 0 or k.numel() == 0:
        return (*(b.zero_() for b in buffers), _zero_bias_grad(relative_bias))
    grads = [b.transpose(1, 2) for b in buffers]
    grad_out = _unit_stride_on_d(grad_out.transpose(1, 2))
    delta = (grad_out.float() * out.transpose(1, 2).float()).sum(-1)
    sequences = dense(q, k, key_padding_mask)
    args = (sequences, scale, dropout_p, seed_value(seed), rotary, window)
    table = scaled_bias_table(relative_bias)
    grad_bias = _launch_backward(q, k, v, grad_out, *grads, lse, delta, table, *args)
    return (*buffers, _bias_grad_as(relative_bias, grad_bias))


def attention_varlen_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float,
    dropout_p: float,
    seed: torch.Tensor | None,
    relative_bias: torch.Tensor | None = None,
    rotary: torch.Tensor | None = None,
    window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(dq, dk, dv, d relative_bias) of the padding-free attention: each of the first three a
    contiguous [T, H, D] in q's dtype, the table's gradient in its dtype (None without one).

    grad_out and out: [T, H, D]; lse: the forward's fp32 [H, T]. Tokens outside every sequence
    (past cu_seqlens[-1]) get zero gradients.
    """
    grads = tuple(torch.zeros_like(q, memory_format=torch.contiguous_format) for _ in range(3))
    sequences = packed(q, cu_seqlens, max_seqlen)
    if q.numel() == 0 or sequences.count == 0:
        return (*grads, _zero_bias_grad(relative_bias))
    grad_out = _unit_stride_on_d(grad_out)
    delta = (grad_out.float() * out.float()).sum(-1).transpose(0, 1).contiguous()
    args = (sequences, scale, dropout_p, seed_value(seed), rotary, window)
    table = scaled_bias_table(relative_bias)
    grad_bias = _launch_backward(q, k, v, grad_out, *grads, lse, delta, table, *args)
    return (*grads, _bias_grad_as(relative_bias, grad_bias))


def _zero_bias_grad(relative_bias: torch.Tensor | None) -> torch.Tensor | None:
    return None if relative_bias is None else torch.zeros_like(relative_bias)


def _bias_grad_as(
    relative_bias: torch.Tensor | None, grad: torch.Tensor | None
) -> torch.Tensor | None:
    """The table's gradient in the table's dtype (it is computed in fp32)."""
    return None if relative_bias is None else grad.to(relative_bias.dtype)


__all__ = ["attention_backward", "attention_varlen_backward", "configs", "keep"]
