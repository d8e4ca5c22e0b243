"""Test-only view of the kernels' dropout: the keep mask kernels/_dropout.py draws for a seed,
so that a test can apply the very same mask to the float64 reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from fastbert.kernels._dropout import draw_seed, keep_mask

BLOCK = 1024


@triton.jit
def _keep_mask_kernel(out_ptr, numel, seed, p, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = keep_mask(seed, offsets, p)
    tl.store(out_ptr + offsets, keep.to(tl.int8), mask=offsets < numel)


def keep_mask_of(seed: int, shape: tuple[int, ...], p: float, device: str) -> torch.Tensor:
    """The bool keep decisions of elements 0 .. numel - 1 (row-major over ``shape``) under
    ``seed``: the mask a kernel numbering its elements row * N + col applies."""
    numel = 1
    for size in shape:
        numel *= size
    out = torch.empty(numel, dtype=torch.int8, device=device)
    _keep_mask_kernel[(triton.cdiv(numel, BLOCK),)](out, numel, seed, p, BLOCK=BLOCK)
    return out.view(shape).bool()


def next_seed(rng_seed: int) -> int:
    """The seed an op draws first after ``torch.manual_seed(rng_seed)``."""
    torch.manual_seed(rng_seed)
    return draw_seed()
