"""Where one ``fastbert.embed`` pass spends its time on this CPU, in each precision.

    python -m benchmarks.pass_profile --out benchmarks/results/pass-profile-YYYY-MM-DD

The corpus and model are the corpus benchmark's (benchmarks/embed_bench.py: real English text
of mixed lengths, the packaged all-MiniLM-L6-v2 or ``--model``'s). The texts are tokenised once
(timed), then each precision's model embeds the token ids in the batches ``fastbert.embed``
forms, under PyTorch's profiler, ``--rounds`` times, the precisions in turn (a pass each a
round); the pass nearest the median wall time is reported. Where the compiled attention runs
(fastbert.kernels.cpu_attention), each precision also runs with it off (the per-length path)
and float32 with its AVX2 build (where this CPU runs another), and where it multiplies bfloat16
on AMX's tiles (fastbert.kernels.cpu_attention.tiles), bfloat16 with them off; bfloat16 with
the compiled LayerNorm off, with the compiled embeddings off, and with GELU as oneDNN's post-op
instead of by table (fastbert.kernels.cpu_gelu); and each precision with its batches budgeted
as the padded route budgets them (rows x longest row, as every batch was before the packed
path's budget counted tokens): each a row of its own, so that what each part gains is measured
in the same rounds. A pass's time is split into:

- linear: the products with their fused epilogues (oneDNN's linear, its quantised linear,
  ``torch._int_mm``, MKL), bfloat16's GELU by table after them, and the int8 linear's
  quantisation and dequantisation around them;
- attention: the compiled attention kernel (fastbert.kernels.cpu_attention), and the
  per-length path that runs where it does not (SDPA or the math path, with their masks and
  rotary positions);
- LayerNorm, and the residual adds before it (``aten::add``);
- embeddings: the lookups, their sum and LayerNorm (compiled, or PyTorch's ops);
- other PyTorch ops (pooling, packing, copies);
- outside PyTorch's ops: Python and the glue between the ops.

The linears' rate is their FLOPs (benchmarks/gemm_limit.py counts them) over their time,
stated against this CPU's GEMM limit measured in the same run, before and after the passes
(on a host whose speed wanders the two can differ, and the passes may have run in a spell of
either; the parts' shares of one pass hold regardless). A precision whose linears run near
the limit gains only from what lies outside them. Writes pass-profile.json and
pass-profile.md into --out.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from benchmarks import embed_bench, gemm_limit, reporting

# Profiler event names by part of the pass: each outermost event counts with the time of the
# ops it calls (an event not named here is "other ops").
PARTS = {
    "mkldnn::_linear_pointwise": "linear",
    "onednn::qlinear_pointwise": "linear",
    "aten::linear": "linear",
    "aten::addmm": "linear",
    "aten::mm": "linear",
    "aten::_int_mm": "linear",
    "fastbert::int8_linear": "linear",
    "fastbert::cpu_attention": "attention",
    "fastbert::attention_by_length": "attention",
    "fastbert::cpu_layer_norm": "LayerNorm",
    "fastbert::gelu_table": "linear",
    "aten::scaled_dot_product_attention": "attention",
    "aten::layer_norm": "LayerNorm",
    "aten::native_layer_norm": "LayerNorm",
    "aten::add": "residual add",
    "fastbert::cpu_embeddings": "embeddings",
    "fastbert::embeddings_by_ops": "embeddings",
}
ORDER = (
    "linear",
    "attention",
    "LayerNorm",
    "residual add",
    "embeddings",
    "other ops",
    "outside ops",
)
MODEL_HELP = "the corpus benchmark's model (benchmarks/embed_bench.py's --model)"
# The row of bfloat16 with the compiled attention's AMX tiles off (where it has them).
UNTILED = "bfloat16, attention without AMX tiles"
# The row of bfloat16 with the residual adds and LayerNorms on PyTorch's ops (where the CPU
# engine's compiled LayerNorm runs).
NORM_UNCOMPILED = "bfloat16, LayerNorm on PyTorch's ops"
# The row of bfloat16 with the embeddings' lookups, sum and LayerNorm on PyTorch's ops.
EMBEDDINGS_UNCOMPILED = "bfloat16, embeddings on PyTorch's ops"
# The row of bfloat16 with GELU as oneDNN's post-op (where GELU by table runs).
GELU_POST_OP = "bfloat16, GELU as oneDNN's post-op"
# A precision's row with the compiled attention off (where it runs): the per-length path.
ATTENTION_UNCOMPILED = "{}, attention on the per-length path"
# float32's row with the compiled attention's AVX2 build (where this CPU runs another).
ATTENTION_AVX2 = "float32, attention on its AVX2 build"
# A precision's row with its batches budgeted as rows x longest row (the padded route's).
PADDED_BUDGET = "{}, batches budgeted as rows x longest row"
# int8's rows with the products of a CPU without int8 dot products: the byte multiply-adds of
# AVX2 (with the compiled attention's AVX2 build, as an AVX2-only CPU runs them) and of
# AVX-512 (where they are not int8's own product here), and the float32 GEMMs.
INT8_BYTES = "int8, product on {}'s byte multiply-adds"
INT8_FLOAT32 = "int8, product as float32 GEMMs"


@contextlib.contextmanager
def padded_budget() -> Iterator[None]:
    """Within the block, the embedding loop cuts batches as it does for the padded route
    (rows x longest row within the budget) though the model runs them packed."""
    from fastbert.embedding import run

    original = run.token_batches
    run.token_batches = lambda lengths, budget, packed=False: original(lengths, budget)
    try:
        yield
    finally:
        run.token_batches = original


@contextlib.contextmanager
def labelled_compiled_kernels() -> Iterator[None]:
    """The compiled C++ kernels (called through ctypes, unseen by the profiler) run inside
    profiler ranges named for them, for the duration of the block: the attention kernel, the
    LayerNorm with its residual add, the embeddings (and their plain op), GELU by table, and
    the whole int8 linear (its compiled
    quantisation and dequantisation around the product); so does the per-length attention
    path, whose several ops (and Python between them) are attention's."""
    from fastbert.kernels import (
        cpu_attention,
        cpu_engine_attention,
        cpu_gelu,
        cpu_layer_norm,
        torch_ops,
    )

    wrapped = [
        (cpu_attention, "attention_sequences", "fastbert::cpu_attention"),
        (cpu_engine_attention, "attention_by_length", "fastbert::attention_by_length"),
        (cpu_layer_norm, "layer_norm", "fastbert::cpu_layer_norm"),
        (cpu_layer_norm, "embeddings_layer_norm", "fastbert::cpu_embeddings"),
        (torch_ops, "embeddings_layer_norm_unchecked", "fastbert::embeddings_by_ops"),
        (cpu_gelu, "gelu_", "fastbert::gelu_table"),
        (torch_ops, "linear_quantized_unchecked", "fastbert::int8_linear"),
    ]
    originals = [getattr(module, name) for module, name, _ in wrapped]

    def labelled(function, label):
        def run(*args, **kwargs):
            with torch.profiler.record_function(label):
                return function(*args, **kwargs)

        return run

    for (module, name, label), original in zip(wrapped, originals, strict=True):
        setattr(module, name, labelled(original, label))
    try:
        yield
    finally:
        for (module, name, _), original in zip(wrapped, originals, strict=True):
            setattr(module, name, original)


def split(events, wall: float) -> dict[str, float]:
    """Seconds of one profiled pass per part (ORDER): each outermost profiler event's total
    time (its own and its callees') under its name's part; ``wall``: the pass's seconds, the
    rest of which is "outside ops"."""
    seconds: dict[str, float] = collections.Counter()
    for event in events:
        if event.cpu_parent is None:
            seconds[PARTS.get(event.name, "other ops")] += event.cpu_time_total / 1e6
    seconds["outside ops"] = max(0.0, wall - sum(seconds.values()))
    return {part: seconds.get(part, 0.0) for part in ORDER}


def profiled_pass(job, tokens: list[list[int]]) -> tuple[float, dict[str, float]]:
    """(wall seconds, seconds per part) of one pass embedding ``tokens`` in
    ``fastbert.embed``'s batches, under the profiler."""
    from fastbert.embedding.run import embed_sorted

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        start = time.perf_counter()
        for _ in embed_sorted(job.encoder, tokens, job.options.batch_tokens):
            pass
        wall = time.perf_counter() - start
    return wall, split(profile.events(), wall)


def rows_to_run(jobs: dict) -> dict[str, tuple[str, Any, Callable]]:
    """Row name -> (precision, job, the switch it runs under): each precision's job, each
    precision with the compiled attention turned off, float32 with its AVX2 build, and
    bfloat16 with each of the CPU engine's other compiled parts that runs here turned off in
    turn (the attention's AMX tiles, the compiled LayerNorm, the compiled embeddings, GELU by
    table); int8 with the products of a CPU without int8 dot products (each build of the byte
    product that runs here and is not int8's own product, AVX2's with the attention's AVX2
    build, the float32 GEMMs); then each precision with the padded route's batch budget."""
    from fastbert.kernels import cpu_attention, cpu_gelu, cpu_int8_product, cpu_layer_norm

    rows = {precision: (precision, job, contextlib.nullcontext) for precision, job in jobs.items()}
    if cpu_attention.available():
        for precision, job in jobs.items():
            name = ATTENTION_UNCOMPILED.format(precision)
            rows[name] = (precision, job, cpu_attention.turned_off)
    attention_avx2 = functools.partial(cpu_attention.taken, "avx2")
    if "float32" in jobs and cpu_attention.running() != "avx2" and runs(attention_avx2):
        rows[ATTENTION_AVX2] = ("float32", jobs["float32"], attention_avx2)
    if "bfloat16" in jobs and cpu_attention.tiles():
        rows[UNTILED] = ("bfloat16", jobs["bfloat16"], cpu_attention.tiles_turned_off)
    if "bfloat16" in jobs and cpu_layer_norm.available():
        for name, op in (
            (NORM_UNCOMPILED, "layer_norm"),
            (EMBEDDINGS_UNCOMPILED, "embeddings_layer_norm"),
        ):
            switch = functools.partial(cpu_layer_norm.op_turned_off, op)
            rows[name] = ("bfloat16", jobs["bfloat16"], switch)
    if "bfloat16" in jobs and cpu_gelu.available():
        rows[GELU_POST_OP] = ("bfloat16", jobs["bfloat16"], cpu_gelu.turned_off)
    builds = [
        b for b in cpu_int8_product.BUILDS if "int8" in jobs and cpu_int8_product.available(b)
    ]
    if builds:
        for build in builds:
            if build != cpu_int8_product.chosen():
                name = INT8_BYTES.format(cpu_int8_product.REGISTERS[build])
                switch = functools.partial(cpu_int8_product.taken, build)
                if build == "avx2":
                    switch = functools.partial(both, switch, attention_avx2)
                rows[name] = ("int8", jobs["int8"], switch)
        float32 = functools.partial(cpu_int8_product.taken, "float32")
        rows[INT8_FLOAT32] = ("int8", jobs["int8"], float32)
    for precision, job in jobs.items():
        rows[PADDED_BUDGET.format(precision)] = (precision, job, padded_budget)
    return rows


def runs(switch: Callable) -> bool:
    """Whether the compiled attention runs under ``switch``."""
    from fastbert.kernels import cpu_attention

    with switch():
        return cpu_attention.available()


@contextlib.contextmanager
def both(first: Callable, second: Callable) -> Iterator[None]:
    with first(), second():
        yield


def profile_rows(rows: dict, tokens: list[list[int]], rounds: int) -> dict[str, tuple]:
    """Row name -> (wall seconds, seconds per part) of its pass nearest the median of
    ``rounds``; the rows take turns, a pass each a round, so that a slow spell of the machine
    hits them alike."""
    passes: dict[str, list] = {name: [] for name in rows}
    with torch.inference_mode(), labelled_compiled_kernels():
        for _, job, switch in rows.values():
            with switch():
                profiled_pass(job, tokens)  # warm-up: compiled kernels, packed weights
        for _ in range(rounds):
            for name, (_, job, switch) in rows.items():
                with switch():
                    passes[name].append(profiled_pass(job, tokens))
    return {name: sorted(runs)[(len(runs) - 1) // 2] for name, runs in passes.items()}


def markdown(report: dict) -> str:
    before, after = report["gemm_limit_runs"]
    shape = before["shape"]
    rows = []
    for name, row in report["results"].items():
        parts = [f"{row['parts'][p]:.3f} ({row['parts'][p] / row['wall_s']:.0%})" for p in ORDER]
        shares = ", ".join(f"{share:.0%}" for share in row["linear_share_of_limit"])
        rows.append(
            [name, f"{row['wall_s']:.3f}", f"{row['tokens_per_s']:,.0f}", *parts]
            + [f"{row['linear_gflops']:.0f}", shares]
        )
    columns = ["row", "pass s", "tokens/s", *(f"{p} s (share)" for p in ORDER)]
    columns += ["linears GFLOP/s", "linears / limit (before, after)"]
    limits = ", ".join(
        f"{p} {before[p]['gflops']:.0f} / {after[p]['gflops']:.0f}" for p in report["precisions"]
    )
    return "\n".join(
        [
            f"# Where a fastbert.embed pass spends its time, CPU: {report['docs']} docs, "
            f"{report['tokens']} tokens",
            "",
            f"{report['model']}, batches of at most {report['batch_tokens']} tokens; in each "
            f"row the pass nearest the median of {report['rounds']} profiled passes, the rows "
            "in turn. "
            f"Tokenising the texts (once, not in the passes): {report['tokenise_s']:.3f} s.",
            "",
            *reporting.table(columns, "l" + "r" * (len(columns) - 1), rows),
            "",
            f"GEMM limit (benchmarks/gemm_limit.py, [{shape[0]}, {shape[1]}] x [{shape[1]}, "
            f"{shape[2]}]) before / after the passes, GFLOP/s: {limits}.",
            "",
            reporting.cpu_line(report["environment"]),
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = reporting.parser("pass_profile", __doc__.split("\n\n")[0], docs=1000, rounds=3)
    reporting.add_precisions(parser, list(reporting.PRECISIONS), ",".join(reporting.PRECISIONS))
    parser.add_argument(
        "--gemm-seconds", type=float, default=1.0, help="seconds per precision of the GEMM limit"
    )
    parser.add_argument(
        "--model", choices=sorted(embed_bench.MODELS), default="minilm", help=MODEL_HELP
    )
    args = parser.parse_args(argv)
    precisions = args.precisions
    if args.rounds < 1 or args.docs < 1:
        parser.error("--rounds and --docs: at least 1")

    import dataclasses

    from fastbert.bench import environment
    from fastbert.embedding.loading import load_options
    from fastbert.embedding.model import read_config
    from fastbert.embedding.options import EmbedOptions

    texts = embed_bench.corpus(args.docs)
    folder = embed_bench.model_folder(args.model)
    config = read_config(folder)
    if "int8" in precisions and config.glu:
        parser.error(f"--model {args.model}: a gated FFN has no int8 linears; leave out int8")
    options = EmbedOptions(model=str(folder), device="cpu", progress=False)
    jobs = {
        p: load_options(dataclasses.replace(options, **reporting.PRECISIONS[p])).job(False)
        for p in precisions
    }
    first = jobs[precisions[0]]
    start = time.perf_counter()
    tokens, _ = first.tokenise(texts)
    tokenise_s = time.perf_counter() - start
    count = sum(len(t) for t in tokens)

    def limit() -> dict:
        return gemm_limit.measure(
            config.hidden_size,
            config.intermediate_size,
            config.num_hidden_layers,
            precisions=tuple(precisions),
            seconds=args.gemm_seconds,
            glu=config.glu,
        )

    limit_runs = [limit()]
    rows = rows_to_run(jobs)
    print(f"{', '.join(rows)}: {args.rounds} profiled passes each, in turn", file=sys.stderr)
    results = {}
    for name, (wall, parts) in profile_rows(rows, tokens, args.rounds).items():
        linear_flops = count * limit_runs[0]["flops_per_token"]
        results[name] = {"precision": rows[name][0], "wall_s": wall, "parts": parts}
        results[name]["tokens_per_s"] = count / wall
        results[name]["linear_gflops"] = linear_flops / max(parts["linear"], 1e-9) / 1e9
    limit_runs.append(limit())
    for row in results.values():
        row["linear_share_of_limit"] = [
            row["linear_gflops"] / run[row["precision"]]["gflops"] for run in limit_runs
        ]
    report = {
        "model": embed_bench.MODELS[args.model][0]
        + (" (packaged)" if args.model != "modernbert-base" else ""),
        "docs": len(texts),
        "tokens": count,
        "batch_tokens": first.options.batch_tokens,
        "rounds": args.rounds,
        "tokenise_s": tokenise_s,
        "precisions": precisions,
        "gemm_limit": limit_runs[0],
        "gemm_limit_runs": limit_runs,
        "results": results,
        "environment": environment.capture(),
    }
    text = markdown(report)
    reporting.write_report(args.out, "pass-profile", report, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
