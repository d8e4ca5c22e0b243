"""GELU of bfloat16 tensors on a CPU by table lookup, compiled for this CPU (cpu_gelu.cpp).

A bfloat16 tensor holds at most 65,536 distinct values, so GELU rounded to bfloat16 is a
table: entry ``b`` holds PyTorch's own bfloat16 GELU (``F.gelu``, exact erf or tanh) of the
value whose bits are ``b``, computed once per process, so the lookup gives PyTorch's bits for
every input, NaN and infinities included. The CPU engine's bfloat16 linear runs oneDNN's
product without a post-op and then this in place: GELU of the rounded product, as PyTorch's
eager ``gelu(linear(x))`` in bfloat16 (and fastbert's plain backend) computes it, where
oneDNN's GELU post-op took as long as the product (docs/results.md, "GELU by table").
Built at first use on Linux x86-64 with a C++ compiler, on a CPU with AVX512BW
(fastbert.kernels.cpu_library); where it is not, :func:`available` is False, :func:`status`
says why, and the linear keeps oneDNN's post-op.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
import torch.nn.functional as F

from .cpu_library import Library

SOURCE = Path(__file__).with_name("cpu_gelu.cpp")
APPROXIMATIONS = ("none", "tanh")


def _declare(library: ctypes.CDLL) -> None:
    run = library.fastbert_gelu_bf16_table
    run.restype = None
    run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]


_LIBRARY = Library(SOURCE, _declare, "avx512bw")


def available() -> bool:
    """Whether the table's kernel runs here now (builds it at the first call)."""
    return _LIBRARY.in_use()


def status() -> str:
    """ "ready (path)", or why the table's kernel is not used."""
    return _LIBRARY.status()


# Inside ``with turned_off():`` the engine's linear keeps oneDNN's GELU post-op (to compare).
turned_off = _LIBRARY.paused


@functools.cache
def table(approximate: str) -> torch.Tensor:
    """int16 [65537]: entry b the bits of ``F.gelu(v, approximate=approximate)`` in bfloat16,
    v the bfloat16 value of bits b; the last entry padding (the kernel reads 4 bytes an
    entry)."""
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate={approximate!r}: one of {APPROXIMATIONS}")
    # Bits 0 .. 65535 in order (the int16 conversion wraps the upper half to negatives).
    values = torch.arange(2**16, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    found = torch.zeros(2**16 + 1, dtype=torch.int16)
    found[: 2**16] = F.gelu(values, approximate=approximate).view(torch.int16)
    return found


def takes(y: torch.Tensor) -> bool:
    """Whether :func:`gelu_` runs on ``y``: a contiguous bfloat16 CPU tensor autograd does
    not record, with the kernel available."""
    return _readable(y) and not (torch.is_grad_enabled() and y.requires_grad) and available()


def _readable(y: torch.Tensor) -> bool:
    """Whether the kernel can read ``y`` as one run of bfloat16 values in CPU memory."""
    return y.device.type == "cpu" and y.dtype == torch.bfloat16 and y.is_contiguous()


def gelu_(y: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU of ``y`` in place (any shape, bfloat16, for which :func:`takes`); returns ``y``:
    the bits of ``F.gelu(y, approximate=approximate)``. Raises ValueError for a tensor the
    kernel cannot read as one run of bfloat16 values in CPU memory."""
    if not _readable(y):
        raise ValueError(
            f"GELU by table takes a contiguous bfloat16 CPU tensor, not {y.dtype} on "
            f"{y.device} with strides {y.stride()}"
        )
    _LIBRARY.get().fastbert_gelu_bf16_table(
        table(approximate).data_ptr(), y.data_ptr(), y.numel(), torch.get_num_threads()
    )
    return y
