"""Memory under a long steady load: ``fastbert serve`` (or a long ``fastbert embed`` job) run
as a real process, its resident memory sampled every few seconds.

    python -m benchmarks.serve_soak --out benchmarks/results/serve-soak-cpu-<date>
        [--minutes 10] [--clients 4] [--max-texts 8] [--bad 0.1] [--interval 5]
        [--env NAME=VALUE ...]
    python -m benchmarks.serve_soak --mode embed --out benchmarks/results/embed-soak-cpu-<date>
        [--rows 120000]

``serve``: the server on a free loopback port (the packaged all-MiniLM-L6-v2, or ``--model``);
a load generator in a process of its own (benchmarks/serve_load.py) keeps ``--clients``
closed-loop clients busy for ``--minutes``, each request to ``/embed`` holding 1 to
``--max-texts`` paragraphs of real English (benchmarks/embed_bench.py's corpus of Python's
help texts), with a ``--bad`` share of bad requests (empty inputs, a body that is not JSON, a
wrong type, too many inputs, a token id outside the vocabulary, an unknown option value).
``embed``: ``fastbert embed`` on a text file of ``--rows`` documents (the corpus over and over,
each pass dropping one more leading word of every paragraph, so that passes differ in their
lengths) until the job ends.

``--env NAME=VALUE`` sets a variable for the measured process only (``MALLOC_ARENA_MAX=2``,
``FASTBERT_KEEP_CPU_MEMORY=0``...). Writes ``<mode>-soak.json`` (every sample, the load's
counts and latencies, the process's mappings at the end, the conditions) and
``<mode>-soak.md``. Memory is measured here, never asserted in a test.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from benchmarks import reporting, soak_memory
from benchmarks.serve_load import SHAPE_LIST, Call, Generator, Plan, summary

MODES = ("serve", "embed")
CORPUS = 2608  # paragraphs in benchmarks/embed_bench.py's corpus
MAX_CLIENT_BATCH = 32  # fastbert serve's default --max-client-batch-size
# Bad requests, each answered 400 or 422 before or after tokenisation.
BAD_BODIES = (
    b'{"inputs": []}',
    b'{"inputs": ["a sentence", ""]}',
    b'{"inputs": ["not closed"',
    b'{"inputs": 5}',
    json.dumps({"inputs": ["word"] * (MAX_CLIENT_BATCH + 1)}).encode(),
    b'{"inputs": [[101, 999999999, 102]]}',
    b'{"inputs": "a sentence", "truncation_direction": "up"}',
)
# Variables that change how the measured process allocates: recorded where set.
MEMORY_VARIABLES = (
    "FASTBERT_KEEP_CPU_MEMORY",
    "MALLOC_ARENA_MAX",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_MMAP_THRESHOLD_",
    "GLIBC_TUNABLES",
    "LD_PRELOAD",
    "ONEDNN_PRIMITIVE_CACHE_CAPACITY",
    "LRU_CACHE_CAPACITY",
    "OMP_NUM_THREADS",
)


def requests(
    texts: list[str], count: int, max_texts: int, bad: float, seed: int = 0
) -> tuple[Call, ...]:
    """``count`` requests to TEI's ``/embed``: each good one holds 1 to ``max_texts`` of
    ``texts`` in a seeded order; a share ``bad`` of them, spread evenly (so that even a short
    window of a few requests per client meets some), is one of BAD_BODIES in turn."""
    rng = random.Random(seed)
    calls = []
    for i in range(count):
        if math.floor((i + 1) * bad) > math.floor(i * bad):
            body = BAD_BODIES[i % len(BAD_BODIES)]
            calls.append(Call("/embed", body, 1, 0, SHAPE_LIST))
            continue
        chosen = rng.sample(texts, rng.randint(1, max_texts))
        body = json.dumps({"inputs": chosen, "normalize": True}).encode()
        calls.append(Call("/embed", body, len(chosen), 0, SHAPE_LIST))
    return tuple(calls)


def embed_rows(texts: list[str], rows: int) -> list[str]:
    """``rows`` documents: ``texts`` over and over, pass k dropping the first k words of each
    text that has more than k (so that each pass batches other lengths)."""
    out = []
    for i in range(rows):
        k, text = divmod(i, len(texts))
        words = texts[text].split()
        out.append(" ".join(words[k:] if len(words) > k else words))
    return out


def server_env(extra: dict[str, str], workdir: Path) -> dict[str, str]:
    from benchmarks import serve_contenders

    return {**serve_contenders.base_env(workdir), **extra}


def freed_memory(env: dict[str, str]) -> str | None:
    """What ``fastbert info`` says of freed memory and the per-shape caches in ``env`` (the
    measured process's own settings, which its command line sets as it starts)."""
    command = [sys.executable, "-m", "fastbert.cli", "info"]
    out = subprocess.run(command, env=env, capture_output=True, text=True).stdout
    found = [line for line in out.splitlines() if line.startswith("cpu freed memory")]
    return found[0].removeprefix("cpu freed memory").strip() if found else None


def soak_serve(args, model: Path, workdir: Path) -> dict:
    """The server under load for ``args.minutes``: its samples and the load's summary."""
    from benchmarks import embed_bench, serve_contenders

    contender = serve_contenders.Contender("fastbert", "tei")
    port = serve_contenders.free_port()
    command = contender.command(model, port) + ["--dtype", args.dtype]
    calls = requests(embed_bench.corpus(args.docs), 512, args.max_texts, args.bad)
    env = server_env(args.env, workdir)
    log = workdir / "serve.log"
    with serve_contenders.running("fastbert", command, env, log, port, 300) as server:
        plan = Plan(
            server.base_url,
            calls,
            "closed",
            concurrency=args.clients,
            seconds=args.minutes * 60,
            warmup=1.0,
            min_rounds=1.0,
        )
        results: list = []
        with Generator() as generator:
            load = threading.Thread(target=lambda: results.append(generator.run(plan)))
            load.start()
            samples = soak_memory.watch(
                server.process.pid, load.is_alive, args.interval, args.minutes * 60, "serve"
            )
            load.join()
        at_end = soak_memory.mappings(server.process.pid)
        peak = soak_memory.status(server.process.pid).get("VmHWM", 0) / soak_memory.MB
    if not results:
        raise RuntimeError(f"the load generator failed; the server's log:\n{log.read_text()}")
    return {
        "command": command,
        "freed_memory": freed_memory(env),
        "samples": samples,
        "mappings_at_end": at_end,
        "vm_hwm_mb": peak,
        "load": summary(results[0]),
    }


def soak_embed(args, model: Path, workdir: Path) -> dict:
    """``fastbert embed`` over ``args.rows`` documents, sampled until it ends."""
    from benchmarks import embed_bench

    source = workdir / "corpus.txt"
    source.write_text("\n".join(embed_rows(embed_bench.corpus(args.docs), args.rows)) + "\n")
    command = [sys.executable, "-m", "fastbert.cli", "embed", "--model", str(model)]
    command += ["--dtype", args.dtype, "--output", str(workdir / "shards")]
    command += ["--no-progress", str(source)]
    log, env = workdir / "embed.log", server_env(args.env, workdir)
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        peak = [0.0]

        def running() -> bool:
            alive = process.poll() is None
            if alive:  # the last look at the peak before the process is gone
                with contextlib.suppress(OSError):
                    fields = soak_memory.status(process.pid)
                    peak[0] = max(peak[0], fields.get("VmHWM", 0) / soak_memory.MB)
            return alive

        samples = soak_memory.watch(process.pid, running, args.interval, None, "embed")
        code = process.wait()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if code != 0:
        raise RuntimeError(f"fastbert embed exited with {code}:\n{log.read_text()}")
    return {
        "command": command,
        "freed_memory": freed_memory(env),
        "samples": samples,
        "vm_hwm_mb": peak[0],
    }


def markdown(report: dict) -> str:
    memory, env = report["memory"], report["environment"]
    mode = report["mode"]
    what = (
        f"`fastbert serve`, {report['clients']} closed-loop clients, 1-{report['max_texts']} "
        f"texts per `/embed` request, {report['bad']:.0%} bad requests"
        if mode == "serve"
        else f"`fastbert embed` over {report['rows']:,} documents"
    )
    variables = ", ".join(f"{k}={v}" for k, v in report["variables"].items()) or "none"
    if report.get("freed_memory"):
        variables += f"; `fastbert info` in its environment: {report['freed_memory']}"
    lines = [
        f"# Memory over a long run: {report['model']} ({report['dtype']}), {mode}",
        "",
        f"{what}; {memory['seconds'] / 60:.1f} minutes, RSS sampled every "
        f"{report['interval']:g} s. Memory variables: {variables}. CPU: {env['cpu']} "
        f"({env['cpu_threads']} torch threads, a machine shared with other work: load average "
        f"{memory['load_mean']:.1f} on the mean); torch {env['torch']}; fastbert "
        f"{env['fastbert']}; commit {env['commit']}; {env['date']}.",
        "",
        "| start MiB | peak MiB | end MiB | growth over the last half MiB | slope, last half "
        "MiB/min |",
        "|---:|---:|---:|---:|---:|",
        f"| {memory['start_mb']:,.0f} | {memory['peak_mb']:,.0f} | {memory['end_mb']:,.0f} | "
        f"{memory['growth_last_half_mb']:+,.0f} | {memory['slope_last_half_mb_per_min']:+.1f} |",
        "",
    ]
    if mode == "serve":
        load = report["load"]
        errors = ", ".join(f"{k}: {v}" for k, v in load["errors"].items()) or "none"
        lines += [
            f"Load: {load['ok']:,} ok requests ({load['inputs_per_s']:.1f} texts/s; latency p50 "
            f"{load['p50_ms']:.0f} ms, p99 {load['p99_ms']:.0f} ms); errors by status: "
            f"{errors}.",
            "",
        ]
    mappings = report.get("mappings_at_end") or {}
    if mappings:
        lines += [
            f"At the end: main heap {mappings['heap_mb']:,.0f} MiB, anonymous mappings "
            f"{mappings['anonymous_mb']:,.0f} MiB ({mappings['anonymous_over_1mb']} over 1 MiB), "
            f"files {mappings['files_mb']:,.0f} MiB.",
            "",
        ]
    lines += ["| time (m:ss) | RSS MiB | threads | load average |", "|---:|---:|---:|---:|"]
    samples, shown, due = report["samples"], [], 0.0
    for sample in samples:  # the first sample of each minute, and the last
        if sample["seconds"] >= due:
            shown.append(sample)
            due = (sample["seconds"] // 60 + 1) * 60
    if shown[-1] is not samples[-1]:
        shown.append(samples[-1])
    for sample in shown:
        when = soak_memory.clock(sample["seconds"])
        lines.append(
            f"| {when} | {sample['rss_mb']:,.0f} | {sample['threads']} | {sample['load']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs as a dict; ValueError naming a malformed one."""
    env = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise ValueError(f"--env {pair!r}: give NAME=VALUE")
        env[name] = value
    return env


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser("serve_soak", __doc__.split("\n\n")[0], CORPUS, None)
    parser.add_argument("--mode", choices=MODES, default="serve", help="what runs")
    parser.add_argument("--minutes", type=float, default=10.0, help="serve: the load's length")
    parser.add_argument("--clients", type=int, default=4, help="serve: concurrent clients")
    parser.add_argument("--max-texts", type=int, default=8, help="serve: texts per request")
    parser.add_argument("--bad", type=float, default=0.1, help="serve: share of bad requests")
    parser.add_argument("--rows", type=int, default=120000, help="embed: documents of the job")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument("--model", type=Path, help="model folder (default: all-MiniLM-L6-v2)")
    parser.add_argument(
        "--dtype", choices=("float32", "bfloat16"), default="float32", help="the model's dtype"
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="NAME=VALUE", help="for the process"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.docs <= CORPUS:
        parser.error(f"--docs must be 1 to {CORPUS} (the corpus's paragraphs)")
    if args.minutes <= 0 or args.interval <= 0 or args.clients < 1 or args.rows < 1:
        parser.error("--minutes, --interval, --clients and --rows must be positive")
    if not 1 <= args.max_texts <= MAX_CLIENT_BATCH:
        parser.error(f"--max-texts must be 1 to {MAX_CLIENT_BATCH}")
    if not 0 <= args.bad < 1:
        parser.error("--bad must be at least 0 and below 1")
    try:
        args.env = parse_env(args.env)
    except ValueError as exc:
        parser.error(str(exc))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from fastbert.bench import environment
    from fastbert.integrations import models

    model = args.model or Path(models.packaged_minilm_path())
    name = args.model.name if args.model else "all-MiniLM-L6-v2"
    with tempfile.TemporaryDirectory(prefix="fastbert-soak-") as folder:
        soak = soak_serve if args.mode == "serve" else soak_embed
        result = soak(args, model, Path(folder))
    samples = result.pop("samples")
    merged = {**os.environ, **args.env}
    report = {
        "mode": args.mode,
        "model": name,
        "dtype": args.dtype,
        "docs": args.docs,
        "interval": args.interval,
        "minutes": args.minutes,
        "clients": args.clients,
        "max_texts": args.max_texts,
        "bad": args.bad,
        "rows": args.rows,
        "variables": {name: merged[name] for name in MEMORY_VARIABLES if name in merged},
        "memory": soak_memory.growth(samples),
        **result,
        "samples": soak_memory.as_dicts(samples),
        "environment": environment.capture(),
    }
    reporting.write_report(args.out, f"{args.mode}-soak", report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
