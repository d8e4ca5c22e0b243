"""The exact integer product of the dynamic int8 linear on a CPU without int8 dot products (no
VNNI, no AMX), compiled for this CPU (cpu_int8_product.cpp) in two builds: on AVX2's 256-bit
registers and on AVX-512 BW's 512-bit ones.

There, oneDNN's int8 GEMMs either add pairs of full-range products in 16 bits, saturating
(its quantised linear), or run its reference loop (``torch._int_mm``, about 2 GFLOP/s), so
fastbert ran the product as float32 GEMMs of the int8 values (exact, at float32's rate:
fastbert.kernels.torch_ops.int_product_in_float32). This product multiplies bytes with the
byte multiply-add, |a| times the weight with a's sign, so that no pair of products can
saturate (the source says why), faster than float32's GEMMs of the same register width; the
sums are the exact integers, so an int8 model gives the same bits as with any other product.
:func:`chosen` says which build the int8 linear takes here: the AVX2 one is slower than
float32's AVX-512 GEMMs, so a CPU with AVX-512 takes the AVX-512 one or none.

The weight is packed once into panels of 24 (AVX2) or 32 (AVX-512) columns (:func:`pack`; a weight
holding -128 is refused, and its product stays on the float32 GEMMs); the engine keeps the
panels with the model's other packed weights (fastbert.kernels.packed_weights). Built at first
use on Linux x86-64 with a C++ compiler and the build's instructions
(fastbert.kernels.cpu_library); where it is not, :func:`available` is False and :func:`status`
says why.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import torch

from .cpu_library import (
    Library,
    cpu_flags,
    has_avx512,
    has_int8_dot_products,
    int8_dot_products_ignored,
    int8_products_as_on_avx2_only,
)

SOURCE = Path(__file__).with_name("cpu_int8_product.cpp")

# The terms each int32 lane sums per step (cpu_int8_product.cpp).
PANEL_TERMS = 4


def _declare(library: ctypes.CDLL) -> None:
    library.fastbert_int8_panel_columns.restype = ctypes.c_int
    library.fastbert_int8_panel_columns.argtypes = []
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


# The two builds, by the instruction set whose registers they use.
BUILDS = {
    "avx2": Library(SOURCE, _declare, cpu_flag="avx2", extra_flags=("-mno-avx512f",)),
    "avx512": Library(SOURCE, _declare, cpu_flag="avx512bw", extra_flags=("-DFASTBERT_BYTES_512",)),
}


# The instruction sets of the builds, in words.
REGISTERS = {"avx2": "AVX2", "avx512": "AVX-512"}


def available(build: str = "avx2") -> bool:
    """Whether ``build`` of the product runs here now (builds it at the first call)."""
    return BUILDS[build].in_use()


def status(build: str = "avx2") -> str:
    """ "ready (path)", or why ``build`` of the product is not used."""
    return BUILDS[build].status()


def chosen() -> str | None:
    """The build the int8 linear takes here, or None: on a CPU without int8 dot products, the
    AVX-512 one where the CPU has AVX-512 BW, the AVX2 one where it has no AVX-512 (the AVX2
    one ran slower than float32's AVX-512 GEMMs: docs/cpu.md), each where :func:`available`."""
    if has_int8_dot_products():
        return None
    build = ("avx512" if "avx512bw" in cpu_flags() else None) if has_avx512() else "avx2"
    return build if build is not None and available(build) else None


@contextlib.contextmanager
def turned_off() -> Iterator[None]:
    """Inside the block the int8 linear takes the float32 GEMMs (to compare the two); not for
    use from several threads."""
    with BUILDS["avx2"].paused(), BUILDS["avx512"].paused():
        yield


@contextlib.contextmanager
def taken(product: str) -> Iterator[None]:
    """Inside the block the int8 linear takes ``product`` as a CPU without int8 dot products
    would, whatever this one has (to compare the products on one machine, as the tests and the
    pass profile do): a build of the byte product ("avx2", as without AVX-512 too; "avx512",
    which needs AVX-512 BW here) or the float32 GEMMs ("float32"). Not for use from several
    threads."""
    if product == "float32":
        with int8_dot_products_ignored(), turned_off():
            yield
    elif product in BUILDS:
        ignored = int8_products_as_on_avx2_only if product == "avx2" else int8_dot_products_ignored
        with ignored():
            yield
    else:
        raise ValueError(f"product must be float32 or one of {list(BUILDS)}, got {product!r}")


@dataclasses.dataclass(frozen=True)
class Panels:
    """An int8 [out_features, in_features] weight packed for :func:`product` by ``build``:
    int8 ``data``, [ceil(out / columns), ceil(in / 4), columns, 4] flattened, zeros past the
    weight's edges (columns: 24 in the AVX2 build, 32 in the AVX-512 one)."""

    data: torch.Tensor
    out_features: int
    in_features: int
    build: str


def _check(name: str, t: torch.Tensor) -> None:
    """TypeError / ValueError unless ``t`` is an int8 matrix in CPU memory (what the compiled
    loops read)."""
    if t.dtype != torch.int8:
        raise TypeError(f"{name} must be int8, got {t.dtype}")
    if t.dim() != 2 or t.device.type != "cpu":
        raise ValueError(f"{name} must be a 2-D CPU tensor, got {t.dim()}-D on {t.device}")


def pack(weight: torch.Tensor, build: str) -> Panels | None:
    """An int8 [N, K] CPU weight -> its :class:`Panels` for ``build``, or None when it holds
    -128 (the product would not be exact) or ``build`` is not :func:`available`."""
    _check("weight", weight)
    if not available(build):
        return None
    library = BUILDS[build].get()
    n, k = weight.shape
    weight = weight.contiguous()
    columns = library.fastbert_int8_panel_columns()
    size = -(-n // columns) * -(-k // PANEL_TERMS) * columns * PANEL_TERMS
    data = torch.empty(size, dtype=torch.int8)
    refused = library.fastbert_pack_int8_panels(weight.data_ptr(), n, k, data.data_ptr())
    return None if refused else Panels(data, n, k, build)


def product(q: torch.Tensor, panels: Panels) -> torch.Tensor:
    """int8 q [M, K] (rows of unit column stride) times the packed weight -> the exact int32
    [M, N] product ``q @ weight.T``."""
    _check("q", q)
    rows, k = q.shape
    if k != panels.in_features:
        raise ValueError(f"q has {k} columns, the packed weight {panels.in_features}")
    if k % PANEL_TERMS:  # the loops read whole groups of terms: zeros after the last
        q = torch.nn.functional.pad(q, (0, PANEL_TERMS - k % PANEL_TERMS))
    elif q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty((rows, panels.out_features), dtype=torch.int32)
    if rows == 0 or panels.out_features == 0:
        return out
    BUILDS[panels.build].get().fastbert_int8_panels_product(
        q.data_ptr(),
        rows,
        q.shape[1],
        q.stride(0),
        panels.data.data_ptr(),
        panels.out_features,
        out.data_ptr(),
        out.stride(0),
        torch.get_num_threads(),
    )
    return out
