"""A fastbert-optimized Hugging Face sequence classifier run on packed sequences.

The ``*ForSequenceClassification`` heads of the supported families read one row per input of
the encoder's last hidden state: the first token's (BERT's pooler, the RoBERTa, XLM-R,
ELECTRA and MPNet classification heads, DistilBERT's pre-classifier, ModernBERT with
``classifier_pooling="cls"``), or the mean of its real tokens' (ModernBERT with ``"mean"``).
:func:`packed_logits` computes those rows from packed sequences
(:meth:`fastbert.BertModel.forward_packed`: no padding, nothing gathered or scattered) and runs
the model's own head on them, given as a one-token last hidden state [B, 1, H] with a mask of
ones, so the head's code is Hugging Face's. :func:`reads_head_rows_only` checks, on a padded
batch, that the head gives the same logits from those rows as from the whole hidden state, so
a head that reads other positions is found when the model loads (and runs padded) instead of
being scored wrongly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from fastbert.integrations.optimize import FastbertForward, base_model
from fastbert.model.pooling import pool_packed


def optimized_forward(model: Any) -> FastbertForward:
    """The :class:`FastbertForward` of a model that fastbert.optimize changed; TypeError for
    another."""
    forward = vars(base_model(model)[1]).get("forward")
    if not isinstance(forward, FastbertForward):
        raise TypeError(f"{type(model).__name__} is not fastbert-optimized: call fastbert.optimize")
    return forward


def head_rows(model: Any, hidden: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
    """The rows the classification head of ``model`` reads, per sequence: ``hidden`` [T, H]
    packed, ``cu_seqlens`` int [B + 1] on its device -> [B, H] in ``hidden``'s dtype, the
    first token's row, or the tokens' mean where the config's ``classifier_pooling`` (a
    ModernBERT's) is "mean"."""
    if getattr(model.config, "classifier_pooling", "cls") == "mean":
        ones = torch.ones(hidden.shape[0], dtype=torch.int64, device=hidden.device)
        return pool_packed(hidden, ones, cu_seqlens, ("mean",)).to(hidden.dtype)
    return hidden[cu_seqlens[:-1].long()]


def packed_logits(
    model: Any,
    input_ids: torch.Tensor,
    cu_seqlens: torch.Tensor | Sequence[int],
    token_type_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """A fastbert-optimized ``*ForSequenceClassification`` model's logits [B, num_labels] for
    B sequences packed end to end: ``input_ids`` [T] on the model's device, ``cu_seqlens``
    [B + 1] from 0 to T (built on the host), ``token_type_ids`` [T] or None. Call under
    torch.inference_mode() (or no_grad); valid where :func:`reads_head_rows_only` holds."""
    forward = optimized_forward(model)
    types = _token_types(forward, token_type_ids)
    hidden = forward.current_encoder().forward_packed(input_ids, cu_seqlens, types)
    offsets = torch.as_tensor(cu_seqlens).to(hidden.device, non_blocking=True)
    rows = head_rows(model, hidden, offsets)[:, None]
    return _head_logits(model, forward, rows, torch.ones_like(rows[..., 0], dtype=torch.int64))


def reads_head_rows_only(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    token_type_ids: torch.Tensor | None = None,
) -> bool:
    """Whether the head of a fastbert-optimized ``model`` gives, for a right-padded batch
    ([B, S] integers on its device), the same logits from :func:`head_rows` alone as from
    the whole last hidden state (within a few units of the dtype's rounding: the mean is
    summed in another order)."""
    forward = optimized_forward(model)
    with torch.inference_mode():
        types = _token_types(forward, token_type_ids)
        hidden = forward.current_encoder()(input_ids, attention_mask, types).last_hidden_state
        real = attention_mask.bool()
        lengths = real.sum(1)
        offsets = torch.nn.functional.pad(lengths.cumsum(0), (1, 0))
        rows = head_rows(model, hidden[real], offsets)[:, None]
        whole = _head_logits(model, forward, hidden, attention_mask)
        from_rows = _head_logits(model, forward, rows, torch.ones_like(lengths)[:, None])
    tolerance = 8 * torch.finfo(hidden.dtype).eps * max(1.0, whole.abs().max().item())
    return bool(((whole - from_rows).abs() <= tolerance).all())


def _token_types(
    forward: FastbertForward, token_type_ids: torch.Tensor | None
) -> torch.Tensor | None:
    """The token types the encoder reads: none for a family without them (DistilBERT, MPNet,
    ModernBERT ignore what a tokenizer gives, as Hugging Face does)."""
    return token_type_ids if forward.config.type_vocab_size else None


def _head_logits(
    model: Any, forward: FastbertForward, hidden: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """The model's logits with ``hidden`` [B, S, H] as its encoder's last hidden state."""
    placeholder = torch.zeros_like(attention_mask)
    with forward.returning(hidden):
        return model(input_ids=placeholder, attention_mask=attention_mask).logits


__all__ = ["head_rows", "optimized_forward", "packed_logits", "reads_head_rows_only"]
