"""Pooling on packed rows (fastbert.model.pooling.pool_packed) computes what pooling on the
padded batch computes, mode by mode, for right and left padding, masks with holes, empty rows
and a prompt left out."""

from __future__ import annotations

import pytest
import torch

from fastbert.model.pooling import POOLINGS, pool, pool_packed

MODES = sorted(POOLINGS)


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """hidden [5, 9, 4] and a mask with right padding, left padding, a hole, an empty row and
    a full row."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(5, 9, 4, generator=gen)
    mask = torch.zeros(5, 9, dtype=torch.long)
    mask[0, :6] = 1  # right padding
    mask[1, 3:] = 1  # left padding
    mask[2, :7] = 1
    mask[2, 4] = 0  # a hole
    mask[4] = 1  # no padding; row 3 is empty
    return hidden, mask


def _every_position(hidden: torch.Tensor, mask: torch.Tensor):
    """The padded batch as packed rows, padding included (each row one sequence of S)."""
    batch, seq, width = hidden.shape
    cu_seqlens = torch.arange(batch + 1, dtype=torch.int32) * seq
    return hidden.reshape(-1, width), mask.reshape(-1), cu_seqlens


@pytest.mark.parametrize("prompt_length", [0, 2])
@pytest.mark.parametrize("mode", MODES)
def test_packed_pooling_matches_padded(mode: str, prompt_length: int) -> None:
    hidden, mask = _batch(seed=1)
    expected = pool(hidden, mask, (mode,), prompt_length)
    got = pool_packed(*_every_position(hidden, mask), (mode,), prompt_length)
    # A row with no pooled token: the padded cls reads an unspecified position, the packed
    # one gives zeros; compare the others.
    has_tokens = torch.tensor([True, True, True, False, True])
    assert torch.allclose(got[has_tokens], expected[has_tokens], rtol=1e-6, atol=1e-6), mode
    if mode in ("mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", "cls"):
        assert torch.equal(got[3], torch.zeros(4))


def test_real_tokens_only_and_modes_concatenated() -> None:
    """The packed path's usual input: only the real tokens of right-padded rows."""
    hidden, mask = _batch(seed=2)
    mask[1] = 0
    mask[1, :3] = 1
    mask[2, 4] = 1
    mask[3, :2] = 1
    lengths = mask.sum(dim=1)
    cu_seqlens = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    packed = hidden[mask.bool()]
    ones = torch.ones(packed.shape[0], dtype=torch.long)
    modes = ("cls", "mean", "max", "lasttoken")
    expected = pool(hidden, mask, modes, 1)
    got = pool_packed(packed.to(torch.bfloat16).float(), ones, cu_seqlens, modes, 1)
    close = pool(hidden.to(torch.bfloat16).float(), mask, modes, 1)
    assert torch.allclose(got, close, rtol=1e-6, atol=1e-6)
    assert got.shape == expected.shape == (5, 16)


def test_unknown_mode_is_refused() -> None:
    hidden, mask = _batch(seed=3)
    with pytest.raises(ValueError, match="pooling mode 'median'"):
        pool_packed(*_every_position(hidden, mask), ("median",))
