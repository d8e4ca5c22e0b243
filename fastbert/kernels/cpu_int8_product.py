"""The exact integer product of the dynamic int8 linear on a CPU with AVX2 but no int8 dot
products (no VNNI, no AMX), compiled for this CPU (cpu_int8_product.cpp).

There, oneDNN's int8 GEMMs either add pairs of full-range products in 16 bits, saturating
(its quantised linear), or run its reference loop (``torch._int_mm``, about 2 GFLOP/s), so
fastbert ran the product as float32 GEMMs of the int8 values (exact, at float32's rate:
fastbert.kernels.torch_ops.int_product_in_float32). This product multiplies bytes with AVX2's
byte multiply-add, |a| times the weight with a's sign, so that no pair of products can
saturate (the source says why), faster than float32's AVX2 GEMMs; the sums are the exact
integers, so an int8 model gives the same bits as with any other product. On a CPU with
AVX-512 but no int8 dot products, float32's AVX-512 GEMMs stay faster (:func:`chosen`).

The weight is packed once into panels of 16 columns (:func:`pack`; a weight holding -128 is
refused, and its product stays on the float32 GEMMs); the engine keeps the panels with the
model's other packed weights (fastbert.kernels.packed_weights). Built at first use on Linux
x86-64 with AVX2 and a C++ compiler (fastbert.kernels.cpu_library); where it is not,
:func:`available` is False and :func:`status` says why.
"""

from __future__ import annotations

import ctypes
import dataclasses
from pathlib import Path

import torch

from .cpu_library import Library, has_avx512, has_int8_dot_products

SOURCE = Path(__file__).with_name("cpu_int8_product.cpp")

# The panels' columns and the terms each int32 lane sums per step (cpu_int8_product.cpp).
PANEL_COLUMNS = 16
PANEL_TERMS = 4


def _declare(library: ctypes.CDLL) -> None:
    pack_panels = library.fastbert_pack_int8_panels
    pack_panels.restype = ctypes.c_int
    pack_panels.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    multiply = library.fastbert_int8_panels_product
    multiply.restype = None
    multiply.argtypes = [
        ctypes.c_void_p,  # a
        *[ctypes.c_int64] * 3,  # rows, terms, a's row stride
        ctypes.c_void_p,  # panels
        ctypes.c_int64,  # columns
        ctypes.c_void_p,  # c
        ctypes.c_int64,  # c's row stride
        ctypes.c_int,  # threads
    ]


_LIBRARY = Library(SOURCE, _declare, cpu_flag="avx2")


def available() -> bool:
    """Whether the product runs here now (builds it at the first call)."""
    return _LIBRARY.in_use()


def chosen() -> bool:
    """Whether the int8 linear takes this product here: a CPU without int8 dot products or
    AVX-512, the product :func:`available`. (Where oneDNN's float32 GEMMs have AVX-512 they
    ran faster than this AVX2 product: docs/cpu.md.)"""
    return not has_int8_dot_products() and not has_avx512() and available()


def status() -> str:
    """ "ready (path)", or why the product is not used."""
    return _LIBRARY.status()


# Inside ``with turned_off():`` the int8 linear takes the float32 GEMMs (to compare the two).
turned_off = _LIBRARY.paused


@dataclasses.dataclass(frozen=True)
class Panels:
    """An int8 [out_features, in_features] weight packed for :func:`product`: int8 ``data``,
    [ceil(out / 16), ceil(in / 4), 16, 4] flattened, zeros past the weight's edges."""

    data: torch.Tensor
    out_features: int
    in_features: int


def _check(name: str, t: torch.Tensor) -> None:
    """TypeError / ValueError unless ``t`` is an int8 matrix in CPU memory (what the compiled
    loops read)."""
    if t.dtype != torch.int8:
        raise TypeError(f"{name} must be int8, got {t.dtype}")
    if t.dim() != 2 or t.device.type != "cpu":
        raise ValueError(f"{name} must be a 2-D CPU tensor, got {t.dim()}-D on {t.device}")


def pack(weight: torch.Tensor) -> Panels | None:
    """An int8 [N, K] CPU weight -> its :class:`Panels`, or None when it holds -128 (the
    product would not be exact) or the product is not :func:`available`."""
    _check("weight", weight)
    if not available():
        return None
    n, k = weight.shape
    weight = weight.contiguous()
    groups = -(-k // PANEL_TERMS)
    panels = -(-n // PANEL_COLUMNS)
    data = torch.empty(panels * groups * PANEL_COLUMNS * PANEL_TERMS, dtype=torch.int8)
    refused = _LIBRARY.get().fastbert_pack_int8_panels(weight.data_ptr(), n, k, data.data_ptr())
    return None if refused else Panels(data, n, k)


def product(q: torch.Tensor, panels: Panels) -> torch.Tensor:
    """int8 q [M, K] (rows of unit column stride) times the packed weight -> the exact int32
    [M, N] product ``q @ weight.T``."""
    _check("q", q)
    rows, k = q.shape
    if k != panels.in_features:
        raise ValueError(f"q has {k} columns, the packed weight {panels.in_features}")
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty((rows, panels.out_features), dtype=torch.int32)
    if rows == 0 or panels.out_features == 0:
        return out
    _LIBRARY.get().fastbert_int8_panels_product(
        q.data_ptr(),
        rows,
        k,
        q.stride(0),
        panels.data.data_ptr(),
        panels.out_features,
        out.data_ptr(),
        out.stride(0),
        torch.get_num_threads(),
    )
    return out
