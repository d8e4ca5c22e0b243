"""Timing a callable: warm-up, many repetitions, then the median with p20 and p80 and the
median's 95% interval (:mod:`~fastbert.bench.stopping`).

On CUDA each repetition is bracketed by CUDA events on the current stream, and the device is
synchronized before the events are read, so the times are GPU times including any gaps the
host leaves between kernels (launch overhead counts, as it does for a user). On the CPU each
repetition is timed with ``time.perf_counter``. Both paths are a :data:`Timer`, which times a
sequence of calls (one contender's repetitions, or several contenders' in turns) and gives the
same :class:`Timing`.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from fastbert.bench.stopping import median_interval

# Calls each call in order and returns its time in ms.
Timer = Callable[[Sequence[Callable[[], object]]], list[float]]


@dataclasses.dataclass(frozen=True)
class Timing:
    """Summary of repeated timings, in milliseconds."""

    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    ci_low_ms: float | None = None  # the median's 95% interval (None below 6 repetitions)
    ci_high_ms: float | None = None
    noisy: bool | None = None  # timed in turns: its interval stayed too wide to rank it
    stopped: str | None = None  # timed in turns: why (StoppingRule.stop)

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
    """Median, p20, p80 and the median's 95% interval of per-repetition times (ms)."""
    low, high = median_interval(samples_ms) or (None, None)
    return Timing(
        median_ms=statistics.median(samples_ms),
        p20_ms=percentile(samples_ms, 20),
        p80_ms=percentile(samples_ms, 80),
        reps=len(samples_ms),
        ci_low_ms=low,
        ci_high_ms=high,
    )


def _check_counts(warmup: int, reps: int) -> None:
    if warmup < 0 or reps < 1:
        raise ValueError(f"need warmup >= 0 and reps >= 1, got warmup={warmup}, reps={reps}")


def wall_clock_timer(clock: Callable[[], float] = time.perf_counter) -> Timer:
    """A :data:`Timer` on the host clock ``clock`` (seconds; tests pass a fake)."""

    def run(calls: Sequence[Callable[[], object]]) -> list[float]:
        times = []
        for call in calls:
            start = clock()
            call()
            times.append((clock() - start) * 1e3)
        return times

    return run


def cuda_event_timer(calls: Sequence[Callable[[], object]]) -> list[float]:
    """A :data:`Timer` on the current CUDA stream: a pair of events per call, read after one
    synchronization at the end."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in calls]
    ends = [torch.cuda.Event(enable_timing=True) for _ in calls]
    for call, start, end in zip(calls, starts, ends):
        start.record()
        call()
        end.record()
    torch.cuda.synchronize()
    return [start.elapsed_time(end) for start, end in zip(starts, ends)]


def timer_for(device: torch.device | str) -> Timer:
    """CUDA events for a CUDA ``device``, the wall clock otherwise."""
    return cuda_event_timer if torch.device(device).type == "cuda" else wall_clock_timer()


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
    return summarize(wall_clock_timer(clock)([fn] * reps))


def time_cuda(fn: Callable[[], object], warmup: int = 10, reps: int = 100) -> Timing:
    """Time ``fn()`` on the current CUDA stream with one pair of CUDA events per repetition."""
    _check_counts(warmup, reps)
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return summarize(cuda_event_timer([fn] * reps))


def time_fn(fn: Callable[[], object], device: torch.device | str, warmup: int, reps: int) -> Timing:
    """CUDA-event timing for a CUDA ``device``, wall-clock timing otherwise."""
    if torch.device(device).type == "cuda":
        return time_cuda(fn, warmup, reps)
    return time_cpu(fn, warmup, reps)


def synchronize(device: torch.device | str) -> None:
    """Wait for the device's queued work (a no-op off CUDA)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
