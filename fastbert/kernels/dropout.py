"""Dropout inside the kernels: a keep mask regenerated from a seed and each element's index.

The mask is never stored. A forward draws one seed per call (:func:`draw_seed_tensor`, an
int64 CPU scalar tensor; :func:`seed_value` is the int the kernels take) and keeps it for its
backward, which regenerates the same keep decisions from (seed, element index) with
Triton's Philox generator (``tl.rand``). An element is kept with probability 1 - p and the
kept ones are scaled by 1 / (1 - p), as ``torch.nn.functional.dropout`` does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .launch import FUSED

# Seeds are drawn below 2**31 so that they pass to the kernels as int32 scalars.
_SEED_BOUND = 2**31 - 1


def check_dropout_p(dropout_p: object) -> float:
    """``dropout_p`` as a float, or ValueError unless it is a number with 0 <= p < 1 (p = 1
    would drop everything and scale by infinity)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    p = float(dropout_p)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout_p must be in [0, 1), got {p}")
    return p


def draw_seed_tensor() -> torch.Tensor:
    """The Philox seed of one dropout call as an int64 CPU scalar tensor, from PyTorch's default
    CPU generator (what torch.compile traces: reading it on the host happens inside an op)."""
    return torch.randint(0, _SEED_BOUND, (), dtype=torch.int64)


def seed_value(seed: torch.Tensor | None) -> int:
    """The int a kernel takes of a seed tensor of :func:`draw_seed_tensor` (0 without one)."""
    return 0 if seed is None else int(seed)


def draw_seed() -> int:
    """The Philox seed of one dropout call, from PyTorch's default CPU generator: so
    ``torch.manual_seed`` makes the masks reproducible, and no device synchronises."""
    return int(draw_seed_tensor().item())


@triton.jit
def keep_mask(seed, offsets, p):
    """Bool keep decisions of the elements numbered ``offsets`` (int32 or int64 tensor, unique
    per element of one call) under ``seed``: each True with probability 1 - p."""
    return tl.rand(seed, offsets) >= p


@triton.jit
def dropped(x, seed, offsets, p):
    """``x`` with dropout applied: x / (1 - p) where :func:`keep_mask` keeps, 0 elsewhere.
    The scale 1 / (1 - p) is the GPU's approximate division (within 2 units in the last place):
    immaterial to a random mask, and the IEEE one spilled registers under Triton 3.6 (the
    embeddings' backward on sm_90)."""
    return tl.where(keep_mask(seed, offsets, p), x * (1.0 / (1.0 - p)), 0.0)


@triton.jit
def _keep_mask_kernel(Out, numel, seed, p, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Out + offsets, keep_mask(seed, offsets, p), mask=offsets < numel)


def keep_mask_of(
    shape: tuple[int, ...], seed: int, p: float, device: torch.device | str
) -> torch.Tensor:
    """Bool tensor of ``shape``: the keep decision of each element, numbered by its row-major
    flat index (int64 offsets), under ``seed`` and ``p``: the mask a kernel that numbers its
    elements that way applies (the attention kernels number (b, h, i, j) as the flat index of
    [B, H, S_q, S_k], and varlen (h, i, j) as that of [H, T, T]). For tests and debugging."""
    out = torch.empty(shape, dtype=torch.bool, device=device)
    block = 1024
    if out.numel():
        _keep_mask_kernel[(-(out.numel() // -block),)](
            out, out.numel(), seed, p, BLOCK=block, **FUSED
        )
    return out
