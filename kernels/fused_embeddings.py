"""BERT embeddings fused with their LayerNorm: gather three table rows, sum, normalise.

Math, per token (b, s), in float32::

    e         = word_emb[input_ids[b, s]] + pos_emb[position_ids[b, s]]
                + type_emb[token_type_ids[b, s]]
    out[b, s] = (e - mean(e)) / sqrt(var(e) + eps) * weight + bias

with the biased variance of the centred values, rounded once to the tables' dtype. Token
types default to 0 (HAS_TOKEN_TYPES false) and positions to 0..S-1 (HAS_POSITION_IDS false,
computed in the kernel), as :func:`kernels.reference.embeddings_layer_norm` does.

Shapes and layouts: input_ids and token_type_ids are [B, S] integers of any integer dtype and
strides; position_ids is [B, S] or [S] (read with a zero batch stride); the tables are
[rows, H] and weight, bias [H], all read through their strides; the output is a new contiguous
[B, S, H] tensor.

Dtypes: the tables, weight and bias share one of float16, bfloat16, float32; the sum and the
statistics are float32.

Limits: one program per token holds the whole row (BLOCK = next power of two of H), so H may be
at most 4096. Ids are checked against their tables on the host before the launch (one
synchronisation; an id out of range raises ValueError), so a gather never reads out of
bounds; ``check_ids=False`` skips the check for a caller that has made it. Table row offsets
are int64 (vocab x hidden can pass 2^31). An empty batch returns an empty output without a
launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._checks import check_embeddings, check_id_ranges
from ._runtime import check_triton_device, refuse_gradients
from .fused_layer_norm import block_size, check_hidden, normalize_row, num_warps


@triton.jit
def _table_row(table_ptr, index, stride_row, stride_col, cols, mask):
    """Row ``index`` (int64) of a [rows, H] table, as float32, zero past H."""
    row = tl.load(table_ptr + index * stride_row + cols * stride_col, mask=mask, other=0.0)
    return row.to(tl.float32)


@triton.jit
def _embeddings_layer_norm_fwd_kernel(
    input_ids_ptr,  # [B, S] word ids
    token_type_ids_ptr,  # [B, S] token type ids (None unless HAS_TOKEN_TYPES)
    position_ids_ptr,  # [B, S] or [S] position ids (None unless HAS_POSITION_IDS)
    word_emb_ptr,  # [vocab, H] word embeddings
    pos_emb_ptr,  # [max_positions, H] position embeddings
    type_emb_ptr,  # [type_vocab, H] token type embeddings
    weight_ptr,  # [H] LayerNorm scale (gamma)
    bias_ptr,  # [H] LayerNorm shift (beta)
    out_ptr,  # [B, S, H] output, the tables' dtype
    S,
    H,
    eps,
    stride_input_ids_b,
    stride_input_ids_s,
    stride_token_type_ids_b,
    stride_token_type_ids_s,
    stride_position_ids_b,
    stride_position_ids_s,
    stride_word_emb_row,
    stride_word_emb_col,
    stride_pos_emb_row,
    stride_pos_emb_col,
    stride_type_emb_row,
    stride_type_emb_col,
    stride_weight,
    stride_bias,
    stride_out_b,
    stride_out_s,
    stride_out_col,
    HAS_TOKEN_TYPES: tl.constexpr,
    HAS_POSITION_IDS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    b = (token // S).to(tl.int64)
    s = (token % S).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H

    word = tl.load(input_ids_ptr + b * stride_input_ids_b + s * stride_input_ids_s).to(tl.int64)
    if HAS_POSITION_IDS:
        pos_ptr = position_ids_ptr + b * stride_position_ids_b + s * stride_position_ids_s
        pos = tl.load(pos_ptr).to(tl.int64)
    else:
        pos = s
    if HAS_TOKEN_TYPES:
        type_ptr = token_type_ids_ptr + b * stride_token_type_ids_b + s * stride_token_type_ids_s
        kind = tl.load(type_ptr).to(tl.int64)
    else:
        kind = 0
    e = _table_row(word_emb_ptr, word, stride_word_emb_row, stride_word_emb_col, cols, mask)
    e += _table_row(pos_emb_ptr, pos, stride_pos_emb_row, stride_pos_emb_col, cols, mask)
    e += _table_row(type_emb_ptr, kind, stride_type_emb_row, stride_type_emb_col, cols, mask)

    y = normalize_row(e, mask, cols, H, eps, weight_ptr, bias_ptr, stride_weight, stride_bias)
    out_ptrs = out_ptr + b * stride_out_b + s * stride_out_s + cols * stride_out_col
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _strides_2d(t: torch.Tensor | None) -> tuple[int, int]:
    """(batch, sequence) strides of a [B, S] id tensor; a [S] one repeats over the batch."""
    if t is None:
        return 0, 0
    if t.dim() == 1:
        return 0, t.stride(0)
    return t.stride(0), t.stride(1)


def embeddings_layer_norm(
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    word_emb: torch.Tensor,
    pos_emb: torch.Tensor,
    type_emb: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    *,
    check_ids: bool = True,
) -> torch.Tensor:
    """``LayerNorm(word_emb[ids] + pos_emb[positions] + type_emb[types])`` in one Triton pass.

    Args:
        input_ids: [B, S] word ids, any integer dtype.
        token_type_ids: [B, S] token types, or None for type 0 everywhere.
        position_ids: [B, S] or [S] positions, or None for 0..S-1.
        word_emb: [vocab, H] table; pos_emb: [max_positions, H]; type_emb: [type_vocab, H];
            all of one dtype (float16 / bfloat16 / float32), H <= 4096.
        weight, bias: [H] LayerNorm scale and shift, the tables' dtype.
        eps: the non-negative number added to the variance.
        check_ids: check every id against its table first (one host synchronisation). Pass
            False only when the caller has checked them (fastbert's models do, in the one
            host read they make per call): an id out of range would then be read out of
            bounds.

    Returns:
        A new contiguous [B, S, H] tensor in the tables' dtype.

    Raises:
        TypeError: float (or bool) ids, a non-tensor argument, or mismatched table dtypes.
        ValueError: mismatched shapes or devices, an id outside its table, H > 4096, or
            tensors the Triton kernels cannot reach (not CUDA, and not the CPU under
            TRITON_INTERPRET=1).
    """
    check_embeddings(
        input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias, eps
    )
    check_triton_device("word_emb", word_emb)
    refuse_gradients("embeddings_layer_norm", word_emb, pos_emb, type_emb, weight, bias)
    hidden = word_emb.shape[1]
    check_hidden(hidden)
    batch, seq = input_ids.shape
    if position_ids is None and seq > pos_emb.shape[0]:
        raise ValueError(
            f"sequence length {seq} is longer than the {pos_emb.shape[0]} rows of pos_emb"
        )
    if check_ids:
        check_id_ranges(
            input_ids,
            token_type_ids,
            position_ids,
            word_emb.shape[0],
            type_emb.shape[0],
            pos_emb.shape[0],
        )
    out = torch.empty((batch, seq, hidden), dtype=word_emb.dtype, device=word_emb.device)
    if out.numel() == 0:
        return out
    block = block_size(hidden)
    _embeddings_layer_norm_fwd_kernel[(batch * seq,)](
        input_ids,
        token_type_ids,
        position_ids,
        word_emb,
        pos_emb,
        type_emb,
        weight,
        bias,
        out,
        seq,
        hidden,
        float(eps),
        *_strides_2d(input_ids),
        *_strides_2d(token_type_ids),
        *_strides_2d(position_ids),
        word_emb.stride(0),
        word_emb.stride(1),
        pos_emb.stride(0),
        pos_emb.stride(1),
        type_emb.stride(0),
        type_emb.stride(1),
        weight.stride(0),
        bias.stride(0),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        HAS_TOKEN_TYPES=token_type_ids is not None,
        HAS_POSITION_IDS=position_ids is not None,
        BLOCK=block,
        num_warps=num_warps(block),
    )
    return out
