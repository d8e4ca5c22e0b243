"""What packed weights are worth on a CPU (fastbert.kernels.packed_weights): the torch
backend's linear on oneDNN-packed weights against the plain ones, shape by shape, and
``fastbert.embed`` on the corpus with ``packed_weights`` on and off, in turn.

    python -m benchmarks.packed_weights --out benchmarks/results/packed-weights-<date>
        [--docs 1000] [--rounds 5] [--dtypes float32,bfloat16] [--linear-seconds 1.5]

Linears: all-MiniLM-L6-v2's four shapes (QKV, attention output, FFN in, FFN out) at 16, 128,
600 and 3,700 rows, the two variants alternating call by call, the least time of each kept.
Corpus: the packaged all-MiniLM-L6-v2 loaded once per dtype (``fastbert.load``), warmed up,
then ``--rounds`` rounds each embedding ``--docs`` paragraphs of the corpus benchmark's text
(benchmarks/embed_bench.py) once plain and once packed, in the same process; the largest
difference between the two embeddings is reported (0 where they are the same bits). Writes
packed-weights.json (every timing, with the environment) and packed-weights.md. Speed is
measured here, never asserted in a test.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from benchmarks import reporting

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
# all-MiniLM-L6-v2's linears: (name, in features, out features).
SHAPES = (("qkv", 384, 1152), ("attn_out", 384, 384), ("ffn_in", 384, 1536), ("ffn_out", 1536, 384))
ROWS = (16, 128, 600, 3700)


def time_linears(dtype: torch.dtype, budget_s: float = 1.5) -> list[dict]:
    """Each shape and row count: the least seconds of the plain and the packed linear."""
    from fastbert.kernels import cpu_engine_linear
    from fastbert.kernels.packed_weights import PackedWeights

    rows_out = []
    generator = torch.Generator().manual_seed(0)
    for name, k, n in SHAPES:
        weight = torch.nn.Parameter((0.05 * torch.randn(n, k, generator=generator)).to(dtype))
        bias = torch.randn(n, generator=generator).to(dtype)
        for m in ROWS:
            x = torch.randn(m, k, generator=generator).to(dtype)
            variants = {"plain": None, "packed": PackedWeights()}
            best = {key: float("inf") for key in variants}
            with torch.no_grad():
                plain, packed = (
                    cpu_engine_linear.linear_unchecked(x, weight, bias, packs=packs)
                    for packs in variants.values()
                )
                same = torch.equal(plain, packed)
                deadline = time.perf_counter() + budget_s
                while time.perf_counter() < deadline:
                    for key, packs in variants.items():
                        start = time.perf_counter()
                        cpu_engine_linear.linear_unchecked(x, weight, bias, packs=packs)
                        best[key] = min(best[key], time.perf_counter() - start)
            rows_out.append(
                {"linear": name, "rows": m, "in": k, "out": n, "same_bits": same, **best}
            )
    return rows_out


def time_corpus(dtype: str, docs: int, rounds: int) -> dict:
    """``fastbert.embed`` of the corpus with packed_weights off and on, in turn."""
    import numpy as np

    import fastbert
    from benchmarks import embed_bench

    texts = embed_bench.corpus(docs)
    model = fastbert.load(str(embed_bench.model_folder("minilm")), device="cpu", dtype=dtype)
    bert = model.encoder.model
    outputs = {}
    times: dict[str, list[float]] = {"plain": [], "packed": []}
    for setting in times:  # warm-up
        bert.packed_weights = setting == "packed"
        model.embed(texts[: max(1, docs // 10)])
    for _ in range(rounds):
        for setting in times:
            bert.packed_weights = setting == "packed"
            start = time.perf_counter()
            outputs[setting] = model.embed(texts)
            times[setting].append(time.perf_counter() - start)
    difference = float(np.abs(outputs["plain"] - outputs["packed"]).max())
    return {"dtype": dtype, "docs": docs, "seconds": times, "max_abs_difference": difference}


def markdown(report: dict) -> str:
    env = report["environment"]
    lines = [
        "# Packed weights on a CPU: all-MiniLM-L6-v2",
        "",
        reporting.cpu_line(env),
        "",
        f"## fastbert.embed on {report['docs']} docs of the corpus, plain and packed in turn",
        "",
    ]
    corpus_rows = []
    for corpus in report["corpus"]:
        plain, packed = corpus["seconds"]["plain"], corpus["seconds"]["packed"]
        faster = sum(p < q for p, q in zip(packed, plain))
        plain_median, packed_median = statistics.median(plain), statistics.median(packed)
        corpus_rows.append(
            (
                corpus["dtype"],
                f"{plain_median:.2f}",
                f"{packed_median:.2f}",
                f"{plain_median / packed_median:.3f}x",
                f"{faster} of {len(plain)}",
                f"{corpus['max_abs_difference']:.1e}",
            )
        )
    corpus_columns = (
        "dtype",
        "plain median s",
        "packed median s",
        "speed-up (medians)",
        "rounds packed faster",
        "largest difference",
    )
    lines += reporting.table(corpus_columns, "lrrrrr", corpus_rows)
    lines += ["", "## One linear (least of alternating calls)", ""]
    linear_columns = ("dtype", "linear", "rows", "plain us", "packed us", "speed-up", "same bits")
    linear_rows = [
        (
            dtype,
            f"{r['linear']} [{r['in']} -> {r['out']}]",
            r["rows"],
            f"{r['plain'] * 1e6:,.0f}",
            f"{r['packed'] * 1e6:,.0f}",
            f"{r['plain'] / r['packed']:.2f}x",
            "yes" if r["same_bits"] else "no",
        )
        for dtype, rows in report["linears"].items()
        for r in rows
    ]
    lines += reporting.table(linear_columns, "llrrrrl", linear_rows)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser("packed_weights", __doc__.split("\n\n")[0], 1000, 5)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument(
        "--linear-seconds", type=float, default=1.5, help="time spent on each linear's shape"
    )
    args = parser.parse_args(argv)
    if args.docs < 1 or args.rounds < 1 or args.linear_seconds <= 0:
        parser.error("--docs and --rounds must be at least 1, --linear-seconds above 0")
    dtypes = [d for d in args.dtypes.split(",") if d]
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown or not dtypes:
        parser.error(f"--dtypes: {unknown or 'none'}; choose from {list(DTYPES)}")
    from fastbert.bench import environment
    from fastbert.kernels import packed_weights

    if not packed_weights.available():
        print("this PyTorch build has no oneDNN linear: nothing to measure", file=sys.stderr)
        return 1
    report = {
        "docs": args.docs,
        "rounds": args.rounds,
        "environment": environment.capture(),
        "linears": {},
        "corpus": [],
    }
    for dtype in dtypes:
        print(f"linears, {dtype} ...", file=sys.stderr, flush=True)
        report["linears"][dtype] = time_linears(DTYPES[dtype], args.linear_seconds)
    for dtype in dtypes:
        print(f"corpus, {dtype} ...", file=sys.stderr, flush=True)
        report["corpus"].append(time_corpus(dtype, args.docs, args.rounds))
    reporting.write_report(args.out, "packed-weights", report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
