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
the ``triton`` backend of :mod:`fastbert.ops`. While torch.compile traces they call the custom
ops; in eager mode they call the launchers directly (the op dispatcher costs about 7 us a call,
some 0.6 ms per BERT-base forward), which run the same kernels.

Limits under compilation and CUDA graphs: ``embeddings_layer_norm`` checks the ids against the
tables on the host (one synchronisation per call, inside the op), so it compiles without a
graph break but cannot be captured in a CUDA graph: it carries the ``cudagraph_unsafe`` tag, so
Inductor's CUDA graphs (``mode="reduce-overhead"``) partition around it. The other ops do not
synchronise. Only the attention ops have a backward so far.
"""

from typing import Optional

import torch
from torch import Tensor

from fastbert import kernels as K
from fastbert.kernels import _checks, _dropout, flash_attention
from fastbert.kernels import flash_attention_backward as attention_bwd

# torch.library infers the op schemas from these annotations; it reads typing.Optional.
MaybeTensor = Optional[Tensor]  # noqa: UP045
MaybeFloat = Optional[float]  # noqa: UP045
MaybeStr = Optional[str]  # noqa: UP045
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
    scale, dropout_p = flash_attention.check_inputs(
        q, k, v, key_padding_mask, scale, dropout_p
    )
    out, lse = flash_attention.attention_forward(
        q, k, v, key_padding_mask, scale, dropout_p, _seed_value(seed), return_lse
    )
    return out.transpose(1, 2), q.new_empty((0,), dtype=torch.float32) if lse is None else lse


@_attention.register_fake
def _(q, k, v, key_padding_mask, scale, dropout_p=0.0, seed=None, return_lse=False):
    _checks.check_attention(q, k, v, key_padding_mask, scale)
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
        grad_out.transpose(1, 2), q, k, v, out.transpose(1, 2), lse, key_padding_mask, scale,
        dropout_p, _seed_value(seed),
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
    _checks.check_attention_varlen(q, k, v, cu_seqlens, 0, scale)
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
def _scaled_masked_softmax(
    scores: Tensor, key_padding_mask: MaybeTensor, scale: float
) -> Tensor:
    """scores: [B, H, S_q, S_k]; mask: [B, S_k] -> contiguous probabilities, scores' dtype."""
    return K.scaled_masked_softmax(scores, key_padding_mask, scale)


@_scaled_masked_softmax.register_fake
def _(scores, key_padding_mask, scale):
    _checks.check_softmax(scores, key_padding_mask, scale)
    return scores.new_empty(scores.shape)


@torch.library.custom_op("fastbert::linear", mutates_args=())
def _linear(
    x: Tensor,
    weight: Tensor,
    bias: MaybeTensor,
    activation: MaybeStr,
    residual: MaybeTensor,
) -> Tensor:
    """act(x @ weight.T + bias) + residual: x [..., K], weight [N, K] -> contiguous [..., N]."""
    return K.linear(x, weight, bias, activation, residual)


@_linear.register_fake
def _(x, weight, bias, activation, residual):
    _checks.check_linear(x, weight, bias, activation, residual)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("fastbert::layer_norm", mutates_args=())
def _layer_norm(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float, residual: MaybeTensor
) -> Tensor:
    """LayerNorm(x + residual) over the last dim: x [..., N] -> contiguous [..., N]."""
    return K.layer_norm(x, weight, bias, eps, residual)


@_layer_norm.register_fake
def _(x, weight, bias, eps, residual):
    _checks.check_layer_norm(x, weight, bias, eps, residual)
    return x.new_empty(x.shape)


@torch.library.custom_op(
    "fastbert::embeddings_layer_norm", mutates_args=(), tags=_HOST_SYNC_TAGS
)
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
) -> Tensor:
    """LayerNorm of the summed embeddings: ids [B, S] -> contiguous [B, S, H], tables' dtype."""
    return K.embeddings_layer_norm(
        input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias, eps
    )


@_embeddings_layer_norm.register_fake
def _(input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias, eps):
    _checks.check_embeddings(
        input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias, eps
    )
    batch, seq = input_ids.shape
    return word_emb.new_empty((batch, seq, word_emb.shape[1]))


def _compiling() -> bool:
    """True while torch.compile (or torch.export) traces: then the ops are called, so the
    graph holds them; in eager mode the launchers are called directly, skipping the
    dispatcher's few microseconds per call (the same kernels, bit for bit)."""
    return torch.compiler.is_compiling()


def _dropout_seed(dropout_p: float) -> Tensor | None:
    return _dropout.draw_seed_tensor() if dropout_p > 0.0 else None


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
    _checks.check_scale(scale)
    dropout_p = _dropout.check_dropout_p(dropout_p)
    out, _ = _attention(
        q, k, v, key_padding_mask, _as_float(scale), dropout_p, _dropout_seed(dropout_p),
        flash_attention.wants_gradients(q, k, v),
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
    _checks.check_scale(scale)
    dropout_p = _dropout.check_dropout_p(dropout_p)
    out, _ = _attention_varlen(
        q, k, v, cu_seqlens, max_seqlen, _as_float(scale), dropout_p, _dropout_seed(dropout_p),
        flash_attention.wants_gradients(q, k, v),
    )
    return out


def scaled_masked_softmax(
    scores: Tensor, key_padding_mask: Tensor | None = None, scale: float = 1.0
) -> Tensor:
    """``K.scaled_masked_softmax`` / ``fastbert::scaled_masked_softmax``."""
    if not _compiling():
        return K.scaled_masked_softmax(scores, key_padding_mask, scale)
    _checks.check_scale(scale)
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
    return _linear(x, weight, bias, activation, residual)


def layer_norm(
    x: Tensor, weight: Tensor, bias: Tensor, eps: float, residual: Tensor | None = None
) -> Tensor:
    """``K.layer_norm`` / ``fastbert::layer_norm``: LayerNorm(x + residual)."""
    if not _compiling():
        return K.layer_norm(x, weight, bias, eps, residual)
    _checks.check_eps(eps)
    return _layer_norm(x, weight, bias, float(eps), residual)


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
) -> Tensor:
    """``K.embeddings_layer_norm`` / ``fastbert::embeddings_layer_norm``: [B, S, H].

    ``check_ids=False`` skips the id-range check in eager mode; the custom op (used while
    torch.compile traces) always checks."""
    args = (input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias)
    if not _compiling():
        return K.embeddings_layer_norm(*args, eps, check_ids=check_ids)
    _checks.check_eps(eps)
    return _embeddings_layer_norm(*args, float(eps))


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
