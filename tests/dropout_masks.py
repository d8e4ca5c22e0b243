"""Test-only view of the kernels' dropout: the seed an op draws, so that a test can rebuild
its keep mask (fastbert/kernels/dropout.keep_mask_of) and apply it to the float64 reference."""

from __future__ import annotations

import torch

from fastbert.kernels.dropout import draw_seed


def next_seed(rng_seed: int) -> int:
    """The seed an op draws first after ``torch.manual_seed(rng_seed)``."""
    torch.manual_seed(rng_seed)
    return draw_seed()
