"""Timing a callable: warm-up, many repetitions, then the median with p20 and p80.

On CUDA each repetition is bracketed by CUDA events on the current stream, and the device is
synchronized before the events are read, so the times are GPU times including any gaps the
host leaves between kernels (launch overhead counts, as it does for a user). On the CPU each
repetition is timed with ``time.perf_counter``. Both paths have the same structure and give
the same :class:`Timing`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

import torch


@dataclasses.dataclass(frozen=True)
class Timing:
    """Summary of repeated timings, in milliseconds."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) of ``samples``, linear between closest ranks."""
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}")
    ordered = sorted(samples)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def summarize(samples_ms: Sequence[float]) -> Timing:
    """Median, p20 and p80 of per-repetition times (ms)."""
    return Timing(
        median_ms=statistics.median(samples_ms),
        p20_ms=percentile(samples_ms, 20),
        p80_ms=percentile(samples_ms, 80),
        reps=len(samples_ms),
    )


def _check_counts(warmup: int, reps: int) -> None:
    if warmup < 0 or reps < 1:
        raise ValueError(f"need warmup >= 0 and reps >= 1, got warmup={warmup}, reps={reps}")


def time_cpu(
    fn: Callable[[], object],
    warmup: int = 3,
    reps: int = 10,
    clock: Callable[[], float] = time.perf_counter,
) -> Timing:
    """Time ``fn()`` on the host: ``warmup`` untimed calls, then ``reps`` timed ones.

    ``clock`` returns seconds (``time.perf_counter``; tests pass a fake).
    """
    _check_counts(warmup, reps)
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        start = clock()
        fn()
        samples.append((clock() - start) * 1e3)
    return summarize(samples)


def time_cuda(fn: Callable[[], object], warmup: int = 10, reps: int = 100) -> Timing:
    """Time ``fn()`` on the current CUDA stream with one pair of CUDA events per repetition."""
    _check_counts(warmup, reps)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return summarize([start.elapsed_time(end) for start, end in zip(starts, ends)])


def time_fn(fn: Callable[[], object], device: torch.device | str, warmup: int, reps: int) -> Timing:
    """CUDA-event timing for a CUDA ``device``, wall-clock timing otherwise."""
    if torch.device(device).type == "cuda":
        return time_cuda(fn, warmup, reps)
    return time_cpu(fn, warmup, reps)


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op off CUDA)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
