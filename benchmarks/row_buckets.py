"""``fastbert.embed`` with and without row buckets on this CPU, on batches of new sizes.

    python -m benchmarks.row_buckets --out benchmarks/results/row-buckets-YYYY-MM-DD

oneDNN makes a primitive for each linear and row count it meets; on a CPU with AMX a bfloat16
one took longer to make than to run. fastbert therefore pads a bfloat16 padding-free call's
rows to a size bucket (fastbert.execution.runtime, "Row buckets on a CPU"), so that a few
dozen row counts cover every batch. A benchmark that embeds the same texts again and again
meets each batch's size once and then finds its primitives made; a job over a large corpus
meets new sizes batch after batch. So here each pass embeds the corpus benchmark's texts
(benchmarks/embed_bench.py, the packaged all-MiniLM-L6-v2) cut by one more leading word each
than any pass before it, whose batches are, for the most part, sizes the process has not met.

Rows, for each precision of ``--precisions``: "buckets" (bucketed; for a dtype fastbert does
not bucket, forced on, to measure what it would gain) and "no buckets", taking turns a pass
each a round. The per-shape caches are sized as fastbert's command line sizes them (set before
torch loads; fastbert.execution.cpu_memory), and the report says the sizes in effect. Reported:
each row's median pass, its spread, tokens/s, and the median of the rounds' ratios of the two
rows' tokens/s (the rows' passes are cut differently, so their token counts differ a little).
Writes row-buckets.json and row-buckets.md into --out.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time

from benchmarks import reporting
from fastbert.execution import cpu_tuning

ROWS = ("buckets", "no buckets")
TEXTS_HELP = (
    "new: each pass on texts cut anew (batch sizes the process has not met); same: every pass "
    "on the same texts (sizes met before, their primitives made)"
)


def cut(texts: list[str], words: int) -> list[str]:
    """Each text without its first ``words`` words (a text that short is kept whole)."""
    return [" ".join(t.split(" ")[words:]) or t for t in texts]


@contextlib.contextmanager
def bucketing(dtype, on: bool):
    """Within the block, padding-free CPU calls in ``dtype`` are bucketed (``on``) or not."""
    from fastbert.execution import runtime

    before = runtime.CPU_BUCKETED_DTYPES
    others = tuple(d for d in before if d != dtype)
    runtime.CPU_BUCKETED_DTYPES = (*others, dtype) if on else others
    try:
        yield
    finally:
        runtime.CPU_BUCKETED_DTYPES = before


def run_rounds(
    jobs: dict, texts: list[str], rounds: int, same_texts: bool = False
) -> dict[str, dict[str, list]]:
    """Precision -> row -> the (seconds, tokens) of each of its passes, every pass on texts
    cut by a number of words no pass before it used (``same_texts``: every pass on the whole
    texts, after an untimed pass of each row, so that the timed passes meet sizes they have
    met); the rows take turns."""
    import torch

    from fastbert.embedding.run import embed_sorted

    def timed_pass(job, row: str, words: int) -> tuple[float, int]:
        tokens, _ = job.tokenise(cut(texts, words))
        with bucketing(job.encoder.model.dtype, row == "buckets"):
            start = time.perf_counter()
            for _ in embed_sorted(job.encoder, tokens, job.options.batch_tokens):
                pass
            return time.perf_counter() - start, sum(len(t) for t in tokens)

    passes = {p: {row: [] for row in ROWS} for p in jobs}
    words = 0
    with torch.inference_mode():
        for job in jobs.values():
            for _ in embed_sorted(job.encoder, job.tokenise(texts[:16])[0], 512):
                pass  # compiled kernels, packed weights; batches far smaller than the passes'
            for row in ROWS if same_texts else ():
                timed_pass(job, row, 0)
        for _ in range(rounds):
            for precision, job in jobs.items():
                for row in ROWS:
                    words = 0 if same_texts else words + 1
                    passes[precision][row].append(timed_pass(job, row, words))
    return passes


def summary(passes: dict[str, dict[str, list]]) -> dict:
    """Each precision's rows: median seconds, min, max, median tokens/s; and the median over
    rounds of (buckets tokens/s) / (no buckets tokens/s)."""
    results = {}
    for precision, rows in passes.items():
        result = {}
        for row, runs in rows.items():
            seconds = [s for s, _ in runs]
            result[row] = {
                "seconds": seconds,
                "tokens": [n for _, n in runs],
                "median_s": statistics.median(seconds),
                "min_s": min(seconds),
                "max_s": max(seconds),
                "tokens_per_s": statistics.median(n / s for s, n in runs),
            }
        ratios = [
            (n_on / on) / (n_off / off)
            for (on, n_on), (off, n_off) in zip(rows["buckets"], rows["no buckets"], strict=True)
        ]
        result["speed_up"] = statistics.median(ratios)
        results[precision] = result
    return results


def markdown(report: dict) -> str:
    rows = []
    for precision, result in report["results"].items():
        for row in ROWS:
            r = result[row]
            rows.append(
                [
                    precision,
                    row,
                    f"{r['median_s']:.3f}",
                    f"{r['min_s']:.3f}-{r['max_s']:.3f}",
                    f"{r['tokens_per_s']:,.0f}",
                    f"{result['speed_up']:.2f}x" if row == "buckets" else "",
                ]
            )
    columns = [
        "precision",
        "row",
        "pass s (median)",
        "min-max",
        "tokens/s",
        "buckets' rate / no buckets'",
    ]
    caches = ", ".join(f"{k}={v}" for k, v in report["caches"].items())
    bucketed = ", ".join(report["bucketed_dtypes"]) or "none"
    return "\n".join(
        [
            f"# Row buckets, CPU: {report['docs']} docs a pass, {report['rounds']} rounds",
            "",
            f"{report['model']}, batches of at most {report['batch_tokens']} tokens; "
            + (
                "every pass on the same texts, after an untimed pass of each row (batch sizes "
                "met before)"
                if report.get("texts") == "same"
                else "each pass's texts cut by one more leading word than any pass before it "
                "(new batch sizes)"
            )
            + f", the rows in turn. fastbert buckets here: {bucketed} (other rows forced on). "
            f"Per-shape caches: {caches}.",
            "",
            *reporting.table(columns, "llrrrr", rows),
            "",
            reporting.cpu_line(report["environment"]),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser("row_buckets", __doc__.split("\n\n")[0], docs=1000, rounds=5)
    reporting.add_precisions(parser, list(reporting.PRECISIONS), "bfloat16")
    parser.add_argument("--texts", choices=("new", "same"), default="new", help=TEXTS_HELP)
    args = parser.parse_args(argv)
    precisions = args.precisions
    if args.rounds < 1 or args.docs < 1:
        parser.error("--rounds and --docs: at least 1")

    cpu_tuning.apply_process_tuning()  # the command line's cache sizes, before torch loads
    import dataclasses

    from benchmarks import embed_bench
    from fastbert.bench import environment
    from fastbert.embedding.loading import load_options
    from fastbert.embedding.options import EmbedOptions
    from fastbert.execution import cpu_memory, runtime

    texts = embed_bench.corpus(args.docs)
    options = EmbedOptions(
        model=str(embed_bench.model_folder("minilm")), device="cpu", progress=False
    )
    jobs = {
        p: load_options(dataclasses.replace(options, **reporting.PRECISIONS[p])).job(False)
        for p in precisions
    }
    print(f"{', '.join(precisions)}: {args.rounds} rounds of both rows", file=sys.stderr)
    passes = run_rounds(jobs, texts, args.rounds, same_texts=args.texts == "same")
    report = {
        "model": "all-MiniLM-L6-v2 (packaged)",
        "docs": len(texts),
        "rounds": args.rounds,
        "texts": args.texts,
        "batch_tokens": next(iter(jobs.values())).options.batch_tokens,
        "bucketed_dtypes": [str(d).removeprefix("torch.") for d in runtime.CPU_BUCKETED_DTYPES],
        "caches": cpu_memory.cache_entries(),
        "results": summary(passes),
        "environment": environment.capture(),
    }
    reporting.write_report(args.out, "row-buckets", report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
