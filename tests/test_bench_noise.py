"""Timing that knows when it is noisy: the median's interval from order statistics, the
stopping rule and the timing in turns on synthetic timings (a fake timer: nothing here depends
on this machine's speed), the machine readings, the caution line, the report's marks, and
``fastbert bench`` naming a noisy cell. Nothing here asserts a speed."""

from __future__ import annotations

import itertools
import json
import math
import random
from collections.abc import Callable, Iterator, Sequence
from fractions import Fraction

import pytest

from fastbert.bench import analysis, machine, noise, report, stopping, timing, turns
from fastbert.bench.stopping import StoppingRule
from fastbert.cli import main

# --- the median's interval ----------------------------------------------------------------


def _exact_coverage(n: int, lower: int) -> Fraction:
    """P(x_(lower) <= median <= x_(n+1-lower)) for n draws: 1 - 2 P(Binomial(n, 1/2) < lower)."""
    below = sum(Fraction(math.comb(n, k), 2**n) for k in range(lower))
    return 1 - 2 * below


def test_median_ranks_match_the_published_table() -> None:
    # Conover, Practical Nonparametric Statistics: the 95% ranks for the median.
    assert stopping.median_ranks(5) is None  # [min, max] holds it with probability 15/16 only
    assert stopping.median_ranks(6) == (1, 6)
    assert stopping.median_ranks(10) == (2, 9)
    assert stopping.median_ranks(20) == (6, 15)
    assert stopping.median_ranks(100) == (40, 61)


@pytest.mark.parametrize("n", [6, 7, 11, 30, 99, 250, 1201])
def test_median_ranks_are_the_narrowest_that_cover_95_percent(n: int) -> None:
    lower, upper = stopping.median_ranks(n)
    assert upper == n + 1 - lower
    assert _exact_coverage(n, lower) >= Fraction(95, 100)
    assert _exact_coverage(n, lower + 1) < Fraction(95, 100)


def test_the_interval_holds_the_true_median_as_often_as_it_says() -> None:
    """Skewed timings (exponential, true median ln 2): over 2000 samples of 30 the interval
    misses the median at most about 5% of the time (ranks are discrete: a bit less)."""
    rng = random.Random(0)
    misses = 0
    for _ in range(2000):
        low, high = stopping.median_interval([rng.expovariate(1.0) for _ in range(30)])
        misses += not low <= math.log(2) <= high
    assert 0.01 < misses / 2000 < 0.06


def test_interval_and_relative_width_of_known_samples() -> None:
    samples = [10.0, 1.0, 9.0, 2.0, 8.0, 3.0, 7.0, 4.0, 6.0, 5.0]  # 1..10, shuffled
    assert stopping.median_interval(samples) == (2.0, 9.0)
    assert stopping.relative_width(samples) == pytest.approx(7.0 / 5.5)
    assert stopping.relative_width([3.0] * 4) is None
    assert stopping.relative_width([3.0] * 6) == 0.0
    summary = timing.summarize(samples)
    assert (summary.ci_low_ms, summary.ci_high_ms) == (2.0, 9.0)
    assert timing.summarize([1.0, 2.0]).ci_low_ms is None


# --- the stopping rule and the timing in turns, on a fake timer -----------------------------


def fake_timer(times: Callable[[str, int], float], log: list[str]) -> timing.Timer:
    """A Timer that runs each call (each logs its contender's name) and says it took
    ``times(name, n)`` ms, n counting that contender's calls from 0."""
    counts: dict[str, int] = {}

    def run(calls: Sequence[Callable[[], object]]) -> list[float]:
        result = []
        for call in calls:
            call()
            name = log[-1]
            result.append(times(name, counts.get(name, 0)))
            counts[name] = counts.get(name, 0) + 1
        return result

    return run


def logging_calls(names: str, log: list[str]) -> dict[str, Callable[[], None]]:
    return {name: (lambda name=name: log.append(name)) for name in names}


def test_contenders_take_turns_rep_by_rep() -> None:
    log: list[str] = []
    rule = StoppingRule(min_reps=3, max_seconds=0)
    result = turns.time_in_turns(
        logging_calls("abc", log), rule, fake_timer(lambda name, n: 1.0, log)
    )
    assert "".join(log) == "abc" * 3
    assert {name: t.reps for name, t in result.timings.items()} == {"a": 3, "b": 3, "c": 3}
    assert all(t.noisy and t.stopped == "min reps" for t in result.timings.values())


def test_steady_timings_stop_at_the_minimum_settled() -> None:
    log: list[str] = []
    rule = StoppingRule(min_reps=8, width=0.05, max_seconds=10)
    result = turns.time_in_turns(
        logging_calls("ab", log), rule, fake_timer(lambda name, n: 2.0 + 0.01 * (n % 3), log)
    )
    a = result.timings["a"]
    assert (a.reps, a.stopped, a.noisy) == (8, "settled", False)
    assert a.ci_low_ms == 2.0 and a.ci_high_ms == 2.02 and a.median_ms == pytest.approx(2.01)


def test_a_slow_spell_at_the_start_is_outlasted() -> None:
    """Every contender is slow for its first 6 calls (another process ran), then steady: the
    rule goes on past the minimum until the interval is narrow, and stops settled."""
    log: list[str] = []
    rule = StoppingRule(min_reps=8, width=0.05, max_seconds=10)
    result = turns.time_in_turns(
        logging_calls("ab", log),
        rule,
        fake_timer(lambda name, n: 50.0 if n < 6 else 1.0 + 0.001 * (n % 5), log),
    )
    a = result.timings["a"]
    assert a.stopped == "settled" and not a.noisy and a.reps > 8
    assert a.median_ms == pytest.approx(1.0, abs=0.01)
    assert not rule.settled([50.0] * 6 + [1.0] * 2)  # at the minimum it was not
    assert "".join(log) == "ab" * a.reps  # still in turns, the same count each


def test_noise_that_never_settles_stops_at_the_time_cap() -> None:
    """One contender alternates 1 ms and 3 ms (its interval stays wide); the other is steady.
    Both stop together when their timed calls reach max_seconds each on average."""
    log: list[str] = []
    rule = StoppingRule(min_reps=6, width=0.05, max_seconds=0.1)
    times = {"n": lambda n: 1.0 + 2.0 * (n % 2), "s": lambda n: 1.0}
    result = turns.time_in_turns(
        logging_calls("ns", log), rule, fake_timer(lambda name, n: times[name](n), log)
    )
    noisy, steady = result.timings["n"], result.timings["s"]
    assert noisy.stopped == steady.stopped == "time cap"
    assert noisy.noisy and not steady.noisy and noisy.reps == steady.reps
    spent = noisy.reps * (2.0 + 1.0)  # mean 2 ms and 1 ms per repetition
    assert spent >= 200 and spent - 3 * (noisy.reps // 5 + 1) < 200  # the last round ended it


def test_max_reps_and_round_sizes() -> None:
    log: list[str] = []
    rule = StoppingRule(min_reps=4, width=0.05, max_seconds=1000, max_reps=9)
    result = turns.time_in_turns(
        logging_calls("a", log), rule, fake_timer(lambda name, n: 1.0 + n % 2, log)
    )
    assert (result.timings["a"].reps, result.timings["a"].stopped) == (9, "max reps")
    cells = [[1.0] * 10, [1.0] * 10]
    assert turns.round_size(rule, [[], []]) == 4  # the minimum first
    assert turns.round_size(StoppingRule(min_reps=4, max_reps=100), cells) == 2  # a quarter
    # 20 ms spent of 2 x 15 ms: room for 10 ms, 5 rounds of the 2 ms a round takes.
    assert turns.round_size(StoppingRule(min_reps=4, max_seconds=0.015), [[1.0] * 40] * 2) == 1
    assert turns.round_size(StoppingRule(min_reps=4, max_seconds=0.05), [[1.0] * 40] * 2) == 10


def test_a_failing_contender_drops_out_and_the_others_go_on() -> None:
    log: list[str] = []

    def fails() -> None:
        log.append("f")
        if log.count("f") == 2:
            raise RuntimeError("boom")

    calls = {"a": lambda: log.append("a"), "f": fails}
    rule = StoppingRule(min_reps=6, max_seconds=0)
    result = turns.time_in_turns(calls, rule, fake_timer(lambda name, n: 1.0, log))
    assert list(result.timings) == ["a"] and result.timings["a"].reps == 6
    assert str(result.failures["f"]) == "boom" and log.count("f") == 2


def test_the_rule_refuses_bad_settings_and_describes_itself() -> None:
    with pytest.raises(ValueError):
        StoppingRule(min_reps=0)
    with pytest.raises(ValueError):
        StoppingRule(width=0)
    text = StoppingRule(min_reps=10, width=0.05, max_seconds=3).describe()
    assert text == (
        "at least 10 timed repetitions per cell, more until the median's 95% interval is "
        "within 5% of it (at most 3 s per cell)"
    )
    assert StoppingRule(min_reps=4, max_seconds=0).describe() == (
        "at least 4 timed repetitions per cell"
    )


def test_wall_clock_timer_on_a_fake_clock() -> None:
    ticks: Iterator[float] = iter([0.0, 0.002, 0.002, 0.007])
    assert timing.wall_clock_timer(lambda: next(ticks))([lambda: None] * 2) == pytest.approx(
        [2.0, 5.0]
    )


# --- what the machine did, and the caution ---------------------------------------------------


def test_machine_readings_between_two_snapshots(monkeypatch) -> None:
    monkeypatch.setattr(machine, "cores", lambda: 2)
    before = machine.Snapshot(10.0, 1.0, 100.0, 5.0, 0.5, (2000.0, 2100.0))
    after = machine.Snapshot(12.0, 2.0, 103.0, 5.4, 2.5, (1500.0, 2100.0))
    # 3 s of CPU busy in 2 s, 1 s of it this process's: others used 1 core; 0.4 s of 4 stolen.
    assert machine.during(before, after) == {
        "other_cores": 1.0,
        "steal_fraction": 0.1,
        "load_average": [0.5, 2.5],
        "cpu_mhz": [1500.0, 2100.0],
        "cores": 2,
    }
    blind = machine.Snapshot(0.0, 0.0, None, None, None, None)
    assert machine.during(blind, blind)["other_cores"] is None
    now = machine.snapshot()  # whatever this system shows, the types hold
    assert now.own_cpu_s >= 0 and (now.cpu_mhz is None or min(now.cpu_mhz) > 0)


def _cell(peer: str, shape: str, median: float, low: float, high: float, **extra) -> dict:
    return {
        "peer": peer,
        "shape": shape,
        "batch": 8,
        "seq": 64,
        "padded": False,
        "real_tokens": 512,
        "status": "ok",
        "median_ms": median,
        "p20_ms": low,
        "p80_ms": high,
        "ci_low_ms": low,
        "ci_high_ms": high,
        "reps": 20,
        "noisy": (high - low) / median > 0.05,
        "flops": 1e9,
        "roofline_ms": None,
        "peak_mib": None,
        **extra,
    }


BUSY = {
    "other_cores": 1.6,
    "steal_fraction": 0.0,
    "load_average": [4.2, 4.4],
    "cpu_mhz": [2596.0, 2596.0],
    "cores": 2,
}
IDLE = {**BUSY, "other_cores": 0.02, "load_average": [0.1, 0.2]}


def test_caution_names_the_noisy_cells_and_the_load() -> None:
    records = [
        _cell("hf-eager", "8x64", 80.0, 60.0, 700.0, machine=BUSY),
        _cell("fastbert", "8x64", 36.0, 35.5, 36.5, machine=BUSY),
        _cell("fastbert", "1x64", 4.0, 3.0, 5.0, reps=4, ci_low_ms=None, machine=IDLE),
    ]
    records[2]["noisy"] = True
    line = noise.caution(records, 0.05)
    assert line.startswith("Caution: 2 of 3 cells are too noisy to rank")
    assert "wider than 5% of the median" in line
    assert "hf-eager 8x64 (800%), fastbert 1x64 (none from 4 reps)." in line
    assert "fastbert 8x64 (" not in line
    assert "Likely cause: other processes used 1.6 of the 2 cores (load average 4.2" in line
    assert noise.caution(records[1:2], 0.05) is None


def test_caution_with_nothing_to_blame_or_a_moving_clock() -> None:
    quiet = [_cell("hf-sdpa", "8x64", 10.0, 5.0, 20.0, machine=IDLE)]
    line = noise.caution(quiet, 0.05)
    assert "Nothing measured explains it (other processes used 0.0 of the 2 cores" in line
    assert "the CPU clock read 2596 MHz throughout)" in line
    throttled = {**IDLE, "cpu_mhz": [1200.0, 3000.0]}
    line = noise.caution([_cell("hf-sdpa", "8x64", 10.0, 5.0, 20.0, machine=throttled)], 0.05)
    assert "Likely cause: the CPU clock moved between 1200 and 3000 MHz." in line


# --- the report ------------------------------------------------------------------------------


def test_table_marks_noisy_cells_and_overlapping_speedups() -> None:
    records = [
        _cell("hf-sdpa", "8x64", 40.0, 39.0, 41.0),
        _cell("hf-eager", "8x64", 37.0, 30.0, 60.0),  # noisy, overlaps fastbert's interval
        _cell("fastbert", "8x64", 36.0, 35.5, 36.5),
    ]
    rows = {
        line.split("|")[2].strip(): [c.strip() for c in line.strip("|").split("|")]
        for line in report.markdown_table(records).splitlines()[2:]
    }
    assert rows["hf-sdpa"][3:6] == ["39.000-41.000", "39.000-41.000", "1.11x"]
    assert rows["hf-eager"][3] == "30.000-60.000 noisy" and rows["hf-eager"][5] == "~1.03x"
    assert rows["fastbert"][5] == "1.00x"
    assert analysis.overlap(records[1], records[2]) and not analysis.overlap(*records[::2])


def test_a_cpu_report_lists_no_gpu_targets_and_states_the_rule() -> None:
    settings = {
        "model": "bert-mini",
        "dtype": "float32",
        "device": "cpu",
        "backend": "torch",
        "warmup": 2,
        "reps": 10,
        "stopping": StoppingRule(min_reps=10, max_seconds=3).to_dict(),
    }
    env = {"cpu": "a CPU", "cpu_threads": 2, "commit": "abc", "date": "today"}
    doc = {
        "schema": "fastbert-bench/1",
        "environment": env,
        "settings": settings,
        "complete": True,
        "results": [_cell("hf-eager", "8x64", 80.0, 60.0, 700.0, machine=BUSY)],
    }
    text = report.markdown(doc)
    assert "not measured" not in text and report.CPU_TARGETS in text
    assert "95% interval is within 5% of it (at most 3 s per cell)" in text
    assert "Caution: 1 of 1 cells are too noisy to rank" in text
    old = {**doc, "settings": {k: v for k, v in settings.items() if k != "stopping"}}
    assert "10 timed repetitions" in report.conditions(old)


def test_the_results_page_carries_the_caution(tmp_path) -> None:
    from benchmarks import readme

    doc = {
        "schema": "fastbert-bench/1",
        "environment": {"gpu": "NVIDIA H100", "commit": "abc", "date": "today"},
        "settings": {
            "model": "bert-base",
            "dtype": "float16",
            "device": "cuda",
            "backend": "triton",
            "warmup": 10,
            "reps": 100,
            "stopping": StoppingRule(min_reps=100, max_seconds=2).to_dict(),
        },
        "complete": True,
        "results": [_cell("hf-eager", "32x128", 8.0, 6.0, 70.0, machine=BUSY)],
    }
    text = readme.subsection(tmp_path, doc, tmp_path)
    assert "| 6.000-70.000 noisy |" in text and "Caution: 1 of 1 cells" in text


# --- the command ---------------------------------------------------------------------------


def test_bench_names_a_noisy_cell(tmp_path, capsys, monkeypatch) -> None:
    """A fake timer gives hf-eager alternating 1 and 9 ms and every other contender a steady
    1 ms (the contenders take turns in the order of --peers, so every third call is
    hf-eager's): the run flags hf-eager's cells alone, prints the caution naming them, and
    writes the intervals and flags into results.json and results.md."""
    position = itertools.count()

    def timer(calls: Sequence[Callable[[], object]]) -> list[float]:
        times = []
        for call in calls:
            call()
            i = next(position)
            times.append(1.0 + 8.0 * (i // 3 % 2) if i % 3 == 0 else 1.0)
        return times

    monkeypatch.setattr(timing, "timer_for", lambda device: timer)
    out = tmp_path / "out"
    options = ["--peers", "hf-eager,hf-sdpa,fastbert", "--shapes", "1x8,2x8", "--reps", "10"]
    code = main(
        ["bench", "--quick", "--device", "cpu", "--max-time", "0.05", "--out", str(out), *options]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "then the contenders of each shape in turns, at least 10 timed repetitions" in printed
    caution = next(line for line in printed.splitlines() if line.startswith("Caution:"))
    assert "2 of 6 cells are too noisy to rank" in caution
    assert "hf-eager 1x8 (" in caution and "hf-eager 2x8 (" in caution
    doc = json.loads((out / "results.json").read_text())
    flags = {(r["peer"], r["shape"]): r["noisy"] for r in doc["results"]}
    peers, shapes = ("hf-eager", "hf-sdpa", "fastbert"), ("1x8", "2x8")
    assert flags == {(p, s): p == "hf-eager" for p in peers for s in shapes}
    steady = next(r for r in doc["results"] if r["peer"] == "fastbert")
    assert (steady["ci_low_ms"], steady["ci_high_ms"]) == (1.0, 1.0)
    # 50 ms per cell: the three cells' 150 ms of fake time at 7 ms a repetition of the three
    # (hf-eager's 1 and 9 ms in turn, 5 on average): 22 repetitions, give or take a round.
    assert steady["stopped"] == "time cap" and 20 <= steady["reps"] <= 26
    assert "other_cores" in steady["machine"] and doc["settings"]["stopping"]["min_reps"] == 10
    assert caution in (out / "results.md").read_text()


def test_measure_times_one_contender_alone_for_the_suites() -> None:
    """runner.measure (the pytest-benchmark suites' path): the first call, then exactly
    ``reps`` timed calls after the warm-up; no CUDA memory figures on a CPU."""
    import torch

    from fastbert.bench import runner

    calls = []
    settings = runner.Settings(torch.float32, torch.device("cpu"), warmup=3, reps=7)
    measured = runner.measure(lambda batch: calls.append(batch), "batch", settings, None)
    assert len(calls) == 3 + 7 and measured["reps"] == 7 and measured["status"] == "ok"
    assert measured["first_call_s"] >= 0 and measured["peak_mib"] is None
