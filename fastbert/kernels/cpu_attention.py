"""A compiled attention for bfloat16 and float32 on a CPU with AVX512_BF16, and for float32 on
other CPUs with AVX2 or AVX-512 (cpu_attention.cpp).

PyTorch's CPU attention spends most of its time around the arithmetic for the short
sequences of real text: per call, per run of equal lengths, per conversion. This kernel runs
all the sequences of a batch in one call: one OpenMP task per sequence (per sequence and head
when they are few). In bfloat16, q k^T on
the CPU's bfloat16 dot-product instruction (exact products, float32 sums), the softmax and
P @ V in float32 with P unrounded, the result rounded to bfloat16 once: the torch backend's
math path's precision, more accurate than PyTorch's flash kernel, which rounds P to bfloat16.
In float32, every step in float32 FMAs: float32's accuracy, as PyTorch's flash kernel. On a
CPU with AMX (and a compiler that targets it), bfloat16 q k^T and P @ V run on AMX's tiles,
16 queries at a time (sequences of more than 16), with the same exact products and float32
sums, P carried as two bfloat16 parts (within 2^-18 of P); :func:`tiles` says whether they do.
A relative position bias (MPNet's) is added to the scaled scores in float32, a window
(ModernBERT's local layers) limits each query's keys, skipping the key blocks outside it, and
rotary positions (ModernBERT's) rotate q and k as they are read, in cache.

The source is compiled at first use for this CPU and loaded with ctypes
(fastbert.kernels.cpu_library); a call releases the GIL. One source, three builds
(:data:`BUILDS`), of which :func:`chosen` takes the first this CPU can run: "avx512_bf16"
(bfloat16 and float32), "avx512" (float32, for AVX-512 CPUs without AVX512_BF16, such as
Skylake-SP, Cascade Lake and Ice Lake) and "avx2" (float32, for CPUs without AVX-512). The
float32 builds give the same bits. Where the CPU has none of these, no compiler is found, the
build fails, or ``FASTBERT_CPU_ATTENTION=0``, :func:`available` is False, :func:`status` says
why, and the torch backend keeps its own attention (as it does for bfloat16 where
:func:`dtypes` has only float32). Nothing is compiled at import.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import torch

from fastbert.settings import CPU_ATTENTION

from . import cpu_library, reference
from .cpu_library import Library

SOURCE = Path(__file__).with_name("cpu_attention.cpp")
ENVIRONMENT_SWITCH = CPU_ATTENTION.name
HEAD_DIMS = (32, 64)
# The library's function per dtype (bfloat16's only in the build with AVX512_BF16).
_ENTRY_POINTS = {torch.bfloat16: "fastbert_attention_bf16", torch.float32: "fastbert_attention_f32"}


def _declare(library: ctypes.CDLL) -> None:
    library.dtypes = tuple(d for d, name in _ENTRY_POINTS.items() if hasattr(library, name))
    for dtype in library.dtypes:
        kernel = getattr(library, _ENTRY_POINTS[dtype])
        kernel.restype = ctypes.c_int
        kernel.argtypes = [
            *[ctypes.c_void_p] * 3,  # q, k, v
            ctypes.c_int64,  # token stride
            ctypes.c_int64,  # head stride
            ctypes.c_void_p,  # starts
            ctypes.c_void_p,  # lengths
            ctypes.c_void_p,  # queries
            *[ctypes.c_int64] * 3,  # sequences, heads, head_dim
            ctypes.c_float,  # scale
            ctypes.c_void_p,  # out
            ctypes.c_int,  # threads
            ctypes.c_int,  # tiles: bfloat16 q k^T and P @ V on AMX where built and granted
            ctypes.c_void_p,  # bias: float32 [H, bias_width] by distance, or NULL
            ctypes.c_int64,  # bias_width
            ctypes.c_int,  # window, -1 for none
            ctypes.c_void_p,  # rotary cos: float32 [P, D / 2] by position, or NULL
            ctypes.c_void_p,  # rotary sin
        ]
    library.fastbert_attention_tiles.restype = ctypes.c_int
    library.fastbert_attention_tiles.argtypes = []


def _build(cpu_flag: str, *extra_flags: str) -> Library:
    off = f"off (${ENVIRONMENT_SWITCH})"
    flags = ("-ffp-contract=off", *extra_flags)  # the source's fused multiply-adds only
    return Library(SOURCE, _declare, cpu_flag, CPU_ATTENTION.read, off, flags)


# The builds, by the instruction set each needs, in the order :func:`chosen` tries them.
BUILDS = {
    "avx512_bf16": _build("avx512_bf16"),
    "avx512": _build("avx512f", "-mno-avx512bf16"),
    "avx2": _build("avx2", "-mno-avx512f"),
}


def chosen() -> str:
    """The build this CPU runs: the first of :data:`BUILDS` whose instruction set it has (the
    last where it has none: its :func:`status` says so)."""
    flags = cpu_library.cpu_flags()
    return next((name for name, build in BUILDS.items() if build.cpu_flag in flags), "avx2")


_taken: Library | None = None  # the build in use instead of the chosen one (taken, built_from)


def _library() -> Library:
    return _taken if _taken is not None else BUILDS[chosen()]


def running() -> str:
    """The build calls run now: :func:`chosen`, or the one :func:`taken` (a source of
    :func:`built_from` is named by its path)."""
    library = _library()
    return next((name for name, build in BUILDS.items() if build is library), str(library.source))


def missing_requirement() -> str | None:
    """Why this machine cannot build the kernel (not Linux on x86-64, none of the builds'
    instruction sets, no C++ compiler), or None."""
    return cpu_library.missing_requirement(_library().cpu_flag)


def _ensure_loaded() -> ctypes.CDLL | None:
    return _library().get()


def available() -> bool:
    """Whether the compiled kernel runs here (builds it at the first call)."""
    return _ensure_loaded() is not None


def status() -> str:
    """The kernel's state here: "ready (path)", or why it is not used."""
    return _library().status()


def dtypes() -> tuple[torch.dtype, ...]:
    """The dtypes the kernel runs here: bfloat16 and float32 with AVX512_BF16, float32 alone
    with the other builds, none where it is not :func:`available`."""
    library = _ensure_loaded()
    return () if library is None else library.dtypes


@contextlib.contextmanager
def turned_off() -> Iterator[None]:
    """Inside the block every attention in this process takes the torch path (to compare the
    two, as benchmarks/cpu_attention_kernel.py does); not for use from several threads."""
    with contextlib.ExitStack() as pauses:
        for library in {*BUILDS.values(), _library()}:
            pauses.enter_context(library.paused())
        yield


@contextlib.contextmanager
def _running(library: Library) -> Iterator[None]:
    global _taken
    before, _taken = _taken, library
    try:
        yield
    finally:
        _taken = before


def taken(build: str) -> contextlib.AbstractContextManager[None]:
    """Inside the block every call runs ``build`` of :data:`BUILDS` instead of the chosen one
    (to compare them on one machine, as the tests and the pass profile do: "avx2" runs an
    AVX2-only CPU's float32 code on any CPU with AVX2); not for use from several threads.
    Where ``build`` does not run here, :func:`available` is False inside the block."""
    if build not in BUILDS:
        raise ValueError(f"build must be one of {list(BUILDS)}, got {build!r}")
    return _running(BUILDS[build])


_tiles_paused = False


def tiles() -> bool:
    """Whether bfloat16 calls multiply q k^T and P @ V on AMX's tiles here: the kernel is
    available, was built for a CPU with AMX-BF16, and Linux granted this process the tile
    state."""
    library = _ensure_loaded()
    return library is not None and bool(library.fastbert_attention_tiles())


@contextlib.contextmanager
def tiles_turned_off() -> Iterator[None]:
    """Inside the block the kernel's bfloat16 q k^T runs on AVX512_BF16 dot products and P @ V
    on float32 FMAs even where :func:`tiles` (to compare the two, as the tests and benchmarks
    do); not for use from several threads."""
    global _tiles_paused
    before, _tiles_paused = _tiles_paused, True
    try:
        yield
    finally:
        _tiles_paused = before


@functools.cache
def _library_from(source: Path, like: Library) -> Library:
    return Library(source, _declare, like.cpu_flag, extra_flags=like.extra_flags)


@contextlib.contextmanager
def built_from(source: Path) -> Iterator[None]:
    """Inside the block every call runs the kernel compiled from ``source``, another version of
    cpu_attention.cpp, as the build in use now is compiled (to time two versions in one
    process, as benchmarks/cpu_attention_kernel.py's ``--against`` does); not for use from
    several threads. Raises RuntimeError where that source does not build here."""
    other = _library_from(Path(source).resolve(), _library())
    if other.get() is None:
        raise RuntimeError(f"cpu_attention from {source}: {other.status()}")
    with _running(other):
        yield


def takes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether q, k, v ([..., T or S, H, D] views) fit the kernel: one of :func:`dtypes` on
    the CPU, head dimension 32 or 64, the same strides for all three with D contiguous, 4-byte
    aligned data (bfloat16: even strides, as it reads pairs), no autograd record, and the
    kernel available and not :func:`turned_off`."""
    if q.dtype not in _ENTRY_POINTS or q.device.type != "cpu" or q.shape[-1] not in HEAD_DIMS:
        return False
    if not (k.dtype == v.dtype == q.dtype and k.shape == v.shape == q.shape):
        return False
    if not (q.stride() == k.stride() == v.stride()) or q.stride(-1) != 1:
        return False
    pairs = q.dtype == torch.bfloat16
    if pairs and any(stride % 2 for stride in q.stride()[:-1]):
        return False
    if any(t.data_ptr() % 4 for t in (q, k, v)):
        return False
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        return False
    library = _library()
    return library.in_use() and q.dtype in library.get().dtypes


class Positions(NamedTuple):
    """What a call adds to plain softmax attention, as fastbert.kernels.reference.attention's
    arguments of these names: MPNet's ``relative_bias`` table [H, RELATIVE_BUCKETS],
    ModernBERT's ``rotary`` inverse frequencies [D / 2] and ``window``."""

    relative_bias: torch.Tensor | None = None
    rotary: torch.Tensor | None = None
    window: int | None = None


PLAIN = Positions()


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None = None,
    positions: Positions = PLAIN,
) -> torch.Tensor:
    """softmax(scale * rope(q) rope(k)^T + bias) v within each sequence of ``cu_seqlens``.

    q, k, v: bfloat16 or float32 [T, H, D] on the CPU that :func:`takes`; cu_seqlens: int
    [B + 1] prefix sums (0 first, non-decreasing, T last: the caller's contract, unchecked
    here). ``scale`` None is 1 / sqrt(D). ``positions``: the bias, rotary positions and window
    (positions and distances counted within a sequence). Returns [T, H, D] in q's dtype,
    contiguous."""
    bounds = cu_seqlens.long()
    lengths = bounds[1:] - bounds[:-1]
    return attention_sequences(q, k, v, bounds[:-1], lengths, lengths, scale, positions)


def bias_by_distance(relative_bias: torch.Tensor, longest: int) -> torch.Tensor:
    """The kernel's bias: float32 [H, 2P - 1] (P: ``longest`` rounded up to 16), column
    P - 1 + d holding ``relative_bias[h, bucket(d)]`` for the distance d = j - i."""
    padded = -(-max(longest, 1) // 16) * 16
    distances = torch.arange(1 - padded, padded)
    return relative_bias[:, reference.relative_position_bucket(distances)].float().contiguous()


def rotary_tables(rotary: torch.Tensor, longest: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, float32 [longest, D / 2], of the angles fastbert.kernels.reference's
    rotary_positions takes at positions 0 .. longest - 1 (the same float32 values)."""
    angle = reference.rotary_angles(torch.arange(max(longest, 1)), rotary)
    return angle.cos().contiguous(), angle.sin().contiguous()


def attention_sequences(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    starts: torch.Tensor,
    lengths: torch.Tensor,
    queries: torch.Tensor,
    scale: float | None,
    positions: Positions,
) -> torch.Tensor:
    """The kernel's own contract, which :func:`attention_varlen` and the CPU engine's
    right-padded batches (fastbert.kernels.cpu_engine_attention.compiled_dense) fill in:
    sequence s's queries at tokens ``starts[s]`` .. + ``queries[s]`` - 1 of q, k, v ([T, H, D]
    that :func:`takes`) attend its keys at ``starts[s]`` .. + ``lengths[s]`` - 1 (lengths[s] <=
    queries[s]: a right-padded row's real tokens), at positions and distances counted from
    ``starts[s]``; starts, lengths, queries: int64 [B]; ``scale`` and ``positions`` as
    :func:`attention_varlen`'s. Returns [T, H, D] in q's dtype, contiguous: tokens outside
    every sequence's queries are left unset, a query without keys gets zeros."""
    out = torch.empty(q.shape, dtype=q.dtype)
    library = _ensure_loaded()
    assert library is not None, status()
    _, heads, head_dim = q.shape
    starts, lengths, queries = (t.contiguous() for t in (starts, lengths, queries))
    bias = cos = sin = None
    window = -1
    if starts.numel() and any(p is not None for p in positions):  # a host read, free here
        longest = int(torch.maximum(lengths, queries).max())
        if positions.relative_bias is not None:
            bias = bias_by_distance(positions.relative_bias, longest)
        if positions.rotary is not None:
            cos, sin = rotary_tables(positions.rotary, longest)
        # A window that every distance here is within binds nothing (and any window passes
        # as a C int without wrapping).
        if positions.window is not None and positions.window < longest - 1:
            window = int(positions.window)
    kernel = getattr(library, _ENTRY_POINTS[q.dtype])
    failed = kernel(
        q.data_ptr(),
        k.data_ptr(),
        v.data_ptr(),
        q.stride(0),
        q.stride(1),
        starts.data_ptr(),
        lengths.data_ptr(),
        queries.data_ptr(),
        starts.numel(),
        heads,
        head_dim,
        head_dim**-0.5 if scale is None else float(scale),
        out.data_ptr(),
        torch.get_num_threads(),
        not _tiles_paused,
        None if bias is None else bias.data_ptr(),
        0 if bias is None else bias.shape[1],
        window,
        None if cos is None else cos.data_ptr(),
        None if sin is None else sin.data_ptr(),
    )
    if failed == 2:
        raise MemoryError("cpu_attention: no scratch memory for the longest sequence")
    if failed:
        raise ValueError(f"cpu_attention: head dimension {head_dim} is not one of {HEAD_DIMS}")
    return out
