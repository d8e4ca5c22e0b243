"""The compiled CPU attention against the torch backend's own, on the corpus's batches.

``python -m benchmarks.cpu_attention_kernel --out benchmarks/results/NAME [--rounds 5]``
tokenises the corpus of benchmarks/embed_bench.py (its 2,608 paragraphs, all-MiniLM-L6-v2's
tokenizer, at most 256 tokens), forms ``fastbert.embed``'s length-sorted batches of at most
4,096 tokens, and times one attention per batch in bfloat16 and float32 on random q, k, v
(views of one fused [T, 3, H, D] buffer, as the encoder passes them), for H = 12 at head
dimensions 32 (MiniLM) and 64 (BERT-base):

- compiled: ``fastbert.kernels.cpu_attention.attention_varlen``, one call per batch;
- torch: what the torch backend ran before it (and runs where the kernel is not built):
  one SDPA call or math-path pass per run of equal-length sequences
  (``cpu_engine_attention.attention_by_length``);
- on a CPU where the kernel multiplies bfloat16 q k^T and P @ V on AMX's tiles
  (:func:`fastbert.kernels.cpu_attention.tiles`), also the kernel with its tiles turned off
  (AVX512_BF16 dot products and float32 FMAs,
  :func:`fastbert.kernels.cpu_attention.tiles_turned_off`).

Wall time on torch's threads, round-robin (each batch's two paths in turn), the best of
``--rounds`` kept per batch; the relative RMS error of both against float64
(``reference.attention_varlen``) on every batch.

With ``--against SOURCE`` (another version of fastbert/kernels/cpu_attention.cpp, such as ``git show
HEAD~1:fastbert/kernels/cpu_attention.cpp > before.cpp``), the kernel built from it is timed in turn
with the others, on the same batches and in the corpus runs below, so that a change to the kernel is
measured against the version before it in one process.

With ``--build NAME`` (one of :data:`fastbert.kernels.cpu_attention.BUILDS`), that build of the
kernel runs instead of the one this CPU takes (``avx2``: an AVX2-only CPU's float32 code, on
any CPU with AVX2; under ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2_VNNI`` PyTorch's
and oneDNN's kernels are held to AVX2 too); ``--dtypes`` and ``--corpus-precisions`` default
to what it runs.

Then end to end (``--corpus-rounds``, 0 to skip): ``fastbert.load`` of the packaged
all-MiniLM-L6-v2 in float32, bfloat16 and with ``quantize="int8"`` (whose attention runs in
float32), warmed up, and ``model.embed`` of the whole corpus with the kernel on and off
(:func:`fastbert.kernels.cpu_attention.turned_off`) in turn, and in bfloat16 with its tiles
off where it has them, the medians and the least cosine between the kernel's and the torch
path's embeddings. Writes attention.md and attention.json. Speed is measured
here, never asserted in a test.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks import embed_bench, reporting
from fastbert.bench import environment
from fastbert.embedding.batching import token_batches
from fastbert.kernels import cpu_attention
from fastbert.kernels import cpu_engine_attention as T
from fastbert.kernels import reference as R

HEADS = 12
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
BATCH_TOKENS = 4096
# The corpus runs' name for the kernel built from ``--against``'s source.
AGAINST = "compiled from --against"


def corpus_batches(docs: int) -> list[list[int]]:
    """The sequence lengths of each batch fastbert.embed forms from the corpus, longest first."""
    from transformers import AutoTokenizer

    texts = embed_bench.corpus(docs)
    tokenizer = AutoTokenizer.from_pretrained(str(embed_bench.model_folder("minilm")))
    ids = tokenizer(texts, truncation=True, max_length=256)["input_ids"]
    lengths = [len(row) for row in ids]
    return [
        sorted((lengths[i] for i in batch), reverse=True)
        for batch in token_batches(lengths, BATCH_TOKENS, packed=True)
    ]


def inputs(lengths: list[int], head_dim: int, dtype: torch.dtype, seed: int):
    """q, k, v [T, H, D] views of one fused buffer in ``dtype`` (q scaled by 2, for attention
    of realistic sharpness) and cu_seqlens."""
    g = torch.Generator().manual_seed(seed)
    fused = torch.randn(sum(lengths), 3, HEADS, head_dim, generator=g)
    fused[:, 0] *= 2.0
    fused = fused.to(dtype)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return fused[:, 0], fused[:, 1], fused[:, 2], cu


def compiled_path(q, k, v, cu) -> torch.Tensor:
    return cpu_attention.attention_varlen(q, k, v, cu)


def torch_path(q, k, v, cu) -> torch.Tensor:
    return T.attention_by_length(q, k, v, cu, None, 0.0, None, None, None)


def untiled_path(q, k, v, cu) -> torch.Tensor:
    with cpu_attention.tiles_turned_off():
        return cpu_attention.attention_varlen(q, k, v, cu)


def against_path(source: Path):
    """The compiled path with the kernel built from ``source``."""

    def path(q, k, v, cu) -> torch.Tensor:
        with cpu_attention.built_from(source):
            return cpu_attention.attention_varlen(q, k, v, cu)

    return path


def tiled(dtype: torch.dtype) -> bool:
    """Whether the kernel runs ``dtype`` on AMX's tiles here (then timed with them off too)."""
    return dtype == torch.bfloat16 and cpu_attention.tiles()


def best_seconds(paths, args, rounds: int) -> list[float]:
    best = [float("inf")] * len(paths)
    for path in paths:
        path(*args)
    for _ in range(rounds):
        for i, path in enumerate(paths):
            start = time.perf_counter()
            path(*args)
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.double() - expected).norm() / expected.norm())


def measure(
    batches: list[list[int]],
    dtype: torch.dtype,
    head_dim: int,
    rounds: int,
    against: Path | None = None,
) -> list[dict]:
    rows = []
    optional = {"untiled": untiled_path if tiled(dtype) else None}
    optional["against"] = against_path(against) if against is not None else None
    optional = {name: path for name, path in optional.items() if path is not None}
    for index, lengths in enumerate(batches):
        q, k, v, cu = inputs(lengths, head_dim, dtype, seed=index)
        paths = (compiled_path, torch_path, *optional.values())
        compiled_s, torch_s, *optional_s = best_seconds(paths, (q, k, v, cu), rounds)
        expected = R.attention_varlen(q.double(), k.double(), v.double(), cu, max(lengths))
        extra = {}
        for (name, path), seconds in zip(optional.items(), optional_s):
            extra[f"{name}_ms"] = seconds * 1e3
            extra[f"{name}_error"] = relative_error(path(q, k, v, cu), expected)
        rows.append(
            {
                **extra,
                "dtype": str(dtype).removeprefix("torch."),
                "head_dim": head_dim,
                "sequences": len(lengths),
                "tokens": sum(lengths),
                "longest": max(lengths),
                "shortest": min(lengths),
                "compiled_ms": compiled_s * 1e3,
                "torch_ms": torch_s * 1e3,
                "compiled_error": relative_error(compiled_path(q, k, v, cu), expected),
                "torch_error": relative_error(torch_path(q, k, v, cu), expected),
            }
        )
        print(
            f"{dtype} D={head_dim} batch {index}: {len(lengths)} x {min(lengths)}-{max(lengths)} "
            f"compiled {compiled_s * 1e3:.2f} ms, torch {torch_s * 1e3:.2f} ms",
            flush=True,
        )
    return rows


def time_corpus(precision: str, docs: int, rounds: int, against: Path | None = None) -> dict:
    """``model.embed`` of ``docs`` corpus paragraphs with the kernel on and off in turn (and
    built from ``against``, where given)."""
    import fastbert

    texts = embed_bench.corpus(docs)
    folder = str(embed_bench.model_folder("minilm"))
    model = fastbert.load(folder, device="cpu", **reporting.PRECISIONS[precision])
    model.embed(texts[:200])
    seconds: dict[str, list[float]] = {"compiled": [], "torch": []}
    if tiled(torch.bfloat16) and precision == "bfloat16":
        seconds["compiled, no tiles"] = []
    switches = {
        "torch": cpu_attention.turned_off,
        "compiled, no tiles": cpu_attention.tiles_turned_off,
    }
    if against is not None:
        seconds[AGAINST] = []
        switches[AGAINST] = lambda: cpu_attention.built_from(against)
    vectors = {}
    for _ in range(rounds):
        for name in seconds:
            with switches.get(name, contextlib.nullcontext)():
                start = time.perf_counter()
                vectors[name] = np.asarray(model.embed(texts), dtype=np.float64)
                seconds[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(times) for name, times in seconds.items()}
    a, b = vectors["compiled"], vectors["torch"]
    cosine = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    print(f"{precision}: " + ", ".join(f"{name} {s:.2f} s" for name, s in medians.items()))
    return {
        "precision": precision,
        "seconds": seconds,
        "median_s": medians,
        "speed_up": medians["torch"] / medians["compiled"],
        "tiles_speed_up": (
            medians["compiled, no tiles"] / medians["compiled"]
            if "compiled, no tiles" in medians
            else None
        ),
        "against_ratio": medians[AGAINST] / medians["compiled"] if AGAINST in medians else None,
        "rounds_faster": sum(c < t for c, t in zip(seconds["compiled"], seconds["torch"])),
        "least_cosine": float(cosine.min()),
    }


def markdown(report: dict) -> str:
    env = report["environment"]
    against = report.get("against")
    lines = [
        "# Compiled CPU attention against the torch backend's, on the corpus's batches",
        "",
        f"{report['docs']} paragraphs of the corpus benchmark, {report['tokens']:,} tokens in "
        f"{report['batches']} length-sorted batches of at most {BATCH_TOKENS} tokens; H = {HEADS}; "
        f"random q, k, v; one attention per batch; best of {report['rounds']} rounds "
        "per batch, the two paths in turn; wall time.",
        reporting.cpu_line(env)
        + f" Kernel: the {report['build']} build, {report['kernel']}."
        + (
            f" --against: the kernel built from {against} (sha256 {report['against_sha256']})."
            if against
            else ""
        ),
        "",
        "| dtype | D | batches' longest | batches | compiled ms | torch ms | torch / compiled "
        "| compiled error | torch error | no tiles ms | no tiles / compiled |"
        + (" --against ms | --against / compiled | --against error |" if against else ""),
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"
        + ("---:|---:|---:|" if against else ""),
    ]
    cases = sorted({(r["dtype"], r["head_dim"]) for r in report["rows"]})
    for dtype, head_dim in cases:
        rows = [r for r in report["rows"] if (r["dtype"], r["head_dim"]) == (dtype, head_dim)]
        groups = [("<= 32", 0, 32), ("33-64", 33, 64), ("65-128", 65, 128), ("> 128", 129, 1 << 30)]
        for label, low, high in [*groups, ("all", 0, 1 << 30)]:
            chosen = [r for r in rows if low <= r["longest"] <= high]
            if not chosen:
                continue
            compiled = sum(r["compiled_ms"] for r in chosen)
            torch_ms = sum(r["torch_ms"] for r in chosen)
            untiled = "| |"  # the kernel has no tiles for this dtype here
            if all("untiled_ms" in r for r in chosen):
                untiled_ms = sum(r["untiled_ms"] for r in chosen)
                untiled = f"| {untiled_ms:.1f} | {untiled_ms / compiled:.2f}x |"
            if against:
                against_ms = sum(r["against_ms"] for r in chosen)
                worst = max(r["against_error"] for r in chosen)
                untiled += f" {against_ms:.1f} | {against_ms / compiled:.2f}x | {worst:.2e} |"
            lines.append(
                f"| {dtype} | {head_dim} | {label} | {len(chosen)} | {compiled:.1f} "
                f"| {torch_ms:.1f} "
                f"| {torch_ms / compiled:.2f}x | {max(r['compiled_error'] for r in chosen):.2e} "
                f"| {max(r['torch_error'] for r in chosen):.2e} {untiled}"
            )
    if report["corpus"]:
        lines += [
            "",
            f"End to end: `model.embed` of the {report['docs']} paragraphs with the packaged "
            "all-MiniLM-L6-v2, the kernel on and off in turn in one process, "
            f"{report['corpus_rounds']} rounds each, medians:",
            "",
            "| precision | compiled s | torch path s | speed-up | rounds compiled faster "
            "| least cosine between the two | compiled, no tiles s | tiles' speed-up |"
            + (" --against s | --against / compiled |" if against else ""),
            "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if against else ""),
        ]
        for row in report["corpus"]:
            untiled = row["median_s"].get("compiled, no tiles")
            tiles = "| |"
            if untiled is not None:
                tiles = f"| {untiled:.2f} | {row['tiles_speed_up']:.2f}x |"
            if against:
                tiles += f" {row['median_s'][AGAINST]:.2f} | {row['against_ratio']:.2f}x |"
            lines.append(
                f"| {row['precision']} | {row['median_s']['compiled']:.2f} "
                f"| {row['median_s']['torch']:.2f} | {row['speed_up']:.2f}x "
                f"| {row['rounds_faster']} of {report['corpus_rounds']} "
                f"| {row['least_cosine']:.6f} {tiles}"
            )
    lines += [
        "",
        "Errors: the largest relative RMS error of a batch against float64. The torch path: one "
        "SDPA call (PyTorch's flash kernel) or float32 math-path pass per run of equal-length "
        "sequences (cpu_engine_attention.attention_by_length), what the torch backend runs "
        "where the compiled kernel is not built.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser("cpu_attention_kernel", __doc__.splitlines()[0], 2608, 5)
    parser.add_argument("--head-dims", type=int, nargs="+", default=[32, 64], choices=[32, 64])
    parser.add_argument(
        "--dtypes",
        nargs="+",
        choices=list(DTYPES),
        help="precisions (default: those the build runs)",
    )
    parser.add_argument(
        "--corpus-rounds", type=int, default=3, help="end-to-end rounds per path (0: skip)"
    )
    parser.add_argument(
        "--corpus-precisions",
        nargs="+",
        choices=list(reporting.PRECISIONS),
        help="(default: every one whose attention the build runs)",
    )
    parser.add_argument(
        "--build",
        choices=list(cpu_attention.BUILDS),
        help="the kernel's build to run (default: the one this CPU takes)",
    )
    parser.add_argument(
        "--against",
        type=Path,
        help="another version of fastbert/kernels/cpu_attention.cpp, timed in turn with the others",
    )
    args = parser.parse_args(argv)
    if args.docs < 1 or args.rounds < 1 or args.corpus_rounds < 0:
        parser.error("--docs and --rounds must be at least 1, --corpus-rounds at least 0")
    if args.against is not None and not args.against.is_file():
        parser.error(f"--against {args.against}: no such file")
    build = args.build or cpu_attention.chosen()
    with cpu_attention.taken(build):
        return run(parser, args, build)


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, build: str) -> int:
    if not cpu_attention.available():
        parser.exit(1, f"the compiled kernel does not run here: {cpu_attention.status()}\n")
    runs = [name for name, dtype in DTYPES.items() if dtype in cpu_attention.dtypes()]
    if args.dtypes is None:
        args.dtypes = runs
    elif set(args.dtypes) - set(runs):
        parser.error(f"--dtypes: the {build} build runs {', '.join(runs)} only")
    if args.corpus_precisions is None:  # int8's attention runs in float32
        args.corpus_precisions = [p for p in reporting.PRECISIONS if p in runs or p == "int8"]
    if args.against is not None:
        try:
            with cpu_attention.built_from(args.against):
                pass
        except RuntimeError as error:
            parser.exit(1, f"{error}\n")
    batches = corpus_batches(args.docs)
    rows = [
        row
        for name in args.dtypes
        for d in args.head_dims
        for row in measure(batches, DTYPES[name], d, args.rounds, args.against)
    ]
    corpus = []
    if args.corpus_rounds:
        corpus = [
            time_corpus(p, args.docs, args.corpus_rounds, args.against)
            for p in args.corpus_precisions
        ]
    report = {
        "against": None if args.against is None else str(args.against),
        "against_sha256": None
        if args.against is None
        else hashlib.sha256(args.against.read_bytes()).hexdigest()[:12],
        "docs": args.docs,
        "corpus_rounds": args.corpus_rounds,
        "corpus": corpus,
        "tokens": sum(map(sum, batches)),
        "batches": len(batches),
        "rounds": args.rounds,
        "threads": torch.get_num_threads(),
        "build": build,
        "kernel": cpu_attention.status(),
        "environment": environment.capture(),
        "rows": rows,
    }
    reporting.write_report(args.out, "attention", report, markdown(report), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
