"""BERT embeddings fused with their LayerNorm and dropout: gather three table rows, sum,
normalise, drop; forward and backward.

Math, per token (b, s), in float32::

    e         = word_emb[input_ids[b, s]] + pos_emb[position_ids[b, s]]
                + type_emb[token_type_ids[b, s]]
    out[b, s] = dropout((e - mean(e)) / sqrt(var(e) + eps) * weight + bias)

with the biased variance of the centred values, rounded once to the tables' dtype. Dropout
(HAS_DROPOUT, BERT's embeddings dropout) keeps an element with probability 1 - p and scales it
by 1 / (1 - p); its keep mask comes from the call's seed and the element offset
(b * S + s) * H + c (dropout.py) and is regenerated in the backward, never stored.

Backward: the output gradient goes through the dropout mask, then LayerNorm's backward
(:func:`fused_layer_norm.normalize_row_backward`, from the row statistics the forward saves
when gradients are needed) gives de, and dweight / dbias as float32 per-program partial sums
added up in a second small step, as in fused_layer_norm.py. de is added to the three tables'
gradients at each token's ids by float32 atomic adds into float32 buffers, cast once to the
tables' dtype at the end. Atomics rather than a sort-based segmented sum: one pass with no
sort of the ids, and duplicate ids (the same word twice, every token's position row, the one
or two token-type rows) each add their occurrence exactly once; the float32 sum's order
varies between runs, a difference far below one rounding of float16 / bfloat16 (and within
float32's rounding of the sum). The price is contention on the few token-type rows (every
token adds into one of them), acceptable next to the GEMMs of a training step. Token
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

from . import reference, torch_ops
from .checks import check_embeddings, check_id_ranges
from .dropout import check_dropout_p, dropped, seed_value
from .fused_layer_norm import (
    block_size,
    check_hidden,
    normalize_row,
    normalize_row_backward,
    num_warps,
    partial_sums,
    weight_gradients,
)
from .launch import FUSED, UNFUSED, check_triton_device
from .op import Kernel, Op, dropout_seed, implements, placeholder


def heavy_num_warps(block: int) -> int:
    """Warps per token of the dropout forward and the backward: about 256 elements per warp,
    between 1 and 16. More warps spill: fused_layer_norm's heavy count holds a 4096-wide row
    to 64 registers a thread, and with Triton 3.9's ptxas flags (--regAllocOptLevel=2) 128
    elements per warp spilled the 1024-wide backward on sm_90 (8 bytes); at 256 no 16-bit row
    tile spills on sm_80 or sm_90, under Triton 3.6 or 3.9."""
    return min(16, max(1, block // 256))


@triton.jit
def _table_row(table_ptr, index, stride_row, stride_col, cols, mask):
    """Row ``index`` (int64) of a [rows, H] table, as float32, zero past H."""
    row = tl.load(table_ptr + index * stride_row + cols * stride_col, mask=mask, other=0.0)
    return row.to(tl.float32)


@triton.jit
def _token_ids(
    token,
    S,
    input_ids_ptr,
    token_type_ids_ptr,
    position_ids_ptr,
    stride_input_ids_b,
    stride_input_ids_s,
    stride_token_type_ids_b,
    stride_token_type_ids_s,
    stride_position_ids_b,
    stride_position_ids_s,
    HAS_TOKEN_TYPES: tl.constexpr,
    HAS_POSITION_IDS: tl.constexpr,
):
    """The int64 (word, position, token type) ids of token number ``token`` = b * S + s."""
    b = token // S
    s = token % S
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
        kind = s * 0
    return word, pos, kind


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
    mean_ptr,  # [B * S] float32 row means (None unless SAVE_STATS)
    rstd_ptr,  # [B * S] float32 row 1 / sqrt(var + eps) (None unless SAVE_STATS)
    S,
    H,
    eps,
    seed,  # Philox seed of the dropout mask (unused unless HAS_DROPOUT)
    dropout_p,
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
    HAS_DROPOUT: tl.constexpr,
    SAVE_STATS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    b = token // S
    s = token % S
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    word, pos, kind = _token_ids(
        token,
        S,
        input_ids_ptr,
        token_type_ids_ptr,
        position_ids_ptr,
        stride_input_ids_b,
        stride_input_ids_s,
        stride_token_type_ids_b,
        stride_token_type_ids_s,
        stride_position_ids_b,
        stride_position_ids_s,
        HAS_TOKEN_TYPES,
        HAS_POSITION_IDS,
    )
    e = _table_row(word_emb_ptr, word, stride_word_emb_row, stride_word_emb_col, cols, mask)
    e += _table_row(pos_emb_ptr, pos, stride_pos_emb_row, stride_pos_emb_col, cols, mask)
    e += _table_row(type_emb_ptr, kind, stride_type_emb_row, stride_type_emb_col, cols, mask)

    y, mean, rstd = normalize_row(
        e, mask, cols, H, eps, weight_ptr, bias_ptr, stride_weight, stride_bias
    )
    if HAS_DROPOUT:
        y = dropped(y, seed, (token * H + cols).to(tl.int32), dropout_p)
    out_ptrs = out_ptr + b * stride_out_b + s * stride_out_s + cols * stride_out_col
    tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=mask)
    if SAVE_STATS:
        tl.store(mean_ptr + token, mean)
        tl.store(rstd_ptr + token, rstd)


@triton.jit
def _embeddings_layer_norm_bwd_kernel(
    dout_ptr,  # [B * S, H] gradient of the output, contiguous
    input_ids_ptr,  # [B, S] word ids
    token_type_ids_ptr,  # [B, S] token type ids (None unless HAS_TOKEN_TYPES)
    position_ids_ptr,  # [B, S] or [S] position ids (None unless HAS_POSITION_IDS)
    word_emb_ptr,  # [vocab, H] word embeddings
    pos_emb_ptr,  # [max_positions, H] position embeddings
    type_emb_ptr,  # [type_vocab, H] token type embeddings
    weight_ptr,  # [H] LayerNorm scale (gamma)
    mean_ptr,  # [B * S] float32 row means of the forward
    rstd_ptr,  # [B * S] float32 row rstd of the forward
    dword_ptr,  # [vocab, H] float32 gradient of word_emb, zero-filled, atomically added to
    dpos_ptr,  # [max_positions, H] float32 gradient of pos_emb, likewise
    dtype_ptr,  # [type_vocab, H] float32 gradient of type_emb, likewise
    dweight_partial_ptr,  # [programs, H] float32 partial sums of dweight
    dbias_partial_ptr,  # [programs, H] float32 partial sums of dbias
    tokens,
    S,
    H,
    rows_per_program,  # tokens each program reduces (the last program may have fewer)
    seed,
    dropout_p,
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
    HAS_TOKEN_TYPES: tl.constexpr,
    HAS_POSITION_IDS: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    BLOCK: tl.constexpr,
):
    program = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    w = tl.load(weight_ptr + cols * stride_weight, mask=mask, other=0.0).to(tl.float32)
    dweight = tl.zeros((BLOCK,), dtype=tl.float32)
    dbias = tl.zeros((BLOCK,), dtype=tl.float32)
    first = program * rows_per_program
    last = tl.minimum(first + rows_per_program, tokens)
    for token in range(first, last):
        word, pos, kind = _token_ids(
            token,
            S,
            input_ids_ptr,
            token_type_ids_ptr,
            position_ids_ptr,
            stride_input_ids_b,
            stride_input_ids_s,
            stride_token_type_ids_b,
            stride_token_type_ids_s,
            stride_position_ids_b,
            stride_position_ids_s,
            HAS_TOKEN_TYPES,
            HAS_POSITION_IDS,
        )
        e = _table_row(word_emb_ptr, word, stride_word_emb_row, stride_word_emb_col, cols, mask)
        e += _table_row(pos_emb_ptr, pos, stride_pos_emb_row, stride_pos_emb_col, cols, mask)
        e += _table_row(type_emb_ptr, kind, stride_type_emb_row, stride_type_emb_col, cols, mask)
        dy = tl.load(dout_ptr + token * H + cols, mask=mask, other=0.0).to(tl.float32)
        if HAS_DROPOUT:
            dy = dropped(dy, seed, (token * H + cols).to(tl.int32), dropout_p)
        mean = tl.load(mean_ptr + token)
        rstd = tl.load(rstd_ptr + token)
        de, xhat = normalize_row_backward(dy, e, mask, H, mean, rstd, w)
        dweight += dy * xhat
        dbias += dy
        tl.atomic_add(dword_ptr + word * H + cols, de, mask=mask)
        tl.atomic_add(dpos_ptr + pos * H + cols, de, mask=mask)
        tl.atomic_add(dtype_ptr + kind * H + cols, de, mask=mask)
    tl.store(dweight_partial_ptr + program * H + cols, dweight, mask=mask)
    tl.store(dbias_partial_ptr + program * H + cols, dbias, mask=mask)


def _strides_2d(t: torch.Tensor | None) -> tuple[int, int]:
    """(batch, sequence) strides of a [B, S] id tensor; a [S] one repeats over the batch."""
    if t is None:
        return 0, 0
    if t.dim() == 1:
        return 0, t.stride(0)
    return t.stride(0), t.stride(1)


def _strides(ids: tuple, tables: tuple) -> tuple[int, ...]:
    """The kernels' id and table strides: (batch, sequence) of each of the three id tensors,
    then (row, column) of each [rows, H] table, in order."""
    id_strides = tuple(stride for t in ids for stride in _strides_2d(t))
    return id_strides + tuple(stride for t in tables for stride in (t.stride(0), t.stride(1)))


def _flags(token_type_ids, position_ids, dropout_p: float) -> dict[str, bool]:
    """The kernels' variant flags for these inputs."""
    return dict(
        HAS_TOKEN_TYPES=token_type_ids is not None,
        HAS_POSITION_IDS=position_ids is not None,
        HAS_DROPOUT=dropout_p > 0.0,
    )


def embeddings_layer_norm_forward(
    input_ids,
    token_type_ids,
    position_ids,
    word_emb,
    pos_emb,
    type_emb,
    weight,
    bias,
    eps,
    check_ids,
    dropout_p,
    seed,
    padding_idx,
    position_padding_idx,
    save,
):
    """Launch the forward: (out [B, S, H], mean, rstd); the float32 [B * S] statistics only when
    ``save``. With ``check_ids``, the ids are checked against their tables first (one host
    synchronisation); the rest is checked by the caller. The padding rows matter only to the
    backward."""
    if check_ids:
        check_id_ranges(
            input_ids,
            token_type_ids,
            position_ids,
            word_emb.shape[0],
            type_emb.shape[0],
            pos_emb.shape[0],
        )
    ids = (input_ids, token_type_ids, position_ids)
    tables = (word_emb, pos_emb, type_emb)
    batch, seq = input_ids.shape
    hidden = word_emb.shape[1]
    out = torch.empty((batch, seq, hidden), dtype=word_emb.dtype, device=word_emb.device)
    mean = rstd = None
    if save:
        mean, rstd = (
            torch.empty(batch * seq, dtype=torch.float32, device=out.device) for _ in range(2)
        )
    if out.numel() == 0:
        return out, mean, rstd
    block = block_size(hidden)
    _embeddings_layer_norm_fwd_kernel[(batch * seq,)](
        *ids,
        *tables,
        weight,
        bias,
        out,
        mean,
        rstd,
        seq,
        hidden,
        float(eps),
        seed_value(seed),
        dropout_p,
        *_strides(ids, tables),
        weight.stride(0),
        bias.stride(0),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        **_flags(token_type_ids, position_ids, dropout_p),
        SAVE_STATS=save,
        BLOCK=block,
        num_warps=heavy_num_warps(block) if dropout_p > 0.0 else num_warps(block),
        **UNFUSED,
    )
    return out, mean, rstd


def embeddings_layer_norm_backward(
    dout,
    input_ids,
    token_type_ids,
    position_ids,
    word_emb,
    pos_emb,
    type_emb,
    weight,
    mean,
    rstd,
    dropout_p,
    seed,
    padding_idx,
    position_padding_idx,
):
    """Launch the backward: (dword, dpos, dtype, dweight, dbias), each in its input's dtype.

    ``padding_idx`` / ``position_padding_idx``: the word / position row whose gradient is
    zero, as an ``nn.Embedding(padding_idx=...)``'s (None: none)."""
    ids = (input_ids, token_type_ids, position_ids)
    tables = (word_emb, pos_emb, type_emb)
    batch, seq = input_ids.shape
    hidden = weight.shape[0]
    tokens = batch * seq
    grads = [torch.zeros(t.shape, dtype=torch.float32, device=t.device) for t in tables]
    per_program, programs, partials = partial_sums(tokens, hidden, dout.device)
    if tokens:
        block = block_size(hidden)
        _embeddings_layer_norm_bwd_kernel[(programs,)](
            dout.reshape(tokens, hidden).contiguous(),
            *ids,
            *tables,
            weight,
            mean,
            rstd,
            *grads,
            partials[0],
            partials[1],
            tokens,
            seq,
            hidden,
            per_program,
            seed_value(seed),
            dropout_p,
            *_strides(ids, tables),
            weight.stride(0),
            **_flags(token_type_ids, position_ids, dropout_p),
            BLOCK=block,
            num_warps=heavy_num_warps(block),
            **FUSED,
        )
    for grad, row in zip(grads, (padding_idx, position_padding_idx)):
        if row is not None:
            grad[row] = 0.0
    dtables = [g.to(t.dtype) for g, t in zip(grads, tables)]
    return (*dtables, *weight_gradients(partials, weight.dtype))


def _prepare(
    input_ids,
    token_type_ids,
    position_ids,
    word_emb,
    pos_emb,
    type_emb,
    weight,
    bias,
    eps,
    *,
    check_ids=True,
    dropout_p=0.0,
    padding_idx=None,
    position_padding_idx=None,
) -> tuple:
    """Raise as :func:`embeddings_layer_norm` documents, before anything runs (the id ranges in
    the forward, when ``check_ids``); the forward's arguments. While torch.compile traces, the
    ids are always checked: the custom op carries the ``cudagraph_unsafe`` tag for it."""
    check_embeddings(
        input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias, eps
    )
    dropout_p = check_dropout_p(dropout_p)
    check_triton_device("word_emb", word_emb)
    check_hidden(word_emb.shape[1])
    seq = input_ids.shape[1]
    if position_ids is None and seq > pos_emb.shape[0]:
        raise ValueError(
            f"sequence length {seq} is longer than the {pos_emb.shape[0]} rows of pos_emb"
        )
    check_ids = bool(check_ids) or torch.compiler.is_compiling()
    seed = dropout_seed(dropout_p)
    tensors = (input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias)
    return (*tensors, float(eps), check_ids, dropout_p, seed, padding_idx, position_padding_idx)


def _forward_fake(*args):
    """The forward on fake tensors. ``args`` are the forward's: the ids and tables checked
    here (the first nine), check_ids, dropout_p, seed, the padding rows, and save."""
    check_embeddings(*args[:9])
    input_ids, word_emb, save = args[0], args[3], args[-1]
    batch, seq = input_ids.shape
    out = word_emb.new_empty((batch, seq, word_emb.shape[1]))
    if not save:
        return out, placeholder(out), placeholder(out)
    return out, *(word_emb.new_empty(batch * seq, dtype=torch.float32) for _ in range(2))


def _backward_fake(*args):
    """The backward on fake tensors: gradients shaped as the three tables, the weight and the
    bias (``args``: dout, the three ids, the three tables, the weight, ...)."""
    word_emb, pos_emb, type_emb, weight = args[4:8]
    return tuple(t.new_empty(t.shape) for t in (word_emb, pos_emb, type_emb, weight, weight))


def _save(ctx, inputs, outputs) -> None:
    ids_and_tables = inputs[:7]
    dropout_p, seed, padding_idx, position_padding_idx = inputs[10:14]
    ctx.save_for_backward(*ids_and_tables, outputs[1], outputs[2], seed)
    ctx.dropout_p, ctx.padding_rows = dropout_p, (padding_idx, position_padding_idx)


def _gradients(ctx, backward, dout, _dmean, _drstd):
    *saved, seed = ctx.saved_tensors
    grads = backward(dout, *saved, ctx.dropout_p, seed, *ctx.padding_rows)
    return (None, None, None, *grads, None, None, None, None, None, None)


# A forward that checks the ids synchronises with the host: CUDA-graph capture (Inductor's
# mode="reduce-overhead") partitions around it. The tag is absent from older torch releases.
_HOST_SYNC_TAGS = tuple(t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None)

EMBEDDINGS_LAYER_NORM = Op(
    name="embeddings_layer_norm",
    reference=reference.embeddings_layer_norm,
    torch=torch_ops.embeddings_layer_norm_unchecked,
    prepare=_prepare,
    forward=Kernel(
        embeddings_layer_norm_forward,
        "(Tensor input_ids, Tensor? token_type_ids, Tensor? position_ids, Tensor word_emb,"
        " Tensor pos_emb, Tensor type_emb, Tensor weight, Tensor bias, float eps, bool check_ids,"
        " float dropout_p, Tensor? seed, int? padding_idx, int? position_padding_idx, bool save)"
        " -> (Tensor, Tensor, Tensor)",
        _forward_fake,
        tags=_HOST_SYNC_TAGS,
    ),
    backward=Kernel(
        embeddings_layer_norm_backward,
        "(Tensor dout, Tensor input_ids, Tensor? token_type_ids, Tensor? position_ids,"
        " Tensor word_emb, Tensor pos_emb, Tensor type_emb, Tensor weight, Tensor mean,"
        " Tensor rstd, float dropout_p, Tensor? seed, int? padding_idx,"
        " int? position_padding_idx) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
        _backward_fake,
    ),
    save=_save,
    gradients=_gradients,
)


@implements(reference.embeddings_layer_norm)
def embeddings_layer_norm(
    input_ids,
    token_type_ids,
    position_ids,
    word_emb,
    pos_emb,
    type_emb,
    weight,
    bias,
    eps,
    *,
    check_ids,
    dropout_p,
    padding_idx,
    position_padding_idx,
):
    """``dropout(LayerNorm(word_emb[ids] + pos_emb[positions] + type_emb[types]))`` in one
    Triton pass (:func:`fastbert.kernels.reference.embeddings_layer_norm`).

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
        dropout_p: probability of zeroing an output element (the kept ones are scaled by
            1 / (1 - dropout_p)); 0.0 (the default) runs no dropout.
        padding_idx, position_padding_idx: the word / position row that gets no gradient, as
            with ``nn.Embedding(padding_idx=...)`` (Hugging Face's tables); None: every row
            gets its gradient.

    Returns:
        A new contiguous [B, S, H] tensor in the tables' dtype. When grad mode is on and a
        table, weight or bias requires grad, it carries gradients to the three tables (each
        occurrence of an id adds once), weight and bias (Triton backward kernels).

    Raises:
        TypeError: float (or bool) ids, a non-tensor argument, or mismatched table dtypes.
        ValueError: mismatched shapes or devices, an id outside its table, H > 4096,
            dropout_p outside [0, 1), or tensors the Triton kernels cannot reach (not CUDA,
            and not the CPU under TRITON_INTERPRET=1).
    """
    return EMBEDDINGS_LAYER_NORM(
        input_ids,
        token_type_ids,
        position_ids,
        word_emb,
        pos_emb,
        type_emb,
        weight,
        bias,
        eps,
        check_ids=check_ids,
        dropout_p=dropout_p,
        padding_idx=padding_idx,
        position_padding_idx=position_padding_idx,
    )
