"""When to stop timing: the median's confidence interval from order statistics, and the rule
that stops once it is narrow enough or the time allowed is spent.

The interval assumes nothing about the shape of the timings (they are skewed: a slow spell
stretches the right tail). Of n independent timings, the number below the true median is
Binomial(n, 1/2), so with the timings sorted, x_(1) <= ... <= x_(n), the interval
[x_(l), x_(n+1-l)] holds the median with probability 1 - 2 P(Binomial(n, 1/2) <= l - 1). The
lower rank l is the largest that keeps this at least the confidence (95%). Below 6 timings no
interval reaches 95% ([min, max] holds the median with probability 1 - 2^(1-n)); at 10 it is
[x_(2), x_(9)], at 100 [x_(40), x_(61)].

The rule (:class:`StoppingRule`): time at least ``min_reps`` repetitions; then stop as soon as
the interval is at most ``width`` of the median wide (a cell whose median is known to within
that is *settled*), or when ``max_seconds`` of timed calls per contender are spent, or at
``max_reps``. A cell that stops unsettled is *noisy*: its median is not known well enough to
rank it against another.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from collections.abc import Sequence

CONFIDENCE = 0.95


@functools.cache
def median_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int] | None:
    """1-based ranks (l, n + 1 - l) of the sorted timings that bound the median with at least
    ``confidence``; None when even [min, max] falls short (n < 6 at 95%)."""
    tail = (1 - confidence) / 2
    below, lower = 0.0, 0  # below: P(Binomial(n, 1/2) <= lower - 1)
    for k in range(n // 2 + 1):
        # P(Binomial(n, 1/2) = k) in logarithms: 2**-n underflows a float past n = 1074.
        below += math.exp(
            math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) - n * math.log(2)
        )
        if below > tail:
            break
        lower = k + 1
    return (lower, n + 1 - lower) if lower >= 1 else None


def median_interval(
    samples: Sequence[float], confidence: float = CONFIDENCE
) -> tuple[float, float] | None:
    """(low, high) of the median's ``confidence`` interval; None with too few samples."""
    ranks = median_ranks(len(samples), confidence)
    if ranks is None:
        return None
    ordered = sorted(samples)
    return ordered[ranks[0] - 1], ordered[ranks[1] - 1]


def relative_width(samples: Sequence[float], confidence: float = CONFIDENCE) -> float | None:
    """The interval's width over the median (0.05: the median is known to within 5% of
    itself); None with too few samples."""
    interval = median_interval(samples, confidence)
    if interval is None:
        return None
    median = statistics.median(samples)
    return (interval[1] - interval[0]) / median if median > 0 else math.inf


@dataclasses.dataclass(frozen=True)
class StoppingRule:
    """How long to time the contenders of one shape (see the module docstring).

    min_reps: timed repetitions at least. width: the interval's width over the median at which
    a cell is settled. max_seconds: timed seconds per contender after which an unsettled
    cell stops as noisy (0: stop at ``min_reps``). max_reps: repetitions at most.
    """

    min_reps: int = 10
    width: float = 0.05
    max_seconds: float = 3.0
    max_reps: int = 5000
    confidence: float = CONFIDENCE

    def __post_init__(self) -> None:
        if self.min_reps < 1 or self.max_reps < self.min_reps:
            raise ValueError(f"need 1 <= min_reps <= max_reps: {self.min_reps}, {self.max_reps}")
        if self.width <= 0 or self.max_seconds < 0 or not 0 < self.confidence < 1:
            raise ValueError("need width > 0, max_seconds >= 0 and 0 < confidence < 1")

    def settled(self, samples_ms: Sequence[float]) -> bool:
        """Whether one cell's median is known to within ``width``."""
        width = relative_width(samples_ms, self.confidence)
        return len(samples_ms) >= self.min_reps and width is not None and width <= self.width

    def stop(self, cells_ms: Sequence[Sequence[float]]) -> str | None:
        """Why cells timed in turns (the same number of repetitions each) stop now: "settled"
        (every one is), "min reps" (no time to settle: ``max_seconds`` 0), "time cap" (their
        timed calls took ``max_seconds`` each on average), "max reps"; None to go on."""
        reps = min(len(samples) for samples in cells_ms)
        if reps < self.min_reps:
            return None
        if all(self.settled(samples) for samples in cells_ms):
            return "settled"
        if self.max_seconds == 0:
            return "min reps"
        if reps >= self.max_reps:
            return "max reps"
        if sum(map(sum, cells_ms)) >= 1e3 * self.max_seconds * len(cells_ms):
            return "time cap"
        return None

    def describe(self) -> str:
        """The rule in a sentence fragment, for reports."""
        text = f"at least {self.min_reps} timed repetitions per cell"
        if self.max_seconds == 0:
            return text
        return (
            f"{text}, more until the median's {self.confidence:.0%} interval is within "
            f"{self.width:.0%} of it (at most {self.max_seconds:g} s per cell)"
        )

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
