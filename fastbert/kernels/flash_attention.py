"""Fused flash-style attention forward: softmax(scale * q @ k^T, masked keys excluded) @ v,
with optional attention-probability dropout, and the autograd wiring of its backward
(flash_attention_backward.py).

Math, per (batch, head) and query row i, over the keys j of its sequence::

    s_ij = scale * <q_i, k_j>                        (fp32; -inf where key j is masked)
    o_i  = sum_j exp(s_ij - m_i) v_j / sum_j exp(s_ij - m_i),   m_i = max_j s_ij

computed with the online softmax of FlashAttention: each program owns BLOCK_M query rows and
streams the keys in BLOCK_N blocks, keeping a running maximum m, a running sum l and an fp32
accumulator, so the S_q x S_k score matrix is never materialised. ``scale * log2(e)`` is folded
into one multiplier and the exponentials are ``exp2``. A row whose keys are all masked has
l = 0 and returns zeros, never NaN.

Training variants (constexpr flags, so the inference kernel compiles exactly as without them):
STORE_LSE writes each query row's log2-sum-exp2 of its scaled scores, lse_i = m_i + log2(l_i)
in log2 units (+inf for a row with no real key), fp32 [B, H, S_q] (dense) or [H, T] (varlen),
from which the backward recomputes the probabilities; it is stored only when an input
requires grad. HAS_DROPOUT drops each probability with probability p after it entered the
running sum l (the normaliser counts every key) and scales the kept ones by 1 / (1 - p):
out = dropout(softmax) @ v. The keep mask comes from ``tl.rand(seed, offset)`` with the
element's flat index in a [B, H, S_q, S_k] array (dense) or an [H, T, T] array of global token
indices (varlen) as its 64-bit offset (``dropout_origin``, attention_tiles.py), so the
backward regenerates it.

Relative position bias (HAS_BIAS, MPNet): s_ij gains bias[h, bucket(j - i)], with i and j
the positions inside the sequence (the packed sequence's own, padding-free) and ``bucket`` the
T5 / Hugging Face MPNet bucketing of the key - query distance (32 buckets, log-spaced up to
128), computed in the tile by integer comparisons with the bucket edges
(``attention_tiles.relative_bucket``; the edges are read off the reference's float math at
import, so they match Hugging Face's float logs exactly). The [H, 32] table is read as fp32
times log2(e) (``scaled_bias_table``); no [B, H, S, S] bias is ever formed. With the bias the
unmasked tiles add it after the scale instead of folding the scale into the FFMA.

Rotary positions (ROTARY, ModernBERT's RoPE): the query block is rotated once as it is loaded
and each key tile as it is loaded (``attention_tiles.rotate_rows``): the partner half of each
row is a second load of the same rows with the halves swapped, and cos / sin come from a
float32 [L, D] table the launcher builds with torch from the inverse frequencies
(``rotary_table``), the reference's own float32 arithmetic, rather than from the GPU's
approximate sin / cos instructions, whose error grows with the angle (up to ~8192 radians
here). L is max(S_q, S_k), or T padding-free (a sequence's positions are below T whatever
max_seqlen says).

Sliding window (WINDOW, ModernBERT's local layers): query i attends keys j with |i - j| <= w.
The key loop of a query block runs over ``attention_tiles.window_keys`` only, the tiles that
hold a key within w of one of its queries; the others are never loaded. Those tiles take the
checked path, with the window tested per score.

Masked keys have no influence whatever K and V hold there, NaN and Inf included (the semantics
of FlashAttention and xformers): their scores are replaced by -inf after the product, and their
V rows are loaded as zeros, since a zero weight times a NaN or Inf value would still be NaN.
The padding-free variant never reads another sequence's tokens. Programs are launched per
BLOCK_M queries of each (sequence, head); each streams the keys of its sequence.

Key tiles take one of three paths. Whole BLOCK_N tiles of real keys (all of them before the
first masked key) run with no masking at all, the scale folded into one FMA with the running
maximum: exp2(fma(qk, scale, -m)) (scale >= 0; a negative scale runs every tile on the
checked paths, which scale before taking the maximum). A partial tile of a row whose real
keys are a prefix (the encoder's right padding, or the end of an unmasked sequence) checks
only the bound. Any other key up to the last real one (holes, left padding) reads the mask.
Keys after the last real one are skipped. With a mask, each program finds the first masked
and the last real key in one pass over its mask row before the loop. That is for fp16 and
bf16; fp32, whose exact products on the FMA units dominate the step, runs one loop of checked
tiles (three copies of it spilled registers).

Shapes and layouts:

- dense: q [B, H, S_q, D], k and v [B, H, S_k, D], any strides with unit stride on D (Hugging
  Face passes [B, S, H, D] tensors transposed; the encoder passes strided views of one fused
  [B, S, 3, H, D] QKV buffer). They are read in place by their strides, never copied.
  key_padding_mask [B, S_k], bool or integer, nonzero = a real token.
  Output: a contiguous [B, S_q, H, D] buffer returned as its [B, H, S_q, D] view
  (``.transpose(1, 2)``), so ``out.transpose(1, 2).reshape(B, S_q, H * D)`` is free.
- varlen (padding-free): q, k, v [T, H, D] packed tokens (unit stride on D), cu_seqlens int32
  [B + 1] prefix sums of the sequence lengths; tokens cu_seqlens[b]:cu_seqlens[b + 1] attend
  each other. Output: contiguous [T, H, D].

Dtypes: float16, bfloat16, float32 (all three tensors alike); the products run on tensor cores
for fp16/bf16 and in exact IEEE fp32 for fp32 (``input_precision="ieee"``, not tf32); the
softmax statistics and the accumulator are fp32; the output has q's dtype.

Limits: head dims 32, 64, 80, 96, 128 (80 and 96 are padded to a 128-wide block and masked);
batch (or number of sequences) and heads each at most 65535 (CUDA grid limits). Batch and
token offsets are 64-bit; offsets inside one sequence (row * row stride) are 32-bit, which
holds for sequences below 2**31 / row stride (e.g. 349k tokens at a 6144-element row).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import checks, dropout, reference, torch_ops
from .attention_configs import forward_load as load
from .attention_configs import keep_forward as keep
from .attention_launch import (
    AUTOTUNE_KEY,
    SUPPORTED_HEAD_DIMS,
    Sequences,
    check_kernel_inputs,
    checked_grid,
    checked_variants,
    dense,
    head_strides,
    packed,
    pruner,
    resolve_scale,
    rotary_factors,
    row_strides,
    scaled_bias_table,
    trailing_scalars,
    tune_configs,
    variant_flags,
)
from .attention_tiles import (
    LOG2_E,
    bias_tile,
    dropout_origin,
    head_base,
    key_ranges,
    load_all_rows,
    load_rows,
    rotate_rows,
    window_keys,
)
from .dropout import seed_value
from .flash_attention_backward import attention_backward, attention_varlen_backward
from .launch import FUSED, TRITON_3_6, cdiv, launch_lock, launch_tuned, time_config
from .op import Kernel, Op, dropout_seed, implements, placeholder

# What one key tile of _attend_tile checks: nothing (every key real), the bound ``end`` (keys
# from ``end`` on are masked), or the bound and the key-padding mask.
ALL_REAL = tl.constexpr(0)
BOUNDED = tl.constexpr(1)
MASKED = tl.constexpr(2)

# (BLOCK_M, BLOCK_N, num_warps, num_stages), tuned for Hopper / Ampere with BERT shapes in mind.
_TUNE_SPACE = (
    (64, 64, 4, 3),
    (128, 64, 8, 3),
    (128, 128, 8, 2),
    (64, 32, 4, 4),
    (128, 32, 8, 3),
    (64, 32, 8, 2),
    (32, 16, 8, 2),
)
# The one config the Triton interpreter runs (tune_configs: the first).
_INTERPRETER_CONFIG = _TUNE_SPACE[0]
# Triton 3.6 compiles two configs to code that ptxas fits into fewer registers than 3.9's by
# spilling a few words outside the loops (sm_80, 64x32 tiles: on 8 warps at 128 registers, 24
# bytes at D=128 and 8 with a relative bias at D=80 and 96; on 4 warps at 168, 4 bytes with a
# bias at D=64). There they state maxnreg=255: ptxas then uses 161 to 252 registers and spills
# nothing, the occupancy that 3.9's 140 to 214 give. keep() lowers two budgets there too.
_TRITON_3_6_MAXNREG = {(64, 32, 8, 2): 255, (64, 32, 4, 4): 255}


def configs() -> list[triton.Config]:
    """Autotune configs; a single one under the interpreter (it runs every config it is given)."""
    return tune_configs(_TUNE_SPACE, _TRITON_3_6_MAXNREG if TRITON_3_6 else None)


def _variant(args: dict) -> tuple[bool, ...]:
    """``keep``'s variant arguments of a launch."""
    flags = ("IS_VARLEN", "HAS_MASK", "HAS_BIAS", "ROTARY", "HAS_DROPOUT")
    return tuple(bool(args[flag]) for flag in flags)


# Autotuner hook: the configs ``keep`` allows for a launch's BLOCK_D, dtype and variant (the
# least ``load`` where it allows none).
_prune = pruner(keep, _variant, load)


@triton.jit
def _attend_tile(
    q,
    keys,  # where the keys, values and mask row of this (batch, head) are: see _attend_rows
    start_n,
    end,  # keys from here on are masked or past the sequence (BOUNDED, MASKED)
    m_i,
    l_i,
    acc,
    scoring,  # the scale and the variants' inputs of this query block: see _attend_rows
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    KEYS: tl.constexpr,  # ALL_REAL, BOUNDED or MASKED: what the tile's keys need checked
    HAS_DROPOUT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROTARY: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """One online-softmax step over keys start_n .. start_n + BLOCK_N - 1: the updated
    (m_i, l_i, acc). ALL_REAL: nothing is masked and the scale folds into one FFMA with the
    running maximum (scale >= 0: max(s x) = s max(x)); BOUNDED: keys from ``end`` on are
    masked; MASKED: so are the keys the key-padding mask marks. With HAS_DROPOUT the
    probabilities are dropped after the row sum took them all. HAS_BIAS adds each score's
    relative position bias after the scale (the scale then never folds into the FFMA). ROTARY
    rotates the key tile as it is loaded; WINDOW (checked tiles only) excludes the scores of
    keys farther than ``window`` from their query. ``qk_scale`` is >= 0 for ALL_REAL."""
    k_base, v_base, mask_base, stride_k_s, stride_v_s, stride_mask_s = keys
    qk_scale, drop_rows, dropout_p, seed, bias_base, offs_m, rotary, window = scoring
    offs_n = start_n + tl.arange(0, BLOCK_N)
    if KEYS != ALL_REAL:
        real = offs_n < end
        k = load_rows(k_base, offs_n, stride_k_s, real, HEAD_DIM, BLOCK_D)
        if ROTARY:
            k = rotate_rows(k, k_base, offs_n, stride_k_s, real, offs_n, rotary, HEAD_DIM, BLOCK_D)
        if KEYS == MASKED:
            token = tl.load(mask_base + offs_n * stride_mask_s, mask=real, other=0)
            real = real & (token != 0)
        # Masked keys' scores are replaced below, whatever K holds there; their values are
        # loaded as zeros, since p = 0 times a NaN or Inf in V would still be NaN.
        v = load_rows(v_base, offs_n, stride_v_s, real, HEAD_DIM, BLOCK_D)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee") * qk_scale
        if HAS_BIAS:
            qk += bias_tile(bias_base, offs_m, offs_n)
        keep = real[None, :]
        if WINDOW:
            keep = keep & (tl.abs(offs_n[None, :] - offs_m[:, None]) <= window)
        qk = tl.where(keep, qk, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        # Rows with no real key so far keep m = -inf; shift them by 0 so exp2 gives 0, not NaN.
        m_shift = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(qk - m_shift[:, None])
    else:
        k = load_all_rows(k_base, offs_n, stride_k_s, HEAD_DIM, BLOCK_D)
        if ROTARY:
            every = offs_n >= 0
            k = rotate_rows(k, k_base, offs_n, stride_k_s, every, offs_n, rotary, HEAD_DIM, BLOCK_D)
        v = load_all_rows(v_base, offs_n, stride_v_s, HEAD_DIM, BLOCK_D)
        qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        # Finite after any real key (m_i = -inf only before the first tile).
        if HAS_BIAS:
            qk = qk * qk_scale + bias_tile(bias_base, offs_m, offs_n)
            m_new = tl.maximum(m_i, tl.max(qk, 1))
            m_shift = m_new
            p = tl.math.exp2(qk - m_shift[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            m_shift = m_new
            p = tl.math.exp2(tl.fma(qk, qk_scale, -m_shift[:, None]))
    alpha = tl.math.exp2(m_i - m_shift)
    l_i = l_i * alpha + tl.sum(p, 1)
    if HAS_DROPOUT:
        p = dropout.dropped(p, seed, drop_rows[:, None] + offs_n[None, :], dropout_p)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision="ieee")
    return m_new, l_i, acc


@triton.jit
def _attend_rows(
    q,
    keys,  # (k_base, v_base, mask_base, stride_k_s, stride_v_s, stride_mask_s), below
    seq_k,
    scoring,  # (qk_scale, drop_rows, dropout_p, seed, bias_base, offs_m, rotary, window)
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
    """Online softmax over all keys for one block of queries: the normalised [BLOCK_M, BLOCK_D]
    output and each row's log2-sum-exp2 of its scaled scores (+inf for a row with no real key).
    With HAS_DROPOUT the probabilities are dropped (after the normaliser took them all).

    Whole tiles of real keys run without any masking, a partial tile of a prefix of real keys
    with a bounds check, and any other keys up to the last real one with the mask (see
    ``key_ranges``). The unmasked path takes the maximum before scaling, which needs
    scale >= 0: with a negative scale every tile runs on the checked paths, which scale first.

    WINDOW: one loop of checked tiles over the keys of ``window_keys`` alone; the tiles wholly
    outside the window of every query of the block are never loaded.

    ``keys``: pointers to key 0 and value 0, column 0, of this (batch, head), to its batch's
    key-padding mask row (HAS_MASK only), and the three row strides. ``scoring``: scale *
    log2(e); the int64 [BLOCK_M] dropout offsets of each query row's key 0, p and the seed
    (HAS_DROPOUT only); the pointer to this head's row of the log2(e)-scaled bias table
    (HAS_BIAS only); the int32 [BLOCK_M] positions of the query rows in their sequence; the
    float32 [L, HEAD_DIM] cos and sin of each position (ROTARY only); the window (WINDOW only).
    """
    mask_base, stride_mask_s = keys[2], keys[5]
    qk_scale, offs_m, window = scoring[0], scoring[5], scoring[7]
    full_end, bounded_end, end = key_ranges(mask_base, stride_mask_s, seq_k, BLOCK_N, HAS_MASK)
    full_end = tl.where(qk_scale < 0, 0, full_end)
    lo, hi = 0, end
    if WINDOW:
        lo, hi = window_keys(tl.min(offs_m, 0), window, end, BLOCK_M, BLOCK_N)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if q.dtype == tl.float32 or HAS_DROPOUT or WINDOW:
        # One copy of the loop: for fp32, whose exact products run on the FMA units and
        # dominate the step, and for dropout, whose keep mask holds registers of its own,
        # three copies would only push into register spills (fp32 up to 15 KB; fp16 with
        # dropout 52 B on sm_80). A window's few tiles all need its per-score check.
        for start_n in range(lo, hi, BLOCK_N):
            m_i, l_i, acc = _attend_tile(
                q,
                keys,
                start_n,
                end,
                m_i,
                l_i,
                acc,
                scoring,
                HEAD_DIM,
                BLOCK_D,
                BLOCK_N,
                MASKED if HAS_MASK else BOUNDED,
                HAS_DROPOUT,
                HAS_BIAS,
                ROTARY,
                WINDOW,
            )
    else:
        for start_n in range(0, full_end, BLOCK_N):
            m_i, l_i, acc = _attend_tile(
                q,
                keys,
                start_n,
                end,
                m_i,
                l_i,
                acc,
                scoring,
                HEAD_DIM,
                BLOCK_D,
                BLOCK_N,
                ALL_REAL,
                HAS_DROPOUT,
                HAS_BIAS,
                ROTARY,
                WINDOW,
            )
        # At most one tile: pipelining it would only hold registers (it spilled on sm_80).
        for start_n in tl.range(full_end, bounded_end, BLOCK_N, num_stages=1):
            m_i, l_i, acc = _attend_tile(
                q,
                keys,
                start_n,
                end,
                m_i,
                l_i,
                acc,
                scoring,
                HEAD_DIM,
                BLOCK_D,
                BLOCK_N,
                BOUNDED,
                HAS_DROPOUT,
                HAS_BIAS,
                ROTARY,
                WINDOW,
            )
        if HAS_MASK:
            for start_n in tl.range(bounded_end, end, BLOCK_N, num_stages=1):
                m_i, l_i, acc = _attend_tile(
                    q,
                    keys,
                    start_n,
                    end,
                    m_i,
                    l_i,
                    acc,
                    scoring,
                    HEAD_DIM,
                    BLOCK_D,
                    BLOCK_N,
                    MASKED,
                    HAS_DROPOUT,
                    HAS_BIAS,
                    ROTARY,
                    WINDOW,
                )
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    lse = tl.where(l_i == 0.0, float("inf"), m_i + tl.math.log2(l_safe))
    # One IEEE reciprocal a row (a plain / compiles to the approximate division, 2 units in the
    # last place) and a product an element: an IEEE division of every element cost 9% of the
    # forward's TFLOP/s at 64x512 (H200, 332 -> 301 fp16).
    return acc * tl.math.div_rn(1.0, l_safe)[:, None], lse


@triton.jit
def _attend_query_block(
    q_base,  # pointer to query 0, column 0 of this (batch, head)
    keys,  # its keys, values and mask row: (k_base, v_base, mask_base, their row strides)
    o_base,  # pointer to output row 0, column 0 of this (batch, head)
    lse_base,  # pointer to the log-sum-exp of query 0 of this (batch, head) (STORE_LSE only)
    stride_q_s,
    stride_o_s,
    start_m,
    seq_q,
    seq_k,
    qk_scale,
    drop_origin,  # dropout offset of query 0, key 0 (HAS_DROPOUT only)
    drop_row_step,  # dropout offset step of one query row (HAS_DROPOUT only)
    dropout_p,
    seed,
    bias_base,  # pointer to this head's row of the log2(e)-scaled bias table (HAS_BIAS only)
    rotary,  # float32 [L, HEAD_DIM] cos and sin of each position (ROTARY only)
    window,  # keys farther than this from a query are excluded (WINDOW only)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    STORE_LSE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROTARY: tl.constexpr,
    WINDOW: tl.constexpr,
):
    """Attention output of queries start_m .. start_m + BLOCK_M - 1 (those < seq_q), and with
    STORE_LSE their log2-sum-exp2 (fp32) for the backward. ROTARY rotates the query block
    once, as it is loaded."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = load_rows(q_base, offs_m, stride_q_s, offs_m < seq_q, HEAD_DIM, BLOCK_D)
    if ROTARY:
        q = rotate_rows(
            q, q_base, offs_m, stride_q_s, offs_m < seq_q, offs_m, rotary, HEAD_DIM, BLOCK_D
        )
    drop_rows = drop_origin + offs_m * drop_row_step
    scoring = (qk_scale, drop_rows, dropout_p, seed, bias_base, offs_m, rotary, window)
    out, lse = _attend_rows(
        q,
        keys,
        seq_k,
        scoring,
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
    offs_d = tl.arange(0, BLOCK_D)
    o_ptrs = o_base + offs_m[:, None] * stride_o_s + offs_d[None, :]
    inside = (offs_m[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM)
    tl.store(o_ptrs, out.to(o_base.dtype.element_ty), mask=inside)
    if STORE_LSE:
        tl.store(lse_base + offs_m, lse, mask=offs_m < seq_q)


@triton.autotune(
    configs=configs(),
    key=[*AUTOTUNE_KEY, "STORE_LSE"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=time_config,
)
# The buckets only key the autotuner: specialising on their values (1, multiples of 16) would
# only compile identical copies.
@triton.jit(do_not_specialize=["seq_q_bucket", "seq_k_bucket"])
def _attention_fwd_kernel(
    Q,  # queries: [B, H, S_q, D] (dense) or [T, H, D] (varlen), unit stride on D
    K,  # keys: [B, H, S_k, D] or [T, H, D], unit stride on D
    V,  # values: like K
    Out,  # output: [B, H, S_q, D] view of a contiguous [B, S_q, H, D] buffer, or [T, H, D]
    Mask,  # key-padding mask [B, S_k], bool or integer, nonzero = real token (HAS_MASK only)
    CuSeqlens,  # int32 [B + 1] sequence boundaries in the packed tokens (IS_VARLEN only)
    Lse,  # fp32 log2-sum-exp2 per query: [B, H, S_q] or [H, T] (STORE_LSE only)
    Bias,  # fp32 [H, RELATIVE_BUCKETS] relative position bias times log2(e) (HAS_BIAS only)
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
    stride_o_b,
    stride_o_h,
    stride_o_s,
    stride_mask_b,
    stride_mask_s,
    stride_lse_b,
    stride_lse_h,
    stride_bias_h,
    seq_q,  # dense query length (varlen: read from CuSeqlens)
    seq_k,  # dense key length (varlen: read from CuSeqlens)
    qk_scale,  # scale * log2(e)
    dropout_p,  # probability of dropping an attention probability (HAS_DROPOUT only)
    seed,  # Philox seed of the dropout mask (HAS_DROPOUT only)
    window,  # sliding window: keys farther than this from the query are excluded (WINDOW only)
    seq_q_bucket,  # autotune key only: next power of two of the (longest) query length
    seq_k_bucket,  # autotune key only: next power of two of the (longest) key length
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_MASK: tl.constexpr,
    IS_VARLEN: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    STORE_LSE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ROTARY: tl.constexpr,
    WINDOW: tl.constexpr,
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
    o_base = head_base(Out, batch, first, head, stride_o_b, stride_o_h, stride_o_s, IS_VARLEN)
    # Without a mask Mask is None, which a tuple holds only as the constexpr argument itself.
    keys = (k_base, v_base, Mask, stride_k_s, stride_v_s, stride_mask_s)
    if HAS_MASK:
        mask_row = Mask + batch.to(tl.int64) * stride_mask_b
        keys = (k_base, v_base, mask_row, stride_k_s, stride_v_s, stride_mask_s)
    bias_base = Bias
    if HAS_BIAS:
        bias_base = Bias + head * stride_bias_h
    lse_base = Lse
    if STORE_LSE:
        lse_base = Lse + first + batch.to(tl.int64) * stride_lse_b + head * stride_lse_h
    drop_origin, drop_row_step = 0, 0
    if HAS_DROPOUT:
        drop_origin, drop_row_step = dropout_origin(
            CuSeqlens, batch, head, first, seq_q, seq_k, IS_VARLEN
        )
    if IS_VARLEN:
        # Grid-stride over query blocks: correct whatever max_seqlen sized the grid to.
        for start_m in range(tl.program_id(0) * BLOCK_M, seq_q, tl.num_programs(0) * BLOCK_M):
            _attend_query_block(
                q_base,
                keys,
                o_base,
                lse_base,
                stride_q_s,
                stride_o_s,
                start_m,
                seq_q,
                seq_k,
                qk_scale,
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
                STORE_LSE,
                HAS_BIAS,
                ROTARY,
                WINDOW,
            )
    else:
        _attend_query_block(
            q_base,
            keys,
            o_base,
            lse_base,
            stride_q_s,
            stride_o_s,
            tl.program_id(0) * BLOCK_M,
            seq_q,
            seq_k,
            qk_scale,
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
            STORE_LSE,
            HAS_BIAS,
            ROTARY,
            WINDOW,
        )


def _prepare(
    q,
    k,
    v,
    key_padding_mask=None,
    scale=None,
    dropout_p=0.0,
    relative_bias=None,
    rotary=None,
    window=None,
) -> tuple:
    """Validate the dense op's inputs for the kernel; the forward's arguments (scale resolved,
    the dropout seed drawn)."""
    checks.check_attention(q, k, v, key_padding_mask, scale)
    dropout_p = checked_variants(q, relative_bias, rotary, window, dropout_p)
    tensors = {"q": q, "k": k, "v": v, "key_padding_mask": key_padding_mask}
    check_kernel_inputs(tensors, q.shape[-1])
    seed = dropout_seed(dropout_p)
    scale = resolve_scale(q, scale)
    return q, k, v, key_padding_mask, scale, dropout_p, relative_bias, rotary, window, seed


def _prepare_varlen(
    q,
    k,
    v,
    cu_seqlens,
    max_seqlen,
    scale=None,
    dropout_p=0.0,
    relative_bias=None,
    rotary=None,
    window=None,
) -> tuple:
    """Validate the padding-free op's inputs for the kernel; the forward's arguments."""
    checks.check_attention_varlen(q, k, v, cu_seqlens, max_seqlen, scale)
    cu_seqlens = cu_seqlens.contiguous()  # the kernels read it as contiguous
    dropout_p = checked_variants(q, relative_bias, rotary, window, dropout_p)
    check_kernel_inputs({"q": q, "k": k, "v": v, "cu_seqlens": cu_seqlens}, q.shape[-1])
    scale = resolve_scale(q, scale)
    seed = dropout_seed(dropout_p)
    rest = (relative_bias, rotary, window, seed)
    return (q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, *rest)


_LAUNCH_LOCK = launch_lock()  # one launch at a time across threads (the autotuner's nargs)


def _launch(
    q, k, v, out, lse, bias, sequences: Sequences, scale, dropout_p, seed, rotary, window
) -> None:
    """Launch the kernel on ``sequences`` (dense or packed); ``lse``: None or where the
    log2-sum-exp2 goes; ``bias``: None or the [H, RELATIVE_BUCKETS] relative position bias
    table (any float dtype); ``rotary``: None or the float32 [D / 2] inverse frequencies;
    ``window``: None or the sliding window.

    One program per BLOCK_M queries of each (sequence, head): the grid follows the query
    length alone, since every program streams the keys of its sequence up to the last real
    one anyway.
    """
    heads, head_dim = q.shape[1], q.shape[-1]  # q is [B, H, S, D] or [T, H, D]
    checked_grid(sequences, heads)
    count, max_seqlen_q = sequences.count, sequences.max_seqlen_q
    grid = lambda meta: (max(1, cdiv(max_seqlen_q, meta["BLOCK_M"])), heads, count)
    table = scaled_bias_table(bias)
    factors = rotary_factors(rotary, sequences)
    with _LAUNCH_LOCK:
        launch_tuned(
            _attention_fwd_kernel,
            grid,
            q,
            k,
            v,
            out,
            sequences.mask,
            sequences.cu_seqlens,
            lse,
            table,
            factors,
            *head_strides(q, k, v, out),
            *row_strides(sequences, lse),
            0 if table is None else table.stride(0),
            sequences.seq_q,
            sequences.seq_k,
            scale * LOG2_E,
            dropout_p,
            seed,
            *trailing_scalars(sequences, window),
            STORE_LSE=lse is not None,
            **variant_flags(sequences, head_dim, dropout_p, table, rotary, window),
            **FUSED,
        )


def attention_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    key_padding_mask: torch.Tensor | None,
    scale: float,
    dropout_p: float,
    relative_bias: torch.Tensor | None,
    rotary: torch.Tensor | None,
    window: int | None,
    seed: torch.Tensor | None,
    save: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The dense kernel on checked inputs: (the contiguous [B, S_q, H, D] output, whose
    ``.transpose(1, 2)`` is the op's [B, H, S_q, D] result; with ``save`` the fp32 [B, H, S_q]
    log2-sum-exp2 of the scaled scores that the backward needs, else None)."""
    batch, heads, seq_q, head_dim = q.shape
    buffer = torch.empty((batch, seq_q, heads, head_dim), dtype=q.dtype, device=q.device)
    out = buffer.transpose(1, 2)
    lse = None
    if save:
        lse = torch.empty((batch, heads, seq_q), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return buffer, lse
    sequences = dense(q, k, key_padding_mask)
    args = (sequences, scale, dropout_p, seed_value(seed), rotary, window)
    _launch(q, k, v, out, lse, relative_bias, *args)
    return buffer, lse


def attention_varlen_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int,
    scale: float,
    dropout_p: float,
    relative_bias: torch.Tensor | None,
    rotary: torch.Tensor | None,
    window: int | None,
    seed: torch.Tensor | None,
    save: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The padding-free kernel on checked inputs: (out, contiguous [T, H, D]; with
    ``save`` the fp32 [H, T] log2-sum-exp2 of the scaled scores, else None). A sequence's
    positions are below T whatever max_seqlen says: the RoPE table has T rows."""
    tokens, heads, _ = q.shape
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = None
    if save:
        lse = torch.empty((heads, tokens), dtype=torch.float32, device=q.device)
    sequences = packed(q, cu_seqlens, max_seqlen)
    if out.numel() == 0 or sequences.count == 0:
        return out, lse
    args = (sequences, scale, dropout_p, seed_value(seed), rotary, window)
    _launch(q, k, v, out, lse, relative_bias, *args)
    return out, lse


def _forward_fake(
    q, k, v, key_padding_mask, scale, dropout_p, relative_bias, rotary, window, seed, save
):
    checks.check_attention(q, k, v, key_padding_mask, scale)
    checks.check_relative_bias(relative_bias, q)
    checks.check_rotary(rotary, window, q)
    batch, heads, seq_q, head_dim = q.shape
    lse = q.new_empty((batch, heads, seq_q), dtype=torch.float32) if save else placeholder(q)
    return q.new_empty((batch, seq_q, heads, head_dim)), lse


def _bias_grad_fake(q, relative_bias) -> torch.Tensor:
    return placeholder(q) if relative_bias is None else relative_bias.new_empty(relative_bias.shape)


def _backward_fake(
    grad_out,
    q,
    k,
    v,
    out,
    lse,
    key_padding_mask,
    scale,
    dropout_p,
    seed,
    relative_bias,
    rotary,
    window,
):
    grads = tuple(t.new_empty(t.transpose(1, 2).shape) for t in (q, k, v))
    return (*grads, _bias_grad_fake(q, relative_bias))


def _save(ctx, inputs, outputs) -> None:
    """Keep what the backward needs. The sequences' arguments are the dense op's key-padding
    mask, or the packed op's cu_seqlens and max_seqlen (an int, kept on ``ctx``)."""
    q, k, v, sequences, *lengths, scale, dropout_p, relative_bias, rotary, window, seed, _ = inputs
    saved = (q, k, v, outputs[0], outputs[1], sequences, seed, relative_bias, rotary)
    ctx.save_for_backward(*saved)
    ctx.lengths, ctx.scale, ctx.dropout_p, ctx.window = lengths, scale, dropout_p, window


def _gradients(ctx, backward, grad_out, _grad_lse):
    """The gradients of the forward's arguments: q, k, v and the bias table's (the dense
    backward returns [B, S, H, D] buffers, whose transposes are the gradients)."""
    q, k, v, out, lse, sequences, seed, relative_bias, rotary = ctx.saved_tensors
    *grads, grad_bias = backward(
        grad_out,
        q,
        k,
        v,
        out,
        lse,
        sequences,
        *ctx.lengths,
        ctx.scale,
        ctx.dropout_p,
        seed,
        relative_bias,
        rotary,
        ctx.window,
    )
    if not ctx.lengths:
        grads = (g.transpose(1, 2) for g in grads)
    grad_bias = None if relative_bias is None else grad_bias
    # None for the sequences' arguments, scale and dropout_p, then rotary, window and seed.
    return (*grads, *(None,) * (len(ctx.lengths) + 3), grad_bias, None, None, None)


ATTENTION = Op(
    name="attention",
    reference=reference.attention,
    torch=torch_ops.attention_unchecked,
    prepare=_prepare,
    forward=Kernel(
        attention_forward,
        "(Tensor q, Tensor k, Tensor v, Tensor? key_padding_mask, float scale, float dropout_p,"
        " Tensor? relative_bias, Tensor? rotary, int? window, Tensor? seed, bool save)"
        " -> (Tensor, Tensor)",
        _forward_fake,
    ),
    backward=Kernel(
        attention_backward,
        "(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,"
        " Tensor? key_padding_mask, float scale, float dropout_p, Tensor? seed,"
        " Tensor? relative_bias, Tensor? rotary, int? window) -> (Tensor, Tensor, Tensor, Tensor)",
        _backward_fake,
    ),
    save=_save,
    gradients=_gradients,
    # The kernel writes [B, S_q, H, D] memory: the [B, H, S_q, D] result is its transpose.
    finish=lambda outputs: outputs[0].transpose(1, 2),
)


def _varlen_forward_fake(
    q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, relative_bias, rotary, window, seed, save
):
    # max_seqlen may be symbolic while tracing; the forward's caller checked its value.
    checks.check_attention_varlen(q, k, v, cu_seqlens, 0, scale)
    checks.check_relative_bias(relative_bias, q)
    checks.check_rotary(rotary, window, q)
    lse = q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32) if save else placeholder(q)
    return q.new_empty(q.shape), lse


def _varlen_backward_fake(grad_out, q, k, v, out, lse, cu_seqlens, max_seqlen, *rest):
    relative_bias = rest[-3]
    return (*(t.new_empty(t.shape) for t in (q, k, v)), _bias_grad_fake(q, relative_bias))


ATTENTION_VARLEN = Op(
    name="attention_varlen",
    reference=reference.attention_varlen,
    torch=torch_ops.attention_varlen_unchecked,
    prepare=_prepare_varlen,
    forward=Kernel(
        attention_varlen_forward,
        "(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, SymInt max_seqlen, float scale,"
        " float dropout_p, Tensor? relative_bias, Tensor? rotary, int? window, Tensor? seed,"
        " bool save) -> (Tensor, Tensor)",
        _varlen_forward_fake,
    ),
    backward=Kernel(
        attention_varlen_backward,
        "(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse,"
        " Tensor cu_seqlens, SymInt max_seqlen, float scale, float dropout_p, Tensor? seed,"
        " Tensor? relative_bias, Tensor? rotary, int? window) -> (Tensor, Tensor, Tensor, Tensor)",
        _varlen_backward_fake,
    ),
    save=_save,
    gradients=_gradients,
)


@implements(reference.attention)
def attention(q, k, v, key_padding_mask, scale, dropout_p, relative_bias, *, rotary, window):
    """softmax(scale * q @ k^T + bias, masked keys excluded) @ v, in one fused Triton kernel
    (:func:`fastbert.kernels.reference.attention`).

    q: [B, H, S_q, D]; k, v: [B, H, S_k, D]; fp16, bf16 or fp32, any strides with unit stride
    on D (transposed Hugging Face views and slices of a fused QKV buffer are read in place).
    D in {32, 64, 80, 96, 128}. key_padding_mask: [B, S_k] bool or integer, True / nonzero =
    a real token; masked keys have no influence, even where K or V hold NaN or Inf, and a query
    row with no real key returns zeros. scale defaults to D**-0.5. dropout_p: each attention
    probability is dropped with this probability and the kept ones scaled by 1 / (1 - p)
    (dropout(softmax) @ v; the Philox seed comes from torch's default generator).
    relative_bias: None or a float [H, 32] table (MPNet's relative position bias): each score
    gains relative_bias[h, bucket(j - i)], the bucket computed in the kernel's tile (no
    [B, H, S, S] tensor is formed). rotary: None or float32 [D / 2] RoPE inverse frequencies
    (ModernBERT): q and k are rotated at positions 0.. as their tiles are loaded. window: None
    or an int w >= 0: query i attends only keys j with |i - j| <= w, and key tiles outside
    every query's window are never loaded (:func:`fastbert.kernels.reference.attention`).

    Differentiable in q, k, v and relative_bias (Triton backward kernels) when grad mode is on
    and one of them requires grad (rotary positions and the window included); otherwise
    nothing is saved.

    Returns [B, H, S_q, D] in q's dtype: the ``.transpose(1, 2)`` view of a contiguous
    [B, S_q, H, D] buffer, so ``out.transpose(1, 2).reshape(B, S_q, H * D)`` costs nothing.
    """
    return ATTENTION(
        q, k, v, key_padding_mask, scale, dropout_p, relative_bias, rotary=rotary, window=window
    )


@implements(reference.attention_varlen)
def attention_varlen(
    q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, relative_bias, *, rotary, window
):
    """Attention over packed sequences (padding-free), in one fused Triton kernel
    (:func:`fastbert.kernels.reference.attention_varlen`).

    q, k, v: [T, H, D] packed tokens (fp16, bf16 or fp32, unit stride on D, other strides
    free); cu_seqlens: int32 [B + 1] prefix sums of the sequence lengths, on q's device; tokens
    cu_seqlens[b]:cu_seqlens[b + 1] attend each other, and never read other sequences'
    tokens (a NaN in one sequence stays there). max_seqlen: the longest sequence; it
    sizes the grid (a smaller value is still correct, only slower). scale defaults to D**-0.5.
    dropout_p: attention-probability dropout, as in :func:`attention`. relative_bias: as in
    :func:`attention`, over the distances between a sequence's own tokens; rotary and window
    as in :func:`attention`, at a sequence's own positions. Differentiable as
    :func:`attention` is. Returns a contiguous [T, H, D] tensor in q's dtype; tokens outside
    every sequence (before cu_seqlens[0], from cu_seqlens[-1]) are zeros.

    Reads cu_seqlens' bounds on the host (ValueError for bounds outside [0, T] or a decrease;
    not while torch.compile traces or a CUDA graph captures: the caller's contract there, as
    for the encoder, which calls the op's declaration with the prefix sums it built).
    """
    arguments = (q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, relative_bias)
    return torch_ops.on_covered_tokens(ATTENTION_VARLEN, *arguments, rotary=rotary, window=window)


__all__ = ["SUPPORTED_HEAD_DIMS", "attention", "attention_varlen", "configs", "keep"]
