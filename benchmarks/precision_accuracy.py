"""The precision table: ``fastbert accuracy --precisions`` on the packaged all-MiniLM-L6-v2,
written with the environment it ran in.

    python -m benchmarks.precision_accuracy --out benchmarks/results/precision-accuracy-cpu-<date>
        [--device cpu] [--queries 100] [--corpus 1000] [--threads N]

Runs :func:`fastbert.accuracy.evaluate_precisions` for every precision the device runs, the
emulated ones included (fp8 on a CPU; the torch backend on a CPU, Triton on CUDA), and writes
precision-accuracy.json (the report and the environment: CPU model and flags, threads, GPU,
versions, commit, date) and precision-accuracy.md (the table docs/precisions.md shows).
Accuracy only: nothing is timed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from fastbert.accuracy import precision_report  # noqa: E402


def markdown(report: dict, environment: dict, command: str) -> str:
    """The report as a Markdown table, with the sample, the reference and the environment."""
    top = f"top-{report['top_k']}"
    lines = [
        f"# Precisions, {report['model']} on {report['device']} (backend {report['backend']})",
        "",
        f"Reference: {report['reference']}. Sample: {report['queries']} query sentences and "
        f"{report['corpus']} corpus paragraphs, {report['source']}; {report['tokens']} real "
        f"tokens; mean |hidden state| of the reference {report['hidden_mean_abs']:.3f}. "
        "Hidden: the last layer's output at real tokens. Cosine: the sentence embeddings "
        f"(what `encode` returns), per text. {top} overlap: of each query's {report['top_k']} "
        f"nearest corpus paragraphs (cosine), the fraction also among the reference's.",
        "",
        f"| precision | runs in | hidden max abs err | hidden mean abs err | least cosine "
        f"| mean cosine | least {top} overlap | mean {top} overlap |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in report["results"]:
        runs_in = precision_report.runs_in(r["compute_dtype"], r["quantize"], r["emulated"])
        lines.append(
            f"| {r['precision']} | {runs_in} | {r['hidden_max_abs_err']:.2e} "
            f"| {r['hidden_mean_abs_err']:.2e} | {r['cosine_least']:.6f} "
            f"| {r['cosine_mean']:.6f} | {r['top10_overlap_least']:.2f} "
            f"| {r['top10_overlap_mean']:.3f} |"
        )
    return "\n".join([*lines, *footer(environment, command)])


def footer(env: dict, command: str) -> list[str]:
    """The lines that end a results table: the environment it ran in and its command."""
    return [
        "",
        f"CPU: {env['cpu']} (flags: {env['cpu_flags']}; {env['cpu_threads']} torch threads); "
        f"GPU: {env['gpu']}; torch {env['torch']}, transformers {env['transformers']}, "
        f"sentence-transformers {env['sentence-transformers']}, Python {env['python']}; "
        f"commit {env['commit']}; {env['date']}.",
        "",
        f"Command: `{command}`",
        "",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.precision_accuracy", description=__doc__
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the result files")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--corpus", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: its)")
    args = parser.parse_args(argv)

    import torch

    from fastbert.accuracy import evaluate_precisions
    from fastbert.bench import environment

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    backend = "triton" if args.device.startswith("cuda") else "torch"
    env = environment.capture()  # before the run: the commit and load it started with
    report = evaluate_precisions(
        device=args.device,
        backend=backend,
        queries=args.queries,
        corpus=args.corpus,
        progress=sys.stderr,
        emulated=True,
    ).to_dict()
    command = "python -m benchmarks.precision_accuracy " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"report": report, "environment": env, "command": command}
    (args.out / "precision-accuracy.json").write_text(json.dumps(result, indent=2) + "\n")
    table = markdown(report, env, command)
    (args.out / "precision-accuracy.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
