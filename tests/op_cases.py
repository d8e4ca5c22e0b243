"""Helpers shared by the per-op kernel tests: dtype grids, random inputs, masks, the rule.

Every op test runs the Triton kernel on inputs in a dtype X, the reference op on the same
inputs (dtype X) and the reference on float64 copies of them, then applies
:func:`tests.accuracy.assert_within_rule`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from tests.accuracy import assert_within_rule

GPU = pytest.mark.gpu


def dtype_params(cpu: Sequence[torch.dtype], gpu_only: Sequence[torch.dtype] = ()) -> list:
    """pytest params: ``cpu`` dtypes run everywhere, ``gpu_only`` ones carry the gpu mark."""
    name = lambda d: str(d).removeprefix("torch.")
    return [
        *(pytest.param(d, id=name(d)) for d in cpu),
        *(pytest.param(d, id=name(d), marks=GPU) for d in gpu_only),
    ]


# tl.dot under the interpreter multiplies raw bf16 bit patterns: bf16 GEMMs are GPU-only.
ALL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DOT_DTYPES = dtype_params((torch.float32, torch.float16), (torch.bfloat16,))
ELEMENTWISE_DTYPES = dtype_params(ALL_DTYPES)


def randn(
    shape: Sequence[int], dtype: torch.dtype, device: str, seed: int, scale: float = 1.0
) -> torch.Tensor:
    """Seeded N(0, scale^2) values of ``shape``, drawn in float32 then rounded to ``dtype``."""
    gen = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(tuple(shape), generator=gen)).to(device=device, dtype=dtype)


def padded_mask(
    lengths: Sequence[int], seq: int, dtype: torch.dtype = torch.bool, device: str = "cpu"
) -> torch.Tensor:
    """[len(lengths), seq] key-padding mask: row b is 1 / True on its first lengths[b] keys."""
    mask = torch.arange(seq)[None, :] < torch.tensor(list(lengths))[:, None]
    return mask.to(device=device, dtype=dtype)


def lengths_for(batch: int, seq: int) -> list[int]:
    """Real lengths of a padded batch of ``batch`` rows: seq, then shorter ones (at least 1)."""
    return [max(1, seq - (seq * i) // batch) for i in range(batch)]


def float64(x: object) -> object:
    """A float64 copy of a floating-point tensor; anything else unchanged."""
    if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
        return x.double()
    return x


def check_op(
    kernel: Callable[..., torch.Tensor],
    reference: Callable[..., torch.Tensor],
    args: Sequence[object],
    kwargs: dict[str, object] | None = None,
    where: torch.Tensor | None = None,
    what: str = "output",
) -> torch.Tensor:
    """Run ``kernel(*args)`` and hold it to the rule against ``reference``; return its output.

    ``args`` / ``kwargs`` hold the inputs in the dtype under test (with whatever strides the
    test wants the kernel to see); the float64 oracle gets float64 copies of the float ones.
    """
    kwargs = kwargs or {}
    out = kernel(*args, **kwargs)
    out_torch = reference(*args, **kwargs)
    ref = reference(*map(float64, args), **{k: float64(v) for k, v in kwargs.items()})
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    assert out.dtype == out_torch.dtype, f"{what}: dtype {out.dtype} != {out_torch.dtype}"
    assert_within_rule(out, out_torch, ref, where, what)
    return out
