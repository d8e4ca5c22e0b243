"""Keep the memory a CPU forward frees for the next forward, instead of handing it back to the
operating system and taking it again, page by page.

A forward allocates and frees tensors of megabytes each (a 4,096-token MiniLM batch: 25 MB
for an FFN product). glibc's malloc serves a block that large from a fresh ``mmap`` and
returns it with ``munmap`` when freed (or trims it off the top of its heap), so the next
forward faults every page in again and the kernel zeroes each one. Keeping the freed memory
removes most of those page faults and the system time they cost, int8 linears gaining the
most (benchmarks/cpu_memory.py; docs/results.md, "One process per contender, in rounds, freed
memory kept"). ONNX Runtime and OpenVINO keep their own arenas for the same reason, and
PyTorch's CPU tuning guide suggests preloading jemalloc or tcmalloc.

:func:`keep_freed_memory` sets glibc's ``M_MMAP_THRESHOLD`` (blocks up to 1 GiB come from the
heap) and ``M_TRIM_THRESHOLD`` (up to 1 GiB free at the heap's top stays), once per process,
called by fastbert.execution.cpu_tuning.apply_process_tuning at fastbert's entry points (the
command line, ``fastbert.load`` and the jobs that load a model folder, the server's start),
never from a forward. The process then keeps up to its peak heap for reuse (its resident
memory does not shrink after a large batch); results do not change. Set
``FASTBERT_KEEP_CPU_MEMORY=0`` before that to leave malloc as it is (or when another
allocator is preloaded); elsewhere than glibc it does nothing.

What a process keeps across forwards must also stay bounded. oneDNN, behind PyTorch's CPU
linears (``torch.ops.mkldnn._linear_pointwise``, ``torch._int_mm``), caches the primitives
it makes, one per op and shape, and PyTorch's ideep layer keeps an LRU cache of its own:
1,024 entries each by default. A padding-free batch's shape is its token count, so a server
or an embedding job meets a new shape at almost every batch, and each shape's primitives
stay, megabytes of them (docs/cpu.md, "Caches of one entry per shape"): ``fastbert serve``
under steady load grew until the caches were full (benchmarks/serve_soak.py; docs/results.md,
"Memory over a long run on a CPU"; malloc's arenas and the kept memory were not the cause:
docs/cpu.md, "Over a long run"). :func:`bound_shape_caches` sets
``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` and ``LRU_CACHE_CAPACITY`` to CACHE_ENTRIES where they
are unset (the same load's memory then stayed level); torch reads them as it loads, so
``fastbert``'s command line calls it before anything imports torch, and a program of one's
own sets them before it imports torch. A forward's primitives take eight entries (a
BERT-family layer has four linear shapes, two oneDNN entries each), so each layer after the
first finds them. A float32 batch of a shape no longer cached makes them again, quickly; a
bfloat16 one on a CPU with AMX takes longer than its product runs, so bfloat16 calls run
their size bucket's rows (fastbert.execution.runtime, "Row buckets on a CPU"), and 64 entries
hold the primitives of eight buckets: a corpus job's batches, near the token budget, fill
four or five (docs/cpu.md, "Row buckets").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import platform
import sys

from fastbert.settings import KEEP_CPU_MEMORY

VARIABLE = KEEP_CPU_MEMORY.name
KEEP_BYTES = 1 << 30
# The per-shape caches of oneDNN's primitives and of PyTorch's ideep layer, and the entries
# each keeps (see the module docstring).
CACHE_VARIABLES = ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")
CACHE_ENTRIES = 64
# mallopt's parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def wanted() -> bool:
    """``$FASTBERT_KEEP_CPU_MEMORY``: 1 (the default) or 0."""
    return KEEP_CPU_MEMORY.read()


def on_glibc() -> bool:
    """Whether this process runs on glibc's malloc (Linux with glibc)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


@functools.cache
def keep_freed_memory() -> str:
    """Set malloc to keep freed memory (see the module docstring), once; what was done:
    "kept", "off" (``$FASTBERT_KEEP_CPU_MEMORY=0``) or "unavailable" (not glibc, or mallopt
    refused)."""
    if not wanted():
        return "off"
    if not on_glibc():
        return "unavailable"
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return "unavailable"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # Setting either threshold also stops glibc from moving them itself. glibc before 2.35
    # takes an mmap threshold of at most 32 MiB.
    for keep in (KEEP_BYTES, 32 << 20):
        if mallopt(_M_MMAP_THRESHOLD, keep) == 1 and mallopt(_M_TRIM_THRESHOLD, keep) == 1:
            return "kept"
    return "unavailable"


@functools.cache
def bound_shape_caches() -> bool:
    """Set each of CACHE_VARIABLES to CACHE_ENTRIES in this process's environment where it is
    unset (a value already there is kept), once; whether it could: not once torch is imported
    (it read them as it loaded; nothing is set then). Call it at an entry point, before
    anything imports torch."""
    if "torch" in sys.modules:
        return False
    for name in CACHE_VARIABLES:
        os.environ.setdefault(name, str(CACHE_ENTRIES))
    return True


def cache_entries() -> dict[str, str]:
    """Each of CACHE_VARIABLES as this process's environment sets it ("1024", oneDNN's and
    ideep's default, where unset)."""
    return {name: os.environ.get(name) or "1024" for name in CACHE_VARIABLES}


def status() -> str:
    """What a CPU forward in this process does (or will do) with the memory it frees, and
    the entries of the per-shape caches, in words, for ``fastbert info``."""
    entries = cache_entries()
    caches = f"per-shape caches: {', '.join(f'{k}={v}' for k, v in entries.items())}"
    if not wanted():
        return f"returned to the system ({VARIABLE}=0); {caches}"
    if not on_glibc():
        return (
            "returned to the system (not glibc: preload jemalloc or tcmalloc to keep it); " + caches
        )
    return (
        f"kept for reuse, set where fastbert loads a model (glibc mallopt; {VARIABLE}=0: off); "
        + caches
    )
