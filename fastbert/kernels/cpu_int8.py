"""The passes around the int8 GEMM of the dynamic int8 linear, compiled for this CPU
(cpu_int8.cpp): the per-row quantisation of the float32 activations, and the dequantising
epilogue (the row and column scales, the bias, the residual) of the int32 product.

In PyTorch's ops these are nine passes over the activations and the product (two reductions,
a multiply, a rounding, a conversion; a conversion, two multiplies and an add); here they
are two, with the same bits: every step the same float32 operation in the same order
(fastbert.kernels.torch_ops.quantize_rows and its linear's epilogue are the reference the
tests hold them to). Built at first use on Linux x86-64 with a C++ compiler
(fastbert.kernels.cpu_library); where it is not, :func:`available` is False, :func:`status`
says why, and the torch backend runs PyTorch's ops.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from . import cpu_int8_product, torch_ops
from .cpu_library import Library

SOURCE = Path(__file__).with_name("cpu_int8.cpp")


def _declare(library: ctypes.CDLL) -> None:
    quantize = library.fastbert_quantize_rows
    quantize.restype = None
    quantize.argtypes = [
        ctypes.c_void_p,  # x
        *[ctypes.c_int64] * 3,  # rows, cols, row stride
        ctypes.c_void_p,  # input scale or NULL
        ctypes.c_void_p,  # q
        ctypes.c_void_p,  # scale
        ctypes.c_int,  # threads
    ]
    dequantize = library.fastbert_dequantize
    dequantize.restype = None
    dequantize.argtypes = [
        ctypes.c_void_p,  # acc
        ctypes.c_int,  # acc is float32
        *[ctypes.c_int64] * 2,  # rows, cols
        *[ctypes.c_void_p] * 4,  # row scale, column scale, bias or NULL, residual or NULL
        ctypes.c_int64,  # residual row stride
        ctypes.c_void_p,  # out
        ctypes.c_int,  # threads
    ]


# g++ contracts a * b + c into one fused multiply-add unless told not to (in C++ whatever the
# -std); the passes must round where PyTorch's ops round.
_LIBRARY = Library(SOURCE, _declare, extra_flags=("-ffp-contract=off",))


def available() -> bool:
    """Whether the compiled passes run here now (builds them at the first call)."""
    return _LIBRARY.in_use()


def status() -> str:
    """ "ready (path)", or why the compiled passes are not used."""
    return _LIBRARY.status()


# Inside ``with turned_off():`` the int8 linear takes PyTorch's passes (to compare the two).
turned_off = _LIBRARY.paused


def takes(x: torch.Tensor, *tensors: torch.Tensor | None) -> bool:
    """Whether the passes run for the int8 linear of ``x`` with ``tensors`` (its column
    scales, bias, residual and input scale, or None): float32 CPU tensors whose rows have
    unit column stride, and the passes available."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.stride(-1) != 1:
        return False
    for t in tensors:
        if t is not None and (t.dtype != torch.float32 or t.stride(-1) != 1):
            return False
    return available()


def _address(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def quantize_rows(
    x: torch.Tensor, input_scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 [M, K] (rows of unit stride between columns) -> (int8 [M, K], float32 [M]):
    :func:`fastbert.kernels.torch_ops.quantize_rows`'s int8 result, bit for bit.
    ``input_scale``: float32 [K], multiplied in first."""
    rows, cols = x.shape
    q = torch.empty((rows, cols), dtype=torch.int8)
    scale = torch.empty(rows, dtype=torch.float32)
    scales = None if input_scale is None else input_scale.contiguous()
    _LIBRARY.get().fastbert_quantize_rows(
        x.data_ptr(),
        rows,
        cols,
        x.stride(0),
        _address(scales),
        q.data_ptr(),
        scale.data_ptr(),
        torch.get_num_threads(),
    )
    return q, scale


def product(
    x: torch.Tensor, weight: torch.Tensor, input_scale: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 x [M, K] (see :func:`quantize_rows`), int8 weight [N, K] -> (x's int8 rows times
    the weight, exact int32 [M, N] or its float32 conversion; x's row scales, float32 [M]): the
    rows quantised here, the product the torch backend's (``torch._int_mm``); on a CPU without
    int8 dot products the byte product on the weight packed here where a build of it is
    chosen (fastbert.kernels.cpu_int8_product.chosen), else the torch backend's float32 GEMMs
    (fastbert.kernels.torch_ops.int_product_in_float32)."""
    q, scale = quantize_rows(x, input_scale)
    build = cpu_int8_product.chosen()
    if build is not None:
        panels = cpu_int8_product.pack(weight, build)
        if panels is not None:
            return cpu_int8_product.product(q, panels), scale
    return torch_ops.int_product(q, weight), scale


def dequantize(
    acc: torch.Tensor,
    row_scale: torch.Tensor,
    col_scale: torch.Tensor,
    bias: torch.Tensor | None,
    residual: torch.Tensor | None,
) -> torch.Tensor:
    """int32 [M, N], or float32 [M, N] holding integers (contiguous; its memory is reused)
    -> float32 [M, N]:
    ``torch.addcmul(bias, acc * row_scale[:, None], col_scale)`` (one rounding, as addcmul's
    fused multiply-add; without bias the product) (+ ``residual`` [M, N], rows of unit
    column stride), in the operations and order of the torch backend's epilogue. row_scale
    [M], col_scale and bias [N]: float32, contiguous."""
    rows, cols = acc.shape
    out = acc.view(torch.float32)
    _LIBRARY.get().fastbert_dequantize(
        acc.data_ptr(),
        int(acc.dtype == torch.float32),
        rows,
        cols,
        row_scale.data_ptr(),
        col_scale.data_ptr(),
        _address(bias),
        _address(residual),
        0 if residual is None else residual.stride(0),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return out
