"""Where Triton kernels can run (CUDA tensors, or CPU tensors under the interpreter), which
autotune configs they time, and the launchers' host-side integer helpers."""

from __future__ import annotations

import os
import threading

import torch
import triton

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
