"""The GPU run: every stage of benchmarks/gpu_run/plan.py within one budget, then a short
summary and one archive of every result file (what benchmarks/run_gpu.sh runs).

    python -m benchmarks.gpu_run OUT             # on a machine with a CUDA GPU
    python -m benchmarks.gpu_run OUT --dry-run   # on any machine: would every stage start?

OUT receives two files: summary.txt (also printed at the end) and gpu-run.tar.gz, a folder
``gpu-run/`` holding the stages' results, their logs (logs/), stages.json and the summary.
Exit 0 when every stage that ran ended well (or, dry, would start), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from benchmarks.gpu_run import dry_run, plan, runner, samples, summary

REPO = Path(__file__).resolve().parents[2]
ARCHIVE = "gpu-run.tar.gz"
SUMMARY = "summary.txt"
RESULTS = "gpu-run"
ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONUNBUFFERED": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


def finish(results: Path, out: Path) -> str:
    """Write the summary into ``results`` and ``out``, archive ``results`` into ``out``."""
    text = summary.build(results)
    (results / SUMMARY).write_text(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / SUMMARY).write_text(text)
    with tarfile.open(out / ARCHIVE, "w:gz") as archive:
        archive.add(results, arcname=RESULTS)
    return text


def run(out: Path, budget_s: float, started: float) -> int:
    work = Path(tempfile.mkdtemp(prefix="fastbert-gpu-run-"))
    results, scratch = work / RESULTS, work / "scratch"
    results.mkdir()
    os.environ.update(ENVIRONMENT)
    os.environ.setdefault("FASTBERT_CACHE", str(scratch / "cache"))
    stages = plan.stages(results, scratch, sys.executable, plan.workers_here())
    outcomes = runner.run_all(stages, results, REPO, started + budget_s)
    print(finish(results, out), end="")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(o.status in ("ok", "skipped") for o in outcomes) else 1


def dry(out: Path) -> int:
    work = Path(tempfile.mkdtemp(prefix="fastbert-gpu-dry-run-"))
    results = work / RESULTS
    stages = plan.stages(results, work / "scratch", sys.executable, plan.DEFAULT_WORKERS)
    problems = dry_run.check(stages, REPO)
    for stage in stages:
        problem = problems[stage.name]
        print(
            f"{stage.name:<20}{'would start' if problem is None else 'WOULD NOT START: ' + problem}"
        )
    samples.write(results, stages)
    text = finish(results, out)
    shutil.rmtree(work, ignore_errors=True)
    print(f"summary from made-up files ({len(text.splitlines())} lines) and {ARCHIVE} in {out}")
    return 1 if any(problems.values()) else 0


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("out", type=Path, help="the folder for summary.txt and the archive")
    parser.add_argument(
        "--dry-run", action="store_true", help="check that every stage would start; run none"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=float(os.environ.get("BUDGET_S", plan.BUDGET_S)),
        help=f"seconds for the whole run, install included (BUDGET_S; {plan.BUDGET_S})",
    )
    args = parser.parse_args(argv)
    if args.dry_run:
        return dry(args.out)
    return run(args.out, args.budget, started)


if __name__ == "__main__":
    sys.exit(main())
