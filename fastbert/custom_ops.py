"""The Triton ops as PyTorch custom ops, ``torch.ops.fastbert.<name>``, so that a model built on
them can be wrapped in ``torch.compile`` (``fullgraph=True``) and captured in CUDA graphs.

Each op is registered with ``torch.library.custom_op``: PyTorch sees it as one opaque node
whose fake (meta) implementation gives the output's shape, strides and dtype from the inputs'
(and runs the shape / dtype checks, so a bad input fails while tracing), and whose real
implementation launches the Triton kernel of ``fastbert.kernels``. ``triton_op`` would let
Inductor see inside the kernels, but it needs the launchers to call their kernels through
``torch.library.wrap_triton``; the launchers in ``fastbert.kernels`` call them directly.

The ops are functional: each returns a new tensor and mutates nothing. Every output is a
contiguous tensor; ``fastbert::attention`` returns the contiguous [B, S_q, H, D] buffer and the
public :func:`attention` below returns its ``.transpose(1, 2)`` view, as ``K.attention`` does.

The public functions here have the signatures of :mod:`fastbert.kernels.reference`; they are
the ``triton`` backend of :mod:`fastbert.ops`. While torch.compile traces they call the custom
ops; in eager mode they call the launchers directly (the op dispatcher costs about 7 us a call,
some 0.6 ms per BERT-base forward), which run the same kernels.

Limits under compilation and CUDA graphs: ``embeddings_layer_norm`` checks the ids against the
tables on the host (one synchronisation per call, inside the op), so it compiles without a
graph break but cannot be captured in a CUDA graph: it carries the ``cudagraph_unsafe`` tag, so
Inductor's CUDA graphs (``mode="reduce-overhead"``) partition around it. The other ops do not
synchronise. No op has a backward (inference only).
"""

from typing import Optional

import torch
from torch import Tensor

from fastbert import kernels as K
from fastbert.kernels import _checks

# torch.library infers the op schemas from these annotations; it reads typing.Optional.
MaybeTensor = Optional[Tensor]  # noqa: UP045
MaybeFloat = Optional[float]  # noqa: UP045
MaybeStr = Optional[str]  # noqa: UP045
# Ops that synchronise with the host carry this tag (absent from older torch releases).
_HOST_SYNC_TAGS = [t for t in (getattr(torch.Tag, "cudagraph_unsafe", None),) if t is not None]

@torch.library.custom_op("fastbert::attention", mutates_args=())
def _attention(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: MaybeTensor, scale: MaybeFloat
) -> Tensor:
    """q: [B, H, S_q, D]; k, v: [B, H, S_k, D]; mask: [B, S_k] -> contiguous [B, S_q, H, D]."""
    return K.attention(q, k, v, key_padding_mask, scale).transpose(1, 2)


@_attention.register_fake
def _(q, k, v, key_padding_mask, scale):
    _checks.check_attention(q, k, v, key_padding_mask, scale)
    batch, heads, seq_q, head_dim = q.shape
    return q.new_empty((batch, seq_q, heads, head_dim))


@torch.library.custom_op("fastbert::attention_varlen", mutates_args=())
def _attention_varlen(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor, max_seqlen: int, scale: MaybeFloat
) -> Tensor:
    """q, k, v: packed [T, H, D]; cu_seqlens: int32 [B + 1] -> contiguous [T, H, D]."""
    return K.attention_varlen(q, k, v, cu_seqlens, max_seqlen, scale)


@_attention_varlen.register_fake
def _(q, k, v, cu_seqlens, max_seqlen, scale):
    # max_seqlen may be symbolic while tracing; the real op checks its value.
    _checks.check_attention_varlen(q, k, v, cu_seqlens, 0, scale)
    return q.new_empty(q.shape)


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


def attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """``K.attention`` / ``fastbert::attention``: [B, H, S_q, D], the ``.transpose(1, 2)`` view
    of a contiguous [B, S_q, H, D] buffer (so ``out.transpose(1, 2).reshape(B, S_q, -1)`` is
    free)."""
    if not _compiling():
        return K.attention(q, k, v, key_padding_mask, scale)
    _checks.check_scale(scale)
    return _attention(q, k, v, key_padding_mask, _as_float(scale)).transpose(1, 2)


def attention_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    max_seqlen: int,
    scale: float | None = None,
) -> Tensor:
    """``K.attention_varlen`` / ``fastbert::attention_varlen``: packed [T, H, D]."""
    if not _compiling():
        return K.attention_varlen(q, k, v, cu_seqlens, max_seqlen, scale)
    _checks.check_scale(scale)
    return _attention_varlen(q, k, v, cu_seqlens, max_seqlen, _as_float(scale))


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
