"""Where Triton kernels can run: on CUDA tensors, or on CPU tensors under the interpreter."""

from __future__ import annotations

import os

import torch


def interpreting() -> bool:
    """True when TRITON_INTERPRET=1, i.e. @triton.jit kernels run on the CPU with numpy."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


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
        "backend='torch' to run the pure-PyTorch reference anywhere"
    )
