"""Roofline peaks of the GPUs whose figures we know.

The compute peak is what cuBLAS achieves on large fp16/bf16 dense GEMMs (not the datasheet
number), the memory peak the HBM bandwidth a streaming kernel reaches. A GPU not in the table
gets no roofline: a missing figure is better than a wrong one.
"""

from __future__ import annotations

import dataclasses
import re

import torch


@dataclasses.dataclass(frozen=True)
class Peaks:
    """Achievable peaks: ``tflops`` (fp16/bf16 dense TFLOP/s) and ``tbps`` (HBM TB/s)."""

    gpu: str
    tflops: float
    tbps: float


# (pattern on the device name, excluded pattern or None, peaks). First match wins.
# H100 PCIe and H100 NVL have other clocks and memories, GH200 another memory: not listed.
# Memory: what a device-to-device copy reaches (counting bytes read and written), about 3.0
# TB/s on an H100 SXM and 4.3 on an H200, below the datasheets' 3.35 and 4.8. Compute: a large
# random-data bf16 GEMM through cuBLAS reaches about 770 to 800 TFLOP/s on both.
_KNOWN = (
    (r"\bH200\b", None, Peaks("H200", 800.0, 4.3)),
    (r"\bH100\b", r"PCIe|NVL", Peaks("H100 SXM", 800.0, 3.0)),
)


def peaks_for(device_name: str | None) -> Peaks | None:
    """The peaks of a GPU named ``device_name`` (as torch.cuda.get_device_name gives it)."""
    if not device_name:
        return None
    for pattern, excluded, peaks in _KNOWN:
        if re.search(pattern, device_name) and not (
            excluded and re.search(excluded, device_name, re.I)
        ):
            return peaks
    return None


def device_name(device: torch.device | str) -> str:
    """The GPU's name for a CUDA device, "cpu" otherwise."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


def peaks_here(device: torch.device | str) -> Peaks | None:
    """The peaks of ``device``; None for a CPU or a GPU not in the table."""
    device = torch.device(device)
    return peaks_for(device_name(device)) if device.type == "cuda" else None
