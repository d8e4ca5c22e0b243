"""Every config of fastbert's linear kernel on the four projections of a BERT layer, timed.

    python -m benchmarks.gemm_configs --out DIR             # a CUDA GPU: BERT-base, 32 x 128
    python -m benchmarks.gemm_configs --out DIR --tokens 64 --hidden 32 --intermediate 64

For each projection of the layer (QKV: hidden -> 3 x hidden + bias; attention output: hidden
-> hidden + bias; FFN1: hidden -> intermediate + bias + GELU; FFN2: intermediate -> hidden +
bias) at M = --tokens rows, every config the autotuner keeps for that launch (on sm_90 both
the one-tile-per-program and the persistent TMA configs) is pinned in turn
(FASTBERT_AUTOTUNE=i) and timed: CUDA events on a GPU, the wall clock on a CPU (the Triton
interpreter: a check that the command works, its times say nothing of a GPU). Then the
autotuner's own choice is recorded. Results are written after each projection, so an
interrupted run keeps what it measured: results.json (with the environment) and results.md
(per projection and config: median ms, p20 / p80, TFLOP/s, the autotuner's choice marked).

These are the measured counterparts of the static report's modelled GEMM figures
(benchmarks/results/static-sm90.md, ``python -m tests.sass_report``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from fastbert import kernels as K
from fastbert.bench import environment, timing
from fastbert.bench.progress import Progress
from fastbert.kernels import fused_linear, linear_configs
from fastbert.kernels.launch import AUTOTUNE_ENV

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@dataclass(frozen=True)
class Projection:
    """One linear layer of the encoder layer: [tokens, k] -> [tokens, n]."""

    name: str
    n: int
    k: int
    activation: str | None


def projections(hidden: int, intermediate: int) -> list[Projection]:
    return [
        Projection("QKV projection", 3 * hidden, hidden, None),
        Projection("attention output", hidden, hidden, None),
        Projection("FFN1 + GELU", intermediate, hidden, "gelu"),
        Projection("FFN2", hidden, intermediate, None),
    ]


def operands(p: Projection, tokens: int, dtype: torch.dtype, device: torch.device):
    """Seeded x [tokens, k], weight [n, k] (scaled as nn.Linear's init), bias [n]."""
    generator = torch.Generator().manual_seed(0)
    draw = lambda *shape, scale=1.0: (torch.randn(shape, generator=generator) * scale).to(
        device=device, dtype=dtype
    )
    return draw(tokens, p.k), draw(p.n, p.k, scale=p.k**-0.5), draw(p.n, scale=0.1)


def measure(
    p: Projection, tokens: int, dtype: torch.dtype, device: torch.device, warmup: int, reps: int
) -> dict:
    """Time every kept config of ``p`` pinned in turn, then the autotuner's choice."""
    x, weight, bias = operands(p, tokens, dtype, device)
    kernel = fused_linear._linear_fwd_kernel
    run = lambda: K.linear(x, weight, bias, p.activation)
    flops = 2.0 * tokens * p.n * p.k
    rows = []
    pinned_before = os.environ.get(AUTOTUNE_ENV)
    try:
        for index, config in enumerate(fused_linear.kept_configs(x, weight, p.activation)):
            os.environ[AUTOTUNE_ENV] = str(index)
            kernel.cache.clear()
            result = timing.time_fn(run, device, warmup, reps)
            rows.append(
                {
                    "config": linear_configs.config_name(config),
                    **result.to_dict(),
                    "tflops": flops / (result.median_ms * 1e-3) / 1e12,
                }
            )
        os.environ[AUTOTUNE_ENV] = "all"
        kernel.cache.clear()
        run()
        chosen = linear_configs.config_name(kernel.best_config)
    finally:
        kernel.cache.clear()
        if pinned_before is None:
            os.environ.pop(AUTOTUNE_ENV, None)
        else:
            os.environ[AUTOTUNE_ENV] = pinned_before
    shape = {"m": tokens, "n": p.n, "k": p.k, "activation": p.activation}
    return {"projection": p.name, **shape, "configs": rows, "autotuner_choice": chosen}


def markdown(results: list[dict], header: str) -> str:
    lines = [header, ""]
    for r in results:
        gemm = f"{r['m']}x{r['n']}x{r['k']}" + (f" + {r['activation']}" if r["activation"] else "")
        lines += [
            f"## {r['projection']} {gemm}",
            "",
            "| config | median ms | p20 ms | p80 ms | TFLOP/s | autotuner's choice |",
            "|---|---|---|---|---|---|",
        ]
        for c in sorted(r["configs"], key=lambda c: c["median_ms"]):
            mark = "yes" if c["config"] == r["autotuner_choice"] else ""
            lines.append(
                f"| {c['config']} | {c['median_ms']:.4f} | {c['p20_ms']:.4f} | "
                f"{c['p80_ms']:.4f} | {c['tflops']:.1f} | {mark} |"
            )
        lines.append("")
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gemm_configs",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for results.json/.md")
    parser.add_argument("--tokens", type=int, default=32 * 128, help="rows M (default 4096)")
    parser.add_argument("--hidden", type=int, default=768, help="hidden size (default 768)")
    parser.add_argument("--intermediate", type=int, default=3072, help="FFN size (default 3072)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls per config")
    parser.add_argument("--reps", type=int, default=50, help="timed calls per config")
    args = parser.parse_args(argv)
    for name in ("tokens", "hidden", "intermediate", "reps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        print(
            "no CUDA GPU: set TRITON_INTERPRET=1 to run the kernels under the Triton "
            "interpreter (a check of the command, not a measurement)",
            file=sys.stderr,
        )
        return 2
    dtype = DTYPES[args.dtype]
    args.out.mkdir(parents=True, exist_ok=True)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "Triton interpreter"
    header = (
        f"# Linear kernel configs, {args.dtype}, M = {args.tokens}, hidden {args.hidden}, "
        f"intermediate {args.intermediate} ({where})"
    )
    results = []
    layer = projections(args.hidden, args.intermediate)
    bar = Progress(len(layer), "projections")
    for p in layer:
        bar.step(p.name)
        results.append(measure(p, args.tokens, dtype, device, args.warmup, args.reps))
        bar.advance()
        document = {"environment": environment.capture(), "dtype": args.dtype, "results": results}
        (args.out / "results.json").write_text(json.dumps(document, indent=1) + "\n")
        (args.out / "results.md").write_text(markdown(results, header) + "\n")
    for r in results:
        best = min(r["configs"], key=lambda c: c["median_ms"])
        print(
            f"{r['projection']}: fastest {best['config']} {best['median_ms']:.4f} ms "
            f"({best['tflops']:.1f} TFLOP/s); autotuner chose {r['autotuner_choice']}"
        )
    print(f"wrote {args.out / 'results.json'} and {args.out / 'results.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
