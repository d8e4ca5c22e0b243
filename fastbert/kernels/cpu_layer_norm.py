"""The CPU engine's LayerNorms: the residual add and the normalisation in one pass, and the
embeddings' lookups, sum and normalisation in one pass, compiled for this CPU
(cpu_layer_norm.cpp).

PyTorch runs ``LayerNorm(x + residual)`` as two ops: an add that writes the sum and a
LayerNorm that reads it back. Here each row is read once (x and the residual), its sum rounded
to the dtype as PyTorch's add rounds it, and the normalised row written: the statistics in
float32 over the rounded sum, as fastbert.kernels.reference.layer_norm takes them (their
float32 sums in another order than PyTorch's, so a result may differ from the plain backend's
in a last bit). bfloat16 and float32, rows of unit column stride, no dropout; other calls take
the plain op. The embeddings' LayerNorm reads each token's word, position and token-type rows
from their tables and sums them in float32 unrounded (as the reference and the plain backend
do, which widen half tables and sum them before normalising): for a bfloat16 model, the plain
backend's widening copy, two adds, LayerNorm and narrowing copy in one pass. Built at first
use on Linux x86-64 with a C++ compiler (fastbert.kernels.cpu_library); where it is not,
:func:`available` is False and :func:`status` says why.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from pathlib import Path

import torch

from . import checks, reference, torch_ops
from .cpu_library import Library
from .op import implements

SOURCE = Path(__file__).with_name("cpu_layer_norm.cpp")
DTYPES = (torch.float32, torch.bfloat16)


def _declare(library: ctypes.CDLL) -> None:
    embed = library.fastbert_embeddings_layer_norm
    embed.restype = ctypes.c_int
    embed.argtypes = [
        ctypes.c_void_p,  # tables: word, position, token type
        ctypes.c_void_p,  # their row strides
        ctypes.c_void_p,  # their rows
        ctypes.c_void_p,  # ids into each: int64 [rows]
        *[ctypes.c_int64] * 2,  # rows, cols
        *[ctypes.c_void_p] * 2,  # weight, bias or NULL
        ctypes.c_float,  # eps
        ctypes.c_int,  # bfloat16
        ctypes.c_void_p,  # out
        ctypes.c_int,  # threads
    ]
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


# Inside ``with turned_off():`` the engine's LayerNorms take PyTorch's ops (to compare the two).
turned_off = _LIBRARY.paused

# The compiled ops turned off one at a time by op_turned_off.
_paused_ops: set[str] = set()


@contextlib.contextmanager
def op_turned_off(op: str) -> Iterator[None]:
    """Inside the block ``op`` ("layer_norm" or "embeddings_layer_norm") takes PyTorch's ops,
    the other compiled op still runs (to measure each, as benchmarks/pass_profile.py does);
    not for use from several threads."""
    if op not in ("layer_norm", "embeddings_layer_norm"):
        raise ValueError(f"op must be 'layer_norm' or 'embeddings_layer_norm', not {op!r}")
    before = set(_paused_ops)
    _paused_ops.add(op)
    try:
        yield
    finally:
        _paused_ops.intersection_update(before)


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
    if torch.compiler.is_compiling() or not available() or "layer_norm" in _paused_ops:
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, *tensors)):
        return False
    if x.shape[-1] > max_cols():
        return False
    if residual is not None and residual.shape != x.shape:
        return False
    return all(_rows(t) is not None for t in (x, residual) if t is not None)


def _normalisation(weight, bias, eps: float, out: torch.Tensor) -> tuple:
    """Both kernels' last arguments: weight, bias (or NULL), eps, whether bfloat16, out and
    the threads."""
    bias_pointer = None if bias is None else bias.data_ptr()
    is_bf16 = int(out.dtype == torch.bfloat16)
    return (
        weight.data_ptr(),
        bias_pointer,
        float(eps),
        is_bf16,
        out.data_ptr(),
        torch.get_num_threads(),
    )


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
        *_normalisation(weight, bias, eps, out),
    )
    return out


@implements(reference.layer_norm)
def layer_norm_unchecked(x, weight, bias, eps, residual, dropout_p):
    """:func:`fastbert.kernels.torch_ops.layer_norm_unchecked` on the compiled kernel where
    :func:`takes` the call."""
    if takes(x, weight, bias, residual, dropout_p):
        return layer_norm(x, weight, bias, eps, residual)
    return torch_ops.layer_norm_unchecked(x, weight, bias, eps, residual, dropout_p)


def embeddings_takes(input_ids, token_type_ids, position_ids, tables, weight, bias, dropout_p):
    """Whether the compiled embeddings' LayerNorm runs this call: ``tables`` (word, position,
    token type) and weight, bias on the CPU in one dtype of DTYPES, rows of unit column stride,
    at most the kernel's columns; CPU integer ids, positions [B, S] or [S]; no dropout, no
    autograd record, nothing tracing."""
    if dropout_p or weight is None or input_ids.dim() != 2:
        return False
    if "embeddings_layer_norm" in _paused_ops:
        return False
    ids = [t for t in (input_ids, token_type_ids, position_ids) if t is not None]
    if any(t.device.type != "cpu" or t.is_floating_point() or t.is_complex() for t in ids):
        return False
    if position_ids is not None and position_ids.shape not in (
        input_ids.shape,
        input_ids.shape[1:],
    ):
        return False
    if token_type_ids is not None and token_type_ids.shape != input_ids.shape:
        return False
    tensors = [*tables, weight, *([] if bias is None else [bias])]
    dtype = tables[0].dtype
    if dtype not in DTYPES or any(t.device.type != "cpu" or t.dtype != dtype for t in tensors):
        return False
    if any(t.dim() != 2 or t.stride(1) != 1 or t.shape[1] != weight.shape[0] for t in tables):
        return False
    if torch.compiler.is_compiling() or not available() or weight.shape[0] > max_cols():
        return False
    return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def embeddings_layer_norm(
    input_ids: torch.Tensor,
    token_type_ids: torch.Tensor | None,
    position_ids: torch.Tensor,
    tables: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    """LayerNorm(word[input_ids] + pos[position_ids] + type[token_type_ids]) on the compiled
    kernel, for a call :func:`embeddings_takes` (dropout 0). input_ids, token_type_ids (None:
    type 0): [B, S] integers; position_ids: [B, S] or [S]; tables: [rows, H] each. Returns
    [B, S, H] in the tables' dtype, contiguous. Raises ValueError for an id outside its table
    (the kernel checks every id before it reads a row)."""
    shape = input_ids.shape
    types = torch.zeros(shape, dtype=torch.int64) if token_type_ids is None else token_type_ids
    # The kernel reads each id tensor as one run of int64: reshape(-1) may return a strided
    # view (ids[:, ::2], or [S] positions expanded over rows of one token), not a copy.
    ids = [
        t.expand(shape).reshape(-1).to(torch.int64).contiguous()
        for t in (input_ids, position_ids, types)
    ]
    weight, bias = weight.contiguous(), None if bias is None else bias.contiguous()
    out = torch.empty((*shape, weight.shape[0]), dtype=tables[0].dtype)
    as_array = functools.partial(torch.tensor, dtype=torch.int64)
    strides = as_array([t.stride(0) for t in tables])
    rows = as_array([t.shape[0] for t in tables])
    pointers = (ctypes.c_void_p * 3)(*(t.data_ptr() for t in tables))
    id_pointers = (ctypes.c_void_p * 3)(*(t.data_ptr() for t in ids))
    failed = _LIBRARY.get().fastbert_embeddings_layer_norm(
        ctypes.addressof(pointers),
        strides.data_ptr(),
        rows.data_ptr(),
        ctypes.addressof(id_pointers),
        ids[0].numel(),
        weight.shape[0],
        *_normalisation(weight, bias, eps, out),
    )
    if failed:  # the plain backend's message for the id out of range, else a plain one
        checks.check_embedding_ids(input_ids, token_type_ids, position_ids, *tables)
        raise ValueError("an embedding id lies outside its table")
    return out


@implements(reference.embeddings_layer_norm)
def embeddings_layer_norm_unchecked(
    input_ids, token_type_ids, position_ids, word_emb, pos_emb, type_emb, weight, bias, eps, **flags
):
    """:func:`fastbert.kernels.torch_ops.embeddings_layer_norm_unchecked` on the compiled
    kernel where :func:`embeddings_takes` the call (positions None: 0 .. S - 1 in each row).
    ``flags``: the plain op's keywords (``check_ids``, ``dropout_p``, ``padding_idx``,
    ``position_padding_idx``, with the reference's defaults where left out), which the
    kernel's output does not depend on but for ``dropout_p``. The kernel checks every id
    whatever ``check_ids`` says (it reads the rows they name)."""
    tables = (word_emb, pos_emb, type_emb)
    dropout_p = flags.get("dropout_p", 0.0)
    if embeddings_takes(input_ids, token_type_ids, position_ids, tables, weight, bias, dropout_p):
        if flags.get("check_ids", True):
            checks.check_embedding_ids(input_ids, token_type_ids, position_ids, *tables)
        if position_ids is None:
            position_ids = torch.arange(input_ids.shape[1])
        return embeddings_layer_norm(
            input_ids, token_type_ids, position_ids, tables, weight, bias, eps
        )
    return torch_ops.embeddings_layer_norm_unchecked(
        input_ids, token_type_ids, position_ids, *tables, weight, bias, eps, **flags
    )
