"""The CPU engine's LayerNorm: the residual add and the normalisation in one pass, compiled for
this CPU (cpu_layer_norm.cpp).

PyTorch runs ``LayerNorm(x + residual)`` as two ops: an add that writes the sum and a
LayerNorm that reads it back. Here each row is read once (x and the residual), its sum rounded
to the dtype as PyTorch's add rounds it, and the normalised row written: the statistics in
float32 over the rounded sum, as fastbert.kernels.reference.layer_norm takes them (their
float32 sums in another order than PyTorch's, so a result may differ from the plain backend's
in a last bit). bfloat16 and float32, rows of unit column stride, no dropout; other calls take
the plain op. Built at first use on Linux x86-64 with a C++ compiler
(fastbert.kernels.cpu_library); where it is not, :func:`available` is False and
:func:`status` says why.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch

from . import reference, torch_ops
from .cpu_library import Library
from .op import implements

SOURCE = Path(__file__).with_name("cpu_layer_norm.cpp")
DTYPES = (torch.float32, torch.bfloat16)


def _declare(library: ctypes.CDLL) -> None:
    library.fastbert_layer_norm_max_cols.restype = ctypes.c_int
    library.fastbert_layer_norm_max_cols.argtypes = []
    run = library.fastbert_layer_norm
    run.restype = None
    run.argtypes = [
        ctypes.c_void_p,  # x
        ctypes.c_int64,  # x's row stride
        ctypes.c_void_p,  # residual or NULL
        ctypes.c_int64,  # residual's row stride
        *[ctypes.c_int64] * 2,  # rows, cols
        *[ctypes.c_void_p] * 2,  # weight, bias or NULL
        ctypes.c_float,  # eps
        ctypes.c_int,  # bfloat16
        ctypes.c_void_p,  # out
        ctypes.c_int,  # threads
    ]


_LIBRARY = Library(SOURCE, _declare)


def available() -> bool:
    """Whether the compiled LayerNorm runs here now (builds it at the first call)."""
    return _LIBRARY.in_use()


def status() -> str:
    """ "ready (path)", or why the compiled LayerNorm is not used."""
    return _LIBRARY.status()


@functools.cache
def max_cols() -> int:
    """The widest row the compiled kernel takes (its stack buffers' size)."""
    return _LIBRARY.get().fastbert_layer_norm_max_cols()


# Inside ``with turned_off():`` the engine's LayerNorm takes PyTorch's ops (to compare the two).
turned_off = _LIBRARY.paused


def _rows(t: torch.Tensor) -> torch.Tensor | None:
    """``t`` as [rows, cols] without a copy, or None where its rows are not evenly spaced with
    unit column stride."""
    if t.stride(-1) != 1:
        return None
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:
        return None


def takes(x, weight, bias, residual, dropout_p) -> bool:
    """Whether the compiled LayerNorm runs this call: CPU tensors of one dtype of DTYPES with
    unit column stride, at most the kernel's columns, no dropout, no autograd record, nothing
    tracing."""
    if x.device.type != "cpu" or x.dtype not in DTYPES or dropout_p or not x.shape[-1]:
        return False
    if weight is None:
        return False
    tensors = [t for t in (weight, bias, residual) if t is not None]
    if any(t.device.type != "cpu" or t.dtype != x.dtype for t in tensors):
        return False
    if torch.compiler.is_compiling() or not available():
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, *tensors)):
        return False
    if x.shape[-1] > max_cols():
        return False
    if residual is not None and residual.shape != x.shape:
        return False
    return all(_rows(t) is not None for t in (x, residual) if t is not None)


def layer_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    residual: torch.Tensor | None = None,
) -> torch.Tensor:
    """LayerNorm(x + residual) over the last dim on the compiled kernel, for a call
    :func:`takes` (dropout 0). x, residual: [..., N]; weight, bias: [N]; one dtype of DTYPES.
    Returns x's shape and dtype, contiguous."""
    rows = _rows(x)
    res = None if residual is None else _rows(residual)
    weight, bias = weight.contiguous(), None if bias is None else bias.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype)
    _LIBRARY.get().fastbert_layer_norm(
        rows.data_ptr(),
        rows.stride(0),
        None if res is None else res.data_ptr(),
        0 if res is None else res.stride(0),
        rows.shape[0],
        rows.shape[1],
        weight.data_ptr(),
        None if bias is None else bias.data_ptr(),
        float(eps),
        int(x.dtype == torch.bfloat16),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return out


@implements(reference.layer_norm)
def layer_norm_unchecked(x, weight, bias, eps, residual, dropout_p):
    """:func:`fastbert.kernels.torch_ops.layer_norm_unchecked` on the compiled kernel where
    :func:`takes` the call."""
    if takes(x, weight, bias, residual, dropout_p):
        return layer_norm(x, weight, bias, eps, residual)
    return torch_ops.layer_norm_unchecked(x, weight, bias, eps, residual, dropout_p)
