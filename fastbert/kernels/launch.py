"""Where Triton kernels can run (CUDA tensors, or CPU tensors under the interpreter), which
autotune configs they time, how an autotuned kernel is launched once tuned
(:func:`launch_tuned`), and the launchers' host-side integer helpers."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import torch
import triton
from triton.runtime.autotuner import Autotuner

from fastbert.settings import AUTOTUNE

# Which autotune configs a launch times: unset or "all" for every config the kernel keeps for
# that launch; an integer i for only the i-th of them, so nothing is timed (the GPU tests pin
# each config in turn to check them all, or the first to skip tuning).
AUTOTUNE_ENV = AUTOTUNE.name


def interpreting() -> bool:
    """True when TRITON_INTERPRET=1, i.e. @triton.jit kernels run on the CPU with numpy."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_version() -> tuple[int, int]:
    """(major, minor) of the installed Triton release. Autotune configs that a release compiles
    differently (more registers, spills) depend on it, each where it was measured."""
    major, minor = triton.__version__.split(".")[:2]
    return int(major), int(minor)


# Triton 3.6, the oldest release supported, against 3.9 (CI compiles every kernel with both):
# the attention kernels have configs of their own there (flash_attention.py,
# flash_attention_backward.py). 3.7 and 3.8, not measured, get 3.9's.
TRITON_3_6 = triton_version() < (3, 7)
# The compile options of the row kernels' forwards (LayerNorm, the embeddings, the softmax, the
# row quantisation): no fused multiply-adds but the ones written (tl.fma). The GPU compiler
# otherwise fuses a product and the sum after it into one FMA where it sees fit, which rounds
# differently from the reference and the interpreter, which round each operation as written:
# the quantisation's rounding to an integer then rounded the exact product (367 int8 codes in
# 3.1M off the reference's, float16 rows on an H200), and a LayerNorm that saves its
# statistics for the backward gave other bits than one that does not. These kernels are
# memory-bound. Their backwards keep the compiler's fusions (unfused, the embeddings'
# backward spilled registers on sm_80 under Triton 3.6), as do the matrix kernels: compiled
# unfused, the float32 linear's error at BERT's projections grew from within to twice
# PyTorch's (5.9e-6 against a bound of 2.6e-6, H200), and the attention's score arithmetic is
# in the main loop whose instructions tests/test_compile.py budgets.
UNFUSED = {"enable_fp_fusion": False}
# The compile options of every other kernel: the compiler's fusions, asked for by name. Left
# unsaid, Triton takes TRITON_DEFAULT_FP_FUSION's choice, which 3.9 warns about on every first
# compile and 3.10 turns off: these kernels' bounds and instruction budgets were measured fused.
FUSED = {"enable_fp_fusion": True}


def check_triton_device(name: str, t: torch.Tensor) -> None:
    """Raise unless a Triton kernel can read ``t`` where it lives and in its dtype."""
    if t.dtype == torch.float64:
        raise TypeError(
            f"{name} is float64: the Triton kernels run float16, bfloat16 and float32; "
            "backend='torch' runs float64"
        )
    if t.device.type == "cuda":
        return
    if t.device.type == "cpu" and interpreting():
        return
    raise ValueError(
        f"{name} is on {t.device}: the Triton kernels need CUDA tensors, or CPU tensors with "
        "TRITON_INTERPRET=1 set before fastbert is imported (the Triton interpreter); use "
        "backend='torch' to run PyTorch's own ops anywhere"
    )


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for host integers, b > 0.

    The launchers use these two instead of ``triton.cdiv`` / ``triton.next_power_of_2``: in
    recent Triton releases those are constexpr functions whose host call costs a few
    microseconds (3 to 5 with Triton 3.9, against tens of nanoseconds here), paid several times
    per launch, dozens of launches per forward.
    """
    return -(a // -b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n, for host integers n >= 1 (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def pinned_config() -> int | None:
    """The config index FASTBERT_AUTOTUNE pins, or None when every config is timed."""
    return AUTOTUNE.read()


def tuned(kept: list[triton.Config]) -> list[triton.Config]:
    """The configs an autotuner times for a launch, of the ``kept`` ones: all of them, or the
    one that FASTBERT_AUTOTUNE names by its index."""
    index = pinned_config()
    if index is None:
        return kept
    if index >= len(kept):
        raise ValueError(
            f"{AUTOTUNE_ENV}={index}, but this launch keeps {len(kept)} autotune configs"
        )
    return kept[index : index + 1]


def time_config(kernel_call, quantiles):
    """The autotuners' timer: ``triton.testing.do_bench`` (Triton's default), except when
    FASTBERT_AUTOTUNE pins a config (there is nothing to compare then, and some Triton
    releases time even a lone config) or under the interpreter (whose timings say nothing
    of a GPU): it returns zeros without running anything, so the first config kept runs."""
    if pinned_config() is not None or interpreting():
        return [0.0 for _ in quantiles] if quantiles else 0.0
    return triton.testing.do_bench(kernel_call, quantiles=quantiles)


def launch_lock() -> threading.Lock:
    """A lock for the launches of one autotuned kernel.

    Triton's autotuner keeps a launch's arguments on itself (``Autotuner.nargs``) from the
    start of the launch to its end, and reads them back while it tunes (the prune hook, the
    timed runs) and in config pre-hooks: two threads launching the same kernel at once would
    read each other's arguments, or None. Each autotuned kernel's launches hold its lock.
    """
    return threading.Lock()


class _KeyReader:
    """Where an autotuner's key sits among a launch's arguments, found once per kernel."""

    def __init__(self, tuner: Autotuner) -> None:
        self.names = frozenset(tuner.arg_names)
        self.position = {name: i for i, name in enumerate(tuner.arg_names)}
        self.keys = [(name, self.position[name]) for name in tuner.keys]

    def key(self, args: tuple, kwargs: dict) -> tuple:
        """The tuple ``Autotuner.run`` builds for its cache: the key arguments' values, then
        the dtype of every argument that has one, positional ones first."""
        values = []
        for name, i in self.keys:
            if i < len(args):
                values.append(args[i])
            elif name in kwargs:
                values.append(kwargs[name])
        for a in args:
            if a is not None and hasattr(a, "dtype"):
                values.append(_dtype_name(a.dtype))
        for name, v in kwargs.items():
            if name in self.names and hasattr(v, "dtype"):
                values.append(_dtype_name(v.dtype))
        return tuple(values)


_DTYPE_NAMES: dict[Any, str] = {}


def _dtype_name(dtype: Any) -> str:
    """``str(dtype)``, remembered: the key reads a dozen dtypes a launch."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


class _LaunchArguments(Mapping):
    """A launch's arguments by name, looked up when read: what a config's pre-hook is given
    (Triton builds the whole dict; the linear's pre-hook reads five of its 39 entries)."""

    def __init__(self, position: dict[str, int], args: tuple, *named: dict) -> None:
        self._position, self._args, self._named = position, args, named

    def __getitem__(self, name: str) -> Any:
        for values in self._named[::-1]:
            if name in values:
                return values[name]
        i = self._position.get(name, len(self._args))
        if i < len(self._args):
            return self._args[i]
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        names = [name for name, i in self._position.items() if i < len(self._args)]
        for values in self._named:
            names += [name for name in values if name not in names]
        return iter(names)

    def __len__(self) -> int:
        return sum(1 for _ in self)


_KEY_READERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def launch_tuned(kernel: Any, grid: Any, *args: Any, **kwargs: Any) -> None:
    """``kernel[grid](*args, **kwargs)`` for an autotuned kernel, without the autotuner's
    per-launch bookkeeping once it has chosen a config for the launch's key.

    Triton's ``Autotuner.run`` builds two dicts of every argument and looks each name up in a
    list on every launch, host time a forward pays dozens of times (the linear has 39
    arguments; docs/results.md has the measurements). Here the autotuner's own cache is read with
    the key it would build; a key it holds no config for (never tuned, or its cache cleared)
    goes through the autotuner as before, so pruning, pinning, timing and ``cache.clear()``
    behave as Triton's. The config's pre-hook runs, and ``best_config`` is set, as there. Any
    other ``kernel`` (a stand-in a test puts in its place) is launched as ``kernel[grid]``."""
    if not isinstance(kernel, Autotuner):
        kernel[grid](*args, **kwargs)
        return
    reader = _KEY_READERS.get(kernel)
    if reader is None:
        reader = _KEY_READERS[kernel] = _KeyReader(kernel)
    if len(kernel.configs) == 1:
        config = kernel.configs[0]
    else:
        config = kernel.cache.get(reader.key(args, kwargs))
        if config is None:
            kernel[grid](*args, **kwargs)
            return
    kernel.best_config = config
    chosen = config.all_kwargs()
    if config.pre_hook is not None:
        config.pre_hook(_LaunchArguments(reader.position, args, kwargs, chosen))
    kernel.fn.run(*args, grid=grid, warmup=False, **kwargs, **chosen)
