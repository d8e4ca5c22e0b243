"""What keeping freed memory is worth on a CPU (fastbert.execution.cpu_memory): the corpus
benchmark's fastbert contenders, each timed in fresh processes with ``FASTBERT_KEEP_CPU_MEMORY``
on and off, in turn.

    python -m benchmarks.cpu_memory --out benchmarks/results/cpu-memory-<date> [--docs 1000]
        [--rounds 3] [--contenders fastbert-int8,fastbert-bf16,fastbert-list] [--caches 1024,16]

``--caches`` also runs each pair with oneDNN's and ideep's per-shape caches at each size given
(``ONEDNN_PRIMITIVE_CACHE_CAPACITY`` and ``LRU_CACHE_CAPACITY``; without it the processes
take this one's environment). Each round runs every (contender, caches, setting) once, each in
a process of its own that loads
the packaged all-MiniLM-L6-v2, warms up on a tenth of the texts (benchmarks/embed_bench.py's
``load_contender``) and times one embedding of ``--docs`` paragraphs of its corpus, counting
the minor page faults and the system time of that run (getrusage). Writes cpu-memory.json
(every run, with the environment) and cpu-memory.md (medians per pair). Speed is measured
here, never asserted in a test.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys

from benchmarks import reporting
from fastbert.execution import cpu_memory

SETTINGS = ("1", "0")  # kept, returned to the system


def child(key: str, docs: int) -> dict:
    """One timed run of ``key`` in this process (the variable already set): seconds, minor
    page faults, system seconds."""
    from benchmarks import embed_bench

    texts = embed_bench.corpus(docs)
    embed_bench.load_contender(key, texts, "cpu", None, "minilm")
    before = resource.getrusage(resource.RUSAGE_SELF)
    seconds, _ = embed_bench.time_contender(key, texts)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "minor_faults": after.ru_minflt - before.ru_minflt,
        "system_s": after.ru_stime - before.ru_stime,
    }


def run_child(key: str, docs: int, keep: str, caches: str | None = None) -> dict:
    env = {**os.environ, cpu_memory.VARIABLE: keep, "HF_HUB_OFFLINE": "1"}
    if caches is not None:
        env.update(dict.fromkeys(cpu_memory.CACHE_VARIABLES, caches))
    command = [sys.executable, "-m", "benchmarks.cpu_memory", "--child", key, "--docs", str(docs)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        f"# Freed memory kept or returned: {report['docs']} docs, all-MiniLM-L6-v2, cpu",
        "",
        f"Median of {report['rounds']} rounds; each run in a fresh process, the pairs in turn. "
        + reporting.cpu_line(env),
        "",
    ]
    rows = []
    for key in report["contenders"]:
        for caches in report.get("caches") or [None]:
            medians = {}
            for keep in SETTINGS:
                runs = [
                    r
                    for r in report["runs"]
                    if r["contender"] == key and r["keep"] == keep and r.get("caches") == caches
                ]
                medians[keep] = {
                    field: statistics.median(r[field] for r in runs)
                    for field in ("seconds", "minor_faults", "system_s")
                }
            for keep in SETTINGS:
                m = medians[keep]
                speedup = medians["0"]["seconds"] / m["seconds"] if keep == "1" else None
                rows.append(
                    (
                        key,
                        caches or "inherited",
                        "kept" if keep == "1" else "returned",
                        f"{m['seconds']:.2f}",
                        f"{m['minor_faults']:,.0f}",
                        f"{m['system_s']:.2f}",
                        "" if speedup is None else f"{speedup:.2f}x",
                    )
                )
    columns = (
        "contender",
        "cache entries",
        "freed memory",
        "median s",
        "minor page faults",
        "system s",
        "kept speed-up",
    )
    lines += reporting.table(columns, "lrlrrrr", rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser("cpu_memory", __doc__.split("\n\n")[0], 1000, 3, False)
    parser.add_argument("--contenders", default="fastbert-int8,fastbert-bf16,fastbert-list")
    parser.add_argument(
        "--caches",
        help="entries of oneDNN's and ideep's per-shape caches, each size run in turn "
        "(default: this process's environment)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.docs < 1 or args.rounds < 1:
        parser.error("--docs and --rounds must be at least 1")
    caches = [c for c in (args.caches or "").split(",") if c]
    if not all(c.isdigit() for c in caches):
        parser.error(f"--caches takes entries as whole numbers, got {args.caches!r}")
    if args.child:
        print(json.dumps(child(args.child, args.docs)))
        return 0
    if args.out is None:
        parser.error("--out is required")
    from benchmarks import embed_bench
    from fastbert.bench import environment

    keys = [k for k in args.contenders.split(",") if k]
    fastbert_keys = [k for k in embed_bench.FASTBERT if k != "st"]
    unknown = [k for k in keys if k not in fastbert_keys]
    if unknown or not keys:
        parser.error(f"--contenders: {unknown or 'none'}; choose from {fastbert_keys}")
    env = environment.capture()
    runs = []
    for round_index in range(args.rounds):
        for key in keys:
            for size in caches or [None]:
                for keep in SETTINGS:
                    result = {"round": round_index, "contender": key, "keep": keep}
                    result["caches"] = size
                    result.update(run_child(key, args.docs, keep, size))
                    runs.append(result)
                    print(json.dumps(result), file=sys.stderr, flush=True)
    report = {
        "docs": args.docs,
        "rounds": args.rounds,
        "contenders": keys,
        "caches": caches or None,
        "environment": env,
        "runs": runs,
    }
    reporting.write_report(args.out, "cpu-memory", report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
