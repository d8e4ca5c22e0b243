"""Peak CUDA memory of a contender, in MiB (None off CUDA: the CPU allocator keeps no peak)."""

from __future__ import annotations

import torch


def _is_cuda(device: torch.device | str) -> bool:
    return torch.device(device).type == "cuda"


def allocated_mib(device: torch.device | str) -> float | None:
    """CUDA memory allocated now (MiB)."""
    if not _is_cuda(device):
        return None
    return torch.cuda.memory_allocated(device) / 2**20


def reset_peak(device: torch.device | str) -> None:
    """Start a new peak-memory window."""
    if _is_cuda(device):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_mib(device: torch.device | str) -> float | None:
    """The most CUDA memory allocated since :func:`reset_peak` (MiB)."""
    if not _is_cuda(device):
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


def release(device: torch.device | str) -> None:
    """Give cached CUDA blocks back, so the next contender starts from the same state."""
    if _is_cuda(device):
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
