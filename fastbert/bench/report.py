"""Results documents and their reports: JSON, a Markdown table, a PNG plot.

A results document (``results.json``) is::

    {"schema": "fastbert-bench/1", "environment": {...}, "settings": {...},
     "complete": true, "results": [record, ...]}

with the records of runner.py. ``python -m fastbert.bench.report DIR`` re-renders DIR's
results.md and results.png from its results.json (and kernels-bench.json, the kernel suite's
pytest-benchmark output, when it is there).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fastbert.bench import analysis, noise, targets
from fastbert.bench.document import read_document, write_json
from fastbert.bench.stopping import StoppingRule

RESULTS_JSON = "results.json"
RESULTS_MD = "results.md"
RESULTS_PNG = "results.png"
KERNELS_JSON = "kernels-bench.json"
COUNTING_NOTE = (
    "Times are medians over the timed repetitions (CUDA events on a GPU, wall clock on a "
    "CPU), the contenders of a shape timed in turns; the 95% interval is the median's (order "
    'statistics), "noisy" where it stayed too wide to rank the row, and p20-p80 the spread. '
    "tokens/s counts real tokens. TFLOP/s and % roofline count the work each contender does: "
    "all batch x seq positions for dense ones, the real tokens for padding-free ones. "
    '"fastbert x" is how many times faster the fastest fastbert variant is than that row, '
    '"~" where the two intervals overlap (not a ranking). Peak MiB: CUDA memory, the '
    "contender's weights plus the most its calls on the shape allocated."
)
# Targets are set for a GPU run; a CPU run says so instead of listing each as not measured.
CPU_TARGETS = (
    "The targets are set for BERT-base in float16 on an H100 (fastbert/bench/targets.py, "
    "docs/benchmarks.md#targets); a CPU run measures none of them."
)


def merge(old: dict, new: dict) -> dict:
    """``new``'s records added to ``old``'s (same model, dtype, device and fastbert backend);
    a (shape, peer) measured in both keeps ``new``'s record. Environment and settings are
    ``new``'s."""
    keys = ("model", "dtype", "device", "backend")
    if any(old["settings"].get(k) != new["settings"].get(k) for k in keys):
        raise ValueError(
            "can only add to results of the same model, dtype, device and fastbert backend: "
            + ", ".join(f"{k} {old['settings'].get(k)} vs {new['settings'].get(k)}" for k in keys)
        )
    fresh = {(r["shape"], r["peer"]) for r in new["results"]}
    kept = [r for r in old["results"] if (r["shape"], r["peer"]) not in fresh]
    complete = old["complete"] and new["complete"]
    # Each record keeps the invocation that timed it (1: the first): rows of one shape from
    # different invocations were not timed in turns (APPENDED_NOTE).
    run = max((r.get("run", 1) for r in old["results"]), default=1) + 1
    added = [{**r, "run": run} for r in new["results"]]
    return {**new, "results": kept + added, "complete": complete}


APPENDED = " †"
APPENDED_NOTE = (
    "† Timed by a later invocation (--append), in turns only with the rows of its shape that "
    "invocation timed (marked alike): it was not timed in turns with the others, so its ratio "
    "to them holds the change of the machine's state between the two."
)
INTERRUPTED_NOTE = "The run was interrupted: some measurements are missing."


def notes(doc: dict) -> list[str]:
    """The notes a table of ``doc`` needs: its rows from later invocations, an interrupted
    run."""
    found = []
    if any(r.get("run", 1) > 1 for r in doc["results"]):
        found.append(APPENDED_NOTE)
    if not doc.get("complete", True):
        found.append(INTERRUPTED_NOTE)
    return found


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def contender(peer: str, backend: str | None) -> str:
    """A row's contender cell: fastbert's variants name the backend that ran them."""
    return f"{peer} on {backend}" if backend and analysis.is_fastbert(peer) else peer


def backend_text(settings: dict) -> str:
    """The backend fastbert's rows ran on ("torch", "triton", "triton (interpreter)"), or
    the requested one and that it could not run."""
    if settings.get("backend"):
        return settings["backend"]
    return f"{settings.get('backend_requested')} (cannot run here: nothing ran)"


def _interval_cell(record: dict) -> str:
    bounds = analysis.interval(record)
    text = "-" if bounds is None else f"{bounds[0]:.3f}-{bounds[1]:.3f}"
    return f"{text} noisy" if record.get("noisy") else text


def _speedup_cell(record: dict, best: dict | None) -> str:
    if best is None:
        return "-"
    text = f"{analysis.speedup(best, record):.2f}x"
    return f"~{text}" if record is not best and analysis.overlap(best, record) else text


def _row(record: dict, best: dict | None, backend: str | None) -> list[str]:
    name = contender(record["peer"], backend) + (APPENDED if record.get("run", 1) > 1 else "")
    if not analysis.ok(record):
        return [name, f"skipped: {record['reason']}"] + [""] * 7
    fraction = analysis.roofline_fraction(record)
    return [
        name,
        f"{record['median_ms']:.3f}",
        _interval_cell(record),
        f"{record['p20_ms']:.3f}-{record['p80_ms']:.3f}",
        _speedup_cell(record, best),
        f"{analysis.tokens_per_s(record):,.0f}",
        f"{analysis.tflops(record):.1f}",
        _cell(None if fraction is None else 100 * fraction, ".0f"),
        _cell(record.get("peak_mib"), ".0f"),
    ]


def markdown_table(records: list[dict], backend: str | None = None) -> str:
    """One Markdown table of all records, grouped by shape; ``backend`` (what fastbert ran
    on: "torch", "triton", "triton (interpreter)") is named in fastbert's rows."""
    header = [
        "shape",
        "contender",
        "median ms",
        "95% interval ms",
        "p20-p80 ms",
        "fastbert x",
        "tokens/s",
        "TFLOP/s",
        "% roofline",
        "peak MiB",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for shape, rows in analysis.by_shape(records).items():
        best = analysis.best_fastbert(rows)
        for record in rows.values():
            lines.append("| " + " | ".join([shape] + _row(record, best, backend)) + " |")
    return "\n".join(lines)


def conditions(doc: dict) -> str:
    """One line: model, dtype, device and the environment it was measured in."""
    env, settings = doc["environment"], doc["settings"]
    device = env.get("gpu") or f"CPU ({env.get('cpu')}, {env.get('cpu_threads')} threads)"
    parts = [
        f"model {settings['model']}",
        f"dtype {settings['dtype']}",
        device,
        f"driver {env.get('driver')}" if env.get("gpu") else None,
        f"CUDA {env.get('cuda')}" if env.get("gpu") else None,
        f"torch {env.get('torch')}",
        f"triton {env.get('triton')}",
        f"transformers {env.get('transformers')}",
        f"fastbert backend {backend_text(settings)}",
        f"commit {str(env.get('commit'))[:12]}",
        f"{env.get('date')}",
        f"{settings['warmup']} warm-up calls",
        stopping_text(settings),
    ]
    return ", ".join(p for p in parts if p)


def stopping_text(settings: dict) -> str:
    """How the timed repetitions were counted (the stopping rule, or a fixed count in results
    from before it)."""
    rule = settings.get("stopping")
    if rule is None:
        return f"{settings['reps']} timed repetitions"
    return StoppingRule(**rule).describe()


def caution(doc: dict) -> str | None:
    """The caution line about noisy cells (noise.py); None when there are none."""
    rule = doc["settings"].get("stopping") or {}
    return noise.caution(doc["results"], rule.get("width"))


def roofline_line(doc: dict) -> str:
    peaks = doc["settings"].get("peaks")
    line = (
        f"Roofline: {peaks['gpu']}, {peaks['tflops']:.0f} TFLOP/s (fp16/bf16 dense, as "
        f"cuBLAS achieves) and {peaks['tbps']:.1f} TB/s."
        if peaks
        else "Roofline: none (no known peaks for this device)."
    )
    measured = doc["settings"].get("measured_ceilings")
    if measured:
        line += (
            f" Measured on this GPU: {measured['copy_tbps']:.2f} TB/s (device-to-device "
            f"copy, {measured['copy_bytes'] >> 20} MiB) and {measured['gemm_tflops']:.0f} "
            f"TFLOP/s ({measured['dtype']} torch.matmul, n = {measured['gemm_size']})."
        )
    return line


def markdown(doc: dict, kernels: dict | None = None) -> str:
    """The whole report: conditions, table, notes and the targets."""
    parts = [
        f"# fastbert bench: {doc['settings']['model']}, {doc['settings']['dtype']}",
        "",
        conditions(doc),
        "",
        markdown_table(doc["results"], doc["settings"].get("backend")),
        "",
        COUNTING_NOTE + " " + roofline_line(doc),
    ]
    if caution(doc):
        parts += ["", caution(doc)]
    if doc["settings"].get("note"):
        parts += ["", doc["settings"]["note"]]
    for note in notes(doc):
        parts += ["", note]
    parts += ["", "## Targets", ""]
    if doc["settings"].get("device") == "cuda":
        parts.append(targets.markdown(targets.evaluate(doc, kernels)))
    else:
        parts.append(CPU_TARGETS)
    return "\n".join(parts) + "\n"


def plot(doc: dict, path: str | Path) -> str | None:
    """Median time per shape and contender (log scale, p20-p80 bars) as a PNG.

    Returns None when written, else why not (matplotlib missing, nothing measured).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib): no plot"
    records = [r for r in doc["results"] if analysis.ok(r)]
    if not records:
        return "nothing was measured: no plot"
    table = analysis.by_shape(records)
    peers = analysis.peers_in_order(records)
    width = 0.8 / len(peers)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.8 * len(table)), 4.5))
    for i, peer in enumerate(peers):
        xs, ys, low, high = [], [], [], []
        for x, rows in enumerate(table.values()):
            if peer in rows:
                r = rows[peer]
                xs.append(x + (i - (len(peers) - 1) / 2) * width)
                ys.append(r["median_ms"])
                low.append(r["median_ms"] - r["p20_ms"])
                high.append(r["p80_ms"] - r["median_ms"])
        axes.bar(xs, ys, width, yerr=[low, high], label=peer, capsize=2)
    axes.set_xticks(range(len(table)), list(table))
    axes.set_yscale("log")
    axes.set_ylabel("median time per forward (ms, log scale)")
    env = doc["environment"]
    axes.set_title(
        f"{doc['settings']['model']} {doc['settings']['dtype']} on "
        f"{env.get('gpu') or 'CPU'}: lower is better\n"
        f"fastbert backend: {backend_text(doc['settings'])}",
        fontsize=10,
    )
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return None


def read_kernels(folder: Path) -> dict | None:
    """The kernel suite's pytest-benchmark JSON in ``folder``; None when absent or empty (a
    suite that ran no benchmark leaves an empty file)."""
    path = folder / KERNELS_JSON
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_reports(folder: str | Path, doc: dict) -> list[str]:
    """Write results.json, results.md and results.png into ``folder``; return messages."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_json(doc, folder / RESULTS_JSON)
    (folder / RESULTS_MD).write_text(markdown(doc, read_kernels(folder)))
    problem = plot(doc, folder / RESULTS_PNG)
    return [problem] if problem else []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m fastbert.bench.report",
        description="re-render results.md and results.png from a folder's results.json",
    )
    parser.add_argument("folder")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    for message in write_reports(folder, read_document(folder / RESULTS_JSON)):
        print(message)
    print((folder / RESULTS_MD).read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
