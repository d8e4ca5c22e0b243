"""Dynamic int8 on the CPU: PyTorch's int8 GEMMs compared by speed and accuracy.

``python -m benchmarks.int8_cpu [--reps 15] [--threads N]`` times, on all-MiniLM-L6-v2's FFN
shape (x [4096 tokens, 384] @ W^T [1536, 384], bias), round-robin (one call of each in turn,
repeatedly, so that a change of load on a shared machine hits all alike; medians with p20 /
p80):

- float32 ``F.linear`` (the exact path);
- fastbert's torch backend of ``linear_int8``: per-token activations, ``torch._int_mm``
  (int8 x int8 -> int32, oneDNN), dequantise + bias in place;
- ``torch._int_mm`` alone, and the per-token quantisation alone (its parts);
- ``torch.ops.quantized.linear_dynamic`` with fbgemm per-channel packed weights (what
  ``torch.ao.quantization.quantize_dynamic`` runs), whose activations are quantised per
  tensor: one uint8 scale and zero point for the whole batch;

and each one's relative error against float64 on real-looking activations (normal, with two
outlier channels 20x the others, as LayerNorm outputs have). Prints a Markdown table. Speed
is measured here, never asserted in a test.
"""

from __future__ import annotations

import argparse
import warnings

import torch
import torch.nn.functional as F

from benchmarks import reporting
from fastbert.kernels import reference, torch_ops


def operands(m: int = 4096, n: int = 1536, k: int = 384, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[:, 7] *= 20.0
    x[:, 99] *= 20.0
    weight = torch.randn(n, k, generator=g) * k**-0.5
    bias = torch.randn(n, generator=g) * 0.1
    return x, weight, bias


def fbgemm_packed(weight, scale, bias):
    """fbgemm's packed dynamic-int8 linear of ``weight`` [N, K] with per-channel ``scale``
    [N] (``quantize_dynamic``'s weights), for ``torch.ops.quantized.linear_dynamic``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # quantize_per_channel is deprecated
        torch.backends.quantized.engine = "fbgemm"
        zero = torch.zeros(weight.shape[0], dtype=torch.long)
        qweight = torch.quantize_per_channel(weight, scale.double(), zero, 0, torch.qint8)
        return torch.ops.quantized.linear_prepack(qweight, bias)


def contenders(x, weight, bias) -> dict:
    q, scale = reference.quantize_weight(weight)
    xq, _ = torch_ops.quantize_rows(x)
    runs = {
        "float32 F.linear": lambda: F.linear(x, weight, bias),
        "fastbert int8 (per-token, torch._int_mm)": lambda: torch_ops.linear_int8(
            x, q, scale, bias
        ),
        "  torch._int_mm alone": lambda: torch._int_mm(xq, q.t()),
        "  per-token quantisation alone": lambda: torch_ops.quantize_rows(x),
    }
    packed = fbgemm_packed(weight, scale, bias)
    runs["fbgemm linear_dynamic (per-channel W, per-tensor x)"] = lambda: (
        torch.ops.quantized.linear_dynamic(x, packed, False)
    )
    return runs


def time_round_robin(runs: dict, reps: int) -> dict[str, list[float]]:
    """A warm-up call of each run, then ``reps`` rounds of them in turns."""
    for run in runs.values():
        run()
    return reporting.in_turns(runs, reps)


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.int8_cpu", description=__doc__)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    x, weight, bias = operands()
    exact = F.linear(x.double(), weight.double(), bias.double())
    runs = contenders(x, weight, bias)
    times = time_round_robin(runs, args.reps)
    base = quantile(times["float32 F.linear"], 0.5)
    print(f"x [4096, 384] @ W^T [1536, 384] + bias, {args.threads} threads, {args.reps} rounds")
    print()
    print("| contender | median ms (p20-p80) | float32 time / this | rel. error vs float64 |")
    print("|---|---|---|---|")
    for name, run in runs.items():
        median = quantile(times[name], 0.5)
        spread = f"{quantile(times[name], 0.2) * 1e3:.1f}-{quantile(times[name], 0.8) * 1e3:.1f}"
        out = run()
        error = "-"
        if isinstance(out, torch.Tensor) and out.is_floating_point() and out.shape == exact.shape:
            error = f"{((out.double() - exact).norm() / exact.norm()).item():.2e}"
        print(f"| {name} | {median * 1e3:.1f} ({spread}) | {base / median:.2f} | {error} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
