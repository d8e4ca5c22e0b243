"""The Triton ops as PyTorch custom ops, ``torch.ops.fastbert.<name>``, so that a model built on
them can be wrapped in ``torch.compile`` (``fullgraph=True``) and captured in CUDA graphs.

Each op is registered with ``torch.library.custom_op``: PyTorch sees it as one opaque node
whose fake (meta) implementation gives the output's shape, strides and dtype from the inputs'
(and runs the shape / dtype checks, so a bad input fails while tracing), and whose real
implementation launches the Triton kernel of ``fastbert.kernels``. ``triton_op`` would let
Inductor see inside the kernels, but it needs the launchers to call their kernels through
``torch.library.wrap_triton``; the launchers in ``fastbert.kernels`` call them directly.

The ops are functional: each returns new tensors and mutates nothing. Every output is a
contiguous tensor; ``fastbert::attention`` returns the contiguous [B, S_q, H, D] buffer and the
public :func:`attention` below returns its ``.transpose(1, 2)`` view, as ``K.attention`` does.

The attention ops are differentiable: ``register_autograd`` connects them to the backward ops
``fastbert::attention_backward`` / ``fastbert::attention_varlen_backward`` (Triton kernels),
so ``torch.compile(fullgraph=True)`` traces training. They return (out, lse): the fp32
log-sum-exp their backward needs, stored only when ``return_lse`` is set (the public functions
set it when an input requires grad; an empty tensor otherwise). With ``dropout_p`` > 0 they
take the dropout's Philox seed as an int64 CPU scalar tensor, drawn by the public functions
from torch's default generator (a traced random op, so no graph break), and the backward
regenerates the same mask from it.

The public functions here have the signatures of :mod:`fastbert.kernels.reference`; they are
the ``triton`` backend of :mod:`fastbert.execution.backends`. While torch.compile traces they call
the custom
ops; in eager mode they call the launchers directly (the op dispatcher costs about 7 us a call,
some 0.6 ms per BERT-base forward), which run the same kernels.

Limits under compilation and CUDA graphs: ``embeddings_layer_norm`` checks the ids against the
tables on the host (one synchronisation per call, inside the op), so it compiles without a
graph break but cannot be captured in a CUDA graph: it carries the ``cudagraph_unsafe`` tag, so
Inductor's CUDA graphs (``mode="reduce-overhead"``) partition around it. The other ops do not
synchronise.

Training: every op is differentiable. The attention ops return (out, lse) as above; the others
have ``register_autograd`` whose backward calls a backward custom op
(``fastbert::<op>_backward``, with a fake implementation), so ``torch.compile(fullgraph=True)``
traces a training step. To give the backward what it needs, ``fastbert::linear`` also returns
the pre-activation and ``fastbert::layer_norm`` / ``fastbert::embeddings_layer_norm`` the
float32 row statistics, each only when the public function's inputs require grad (an empty [0]
tensor otherwise). Dropout seeds pass to the ops as 0-d int64 CPU tensors drawn from PyTorch's
default generator (``torch.manual_seed`` makes them reproducible), so tracing needs no
``.item()``.
"""

from typing import Optional

import torch
from torch import Tensor

from fastbert import kernels as K
from fastbert.kernels import checks, dropout, flash_attention
from fastbert.kernels import flash_attention_backward as attention_bwd
from fastbert.kernels import fused_embeddings as embeddings_kernels
from fastbert.kernels import fused_layer_norm as layer_norm_kernels
from fastbert.kernels import fused_linear as linear_kernels
from fastbert.kernels import masked_softmax as softmax_kernels
from fastbert.kernels.dropout import check_dropout_p, draw_seed_tensor
from fastbert.kernels.launch import needs_grad

# torch.library infers the op schemas from these annotations; it reads typing.Optional.
MaybeTensor = Optional[Tensor]  # noqa: UP045
MaybeFloat = Optional[float]  # noqa: UP045
MaybeStr = Optional[str]  # noqa: UP045
MaybeInt = Optional[int]  # noqa: UP045
# Ops that synchronise with the host carry this tag (absent from older torch releases).
_HOST_SYNC_TAGS = [t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None]


def _seed_value(seed: Tensor | None) -> int:
    """The dropout seed the public functions drew (an int64 CPU scalar), or 0 without one."""
    return 0 if seed is None else int(seed)


@torch.library.custom_op("fastbert::attention", mutates_args=())
def _attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: MaybeTensor,
    scale: MaybeFloat,
    dropout_p: float = 0.0,
    seed: MaybeTensor = None,
    return_lse: bool = False,
) -> tuple[Tensor, Tensor]:
    """q: [B, H, S_q, D]; k, v: [B, H, S_k, D]; mask: [B, S_k] -> (contiguous [B, S_q, H, D],
    fp32 [B, H, S_q] log-sum-exp if return_lse else an empty tensor)."""
    scale, dropout_p = flash_attention.check_inputs(q, k, v, key_padding_mask, scale, dropout_p)
    out, lse = flash_attention.attention_forward(
        q, k, v, key_padding_mask, scale, dropout_p, _seed_value(seed), return_lse
    )
    return out.transpose(1, 2), q.new_empty((0,), dtype=torch.float32) if lse is None else lse


@_attention.register_fake
def _(q, k, v, key_padding_mask, scale, dropout_p=0.0, seed=None, return_lse=False):
    checks.check_attention(q, k, v, key_padding_mask, scale)
    batch, heads, seq_q, head_dim = q.shape
    lse_shape = (batch, heads, seq_q) if return_lse else (0,)
    return q.new_empty((batch, seq_q, heads, head_dim)), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("fastbert::attention_backward", mutates_args=())
def _attention_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    key_padding_mask: MaybeTensor,
    scale: float,
    dropout_p: float,
    seed: MaybeTensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """grad_out, out: [B, S_q, H, D] (the forward op's layout); lse: fp32 [B, H, S_q] ->
    (dq, dk, dv), contiguous [B, S, H, D] buffers in q's dtype."""
    grads = attention_bwd.attention_backward(
        grad_out.transpose(1, 2),
        q,
        k,
        v,
        out.transpose(1, 2),
        lse,
        key_padding_mask,
        scale,
        dropout_p,
        _seed_value(seed),
    )
    return tuple(g.transpose(1, 2) for g in grads)


@_attention_backward.register_fake
def _(grad_out, q, k, v, out, lse, key_padding_mask, scale, dropout_p, seed):
    return tuple(t.new_empty(t.transpose(1, 2).shape) for t in (q, k, v))


def _setup_attention(ctx, inputs, output) -> None:
    q, k, v, key_padding_mask, scale, dropout_p, seed, _ = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], key_padding_mask, seed)
    ctx.scale, ctx.dropout_p = flash_attention.resolve_scale(q, scale), dropout_p


def _attention_grads(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, key_padding_mask, seed = ctx.saved_tensors
    _check_lse_saved(lse)
    dq, dk, dv = _attention_backward(
        grad_out, q, k, v, out, lse, key_padding_mask, ctx.scale, ctx.dropout_p, seed
    )
    grads = (g.transpose(1, 2) for g in (dq, dk, dv))
    return (*grads, None, None, None, None, None)


_attention.register_autograd(_attention_grads, setup_context=_setup_attention)


@torch.library.custom_op("fastbert::attention_varlen", mutates_args=())
def _attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    scale: MaybeFloat,
    dropout_p: float = 0.0,
    seed: MaybeTensor = None,
    return_lse: bool = False,
) -> tuple[Tensor, Tensor]:
    """q, k, v: packed [T, H, D]; cu_seqlens: int32 [B + 1] -> (contiguous [T, H, D], fp32
    [H, T] log-sum-exp if return_lse else an empty tensor)."""
    scale, dropout_p = flash_attention.check_varlen_inputs(
        q, k, v, cu_seqlens, max_seqlen, scale, dropout_p
    )
    out, lse = flash_attention.attention_varlen_forward(
        q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, _seed_value(seed), return_lse
    )
    return out, q.new_empty((0,), dtype=torch.float32) if lse is None else lse


@_attention_varlen.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, scale, dropout_p=0.0, seed=None, return_lse=False):
    # max_seqlen may be symbolic while tracing; the real op checks its value.
    checks.check_attention_varlen(q, k, v, cu_seqlens, 0, scale)
    lse_shape = (q.shape[1], q.shape[0]) if return_lse else (0,)
    return q.new_empty(q.shape), q.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("fastbert::attention_varlen_backward", mutates_args=())
def _attention_varlen_backward(
    grad_out: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    scale: float,
    dropout_p: float,
    seed: MaybeTensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """grad_out, out: [T, H, D]; lse: fp32 [H, T] -> (dq, dk, dv), contiguous [T, H, D]."""
    return attention_bwd.attention_varlen_backward(
        grad_out, q, k, v, out, lse, cu_seqlens, max_seqlen, scale, dropout_p, _seed_value(seed)
    )


@_attention_varlen_backward.register_fake
def _(grad_out, q, k, v, out, lse, cu_seqlens, max_seqlen, scale, dropout_p, seed):
    return tuple(t.new_empty(t.shape) for t in (q, k, v))


def _setup_attention_varlen(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, seed, _ = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1], cu_seqlens, seed)
    ctx.max_seqlen, ctx.dropout_p = max_seqlen, dropout_p
    ctx.scale = flash_attention.resolve_scale(q, scale)


def _attention_varlen_grads(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, cu_seqlens, seed = ctx.saved_tensors
    _check_lse_saved(lse)
    grads = _attention_varlen_backward(
        grad_out, q, k, v, out, lse, cu_seqlens, ctx.max_seqlen, ctx.scale, ctx.dropout_p, seed
    )
    return (*grads, None, None, None, None, None, None)


_attention_varlen.register_autograd(_attention_varlen_grads, setup_context=_setup_attention_varlen)


def _check_lse_saved(lse: Tensor) -> None:
    if lse.dim() == 1 and lse.numel() == 0:
        raise RuntimeError(
            "the fastbert attention op ran with return_lse=False, so it saved nothing for its "
            "backward; call it with return_lse=True when gradients are needed"
        )


@torch.library.custom_op("fastbert::scaled_masked_softmax", mutates_args=())
def _scaled_masked_softmax(scores: Tensor, key_padding_mask: MaybeTensor, scale: float) -> Tensor:
    """scores: [B, H, S_q, S_k]; mask: [B, S_k] -> contiguous probabilities, scores' dtype."""
    softmax_kernels.check_inputs(scores, key_padding_mask, scale)
    return softmax_kernels.scaled_masked_softmax_forward(scores, key_padding_mask, scale)


@_scaled_masked_softmax.register_fake
def _(scores, key_padding_mask, scale):
    checks.check_softmax(scores, key_padding_mask, scale)
    return scores.new_empty(scores.shape)


@torch.library.custom_op("fastbert::scaled_masked_softmax_backward", mutates_args=())
def _scaled_masked_softmax_backward(probs: Tensor, dprobs: Tensor, scale: float) -> Tensor:
    """Gradient of the scores from the probabilities and their gradient, all [B, H, S_q, S_k]."""
    return softmax_kernels.scaled_masked_softmax_backward(probs, dprobs, scale)


@_scaled_masked_softmax_backward.register_fake
def _(probs, dprobs, scale):
    return probs.new_empty(probs.shape)


def _softmax_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.scale = inputs[2]


def _softmax_grad(ctx, dprobs):
    (probs,) = ctx.saved_tensors
    return _scaled_masked_softmax_backward(probs, dprobs, ctx.scale), None, None


_scaled_masked_softmax.register_autograd(_softmax_grad, setup_context=_softmax_setup)


@torch.library.custom_op("fastbert::linear", mutates_args=())
def _linear(
    x: Tensor,
    weight: Tensor,
    bias: MaybeTensor,
    activation: MaybeStr,
    residual: MaybeTensor,
    save_pre_activation: bool,
) -> tuple[Tensor, Tensor]:
    """act(x @ weight.T + bias) + residual: x [..., K], weight [N, K] -> (contiguous [..., N],
    the [M, N] pre-activation when ``save_pre_activation`` and there is an activation, else an
    empty [0] tensor)."""
    linear_kernels.check_inputs(x, weight, bias, activation, residual)
    out, pre = linear_kernels.linear_forward(
        x, weight, bias, activation, residual, save_pre_activation
    )
    return out, pre if pre is not None else x.new_empty(0)


def _pre_activation_shape(x, weight, activation, save: bool) -> tuple[int, ...]:
    if not (save and activation is not None):
        return (0,)
    return (x.numel() // x.shape[-1] if x.shape[-1] else 0, weight.shape[0])


@_linear.register_fake
def _(x, weight, bias, activation, residual, save_pre_activation):
    checks.check_linear(x, weight, bias, activation, residual)
    out = x.new_empty((*x.shape[:-1], weight.shape[0]))
    return out, x.new_empty(_pre_activation_shape(x, weight, activation, save_pre_activation))


@torch.library.custom_op("fastbert::linear_backward", mutates_args=())
def _linear_backward(
    dout: Tensor, x: Tensor, weight: Tensor, pre: Tensor, activation: MaybeStr
) -> tuple[Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias) of act(x @ weight.T + bias) + residual from the output gradient
    and the pre-activation the forward saved (unused without an activation)."""
    saved = pre if activation is not None else None
    return linear_kernels.linear_backward(dout, x, weight, saved, activation, (True,) * 3)


@_linear_backward.register_fake
def _(dout, x, weight, pre, activation):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape[0])


def _linear_setup(ctx, inputs, output):
    x, weight, bias, activation, residual, _ = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.activation = activation
    ctx.has_bias, ctx.has_residual = bias is not None, residual is not None


def _linear_grad(ctx, dout, _dpre):
    x, weight, pre = ctx.saved_tensors
    dx, dweight, dbias = _linear_backward(dout, x, weight, pre, ctx.activation)
    dbias = dbias if ctx.has_bias else None
    dresidual = dout if ctx.has_residual else None
    return dx, dweight, dbias, None, dresidual, None


_linear.register_autograd(_linear_grad, setup_context=_linear_setup)


@torch.library.custom_op("fastbert::layer_norm", mutates_args=())
def _layer_norm(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    residual: MaybeTensor,
    dropout_p: float,
    seed: MaybeTensor,
    save_stats: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """LayerNorm(dropout(x) + residual) over the last dim: x [..., N] -> (contiguous [..., N],
    float32 row means and rstd, [rows] when ``save_stats`` else empty). ``seed``: the 0-d int64
    CPU tensor of the dropout mask (None without dropout)."""
    layer_norm_kernels.check_inputs(x, weight, bias, eps, residual, dropout_p)
    out, mean, rstd = layer_norm_kernels.layer_norm_forward(
        x, weight, bias, eps, residual, dropout_p, _seed(seed), save_stats
    )
    return out, *_stats_or_empty(mean, rstd, x)


@_layer_norm.register_fake
def _(x, weight, bias, eps, residual, dropout_p, seed, save_stats):
    checks.check_layer_norm(x, weight, bias, eps, residual)
    rows = x.numel() // x.shape[-1] if save_stats and x.shape[-1] else 0
    stats = [x.new_empty(rows, dtype=torch.float32) for _ in range(2)]
    return x.new_empty(x.shape), *stats


@torch.library.custom_op("fastbert::layer_norm_backward", mutates_args=())
def _layer_norm_backward(
    dout: Tensor,
    x: Tensor,
    weight: Tensor,
    residual: MaybeTensor,
    mean: Tensor,
    rstd: Tensor,
    dropout_p: float,
    seed: MaybeTensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dx, dweight, dbias, dresidual) of LayerNorm(dropout(x) + residual); dresidual is an
    empty [0] tensor without a residual."""
    dx, dweight, dbias, dres = layer_norm_kernels.layer_norm_backward(
        dout, x, weight, residual, mean, rstd, dropout_p, _seed(seed)
    )
    return dx, dweight, dbias, dres if dres is not None else x.new_empty(0)


@_layer_norm_backward.register_fake
def _(dout, x, weight, residual, mean, rstd, dropout_p, seed):
    dres = x.new_empty(x.shape if residual is not None else (0,))
    grads = (x.new_empty(x.shape), weight.new_empty(weight.shape), weight.new_empty(weight.shape))
    return (*grads, dres)


def _layer_norm_setup(ctx, inputs, output):
    x, weight, _, _, residual, dropout_p, seed, _ = inputs
    ctx.save_for_backward(x, weight, residual, output[1], output[2], seed)
    ctx.dropout_p = dropout_p


def _layer_norm_grad(ctx, dout, _dmean, _drstd):
    x, weight, residual, mean, rstd, seed = ctx.saved_tensors
    dx, dweight, dbias, dres = _layer_norm_backward(
        dout, x, weight, residual, mean, rstd, ctx.dropout_p, seed
    )
    return dx, dweight, dbias, None, dres if residual is not None else None, None, None, None


_layer_norm.register_autograd(_layer_norm_grad, setup_context=_layer_norm_setup)


@torch.library.custom_op("fastbert::embeddings_layer_norm", mutates_args=(), tags=_HOST_SYNC_TAGS)
def _embeddings_layer_norm(
    input_ids: Tensor,
    token_type_ids: MaybeTensor,
    position_ids: MaybeTensor,
    word_emb: Tensor,
    pos_emb: Tensor,
    type_emb: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    dropout_p: float,
    seed: MaybeTensor,
    save_stats: bool,
    padding_idx: MaybeInt = None,
    position_padding_idx: MaybeInt = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """dropout(LayerNorm of the summed embeddings): ids [B, S] -> (contiguous [B, S, H] in the
    tables' dtype, float32 [B * S] means and rstd when ``save_stats`` else empty). The ids are
    checked against the tables first (a host synchronisation). The padding rows get no
    gradient in the backward."""
    embeddings_kernels.check_inputs(
        input_ids,
        token_type_ids,
        position_ids,
        word_emb,
        pos_emb,
        type_emb,
        weight,
        bias,
        eps,
        check_ids=True,
        dropout_p=dropout_p,
    )
    out, mean, rstd = embeddings_kernels.embeddings_layer_norm_forward(
        (input_ids, token_type_ids, position_ids),
        (word_emb, pos_emb, type_emb),
        weight,
        bias,
        eps,
        dropout_p,
        _seed(seed),
        save_stats,
    )
    return out, *_stats_or_empty(mean, rstd, word_emb)


@_embeddings_layer_norm.register_fake
def _(
    input_ids,
    token_type_ids,
    position_ids,
    word_emb,
    pos_emb,
    type_emb,
    weight,
    bias,
    eps,
    dropout_p,
    seed,
    save_stats,
    padding_idx=None,
    position_padding_idx=None,
):
    checks.check_embeddings(
        input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias, eps
    )
    batch, seq = input_ids.shape
    tokens = batch * seq if save_stats else 0
    stats = [word_emb.new_empty(tokens, dtype=torch.float32) for _ in range(2)]
    return word_emb.new_empty((batch, seq, word_emb.shape[1])), *stats


@torch.library.custom_op("fastbert::embeddings_layer_norm_backward", mutates_args=())
def _embeddings_layer_norm_backward(
    dout: Tensor,
    input_ids: Tensor,
    token_type_ids: MaybeTensor,
    position_ids: MaybeTensor,
    word_emb: Tensor,
    pos_emb: Tensor,
    type_emb: Tensor,
    weight: Tensor,
    mean: Tensor,
    rstd: Tensor,
    dropout_p: float,
    seed: MaybeTensor,
    padding_idx: MaybeInt = None,
    position_padding_idx: MaybeInt = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dword_emb, dpos_emb, dtype_emb, dweight, dbias) of the embeddings LayerNorm; the
    padding rows of the word and position tables get zeros."""
    return embeddings_kernels.embeddings_layer_norm_backward(
        dout,
        (input_ids, token_type_ids, position_ids),
        (word_emb, pos_emb, type_emb),
        weight,
        mean,
        rstd,
        dropout_p,
        _seed(seed),
        (padding_idx, position_padding_idx),
    )


@_embeddings_layer_norm_backward.register_fake
def _(
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
    padding_idx=None,
    position_padding_idx=None,
):
    tables = (word_emb, pos_emb, type_emb, weight, weight)
    return tuple(t.new_empty(t.shape) for t in tables)


def _embeddings_setup(ctx, inputs, output):
    ids, tables, weight = inputs[:3], inputs[3:6], inputs[6]
    dropout_p, seed = inputs[9], inputs[10]
    ctx.save_for_backward(*ids, *tables, weight, output[1], output[2], seed)
    ctx.dropout_p, ctx.padding_rows = dropout_p, inputs[12:14]


def _embeddings_grad(ctx, dout, _dmean, _drstd):
    *saved, seed = ctx.saved_tensors
    grads = _embeddings_layer_norm_backward(dout, *saved, ctx.dropout_p, seed, *ctx.padding_rows)
    return (None, None, None, *grads, None, None, None, None, None, None)


_embeddings_layer_norm.register_autograd(_embeddings_grad, setup_context=_embeddings_setup)


def _stats_or_empty(mean: Tensor | None, rstd: Tensor | None, like: Tensor):
    """The saved statistics, or two distinct empty float32 tensors (outputs may not alias)."""
    if mean is None:
        return tuple(like.new_empty(0, dtype=torch.float32) for _ in range(2))
    return mean, rstd


def _seed(seed: Tensor | None) -> int:
    """The Python int of a dropout seed tensor (0 without dropout)."""
    return 0 if seed is None else int(seed.item())


def _compiling() -> bool:
    """True while torch.compile (or torch.export) traces: then the ops are called, so the
    graph holds them; in eager mode the launchers are called directly, skipping the
    dispatcher's few microseconds per call (the same kernels, bit for bit)."""
    return torch.compiler.is_compiling()


def _dropout_seed(dropout_p: float) -> Tensor | None:
    return dropout.draw_seed_tensor() if dropout_p > 0.0 else None


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """``K.attention`` / ``fastbert::attention``: [B, H, S_q, D], the ``.transpose(1, 2)`` view
    of a contiguous [B, S_q, H, D] buffer (so ``out.transpose(1, 2).reshape(B, S_q, -1)`` is
    free). Differentiable in q, k and v."""
    if not _compiling():
        return K.attention(q, k, v, key_padding_mask, scale, dropout_p)
    checks.check_scale(scale)
    dropout_p = dropout.check_dropout_p(dropout_p)
    out, _ = _attention(
        q,
        k,
        v,
        key_padding_mask,
        _as_float(scale),
        dropout_p,
        _dropout_seed(dropout_p),
        needs_grad(q, k, v),
    )
    return out.transpose(1, 2)


def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    scale: float | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """``K.attention_varlen`` / ``fastbert::attention_varlen``: packed [T, H, D].
    Differentiable in q, k and v."""
    if not _compiling():
        return K.attention_varlen(q, k, v, cu_seqlens, max_seqlen, scale, dropout_p)
    checks.check_scale(scale)
    dropout_p = dropout.check_dropout_p(dropout_p)
    out, _ = _attention_varlen(
        q,
        k,
        v,
        cu_seqlens,
        max_seqlen,
        _as_float(scale),
        dropout_p,
        _dropout_seed(dropout_p),
        needs_grad(q, k, v),
    )
    return out


def scaled_masked_softmax(
    scores: Tensor, key_padding_mask: Tensor | None = None, scale: float = 1.0
) -> Tensor:
    """``K.scaled_masked_softmax`` / ``fastbert::scaled_masked_softmax``."""
    if not _compiling():
        return K.scaled_masked_softmax(scores, key_padding_mask, scale)
    checks.check_scale(scale)
    return _scaled_masked_softmax(scores, key_padding_mask, float(scale))


def linear(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
    residual: Tensor | None = None,
) -> Tensor:
    """``K.linear`` / ``fastbert::linear``: act(x @ weight.T + bias) + residual."""
    if not _compiling():
        return K.linear(x, weight, bias, activation, residual)
    save = needs_grad(x, weight, bias, residual)
    return _linear(x, weight, bias, activation, residual, save)[0]


def layer_norm(
    x: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    residual: Tensor | None = None,
    dropout_p: float = 0.0,
) -> Tensor:
    """``K.layer_norm`` / ``fastbert::layer_norm``: LayerNorm(dropout(x) + residual)."""
    if not _compiling():
        return K.layer_norm(x, weight, bias, eps, residual, dropout_p)
    checks.check_eps(eps)
    dropout_p = check_dropout_p(dropout_p)
    seed = draw_seed_tensor() if dropout_p > 0.0 else None
    save = needs_grad(x, weight, bias, residual)
    return _layer_norm(x, weight, bias, float(eps), residual, dropout_p, seed, save)[0]


def embeddings_layer_norm(
    input_ids: Tensor,
    token_type_ids: Tensor | None,
    position_ids: Tensor | None,
    word_emb: Tensor,
    pos_emb: Tensor,
    type_emb: Tensor,
    weight: Tensor,
    bias: Tensor,
    eps: float,
    *,
    check_ids: bool = True,
    dropout_p: float = 0.0,
    padding_idx: int | None = None,
    position_padding_idx: int | None = None,
) -> Tensor:
    """``K.embeddings_layer_norm`` / ``fastbert::embeddings_layer_norm``: [B, S, H].

    ``check_ids=False`` skips the id-range check in eager mode; the custom op (used while
    torch.compile traces) always checks."""
    args = (input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias)
    padding_rows = {"padding_idx": padding_idx, "position_padding_idx": position_padding_idx}
    if not _compiling():
        return K.embeddings_layer_norm(
            *args, eps, check_ids=check_ids, dropout_p=dropout_p, **padding_rows
        )
    checks.check_eps(eps)
    dropout_p = check_dropout_p(dropout_p)
    seed = draw_seed_tensor() if dropout_p > 0.0 else None
    save = needs_grad(word_emb, pos_emb, type_emb, weight, bias)
    return _embeddings_layer_norm(*args, float(eps), dropout_p, seed, save, **padding_rows)[0]


def _as_float(scale: float | None) -> float | None:
    return None if scale is None else float(scale)


__all__ = [
    "attention",
    "attention_varlen",
    "embeddings_layer_norm",
    "layer_norm",
    "linear",
    "scaled_masked_softmax",
]
