"""Corpus-embedding throughput: docs/s and tokens/s of the fastbert embed pipeline,
``fastbert.optimize(st).encode``, sentence-transformers' ``st.encode`` and, where installed,
ONNX Runtime and OpenVINO, on the packaged all-MiniLM-L6-v2 (or, ``--model mpnet``,
all-mpnet-base-v2: BERT-base size with MPNet's relative position bias; ``--model
modernbert-base``: ModernBERT-base's architecture and size with random weights, see
benchmarks/modernbert_folder.py) and a corpus of real
English shipped with Python (the paragraphs of ``pydoc_data.topics``, the help texts of the
language reference: 2 to ~800 words each).

    python -m benchmarks.embed_bench --out benchmarks/results/cpu-embed-<date> [--docs 1000]
        [--model minilm|mpnet|modernbert-base]
        [--contenders all|fastbert|st,fastbert-list,ort-int8,...]

Contenders (each from a list of texts already in memory, or a .jsonl file for the pipeline,
to embeddings; the model loaded beforehand and not timed):

- ``fastbert embed``: the command's pipeline (read the .jsonl, tokenise ahead, sort by length
  in windows, token-budget batches, write Parquet shards), timed from the file to the shards.
- ``fastbert.embed(texts)``: the same pipeline from a list, into an array.
- ``fastbert.optimize(st).encode``: sentence-transformers' encode with fastbert swapped in.
- ``fastbert.embed(texts)`` in bfloat16 and with dynamic int8 linears (``quantize="int8"``).
- The three ``fastbert.embed(texts)`` rows again on the padded route (``FolderPipeline``'s
  ``packed=False``: the ids padded into a batch with a mask, the model's padded entry, pooling
  over the mask), which a folder with a sentence-transformers module runs and every folder ran
  before the packed path: the packed path's gain, measured in the same run.
- ``fastbert.embed(texts)`` int8 with the linear's quantisation and epilogue in PyTorch's ops
  instead of the CPU engine's compiled passes (fastbert/kernels/cpu_int8.cpp; the same bits): what
  the compiled passes gain, in the same run.
- ``st.encode``: sentence-transformers as shipped (batch_size 32, its default).
- The peers, when their packages are installed (``pip install 'fastbert[peers]'``; see
  benchmarks/embed_peers.py): ONNX Runtime on the BERT-fused graph in fp32 and with dynamic
  int8 weights per channel, OpenVINO in fp32 and bf16, each exported once from the same model
  and run in the ``fastbert.embed(texts)`` pipeline in place of fastbert's forward: the same
  tokenisation, the same length-sorted token-budget batches (the same token ids and masks),
  pooled and normalised as the model folder says.

Each contender loads and runs in a fresh process of its own (``--isolation shared``: all in
this one, where a contender's speed moves with what ran before it) and is warmed up on a slice
of the corpus; then come ``--reps`` rounds, each running every contender once in turn (so a
slow spell of a shared machine slows them alike). The median is reported with the min and max,
and tokens/s as a percentage of the CPU's GEMM limit in the precision the contender computes in
(benchmarks/gemm_limit.py, measured in turn with the rounds: its median, as the contenders'
times are medians). Every contender's embeddings are compared
with ``st.encode``'s (fp32): the least cosine is reported beside the bound the contender is
held to, and the run exits 1 when one falls below it. Writes
embed-bench.json (with the environment: CPU model and flags, threads, versions) and
embed-bench.md (embed-bench-mpnet.* for all-mpnet-base-v2).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import embed_peers, gemm_limit, modernbert_folder

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def corpus(docs: int) -> list[str]:
    """``docs`` paragraphs of pydoc_data.topics, spread evenly over the whole text (so the
    length spread is the text's), one line each."""
    from pydoc_data.topics import topics

    paragraphs = [
        " ".join(p.split()) for name in sorted(topics) for p in topics[name].split("\n\n")
    ]
    paragraphs = [p for p in paragraphs if p]
    if docs > len(paragraphs):
        raise SystemExit(f"--docs: the corpus has {len(paragraphs)} paragraphs")
    step = len(paragraphs) / docs
    return [paragraphs[int(i * step)] for i in range(docs)]


# --model -> (the model's name, the function giving its folder's path).
MODELS = {
    "minilm": ("all-MiniLM-L6-v2", "packaged_minilm_path"),
    "mpnet": ("all-mpnet-base-v2", "packaged_mpnet_path"),
    "modernbert-base": ("ModernBERT-base shape (random weights)", "modernbert_folder"),
}


def model_folder(model: str) -> Path:
    """The folder of ``model`` (a key of MODELS): a packaged model, or the random
    ModernBERT-base built once (benchmarks/modernbert_folder.py)."""
    if MODELS[model][1] == "modernbert_folder":
        return modernbert_folder.folder()
    from fastbert.integrations import models

    return Path(getattr(models, MODELS[model][1])())


@dataclasses.dataclass(frozen=True)
class Contender:
    """A row of the table: its name, the precision it computes in and the least cosine
    against st.encode it is held to."""

    name: str
    precision: str = "float32"
    min_cosine: float = 0.99999


# --contenders key -> the row; "st" is the reference and always runs.
FASTBERT = {
    "st": Contender("st.encode"),
    "fastbert-embed": Contender("fastbert embed"),
    "fastbert-list": Contender("fastbert.embed(texts)"),
    "fastbert-optimize": Contender("fastbert.optimize(st).encode"),
    # fastbert.embed(texts) in the lossy precisions, bounded as the peers computing alike.
    "fastbert-bf16": Contender("fastbert.embed(texts) bf16", "bfloat16", 0.999),
    "fastbert-int8": Contender("fastbert.embed(texts) int8", "int8", 0.99),
    # The same on the padded route: the token ids padded into [n, longest] with a mask, the
    # model's padded entry, pooling over the mask. A folder with a sentence-transformers
    # module runs it, and every folder ran it before the packed path.
    "fastbert-list-padded": Contender("fastbert.embed(texts), padded route"),
    "fastbert-bf16-padded": Contender(
        "fastbert.embed(texts) bf16, padded route", "bfloat16", 0.999
    ),
    "fastbert-int8-padded": Contender("fastbert.embed(texts) int8, padded route", "int8", 0.99),
    # int8 with the quantisation and epilogue in PyTorch's ops rather than the CPU engine's
    # compiled passes (fastbert.kernels.cpu_int8): what those passes gain, the same bits.
    "fastbert-int8-torch": Contender("fastbert.embed(texts) int8, PyTorch's passes", "int8", 0.99),
    # int8 with the integer products on torch._int_mm where the CPU engine runs them on oneDNN's
    # quantised linear (fastbert.kernels.cpu_engine_int8; on AMX-INT8): the same bits. Without
    # int8 dot products, the engine's product on weights converted or packed on every call.
    "fastbert-int8-int-mm": Contender("fastbert.embed(texts) int8, torch._int_mm", "int8", 0.99),
}
# The EmbedOptions of those rows.
LOSSY = {"fastbert-bf16": {"dtype": "bfloat16"}, "fastbert-int8": {"quantize": "int8"}}
PADDED = {"fastbert-list-padded": "fastbert-list", "fastbert-bf16-padded": "fastbert-bf16"}
PADDED["fastbert-int8-padded"] = "fastbert-int8"
# Rows that run another row's model with a part of the CPU engine's int8 linear turned off:
# its compiled passes, or its products on oneDNN.
SWITCHED_OFF = {"fastbert-int8-torch": "fastbert-int8", "fastbert-int8-int-mm": "fastbert-int8"}


def cannot_run(key: str, config: Any) -> str | None:
    """Why contender ``key`` cannot run a model of ``config`` (fastbert's BertConfig), or
    None: fastbert's int8 path has no gated (GeGLU) FFN (ModernBERT)."""
    if key.startswith("fastbert-int8") and config.glu:
        return "fastbert's int8 quantisation does not run gated (GeGLU) FFNs"
    return None


CONTENDERS = {
    **FASTBERT,
    **{k: Contender(p.name, p.precision, p.min_cosine) for k, p in embed_peers.PEERS.items()},
}


@dataclasses.dataclass
class Pipeline:
    """What fastbert's embed loop runs (run.run_rows): fastbert's tokeniser and options with
    ``encoder``, fastbert's or a peer's."""

    encoder: Any
    tokenise: Any
    options: Any


def contenders(
    texts: list[str],
    device: str,
    batch_tokens: int | None,
    workdir: Path,
    model: str = "minilm",
    chosen: list[str] | None = None,
    details: dict | None = None,
) -> dict[str, Callable[[list[str]], np.ndarray]]:
    """key -> function(texts) -> embeddings [n, dim] (float32 numpy), for the keys of
    CONTENDERS in ``chosen`` (default: all fastbert's and the installed peers), each loaded
    here (nothing is loaded for a key not chosen). A peer's details (precision that ran,
    threads, fused nodes, files) go into ``details[key]``."""
    import torch
    from sentence_transformers import SentenceTransformer

    import fastbert
    from fastbert.embedding import readers, run
    from fastbert.embedding.loading import load_options
    from fastbert.embedding.options import EmbedOptions
    from fastbert.embedding.shards import ShardWriter

    chosen = chosen or [*FASTBERT, *embed_peers.available()]
    folder = model_folder(model)
    options = EmbedOptions(
        model=str(folder), device=device, batch_tokens=batch_tokens, progress=False
    )
    loaded = load_options(options)

    def embed_command(batch: list[str]) -> np.ndarray:
        source = workdir / f"corpus-{len(batch)}.jsonl"
        if not source.exists():
            source.write_text("".join(json.dumps({"text": t}) + "\n" for t in batch))
        output = Path(tempfile.mkdtemp(dir=workdir))
        writer = ShardWriter(
            output, loaded.options.rows_per_shard, loaded.kind, loaded.dimensions, np.float32
        )
        run.run_rows(readers.read_rows([source], "text", None), loaded.job(False), writer, 0)
        return read_shards(output)

    def embed_list(pipeline: Pipeline) -> Callable[[list[str]], np.ndarray]:
        def embed(batch: list[str]) -> np.ndarray:
            sink = run.ArraySink(len(batch), pipeline.encoder.dimensions, np.float32)
            rows = (readers.Row(i, i, t, readers.LIST_SOURCE, i) for i, t in enumerate(batch))
            run.run_rows(rows, pipeline, sink, 0)
            return sink.array

        return embed

    runs: dict[str, Callable[[list[str]], np.ndarray]] = {}
    for key in chosen:
        if key == "st":
            st = SentenceTransformer(str(folder), device=device)
            runs[key] = lambda b, st=st: st.encode(b, convert_to_numpy=True)
        elif key == "fastbert-embed":
            runs[key] = embed_command
        elif key in ("fastbert-list", "fastbert-list-padded"):
            runs[key] = embed_list(route(loaded.job(False), key))
        elif key in SWITCHED_OFF:
            lossy = load_options(dataclasses.replace(options, **LOSSY[SWITCHED_OFF[key]]))
            runs[key] = with_turned_off(key, embed_list(lossy.job(False)))
        elif PADDED.get(key, key) in LOSSY:
            lossy = load_options(dataclasses.replace(options, **LOSSY[PADDED.get(key, key)]))
            runs[key] = embed_list(route(lossy.job(False), key))
        elif key == "fastbert-optimize":
            swapped = fastbert.optimize(SentenceTransformer(str(folder), device=device))
            runs[key] = lambda b, m=swapped: m.encode(b, convert_to_numpy=True)
        else:
            encoder = embed_peers.build(key, folder, torch.get_num_threads(), name=MODELS[model][0])
            if details is not None:
                details[key] = encoder.details
            runs[key] = embed_list(Pipeline(encoder, loaded.text_tokenizer, loaded.options))
    return runs


def route(job: Any, key: str) -> Any:
    """``job`` (a loaded model's embed loop) on the padded route for a key of PADDED."""
    if key in PADDED:
        job.encoder = dataclasses.replace(job.encoder, packed=False)
    return job


def with_turned_off(key: str, embed: Callable[[list[str]], np.ndarray]) -> Callable:
    """``embed`` run with the part of the int8 linear that row ``key`` of SWITCHED_OFF turns
    off: the quantisation and epilogue in PyTorch's ops, or the products on torch._int_mm."""
    from fastbert.kernels import cpu_engine_int8, cpu_int8

    switch = cpu_int8 if key == "fastbert-int8-torch" else cpu_engine_int8

    def run(batch: list[str]) -> np.ndarray:
        with switch.turned_off():
            return embed(batch)

    return run


def read_shards(folder: Path) -> np.ndarray:
    import pyarrow.parquet as pq

    tables = [pq.read_table(p) for p in sorted(folder.glob("part-*.parquet"))]
    return np.concatenate(
        [np.stack(t.column("embedding").to_numpy(zero_copy_only=False)) for t in tables]
    )


def count_tokens(texts: list[str], max_length: int, model: str = "minilm") -> int:
    """Tokens the model sees (special tokens included, truncated to ``max_length``)."""
    from fastbert.embedding.model import load_tokenizer

    tokenizer = load_tokenizer(model_folder(model))
    ids = tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]
    return sum(len(i) for i in ids)


@dataclasses.dataclass
class Measured:
    """One contender's timed runs (seconds each, in the order they ran), its embeddings [n,
    dim] float32 from the last run, a peer's details, and the id of the process that ran it."""

    seconds: list[float]
    embeddings: np.ndarray
    details: dict | None
    pid: int


# In the process that runs a contender: key -> its loaded embed function (texts -> [n, dim]).
_LOADED: dict[str, Callable[[list[str]], np.ndarray]] = {}


def load_contender(
    key: str, texts: list[str], device: str, batch_tokens: int | None, model: str
) -> tuple[dict | None, int]:
    """Load contender ``key`` (and nothing else) into this process and warm it up on a tenth
    of ``texts``; its details (a peer's) and this process's id."""
    import torch

    details: dict = {}
    workdir = Path(tempfile.mkdtemp(prefix="embed-bench-"))  # the process's; the OS cleans up
    embed = contenders(texts, device, batch_tokens, workdir, model, [key], details)[key]
    with torch.inference_mode():
        embed(texts[: max(1, len(texts) // 10)])
    _LOADED[key] = embed
    return details.get(key), os.getpid()


def time_contender(key: str, texts: list[str]) -> tuple[float, np.ndarray]:
    """One timed run of the loaded contender ``key`` on ``texts``: seconds, embeddings."""
    import torch

    with torch.inference_mode():
        start = time.perf_counter()
        embedded = _LOADED[key](texts)
        return time.perf_counter() - start, embedded


class _InThisProcess:
    """The executor interface of ProcessPoolExecutor, calling here and now."""

    def submit(self, function: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        future.set_result(function(*args))
        return future

    def shutdown(self) -> None:
        _LOADED.clear()


def _executor(isolation: str) -> Any:
    """Where a contender runs: a fresh Python process of its own (spawned, not forked:
    nothing loaded here is inherited), or this process."""
    if isolation == "shared":
        return _InThisProcess()
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))


def measure_contenders(
    keys: list[str],
    texts: list[str],
    device: str,
    batch_tokens: int | None,
    model: str,
    reps: int,
    isolation: str = "process",
    each_round: Callable[[], None] | None = None,
) -> dict[str, Measured]:
    """key -> its measurement. Each contender is loaded and warmed up in a process of its own
    (``isolation="process"``), or all in this one (``"shared"``); then the timed runs go round
    by round, each round every contender once in the order of ``keys``, so that a machine
    that slows down for a while (a shared host) slows every contender alike rather than the
    one that happened to run then. In one process a contender's speed moved with what ran
    before it (the int8 row by up to 20% on a 2-thread CPU: docs/results.md), hence the
    processes; only one of them computes at a time. ``each_round``: called in this process
    before each round (the GEMM limit's measurement in turn)."""
    executors = {key: _executor(isolation) for key in keys}
    try:
        loaded = {}
        for key in keys:
            loaded[key] = (
                executors[key]
                .submit(load_contender, key, texts, device, batch_tokens, model)
                .result()
            )
        seconds: dict[str, list[float]] = {key: [] for key in keys}
        embedded: dict[str, np.ndarray] = {}
        for round_ in range(1, reps + 1):
            if each_round is not None:
                each_round()
            for key in keys:
                took, embedded[key] = executors[key].submit(time_contender, key, texts).result()
                seconds[key].append(took)
                print(
                    f"round {round_}/{reps}: {CONTENDERS[key].name}: {took:.2f} s, "
                    f"{len(texts) / took:.1f} docs/s",
                    file=sys.stderr,
                )
    finally:
        for executor in executors.values():
            executor.shutdown()
    return {key: Measured(seconds[key], embedded[key], *loaded[key]) for key in keys}


def cosine_min(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
    return float(cos.min())


def markdown(report: dict) -> str:
    env, rows = report["environment"], report["results"]
    limits = report.get("gemm_limit") or {}
    lines = [
        f"# Corpus embedding, {report['device']}: {report['docs']} docs, {report['tokens']} tokens",
        "",
        f"{report.get('model', 'all-MiniLM-L6-v2')}"
        f"{' (packaged)' if report.get('packaged', True) else ''}, max_length "
        f"{report['max_length']}; corpus: "
        f"paragraphs of pydoc_data.topics (words per doc: median {report['words_median']}, "
        f"max {report['words_max']}); median of {report['reps']} rounds after a warm-up; model "
        "loading not timed; "
        + (
            "each contender in a fresh process of its own, the rounds in turn."
            if report.get("isolation", "shared") == "process"
            else "all contenders in one process."
        ),
        f"CPU: {env['cpu']} ({env['cpu_threads']} torch threads; flags: "
        f"{env.get('cpu_flags') or 'none listed'}); load average at start "
        f"{report['load_average']}; fastbert's freed memory: "
        f"{env.get('cpu_freed_memory', 'returned to the system')}; torch {env['torch']}, "
        f"transformers {env['transformers']}, "
        f"sentence-transformers {env['sentence-transformers']}, onnxruntime "
        f"{env.get('onnxruntime')}, openvino {env.get('openvino')}, onnx {env.get('onnx')}; "
        f"commit {env['commit']}; {env['date']}.",
        "",
        "| contender | precision | median s | min s | max s | docs/s | tokens/s | "
        "% GEMM limit | vs st.encode | min cosine vs st.encode | bound |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    baseline = next(r["median_s"] for r in rows if r["name"] == "st.encode")
    over = False  # a share above 100%: the limit measured is no ceiling for that row
    for r in rows:
        percent = r.get("gemm_limit_percent")
        share = "" if percent is None else f"{percent:.1f}%"
        if percent is not None and percent > 100:
            share, over = f"{share} (!)", True
        lines.append(
            f"| {r['name']} | {r.get('precision', 'float32')} | {r['median_s']:.2f} | "
            f"{min(r['seconds']):.2f} | {max(r['seconds']):.2f} | {r['docs_per_s']:.1f} | "
            f"{r['tokens_per_s']:,.0f} | {share} | "
            f"{baseline / r['median_s']:.2f}x | {r['cosine_min']:.6f} | "
            f"{r.get('min_cosine', '')} |"
        )
    if limits:
        tokens, hidden, intermediate = limits["shape"]
        rates = ", ".join(
            f"{p} {limits[p]['gflops']:.0f} GFLOP/s ({limits[p]['tokens_per_s']:,.0f} tokens/s, "
            f"{limits[p]['kernel']})"
            for p in gemm_limit.PRECISIONS
            if p in limits
        )
        highest = report.get("gemm_limit_highest") or {}
        peaks = ", ".join(
            f"{p} {highest[p]['gflops']:.0f}" for p in gemm_limit.PRECISIONS if p in highest
        )
        lines += [
            "",
            f"GEMM limit (benchmarks/gemm_limit.py): [{tokens}, {hidden}] x [{hidden}, "
            f"{intermediate}] through torch on {limits['threads']} threads: {rates}; "
            f"{limits['flops_per_token']:,} linear-layer FLOPs per token. Each rate is the "
            f"median of {len(report.get('gemm_limit_runs') or [])} measurements taken in turn "
            "with the rounds (before each, and after the last), as a contender's time is the "
            f"median of its rounds; the highest measured: {peaks} GFLOP/s. A row's percentage "
            "is of the median limit in its precision.",
        ]
    if over:
        lines.append(
            "\n(!) Above 100% of the GEMM limit: the row ran faster than the matrix products "
            "measured in its precision, so that limit is no ceiling for it (the products of its "
            "shape ran faster than the limit's, or the limit was measured in a slow spell): "
            "the share says nothing there."
        )
    for key, detail in (report.get("peers") or {}).items():
        lines.append(f"\n{CONTENDERS[key].name}: {json.dumps(detail, sort_keys=True)}")
    for name, why in (report.get("not_run") or {}).items():
        lines.append(f"\nNot run: {name} ({why}).")
    return "\n".join(lines) + "\n"


def parse_contenders(text: str) -> list[str]:
    """--contenders: "all" (fastbert's and the installed peers), "fastbert" (fastbert's) or
    comma-separated keys of CONTENDERS (st, the reference, is added when missing). A peer whose
    packages are missing is refused naming the install command."""
    if text in ("all", "fastbert"):
        return [*FASTBERT, *(embed_peers.available() if text == "all" else [])]
    keys = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in keys if k not in CONTENDERS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"unknown contender {', '.join(unknown) or repr(text)}: choose from all, "
            + ", ".join(CONTENDERS)
        )
    missing = [k for k in keys if k in embed_peers.PEERS and not embed_peers.installed(k)]
    if missing:
        raise argparse.ArgumentTypeError(
            f"{', '.join(missing)} need packages that are not installed: {embed_peers.INSTALL}"
        )
    return ["st", *[k for k in dict.fromkeys(keys) if k != "st"]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for the results")
    parser.add_argument("--docs", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch-tokens", type=int, default=None)
    parser.add_argument("--model", choices=sorted(MODELS), default="minilm")
    parser.add_argument(
        "--contenders",
        default=None,
        help="comma-separated: " + ", ".join(CONTENDERS) + "; fastbert: fastbert's rows; all "
        "(the default): fastbert's and, on the CPU, every peer whose packages are installed. "
        "st.encode, the reference, always runs",
    )
    parser.add_argument(
        "--gemm-seconds",
        type=float,
        default=1.0,
        help="seconds of matrix products per precision for the GEMM limit (0: not measured)",
    )
    parser.add_argument(
        "--isolation",
        choices=("process", "shared"),
        default="process",
        help="process (the default): each contender loads and runs in a fresh process of its "
        "own, so none is slowed by what ran before it; shared: all in this process",
    )
    args = parser.parse_args(argv)
    named = args.contenders or ("all" if args.device == "cpu" else "fastbert")
    try:
        args.contenders = parse_contenders(named)
    except argparse.ArgumentTypeError as error:
        parser.error(f"--contenders: {error}")
    peers_named = [k for k in args.contenders if k in embed_peers.PEERS]
    if peers_named and args.device != "cpu":
        parser.error(f"--contenders {','.join(peers_named)}: the peers run on the CPU only")

    from fastbert.bench import environment
    from fastbert.embedding.model import read_config

    texts = corpus(args.docs)
    words = [len(t.split()) for t in texts]
    try:
        folder = model_folder(args.model)
    except ValueError as error:
        raise SystemExit(f"--model {args.model}: {error}") from error
    # A group (all, fastbert) leaves out the rows the model cannot run, saying why; a row
    # named on its own is a usage error.
    config = read_config(folder)
    skipped = {k: why for k in args.contenders if (why := cannot_run(k, config))}
    if skipped and named not in ("all", "fastbert"):
        key, why = next(iter(skipped.items()))
        parser.error(f"--contenders {key}: {why} (--model {args.model})")
    args.contenders = [k for k in args.contenders if k not in skipped]
    if named == "all":  # a peer left out for its packages is named as not run, not dropped
        for key in embed_peers.PEERS:
            if not embed_peers.installed(key):
                skipped[key] = f"its packages are not installed: {embed_peers.INSTALL}"
    for key, why in skipped.items():
        print(f"{CONTENDERS[key].name}: not run: {why}", file=sys.stderr)
    # The folder's max_seq_length (256 for MiniLM, 384 for MPNet), which every contender uses.
    max_length = json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"]
    tokens = count_tokens(texts, max_length, args.model)
    load_average = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    env = environment.capture()  # the commit measured, before anything else runs
    env.update(embed_peers.versions())
    limit_runs = []
    measure_limit = functools.partial(
        gemm_limit.measure,
        config.hidden_size,
        config.intermediate_size,
        config.num_hidden_layers,
        precisions=tuple(
            p
            for p in gemm_limit.PRECISIONS
            if p in {CONTENDERS[k].precision for k in args.contenders}
        ),
        seconds=args.gemm_seconds,
        glu=config.glu,
    )
    # The limit is measured in turn with the contenders: before each round and after the last;
    # the shares are of its median, as the contenders' times are medians.
    in_turn = args.gemm_seconds > 0 and args.device == "cpu"
    measured = measure_contenders(
        args.contenders,
        texts,
        args.device,
        args.batch_tokens,
        args.model,
        args.reps,
        args.isolation,
        (lambda: limit_runs.append(measure_limit())) if in_turn else None,
    )
    if in_turn:
        limit_runs.append(measure_limit())
    limits = gemm_limit.median(*limit_runs) if limit_runs else None
    reference = measured["st"].embeddings
    results = []
    for key, run in measured.items():
        row = CONTENDERS[key]
        median = statistics.median(run.seconds)
        limit = (limits or {}).get(row.precision)
        results.append(
            {
                "key": key,
                "name": row.name,
                "precision": row.precision,
                "seconds": run.seconds,
                "median_s": median,
                "docs_per_s": len(texts) / median,
                "tokens_per_s": tokens / median,
                "gemm_limit_percent": None
                if limit is None
                else 100 * tokens / median / limit["tokens_per_s"],
                "cosine_min": cosine_min(run.embeddings, reference),
                "min_cosine": row.min_cosine,
                "pid": run.pid,
            }
        )
    report = {
        "model": MODELS[args.model][0],
        "packaged": MODELS[args.model][1] != "modernbert_folder",
        "device": args.device,
        "docs": len(texts),
        "tokens": tokens,
        "reps": args.reps,
        "max_length": max_length,
        "words_median": statistics.median(words),
        "words_max": max(words),
        "load_average": load_average,
        "batch_tokens": args.batch_tokens,
        "environment": env,
        "gemm_limit": limits,
        "gemm_limit_highest": gemm_limit.highest(*limit_runs) if limit_runs else None,
        "gemm_limit_runs": limit_runs,
        "isolation": args.isolation,
        "peers": {k: run.details for k, run in measured.items() if run.details is not None},
        "results": results,
        "not_run": {CONTENDERS[k].name: why for k, why in skipped.items()},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "embed-bench" if args.model == "minilm" else f"embed-bench-{args.model}"
    (args.out / f"{stem}.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(report))
    print(markdown(report))
    below = [r for r in results if r["cosine_min"] < r["min_cosine"]]
    for r in below:
        print(
            f"{r['name']}: least cosine {r['cosine_min']:.6f} is below its bound {r['min_cosine']}",
            file=sys.stderr,
        )
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
