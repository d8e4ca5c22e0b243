"""The precisions ``fastbert accuracy`` compares, as data: one entry each, with the dtype it
computes in and whether a device runs it.

A new precision (a ``quantize`` mode, say) is one more :class:`Precision` in
:data:`PRECISIONS`; the stage comparison, the precision report, their option checking and
their documentation read this table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from fastbert.execution import validation


@dataclasses.dataclass(frozen=True)
class Precision:
    """One precision: ``name`` as the command line spells it.

    quantize: the ``quantize`` argument of the entry points (None: a plain dtype).
    compute_dtype: the floating dtype the model runs in on a device (float32 on a CPU and
    float16 on CUDA for int8: the activations, LayerNorm and attention stay floating).
    runs_on: whether fastbert runs it on a device with a backend ("torch" or "triton").
    emulated: whether it is an emulation on a device (its accuracy, not its speed: run only on
    request). cpu_cost: its encode time on a CPU over the float32 reference's (measured on a
    2-core x86 CPU; the run-time estimate of ``fastbert accuracy --precisions``).
    """

    name: str
    quantize: str | None
    compute_dtype: Callable[[torch.device], torch.dtype]
    runs_on: Callable[[torch.device, str], bool]
    emulated: Callable[[torch.device], bool] = lambda device: False
    cpu_cost: float = 1.0


def _cuda_capability_at_least(device: torch.device, capability: tuple[int, int]) -> bool:
    return torch.cuda.get_device_capability(device) >= capability


def _runs_bf16(device: torch.device, backend: str) -> bool:
    """A GPU that has it; on a CPU the torch backend (PyTorch's bfloat16 kernels), not the
    Triton interpreter (its bfloat16 products are wrong: triton issue 11584)."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return backend == "torch"


def _runs_int8(device: torch.device, backend: str) -> bool:
    """CUDA: the integer tensor cores of sm_80 or newer; a CPU: torch._int_mm, or exact
    float32 GEMMs without int8 dot products (the torch backend; the interpreter runs it too,
    slowly)."""
    if device.type == "cuda":
        return _cuda_capability_at_least(device, validation.MIN_CAPABILITY["int8"])
    return True


def _runs_fp8(device: torch.device, backend: str) -> bool:
    """CUDA: the FP8 tensor cores of sm_89 or newer; a CPU: the emulation (the same e4m3
    operands multiplied in float32: fp8's accuracy, not its speed)."""
    if device.type == "cuda":
        return _cuda_capability_at_least(device, validation.MIN_CAPABILITY["fp8"])
    return True


# cpu_cost: each stage's time (optimize and encode) over the reference's in a run of
# `fastbert accuracy --precisions --emulated` on a 2-core AMD EPYC (AVX-512 with BF16 and VNNI,
# no fp16 arithmetic: fp16 runs converted) under other load: rough (docs/accuracy.md, "Run time").
PRECISIONS: tuple[Precision, ...] = (
    Precision(
        "fp32",
        None,
        lambda device: torch.float32,
        lambda device, backend: True,
        cpu_cost=0.6,
    ),
    Precision(
        "fp16",
        None,
        lambda device: torch.float16,
        lambda device, backend: True,
        cpu_cost=2.5,
    ),
    Precision("bf16", None, lambda device: torch.bfloat16, _runs_bf16, cpu_cost=0.4),
    Precision(
        "int8",
        "int8",
        lambda device: torch.float16 if device.type == "cuda" else torch.float32,
        _runs_int8,
        cpu_cost=0.55,
    ),
    Precision(
        "fp8",
        "fp8",
        lambda device: torch.float16 if device.type == "cuda" else torch.float32,
        _runs_fp8,
        emulated=lambda device: device.type != "cuda",
        cpu_cost=0.75,
    ),
)
PRECISION_NAMES: tuple[str, ...] = tuple(p.name for p in PRECISIONS)


def precision(name: str) -> Precision:
    """The entry called ``name``; ValueError naming the choices for another name."""
    for entry in PRECISIONS:
        if entry.name == name:
            return entry
    raise ValueError(f"unknown precision {name!r}; choose from {', '.join(PRECISION_NAMES)}")


def runnable(device: torch.device, backend: str) -> list[str]:
    """The names of the precisions fastbert runs on ``device`` with ``backend``, in table
    order."""
    return [p.name for p in PRECISIONS if p.runs_on(device, backend)]
