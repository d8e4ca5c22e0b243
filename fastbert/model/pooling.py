"""Sentence-embedding pooling as sentence-transformers' ``Pooling`` module computes it.

Every function of :data:`POOLINGS` takes ``hidden`` [B, S, H] (any float dtype) and
``attention_mask`` [B, S] (1 = a real token; right or left padding) and returns [B, H] in
float32. Sums run in float32, as sentence-transformers accumulates half-precision inputs.
Positions the mask excludes may hold any finite value. :func:`pool_packed` computes the same
on B sequences packed end to end ([T, H] rows and their boundaries), with nothing padded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens; a row with no real token gives zeros."""
    weights = attention_mask.to(torch.float32).unsqueeze(-1)
    summed = (hidden.float() * weights).sum(dim=1)
    return summed / weights.sum(dim=1).clamp(min=1e-9)


def mean_sqrt_len_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Sum over real tokens divided by the square root of their count."""
    weights = attention_mask.to(torch.float32).unsqueeze(-1)
    summed = (hidden.float() * weights).sum(dim=1)
    return summed / torch.sqrt(weights.sum(dim=1).clamp(min=1e-9))


def cls_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The first real token's hidden state (BERT's [CLS]; after any left padding)."""
    first = attention_mask.to(torch.int32).argmax(dim=1)
    return hidden[torch.arange(hidden.shape[0], device=hidden.device), first].float()


def max_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum over real tokens (-inf for a row with none)."""
    real = attention_mask.bool().unsqueeze(-1)
    return hidden.float().masked_fill(~real, float("-inf")).max(dim=1).values


def weighted_mean_pool(
    hidden: torch.Tensor, attention_mask: torch.Tensor, pooled_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean over real tokens weighted by position (1, 2, ... from the first real token).
    ``pooled_mask`` [B, S]: the tokens to pool when fewer than the real ones (a prompt left
    out), which keep the positions they have among the real ones."""
    pooled = attention_mask if pooled_mask is None else pooled_mask
    mask = pooled.to(torch.float32).unsqueeze(-1)
    positions = torch.arange(1, hidden.shape[1] + 1, device=hidden.device, dtype=torch.float32)
    left_padding = attention_mask.to(torch.int32).argmax(dim=1)
    weights = mask * (positions.view(1, -1, 1) - left_padding.view(-1, 1, 1))
    summed = (hidden.float() * weights).sum(dim=1)
    return summed / weights.sum(dim=1).clamp(min=1e-9)


def last_token_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The last real token's hidden state (zeros for a row with no real token)."""
    seq = hidden.shape[1]
    found, from_end = attention_mask.flip(1).max(dim=1)
    last = torch.where(found == 0, seq - 1, seq - 1 - from_end)
    rows = torch.arange(hidden.shape[0], device=hidden.device)
    return hidden[rows, last].float() * found.to(torch.float32).unsqueeze(-1)


# sentence-transformers' pooling_mode names -> the function that computes each.
POOLINGS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "cls": cls_pool,
    "max": max_pool,
    "mean": mean_pool,
    "mean_sqrt_len_tokens": mean_sqrt_len_pool,
    "weightedmean": weighted_mean_pool,
    "lasttoken": last_token_pool,
}
# The older config format's flags, in the order sentence-transformers concatenates the modes.
LEGACY_POOLING_FLAGS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}


def without_prompt(attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """``attention_mask`` [B, S] with each row's first ``prompt_length`` real tokens (the
    prompt's, special token included) masked out, as sentence-transformers' Pooling does with
    ``include_prompt=False``."""
    mask = attention_mask.clone()
    left_padding = mask.to(torch.int32).argmax(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device).unsqueeze(0)
    mask[positions < (left_padding + prompt_length).unsqueeze(1)] = 0
    return mask


def pool(
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    modes: tuple[str, ...],
    prompt_length: int = 0,
) -> torch.Tensor:
    """The pooled embeddings of ``modes`` (names of :data:`POOLINGS`) concatenated in order:
    [B, len(modes) * H], float32. ``prompt_length``: leave each row's first tokens out (see
    :func:`without_prompt`)."""
    pooled_mask = without_prompt(attention_mask, prompt_length) if prompt_length else None
    out = []
    for mode in modes:
        if mode == "weightedmean":
            out.append(weighted_mean_pool(hidden, attention_mask, pooled_mask))
        else:
            mask = attention_mask if pooled_mask is None else pooled_mask
            out.append(POOLINGS[mode](hidden, mask))
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)


@dataclasses.dataclass(frozen=True)
class Segments:
    """B sequences packed end to end in T rows: ``index`` int64 [T] holds each row's
    sequence, ``count`` is B."""

    index: torch.Tensor
    count: int

    @classmethod
    def of(cls, cu_seqlens: torch.Tensor, tokens: int) -> Segments:
        """The segments of ``cu_seqlens`` [B + 1] (integers from 0 to ``tokens``), built on
        its device without reading it back."""
        count = cu_seqlens.numel() - 1
        sequences = torch.arange(count, device=cu_seqlens.device)
        index = torch.repeat_interleave(sequences, cu_seqlens.diff().long(), output_size=tokens)
        return cls(index, count)

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """[T, ...] -> [B, ...]: each sequence's sum (zeros for an empty one)."""
        out = values.new_zeros(self.count, *values.shape[1:])
        return out.index_add_(0, self.index, values)

    def reduce(self, values: torch.Tensor, how: str, empty: float) -> torch.Tensor:
        """[T, ...] -> [B, ...]: each sequence's "amax" or "amin" (``empty`` for an empty
        one)."""
        out = values.new_full((self.count, *values.shape[1:]), empty)
        index = self.index.view(-1, *([1] * (values.dim() - 1))).expand_as(values)
        return out.scatter_reduce_(0, index, values, how, include_self=True)


def pool_packed(
    hidden: torch.Tensor,
    attention_mask: torch.Tensor,
    cu_seqlens: torch.Tensor,
    modes: tuple[str, ...],
    prompt_length: int = 0,
) -> torch.Tensor:
    """:func:`pool` of B sequences packed end to end: ``hidden`` [T, H] (any float dtype),
    ``attention_mask`` [T] (1 = a real token), ``cu_seqlens`` [B + 1] (sequence b is rows
    ``cu_seqlens[b]`` to ``cu_seqlens[b + 1]``). Returns [B, len(modes) * H] float32: what
    :func:`pool` gives the same sequences padded (a sequence with no pooled token gives zeros
    for cls and lasttoken)."""
    tokens = hidden.shape[0]
    segments = Segments.of(cu_seqlens, tokens)
    rows = torch.arange(tokens, device=hidden.device)
    real = attention_mask.bool()
    pooled, rank = real, None
    if prompt_length or "weightedmean" in modes:
        # Each row's place among its sequence's tokens from the first real one (the padded
        # batch's position minus its left padding).
        first_real = segments.reduce(torch.where(real, rows, tokens), "amin", tokens)
        rank = rows - first_real[segments.index]
        pooled = real & (rank >= prompt_length) if prompt_length else real
    values = hidden.float()
    out = []
    for mode in modes:
        if mode in ("cls", "lasttoken"):
            if mode == "cls":
                pick = segments.reduce(torch.where(pooled, rows, tokens), "amin", tokens)
            else:
                pick = segments.reduce(torch.where(pooled, rows, -1), "amax", -1)
            found = (pick >= 0) & (pick < tokens)
            out.append(values[pick.clamp(0, max(tokens - 1, 0))] * found.unsqueeze(-1))
        elif mode == "max":
            masked = values.masked_fill(~pooled.unsqueeze(-1), float("-inf"))
            out.append(segments.reduce(masked, "amax", float("-inf")))
        elif mode in ("mean", "mean_sqrt_len_tokens", "weightedmean"):
            weights = pooled.to(torch.float32)
            if mode == "weightedmean":
                weights = weights * (rank + 1).to(torch.float32)
            summed = segments.sum(values * weights.unsqueeze(-1))
            count = segments.sum(weights).clamp(min=1e-9).unsqueeze(-1)
            out.append(summed / (count.sqrt() if mode == "mean_sqrt_len_tokens" else count))
        else:
            raise ValueError(f"pooling mode {mode!r} is not one of {', '.join(POOLINGS)}")
    return out[0] if len(out) == 1 else torch.cat(out, dim=-1)
