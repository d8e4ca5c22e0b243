"""Sentence-embedding pooling as sentence-transformers does it."""

from __future__ import annotations

import torch


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of hidden [B, S, H] over real tokens (attention_mask [B, S], 1 = real) -> [B, H].

    Computed in float32; a row with no real token gives zeros.
    """
    weights = attention_mask.to(torch.float32).unsqueeze(-1)
    summed = (hidden.float() * weights).sum(dim=1)
    return summed / weights.sum(dim=1).clamp(min=1e-9)


def cls_pool(hidden: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The first token's hidden state (BERT's [CLS]) of hidden [B, S, H] -> [B, H], float32.

    ``attention_mask`` is accepted for a common signature with :func:`mean_pool`; the first
    token is always a real one.
    """
    return hidden[:, 0].float()


POOLINGS = {"mean": mean_pool, "cls": cls_pool}
