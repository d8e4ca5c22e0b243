"""The two ceilings of the GPU at hand, measured rather than taken from a datasheet.

- Memory: a device-to-device copy of a buffer far larger than the L2 cache; bytes read plus
  bytes written over the median time.
- Compute: a large square matrix product through torch.matmul (cuBLAS) in the benchmark's
  dtype; 2 n^3 FLOPs over the median time.

They are reported beside the roofline peaks (fastbert.bench.hardware), which stay the
reference for the roofline fractions so that figures from different runs compare; the
measured ones say how close to its own limits this particular card, clock and driver got.
"""

from __future__ import annotations

import torch

from fastbert.bench import timing

COPY_BYTES = 1 << 30  # 1 GiB each way: far beyond any L2 cache
GEMM_SIZE = 8192


def measure(
    device: torch.device | str,
    dtype: torch.dtype,
    *,
    copy_bytes: int = COPY_BYTES,
    gemm_size: int = GEMM_SIZE,
    reps: int = 20,
) -> dict | None:
    """{"copy_tbps", "gemm_tflops", "copy_bytes", "gemm_size", "dtype"} for a CUDA ``device``;
    None off CUDA (a CPU's figures would mean nothing next to a GPU roofline)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return {
        "copy_tbps": copy_tbps(device, dtype, copy_bytes, reps),
        "gemm_tflops": gemm_tflops(device, dtype, gemm_size, reps),
        "copy_bytes": copy_bytes,
        "gemm_size": gemm_size,
        "dtype": str(dtype).removeprefix("torch."),
    }


def copy_tbps(device: torch.device, dtype: torch.dtype, nbytes: int, reps: int) -> float:
    """TB/s of copying ``nbytes`` of random ``dtype`` values (read + written) on ``device``."""
    elements = nbytes // torch.tensor([], dtype=dtype).element_size()
    source = _random((elements,), dtype, device)
    target = torch.empty_like(source)
    median_ms = timing.time_fn(lambda: target.copy_(source), device, 3, reps).median_ms
    return 2 * elements * source.element_size() / (median_ms * 1e-3) / 1e12


def gemm_tflops(device: torch.device, dtype: torch.dtype, size: int, reps: int) -> float:
    """TFLOP/s of a [size, size] x [size, size] product of random ``dtype`` values."""
    a, b = _random((size, size), dtype, device, 1), _random((size, size), dtype, device, 2)
    median_ms = timing.time_fn(lambda: a @ b, device, 3, reps).median_ms
    return 2 * size**3 / (median_ms * 1e-3) / 1e12


def _random(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, seed: int = 0
) -> torch.Tensor:
    """Random values (never zeros: they can run faster than real data)."""
    generator = torch.Generator(device).manual_seed(seed)
    return torch.randn(shape, device=device, generator=generator).to(dtype)
