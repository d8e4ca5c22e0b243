"""What the fused SPLADE head saves: peak memory and time of the sparse head on a batch,
sentence-transformers' unfused computation against the ``splade_max`` op.

    python -m benchmarks.splade_head --out benchmarks/results/splade-head-cpu-<date>
        [--sequences 32] [--length 128] [--hidden 768] [--vocab 30522] [--dtype float32]
        [--log-steps 1] [--rounds 3] [--device cpu]

The head's input is a batch of ``--sequences`` x ``--length`` token states (random, seeded)
and a decoder of BERT's shape ([vocab, hidden] weight and bias). Contenders:

- ``unfused``: what a sentence-transformers SparseEncoder runs: the decoder's logits of the
  padded batch ([B, S, V], the masked-LM head's last linear), then ``SpladePooling``
  (sentence-transformers' own module: the logits times the attention mask, relu, log1p, max
  over the sequence).
- ``torch``: ``splade_max``'s torch backend (fastbert.kernels.sparse_head_torch) on the packed
  rows: the vocabulary in chunks, never all the logits at once.
- ``triton``: the Triton kernel (``fastbert.kernels.splade_max``), on CUDA only.

Time: the contenders alternate call by call for ``--rounds`` rounds after a warm-up call each;
median and least seconds. Peak memory on a CPU: each contender in a fresh process of its own
(the same inputs), glibc told to serve every block above 128 KiB from its own mapping and to
return it when freed (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``) so that resident
memory follows the live tensors; after a warm-up call, the process's resident high-water mark
is reset (``/proc/self/clear_refs``) and the peak is how far one call raises it above the
resident memory before it (``VmHWM`` - ``VmRSS``). On CUDA: ``torch.cuda.max_memory_allocated``
above what was allocated before the call, and times from ``triton.testing.do_bench``. Each
contender's output is compared with the unfused one's (largest absolute difference). Writes
splade-head.json (every measurement, with the environment) and splade-head.md. Speed is
measured here, never asserted in a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks import reporting

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
ACTIVATIONS = {1: "relu", 2: "log1p_relu"}  # log_steps -> SpladePooling's activation_function
# glibc: blocks above this many bytes get a mapping of their own, returned when freed.
MALLOC_BYTES = "131072"
ROOT = Path(__file__).resolve().parent.parent


def contenders(device: str) -> tuple[str, ...]:
    return ("unfused", "torch", "triton") if device == "cuda" else ("unfused", "torch")


def make_inputs(args: argparse.Namespace) -> dict:
    """Seeded inputs: hidden [B, S, H], mask [B, S], weight [V, H], bias [V] on the device,
    and the packed view: x [T, H] and cu_seqlens int32 [B + 1]."""
    generator = torch.Generator().manual_seed(0)
    dtype, device = DTYPES[args.dtype], args.device
    shape = (args.sequences, args.length, args.hidden)
    hidden = torch.randn(shape, generator=generator).to(device, dtype)
    weight = torch.randn((args.vocab, args.hidden), generator=generator) * args.hidden**-0.5
    bias = torch.randn(args.vocab, generator=generator)
    lengths = torch.full((args.sequences,), args.length, dtype=torch.int32)
    cu_seqlens = torch.cat(
        [torch.zeros(1, dtype=torch.int32), lengths.cumsum(0, dtype=torch.int32)]
    )
    return {
        "hidden": hidden,
        "mask": torch.ones(args.sequences, args.length, dtype=torch.int64, device=device),
        "weight": weight.to(device, dtype),
        "bias": bias.to(device, dtype),
        "x": hidden.reshape(-1, args.hidden),
        "cu_seqlens": cu_seqlens.to(device),
    }


def head(name: str, inputs: dict, log_steps: int) -> Callable[[], torch.Tensor]:
    """The contender ``name`` as a call of no arguments returning float32 [B, V]."""
    if name == "unfused":
        from sentence_transformers.sparse_encoder.modules import SpladePooling

        pooling = SpladePooling("max", ACTIVATIONS[log_steps]).eval()

        def unfused() -> torch.Tensor:
            logits = F.linear(inputs["hidden"], inputs["weight"], inputs["bias"])
            features = {"token_embeddings": logits, "attention_mask": inputs["mask"]}
            return pooling(features)["sentence_embedding"].float()

        return unfused
    packed = (inputs["x"], inputs["weight"], inputs["bias"], inputs["cu_seqlens"], log_steps)
    if name == "torch":
        from fastbert.kernels import sparse_head_torch

        return lambda: sparse_head_torch.splade_max_unchecked(*packed)
    from fastbert import kernels

    return lambda: kernels.splade_max(*packed)


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def child_peak(name: str, args: argparse.Namespace) -> dict:
    """In this (fresh) process: a warm-up call of ``name``, then the resident memory one more
    call adds at its peak, in bytes."""
    call = head(name, make_inputs(args), args.log_steps)
    with torch.inference_mode():
        call()
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        before = _status_kib("VmRSS")
        call()
        peak = _status_kib("VmHWM")
    return {"peak_bytes": (peak - before) * 1024}


def cpu_peak(name: str, argv: list[str]) -> int:
    """``name``'s peak bytes, measured by :func:`child_peak` in a process of its own."""
    env = {
        **os.environ,
        "MALLOC_MMAP_THRESHOLD_": MALLOC_BYTES,
        "MALLOC_TRIM_THRESHOLD_": MALLOC_BYTES,
    }
    command = [sys.executable, "-m", "benchmarks.splade_head", *argv, "--child-peak", name]
    out = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_bytes"]


def cuda_peak(call: Callable[[], torch.Tensor]) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    call()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def time_cuda(calls: dict[str, Callable[[], torch.Tensor]], rounds: int) -> dict[str, list[float]]:
    """Median, 20th and 80th percentile seconds of each call (triton.testing.do_bench)."""
    import triton

    quantiles = [0.5, 0.2, 0.8]
    return {
        name: [
            ms / 1e3 for ms in triton.testing.do_bench(call, rep=50 * rounds, quantiles=quantiles)
        ]
        for name, call in calls.items()
    }


def measure(args: argparse.Namespace, argv: list[str]) -> dict:
    names = contenders(args.device)
    calls = {name: head(name, make_inputs(args), args.log_steps) for name in names}
    with torch.inference_mode():
        outputs = {name: call() for name, call in calls.items()}  # warm-up, and the results
        if args.device == "cuda":
            seconds = time_cuda(calls, args.rounds)
            peaks = {name: cuda_peak(call) for name, call in calls.items()}
        else:
            seconds = reporting.in_turns(calls, args.rounds)
            peaks = {name: cpu_peak(name, argv) for name in names}
    tokens = args.sequences * args.length
    reference = outputs["unfused"]
    return {
        "contenders": {
            name: {
                "seconds": seconds[name],
                "peak_bytes": peaks[name],
                "max_abs_difference": float((outputs[name] - reference).abs().max()),
            }
            for name in names
        },
        "logits_bytes": tokens * args.vocab * torch.finfo(DTYPES[args.dtype]).bits // 8,
    }


def markdown(report: dict) -> str:
    env, shape = report["environment"], report["shape"]
    tokens = shape["sequences"] * shape["length"]
    timing = (
        "median (least) of the rounds, contenders alternating"
        if shape["device"] == "cpu"
        else "do_bench median (p20)"
    )
    lines = [
        f"# The SPLADE head: {shape['sequences']} x {shape['length']} tokens, hidden "
        f"{shape['hidden']}, vocabulary {shape['vocab']}, {shape['dtype']}, {shape['device']}",
        "",
        f"CPU: {env['cpu']} ({env['cpu_threads']} torch threads; flags: {env['cpu_flags']}); "
        f"GPU: {env.get('gpu') or 'none'}; torch {env['torch']}, triton {env['triton']}, "
        f"sentence-transformers {env['sentence-transformers']}; commit {env['commit']}; "
        f"{env['date']}.",
        "",
        f"log_steps {shape['log_steps']}; {shape['rounds']} rounds; time: {timing}. The [T, V] "
        f"logits alone take {report['logits_bytes'] / 2**20:,.0f} MiB. Load average (1, 5, 15 "
        f"min) at start {_loads(report['load_average_at_start'])}, at end "
        f"{_loads(report['load_average_at_end'])}.",
        "",
        "| contender | peak MiB | peak / unfused | seconds | tokens/s | speed-up | "
        "largest difference |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    unfused = report["contenders"]["unfused"]
    for name, result in report["contenders"].items():
        median, least = _summary(result["seconds"], shape["device"])
        # A tiny head may not raise the resident memory by a page.
        ratio = result["peak_bytes"] / unfused["peak_bytes"] if unfused["peak_bytes"] else None
        lines.append(
            f"| {name} | {result['peak_bytes'] / 2**20:,.1f} | "
            f"{'n/a' if ratio is None else f'{ratio:.3f}'} | {median:.3f} ({least:.3f}) | "
            f"{tokens / median:,.0f} | "
            f"{_summary(unfused['seconds'], shape['device'])[0] / median:.2f}x | "
            f"{result['max_abs_difference']:.1e} |"
        )
    return "\n".join(lines) + "\n"


def _loads(loads: list[float]) -> str:
    return " / ".join(f"{load:.1f}" for load in loads)


def _summary(seconds: list[float], device: str) -> tuple[float, float]:
    """(median, least) of CPU rounds; (median, p20) of do_bench's quantiles."""
    if device == "cuda":
        return seconds[0], seconds[1]
    return statistics.median(seconds), min(seconds)


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(
        prog="python -m benchmarks.splade_head",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    result.add_argument("--out", type=Path, help="folder for the results (required)")
    result.add_argument("--sequences", type=int, default=32)
    result.add_argument("--length", type=int, default=128, help="tokens per sequence")
    result.add_argument("--hidden", type=int, default=768)
    result.add_argument("--vocab", type=int, default=30522)
    result.add_argument("--dtype", choices=list(DTYPES), default="float32")
    result.add_argument("--log-steps", type=int, choices=[1, 2], default=1)
    result.add_argument("--rounds", type=int, default=3)
    result.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    result.add_argument("--child-peak", help=argparse.SUPPRESS)
    return result


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    cli = parser()
    args = cli.parse_args(argv)
    sizes = (args.sequences, args.length, args.hidden, args.vocab, args.rounds)
    if min(sizes) < 1:
        cli.error("--sequences, --length, --hidden, --vocab and --rounds must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        cli.error("--device cuda: no CUDA device here")
    if args.child_peak is not None:
        print(json.dumps(child_peak(args.child_peak, args)))
        return 0
    if args.out is None:
        cli.error("--out is required")
    from fastbert.bench import environment

    shape = {k: getattr(args, k) for k in ("sequences", "length", "hidden", "vocab", "dtype")}
    shape.update(log_steps=args.log_steps, rounds=args.rounds, device=args.device)
    report = {"shape": shape, "environment": environment.capture()}
    report["load_average_at_start"] = os.getloadavg()
    report.update(measure(args, argv))
    report["load_average_at_end"] = os.getloadavg()
    reporting.write_report(args.out, "splade-head", report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
