"""Timing contenders in turns: repetition 1 of every contender, then repetition 2, and so on,
so that a slow spell of the machine (another process, a clock change) hits all of them alike
instead of whichever one happened to be running.

The contenders of a shape are timed in rounds. A round is several repetitions of each,
interleaved (A B C A B C ...): first the rule's minimum, then a quarter more each round (at
least one), never more than the time the rule has left is expected to fit. After each round
the :class:`~fastbert.bench.stopping.StoppingRule` decides whether to go on, so every
contender gets the same number of repetitions. The timer reads a round's times at its end
(on CUDA: one synchronization per round).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

from fastbert.bench.stopping import StoppingRule
from fastbert.bench.timing import Timer, Timing, summarize


@dataclasses.dataclass
class TurnsResult:
    """The timing of each contender that ran to the end, and the error of each that failed."""

    timings: dict[str, Timing]
    failures: dict[str, Exception]


def round_size(rule: StoppingRule, cells_ms: Sequence[Sequence[float]]) -> int:
    """Repetitions per contender in the next round of cells timed in turns so far."""
    done = len(cells_ms[0])
    if done < rule.min_reps:
        return rule.min_reps - done
    size = min(max(1, done // 4), rule.max_reps - done)
    spent_s = sum(map(sum, cells_ms)) / 1e3
    if rule.max_seconds > 0 and spent_s > 0:
        left_s = rule.max_seconds * len(cells_ms) - spent_s
        per_round_s = spent_s / done  # one repetition of every contender
        size = min(size, math.floor(left_s / per_round_s))
    return max(1, size)


def time_in_turns(
    calls: Mapping[str, Callable[[], object]], rule: StoppingRule, timer: Timer
) -> TurnsResult:
    """Time each of ``calls`` (name -> call) in turns until ``rule`` stops them.

    A call that raises drops out of the turns (its error is in ``failures``); the others go on.
    """
    samples: dict[str, list[float]] = {name: [] for name in calls}
    failures: dict[str, Exception] = {}

    def guarded(name: str) -> Callable[[], None]:
        def call() -> None:
            if name in failures:
                return
            try:
                calls[name]()
            except Exception as exc:  # one failing contender never stops the others
                failures[name] = exc

        return call

    stopped = None
    while active := [name for name in calls if name not in failures]:
        cells = [samples[name] for name in active]
        stopped = rule.stop(cells)
        if stopped is not None:
            break
        order = [name for _ in range(round_size(rule, cells)) for name in active]
        for name, ms in zip(order, timer([guarded(name) for name in order])):
            samples[name].append(ms)
    timings = {
        name: dataclasses.replace(
            summarize(samples[name]), noisy=not rule.settled(samples[name]), stopped=stopped
        )
        for name in calls
        if name not in failures
    }
    return TurnsResult(timings, failures)
