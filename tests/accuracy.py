"""The correctness rule used by every kernel test (FlashAttention's standard).

A kernel's output in a low-precision dtype may differ from the float64 reference by at most
twice what PyTorch's own computation in that same dtype differs by, plus a floor of a couple of
units in the last place at the output's magnitude (the case where PyTorch happens to round
exactly onto the reference).
"""

from __future__ import annotations

import torch


def floor_for(dtype: torch.dtype, ref: torch.Tensor) -> float:
    """Two units in the last place of ``dtype`` at the largest magnitude of ``ref``."""
    magnitude = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    return 2.0 * torch.finfo(dtype).eps * magnitude


def assert_within_rule(
    out: torch.Tensor,
    out_torch: torch.Tensor,
    ref: torch.Tensor,
    where: torch.Tensor | None = None,
    what: str = "output",
) -> None:
    """max|out - ref| <= 2 * max|out_torch - ref| + floor, over positions ``where`` (bool)."""
    dtype = out.dtype
    out, out_torch, ref = (t.detach().double().cpu() for t in (out, out_torch, ref))
    if where is not None:
        where = where.cpu()
        out, out_torch, ref = out[where], out_torch[where], ref[where]
    assert torch.isfinite(out).all(), f"{what}: non-finite values"
    err = (out - ref).abs().max().item() if out.numel() else 0.0
    torch_err = (out_torch - ref).abs().max().item() if out.numel() else 0.0
    bound = 2.0 * torch_err + floor_for(dtype, ref)
    assert err <= bound, f"{what}: max error {err:.3g} > bound {bound:.3g} (torch {torch_err:.3g})"
