"""The GPU run: every stage of benchmarks/gpu_run/plan.py within one budget, then a short
summary and one archive of every result file (what benchmarks/run_gpu.sh runs).

    python -m benchmarks.gpu_run OUT             # on a machine with a CUDA GPU
    python -m benchmarks.gpu_run OUT --dry-run   # on any machine: would every stage start?
    python -m benchmarks.gpu_run OUT --stages install,corpus --cap-scale 2
                                                 # some stages, with longer caps

OUT receives two files: summary.txt (also printed at the end) and gpu-run.tar.gz, a folder
``gpu-run/`` holding the stages' results, their logs (logs/), stages.json and the summary.
Exit 0 when every stage that ran ended well (or, dry, would start), 1 otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
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


def chosen(stages: list[plan.Stage], names: list[str] | None, cap_scale: float) -> list[plan.Stage]:
    """``stages`` in their order, only those ``names`` lists (all when None), each cap times
    ``cap_scale`` (a first run on a machine compiles every kernel: cold caches take longer).
    Raises ValueError naming a stage the plan does not have."""
    if names is not None:
        unknown = sorted(set(names) - {s.name for s in stages})
        if unknown:
            known = ", ".join(s.name for s in stages)
            raise ValueError(f"no stage named {', '.join(unknown)}; the stages: {known}")
        stages = [s for s in stages if s.name in names]
    return [dataclasses.replace(s, cap_s=round(s.cap_s * cap_scale)) for s in stages]


def run(
    out: Path,
    budget_s: float,
    started: float,
    names: list[str] | None = None,
    cap_scale: float = 1.0,
) -> int:
    work = Path(tempfile.mkdtemp(prefix="fastbert-gpu-run-"))
    results, scratch = work / RESULTS, work / "scratch"
    results.mkdir()
    # The bench and kernels stages both write here; either may run without the other.
    (results / "bench").mkdir()
    os.environ.update(ENVIRONMENT)
    os.environ.setdefault("FASTBERT_CACHE", str(scratch / "cache"))
    every = plan.stages(results, scratch, sys.executable, plan.workers_here())
    stages = chosen(every, names, cap_scale)
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
    parser.add_argument(
        "--stages",
        type=lambda text: [name for name in text.split(",") if name],
        help="run only these stages, comma-separated (their order stays the plan's)",
    )
    parser.add_argument(
        "--cap-scale",
        type=float,
        default=1.0,
        help="multiply every stage's cap (default 1; a first run compiles every kernel)",
    )
    args = parser.parse_args(argv)
    if args.cap_scale <= 0:
        parser.error("--cap-scale must be positive")
    if args.dry_run:
        return dry(args.out)
    names = plan.stages(Path("."), Path("."), sys.executable)
    try:
        chosen(names, args.stages, args.cap_scale)
    except ValueError as exc:
        parser.error(str(exc))
    return run(args.out, args.budget, started, args.stages, args.cap_scale)


if __name__ == "__main__":
    sys.exit(main())
