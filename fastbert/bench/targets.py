"""The performance targets (H100, fp16, BERT-base) evaluated against measured results:
met, missed (and by how much) or not measured (and why).

End-to-end targets read a results document (report.py); kernel targets read the kernel
suite's pytest-benchmark JSON (benchmarks/test_kernels_bench.py puts each measurement in the
benchmark's ``extra_info``: op, impl, model, dtype, batch, seq, median_ms, tbps, ...).
The fastbert figure of a shape is its fastest variant (dense, padding-free or CUDA graphs).

``python -m fastbert.bench.targets results.json [--kernels kernels-bench.json]`` prints them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from pathlib import Path

from fastbert.bench import analysis
from fastbert.bench.document import read_document

MODEL = "bert-base"
DTYPE = "float16"
NOT_MEASURED = "not measured"


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A target, its status ("met", "missed", "not measured") and what was measured."""

    target: str
    status: str
    measured: str


def _compare(
    target: str, value: float, goal: float, at_least: bool, fmt: str, where: str
) -> Outcome:
    """Met when value >= goal (``at_least``) or value <= goal; else missed by a percentage."""
    met = value >= goal if at_least else value <= goal
    measured = f"{format(value, fmt)} ({where})"
    if met:
        return Outcome(target, "met", measured)
    gap = (1 - value / goal) if at_least else (value / goal - 1)
    side = "short" if at_least else "over"
    return Outcome(target, f"missed by {100 * gap:.0f}% ({side})", measured)


def _fastbert_at(doc: dict, shape: str) -> dict | None:
    return analysis.best_fastbert(analysis.by_shape(doc["results"]).get(shape, {}))


def _peer_at(doc: dict, shape: str, peer: str) -> dict | None:
    record = analysis.by_shape(doc["results"]).get(shape, {}).get(peer)
    return record if record is not None and analysis.ok(record) else None


def _speedup_target(doc: dict, shape: str, peer: str, goal: float) -> Outcome:
    target = f"{shape}: fastbert >= {goal}x faster than {peer}"
    ours, theirs = _fastbert_at(doc, shape), _peer_at(doc, shape, peer)
    if ours is None or theirs is None:
        return Outcome(target, NOT_MEASURED, f"needs fastbert and {peer} at {shape}")
    where = f"{ours['peer']} {ours['median_ms']:.3f} ms vs {theirs['median_ms']:.3f} ms"
    if ours.get("run", 1) != theirs.get("run", 1):  # see fastbert.bench.report.APPENDED_NOTE
        where += ", timed by different invocations †"
    return _compare(target, analysis.speedup(ours, theirs), goal, True, ".2f", where)


def _roofline_target(doc: dict, shape: str, goal: float) -> Outcome:
    target = f"{shape}: fastbert >= {100 * goal:.0f}% of the roofline"
    ours = _fastbert_at(doc, shape)
    if ours is None or ours.get("roofline_ms") is None:
        return Outcome(target, NOT_MEASURED, f"needs fastbert at {shape} on a GPU with peaks")
    where = f"{ours['peer']} {ours['median_ms']:.3f} ms, roofline {ours['roofline_ms']:.3f} ms"
    return _compare(target, analysis.roofline_fraction(ours), goal, True, ".0%", where)


def _latency_target(doc: dict, shape: str, goal_ms: float) -> Outcome:
    target = f"{shape}: fastbert <= {goal_ms} ms"
    ours = _fastbert_at(doc, shape)
    if ours is None:
        return Outcome(target, NOT_MEASURED, f"needs fastbert at {shape}")
    return _compare(target, ours["median_ms"], goal_ms, False, ".3f", f"{ours['peer']}, ms")


def _memory_target(doc: dict) -> Outcome:
    target = "peak memory <= hf-sdpa's (every shape)"
    ratios = []
    for shape, rows in analysis.by_shape(doc["results"]).items():
        ours, theirs = analysis.best_fastbert(rows), rows.get("hf-sdpa")
        if ours and theirs and analysis.ok(theirs) and ours.get("peak_mib") is not None:
            ratios.append((ours["peak_mib"] / max(theirs["peak_mib"], 1e-9), shape, ours, theirs))
    if not ratios:
        return Outcome(target, NOT_MEASURED, "needs fastbert and hf-sdpa peaks on a GPU")
    ratio, shape, ours, theirs = max(ratios, key=lambda item: item[0])
    where = (
        f"worst at {shape}: {ours['peer']} {ours['peak_mib']:.0f} MiB vs "
        f"{theirs['peak_mib']:.0f} MiB; ratio"
    )
    return _compare(target, ratio, 1.0, False, ".2f", where)


def _kernel_rows(kernels: dict | None, op: str) -> list[dict]:
    """The kernel suite's measurements of ``op`` on BERT-base fp16."""
    if not kernels:
        return []
    infos = [b.get("extra_info", {}) for b in kernels.get("benchmarks", [])]
    return [
        i
        for i in infos
        if i.get("op") == op
        and i.get("model") == MODEL
        and i.get("dtype") == DTYPE
        and "median_ms" in i
    ]


def _case(info: dict) -> str:
    return f"{info['batch']}x{info['seq']}" + (" padded" if info.get("padded") else "")


def _kernel_speedup(
    kernels: dict | None,
    op: str,
    goal: float,
    target: str,
    baseline: Callable[[str], bool],
    cases: Callable[[dict], bool],
) -> Outcome:
    """Worst ratio (best baseline impl time / fastbert time) over the selected cases."""
    rows = [i for i in _kernel_rows(kernels, op) if cases(i)]
    worst = None
    for case in dict.fromkeys(_case(i) for i in rows):
        ours = [i for i in rows if _case(i) == case and i["impl"] == "fastbert"]
        theirs = [i for i in rows if _case(i) == case and baseline(i["impl"])]
        if ours and theirs:
            best = min(theirs, key=lambda i: i["median_ms"])
            ratio = best["median_ms"] / ours[0]["median_ms"]
            if worst is None or ratio < worst[0]:
                worst = (ratio, case, best["impl"])
    if worst is None:
        return Outcome(target, NOT_MEASURED, "needs the kernel suite's results")
    ratio, case, impl = worst
    return _compare(target, ratio, goal, True, ".2f", f"worst at {case}, vs {impl}; x")


def _bandwidth_target(kernels: dict | None, op: str, goal_tbps: float, target: str) -> Outcome:
    rows = [i for i in _kernel_rows(kernels, op) if i["impl"] == "fastbert"]
    if not rows:
        return Outcome(target, NOT_MEASURED, "needs the kernel suite's results")
    largest = max(rows, key=lambda i: i["batch"] * i["seq"])
    return _compare(target, largest["tbps"], goal_tbps, True, ".2f", f"at {_case(largest)}, TB/s")


def evaluate(doc: dict, kernels: dict | None = None) -> list[Outcome]:
    """Every target against an end-to-end results document and the kernel suite's JSON."""
    settings = doc["settings"]
    if settings.get("model") == MODEL and settings.get("dtype") == DTYPE:
        outcomes = [
            _speedup_target(doc, "32x128", "hf-compile-max", 1.3),
            _speedup_target(doc, "32x128", "hf-eager", 3.0),
            _roofline_target(doc, "32x128", 0.7),
            _latency_target(doc, "1x128", 0.2),
            _speedup_target(doc, "64x512 padded", "hf-sdpa", 1.8),
            _memory_target(doc),
        ]
    else:
        why = (
            f"end-to-end targets are for {MODEL} {DTYPE}; this run is "
            f"{settings.get('model')} {settings.get('dtype')}"
        )
        outcomes = [Outcome("end-to-end targets", NOT_MEASURED, why)]
    return outcomes + [
        _kernel_speedup(
            kernels,
            "attention",
            1.0,
            "attention, seq 512: >= torch's best sdpa",
            lambda impl: impl.startswith("sdpa"),
            lambda i: i["seq"] == 512,
        ),
        _bandwidth_target(kernels, "layer_norm", 2.5, "layer_norm (x + r): >= 2.5 TB/s"),
        _kernel_speedup(
            kernels,
            "linear_gelu",
            1.15,
            "linear+GELU: >= 1.15x nn.Linear + F.gelu",
            lambda impl: impl == "eager",
            lambda i: i["batch"] * i["seq"] >= 4096,
        ),
    ]


def markdown(outcomes: list[Outcome]) -> str:
    lines = ["| target | status | measured |", "|---|---|---|"]
    lines += [f"| {o.target} | {o.status} | {o.measured} |" for o in outcomes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fastbert.bench.targets", description="evaluate the targets against results"
    )
    parser.add_argument("results", help="a results.json written by fastbert bench")
    parser.add_argument("--kernels", help="the kernel suite's pytest-benchmark JSON")
    args = parser.parse_args(argv)
    kernels = json.loads(Path(args.kernels).read_text()) if args.kernels else None
    print(markdown(evaluate(read_document(args.results), kernels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
