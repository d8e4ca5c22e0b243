"""The short summary of a GPU run, built from its result files: the machine, each stage's
status, the test counts, the headline figures and the targets, met or missed.

    python -m benchmarks.gpu_run.summary RESULTS_DIR [--out summary.txt]

It reads what the stages of benchmarks/gpu_run/plan.py write (a file that is missing or
unreadable makes its lines say so; nothing here raises on a partial run).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

from benchmarks.gpu_run.runner import STAGES_JSON, read_outcomes

NOT_MEASURED = "not measured"
HEADLINE_SHAPE = "32x128"
BENCH_PEERS = ("hf-eager", "hf-sdpa", "hf-compile", "hf-compile-max")
COMPUTE_OPS = ("attention", "linear_gelu")  # the others are held to the copy limit
TEST_FILES = {"core": "gpu-tests.xml", "rest": "gpu-tests-rest.xml"}
FAILED_SHOWN = 5


def read_json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# --- what the files hold -------------------------------------------------------------------


@dataclasses.dataclass
class TestCounts:
    passed: int = 0
    failed: int = 0
    errors: int = 0
    skipped: int = 0
    failing: tuple[str, ...] = ()


def test_counts(path: Path) -> TestCounts | None:
    """Counts of a JUnit XML report (pytest --junitxml); None when absent or unreadable."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    counts = TestCounts()
    failing = []
    for case in root.iter("testcase"):
        kinds = {child.tag for child in case}
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if "failure" in kinds or "error" in kinds:
            failing.append(name)
            if "failure" in kinds:
                counts.failed += 1
            else:
                counts.errors += 1
        elif "skipped" in kinds:
            counts.skipped += 1
        else:
            counts.passed += 1
    counts.failing = tuple(failing)
    return counts


def bench_rows(results: Path) -> dict[str, dict[str, dict]]:
    """fastbert bench's records by shape, then contender ({} without results)."""
    from fastbert.bench import analysis

    doc = read_json(results / "bench" / "results.json")
    return analysis.by_shape(doc["results"]) if isinstance(doc, dict) else {}


def best_fastbert(rows: dict[str, dict]) -> dict | None:
    from fastbert.bench import analysis

    return analysis.best_fastbert(rows)


def measured(rows: dict[str, dict], peer: str) -> dict | None:
    record = rows.get(peer)
    return record if record and record.get("status") == "ok" else None


def corpus_rate(results: Path, dtype: str, distribution: str, graphs: str = "auto") -> float | None:
    """The corpus tokens/s of ``dtype`` and ``distribution`` with the model's ``cuda_graphs``
    setting ``graphs`` (the default "auto": the headline), or None where not measured."""
    doc = read_json(results / "corpus" / "corpus.json") or {}
    wanted = (dtype, distribution, graphs)
    for row in doc.get("rows", []):
        if (row.get("dtype"), row.get("distribution"), row.get("cuda_graphs", "auto")) == wanted:
            return row.get("tokens_per_s")
    return None


def limits(results: Path) -> dict[str, dict]:
    """dtype -> {"gemm_tflops", "copy_tbps", ...} measured on the GPU ({} without)."""
    doc = read_json(results / "limits.json") or {}
    return {k: v for k, v in (doc.get("limits") or {}).items() if isinstance(v, dict)}


def kernel_rows(results: Path) -> list[dict]:
    """The kernel suite's fastbert measurements (pytest-benchmark's extra_info)."""
    doc = read_json(results / "bench" / "kernels-bench.json") or {}
    infos = [b.get("extra_info", {}) for b in doc.get("benchmarks", [])]
    return [i for i in infos if i.get("impl") == "fastbert" and "median_ms" in i]


def attention_s512(results: Path, dtype: str = "float16") -> dict | None:
    """fastbert's fastest attention at 512 tokens, head dim 64 (BERT-base), unpadded."""
    rows = [
        i
        for i in kernel_rows(results)
        if i.get("op") == "attention"
        and i.get("model") == "bert-base"
        and i.get("dtype") == dtype
        and i.get("seq") == 512
        and not i.get("padded")
    ]
    return max(rows, key=lambda i: i.get("tflops", 0.0), default=None)


# --- the targets ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Target:
    """A goal: ``evaluate(results) -> (value, where)`` (value None: not measured), met when
    the value is at least (``at_least``) or at most ``goal``."""

    text: str
    goal: float
    at_least: bool
    unit: str
    evaluate: Callable[[Path], tuple[float | None, str]]


def _forward_ms(results: Path) -> tuple[float | None, str]:
    best = best_fastbert(bench_rows(results).get(HEADLINE_SHAPE, {}))
    return (None, "no fastbert row") if best is None else (best["median_ms"], best["peer"])


def _speedup_over(peer: str) -> Callable[[Path], tuple[float | None, str]]:
    def evaluate(results: Path) -> tuple[float | None, str]:
        rows = bench_rows(results).get(HEADLINE_SHAPE, {})
        ours, theirs = best_fastbert(rows), measured(rows, peer)
        if ours is None or theirs is None:
            return None, f"needs fastbert and {peer}"
        where = f"{ours['median_ms']:.3f} vs {theirs['median_ms']:.3f} ms"
        return theirs["median_ms"] / ours["median_ms"], where

    return evaluate


def _corpus_s512(results: Path) -> tuple[float | None, str]:
    rate = corpus_rate(results, "float16", "s512")
    return rate, "needs the corpus stage" if rate is None else "padding-free"


def _attention(results: Path) -> tuple[float | None, str]:
    row = attention_s512(results)
    if row is None:
        return None, "needs the kernel suite"
    return row.get("tflops"), f"{row['batch']}x{row['seq']}"


TARGETS = (
    Target("BERT-base fp16 32x128 forward <= 1.2 ms", 1.2, False, "ms", _forward_ms),
    Target("32x128: >= 1.3x HF sdpa", 1.3, True, "x", _speedup_over("hf-sdpa")),
    Target(
        "32x128: >= 1.1x torch.compile max-autotune",
        1.1,
        True,
        "x",
        _speedup_over("hf-compile-max"),
    ),
    Target("corpus, s512 fp16: >= 2.0M tokens/s", 2.0e6, True, "tokens/s", _corpus_s512),
    Target("attention, head dim 64, s512 fp16: >= 340 TFLOP/s", 340.0, True, "TFLOP/s", _attention),
)


def judge(target: Target, results: Path) -> tuple[str, str]:
    """(status, measured): "met", "missed by N%" or "not measured"."""
    try:
        value, where = target.evaluate(results)
    except Exception as exc:  # noqa: BLE001 - a broken file reads as not measured
        return NOT_MEASURED, f"unreadable: {type(exc).__name__}"
    if value is None:
        return NOT_MEASURED, where
    unit = target.unit if target.unit == "x" else f" {target.unit}"
    text = f"{_number(value)}{unit} ({where})"
    if (value >= target.goal) if target.at_least else (value <= target.goal):
        return "met", text
    gap = 1 - value / target.goal if target.at_least else value / target.goal - 1
    return f"missed by {100 * gap:.0f}%", text


# --- the text ------------------------------------------------------------------------------


def _number(value: float) -> str:
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def machine_line(results: Path) -> str:
    env = read_json(results / "environment.json") or {}
    commit = str(env.get("commit") or "unknown")[:12]
    return (
        f"fastbert GPU run: {env.get('gpu') or 'GPU unknown'} ({env.get('compute_capability')}, "
        f"driver {env.get('driver')}, CUDA {env.get('cuda')}), torch {env.get('torch')}, "
        f"triton {env.get('triton')}, commit {commit}, {str(env.get('date'))[:16]}; "
        "random weights of real shapes"
    )


def stage_lines(results: Path) -> list[str]:
    outcomes = read_outcomes(results / STAGES_JSON)
    lines = [f"{'stage':<20}{'status':<11}{'exit':>5}{'s':>7}{'cap':>6}"]
    for o in outcomes:
        code = "-" if o.get("exit_code") is None else str(o["exit_code"])
        cap = "rest" if o.get("leftover") else str(o["cap_s"])
        lines.append(
            f"{o['name']:<20}{o['status']:<11}{code:>5}{o['seconds']:>7.0f}{cap:>6}"
            + (f"  {o['note']}" if o.get("note") else "")
        )
    total = sum(o.get("seconds", 0) for o in outcomes)
    lines.append(f"{'total':<36}{total:>7.0f}")
    return lines


def test_lines(results: Path) -> list[str]:
    parts, failing = [], []
    for grid, name in TEST_FILES.items():
        counts = test_counts(results / name)
        if counts is None:
            parts.append(f"{grid} not run")
            continue
        parts.append(
            f"{grid} {counts.passed} passed, {counts.failed} failed, {counts.errors} errors, "
            f"{counts.skipped} skipped"
        )
        failing += counts.failing
    lines = ["GPU tests: " + "; ".join(parts)]
    lines += [f"  FAILED {name}" for name in failing[:FAILED_SHOWN]]
    if len(failing) > FAILED_SHOWN:
        lines.append(f"  ... and {len(failing) - FAILED_SHOWN} more (the logs in the archive)")
    return lines


def bench_lines(results: Path) -> list[str]:
    table = bench_rows(results)
    if not table:
        return ["BERT-base fp16 forward: not measured"]
    lines = [
        "BERT-base fp16 forward, median ms: fastbert (best variant) | " + " | ".join(BENCH_PEERS)
    ]
    for shape, rows in table.items():
        best = best_fastbert(rows)
        ours = "-" if best is None else f"{best['median_ms']:.3f} ({best['peer']})"
        peers = [measured(rows, peer) for peer in BENCH_PEERS]
        theirs = " | ".join("-" if r is None else f"{r['median_ms']:.3f}" for r in peers)
        lines.append(f"  {shape:<15}{ours} | {theirs}")
    return lines


def corpus_line(results: Path) -> str:
    def figures(graphs: str) -> list[str]:
        return [
            f"{dtype} {distribution} {_number(rate)}"
            for dtype in ("float16", "bfloat16")
            for distribution in ("s512", "mixed")
            if (rate := corpus_rate(results, dtype, distribution, graphs)) is not None
        ]

    line = "corpus tokens/s (padding-free): " + (", ".join(figures("auto")) or NOT_MEASURED)
    eager = figures("false")
    return line + (f"; without CUDA graphs {', '.join(eager)}" if eager else "")


def kernel_lines(results: Path) -> list[str]:
    found = limits(results)
    bf16 = found.get("bfloat16", {})
    lines = [
        "GPU limits (measured): "
        + (
            f"bf16 GEMM {bf16['gemm_tflops']:.0f} TFLOP/s, copy {bf16['copy_tbps']:.2f} TB/s"
            if bf16
            else NOT_MEASURED
        )
    ]
    largest: dict[tuple[str, str], dict] = {}
    for row in kernel_rows(results):
        key = (row["op"], row["dtype"])
        if row.get("padded"):
            continue
        if (
            key not in largest
            or row["batch"] * row["seq"] > largest[key]["batch"] * largest[key]["seq"]
        ):
            largest[key] = row
    parts = []
    for (op, dtype), row in sorted(largest.items()):
        limit = found.get(dtype, {})
        if op in COMPUTE_OPS:
            value, unit, of = row.get("tflops", 0.0), "TFLOP/s", limit.get("gemm_tflops")
        else:
            value, unit, of = row.get("tbps", 0.0), "TB/s", limit.get("copy_tbps")
        share = f" {100 * value / of:.0f}%" if of else ""
        parts.append(f"{op} {dtype} {row['batch']}x{row['seq']} {value:.3g} {unit}{share}")
    lines.append("kernels (fastbert, % of the limit): " + ("; ".join(parts) or NOT_MEASURED))
    return lines


def train_line(results: Path) -> str:
    doc = read_json(results / "train-step" / "results.json") or {}
    parts = []
    for row in doc.get("rows", []):
        times = {n: r["timing"]["median_ms"] for n, r in row.get("results", {}).items()}
        if "fastbert" in times:
            ratio = (
                f" ({times['hf-sdpa'] / times['fastbert']:.2f}x sdpa)" if "hf-sdpa" in times else ""
            )
            parts.append(f"{row['shape']} fastbert {times['fastbert']:.1f} ms{ratio}")
        elif row.get("first_step_s"):  # interrupted: how long the first steps took
            firsts = ", ".join(f"{n} {s:.0f} s" for n, s in row["first_step_s"].items())
            parts.append(f"{row['shape']} not timed (first steps: {firsts})")
    return "fine-tuning step (bf16 autocast): " + ("; ".join(parts) or NOT_MEASURED)


def serve_line(results: Path) -> str:
    doc = read_json(results / "serve" / "serve-bench.json") or {}
    parts = []
    for cell in doc.get("cells", []):
        if cell.get("contender") == "fastbert" and cell.get("mode") == "closed":
            p50 = cell.get("p50_ms")
            latency = "-" if p50 is None else f"{p50:.0f} ms"
            parts.append(
                f"{cell['mix']} c{cell['concurrency']} {cell['inputs_per_s']:,.0f} inputs/s "
                f"p50 {latency}"
            )
    return "fastbert serve: " + ("; ".join(parts) or NOT_MEASURED)


def target_lines(results: Path) -> list[str]:
    env = read_json(results / "environment.json") or {}
    gpu = str(env.get("gpu") or "")
    note = "" if "H100" in gpu else f" (set for an H100; this GPU: {gpu or 'unknown'})"
    lines = [f"targets{note}:"]
    for target in TARGETS:
        status, value = judge(target, results)
        lines.append(f"  {target.text}: {status}, {value}")
    return lines


SECTIONS: tuple[Callable[[Path], str | list[str]], ...] = (
    machine_line,
    stage_lines,
    test_lines,
    bench_lines,
    corpus_line,
    kernel_lines,
    train_line,
    serve_line,
    target_lines,
)


def build(results: Path) -> str:
    """The summary of the run whose files are in ``results``."""
    lines: list[str] = []
    for section in SECTIONS:
        try:
            found = section(results)
        except Exception as exc:  # noqa: BLE001 - one unreadable file never hides the rest
            found = f"{section.__name__.removesuffix('_lines').removesuffix('_line')}: "
            found += f"unreadable ({type(exc).__name__}: {exc})"
        lines += [found] if isinstance(found, str) else found
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_run.summary", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("results", type=Path, help="the run's results folder")
    parser.add_argument("--out", type=Path, help="also write the summary to this file")
    args = parser.parse_args(argv)
    text = build(args.results)
    if args.out:
        args.out.write_text(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
