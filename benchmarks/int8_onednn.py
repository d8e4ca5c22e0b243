"""int8 linears on a CPU: fastbert's ``torch._int_mm`` path against oneDNN's quantised linear.

    python -m benchmarks.int8_onednn --out benchmarks/results/int8-onednn-<date>
        [--rounds 9] [--threads N] [--stem int8-onednn]

On all-MiniLM-L6-v2's linear shapes (384 -> 384 plain, 384 -> 1536 with GELU, 1536 -> 384
with the residual add; bias on all) at 512, 2048 and 4096 tokens, times in turns (one call
of each contender a round, so that a change of load on a shared machine hits all alike;
medians with p20-p80):

- ``fastbert int8``: the plain torch backend's ``linear_int8`` (x quantised per token,
  ``torch._int_mm``, the dequantisation, bias, GELU and residual in place in float32);
- ``CPU engine int8``: the CPU engine's (fastbert.kernels.cpu_engine_int8: the quantisation
  and dequantisation compiled), its product on ``torch._int_mm``, and ``, packed``: on oneDNN's
  quantised linear over a packed weight where the engine does so (a CPU with AMX-INT8, from
  ONEDNN_MIN_ROWS tokens; elsewhere the same as the row before). Both the plain row's bits;
- ``oneDNN qlinear, per-token``: the same per-token quantisation, then
  ``torch.ops.onednn.qlinear_pointwise`` on its prepacked weight with the weight's
  per-channel scales fused, the token scales, bias, GELU and residual applied after it
  (oneDNN's op takes one activation scale per tensor, so a token's scale cannot be fused);
- ``oneDNN qlinear, per-tensor x``: x quantised with one scale for the whole batch, bias and
  GELU or the residual add fused as oneDNN post-ops: the fastest use of the op, other
  numerics than fastbert's int8. On a CPU without an int8 dot-product instruction (no VNNI
  or AMX: AVX2 only) oneDNN sums pairs of u8 x s8 products in 16 bits, which saturate on
  full-range weights: both oneDNN rows are then wrong, and their accuracy columns say so
  (fastbert's int8 takes oneDNN only on AMX-INT8);
- the CPU engine's float32 and bfloat16 linears on packed weights (yardsticks).

Accuracy: each one's largest error against fastbert's float64 reference of ``linear_int8``
(fastbert/kernels/reference.py), in units of the largest reference magnitude, and its relative
(Frobenius) error against the exact float64 linear. Activations are normal with two outlier
channels 20x the others, as LayerNorm outputs have. Writes <stem>.json (every timing,
the load average before and after, the environment) and <stem>.md. Speed is measured
here, never asserted in a test.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks import reporting
from fastbert.kernels import cpu_engine, cpu_engine_int8, cpu_engine_linear, reference, torch_ops
from fastbert.kernels.packed_weights import PackedWeights

# all-MiniLM-L6-v2's linears: (name, in features, out features, activation, residual).
SHAPES = (
    ("q/k/v/o 384->384", 384, 384, None, False),
    ("ffn in 384->1536 +GELU", 384, 1536, "gelu", False),
    ("ffn out 1536->384 +residual", 1536, 384, None, True),
)
TOKENS = (512, 2048, 4096)


def operands(m: int, k: int, n: int, residual: bool, seed: int = 0) -> dict:
    """x [m, k] with two outlier channels, an nn.Linear weight [n, k], bias [n], residual."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[:, 7] *= 20.0
    x[:, 99] *= 20.0
    return {
        "x": x,
        "weight": torch.randn(n, k, generator=g) * k**-0.5,
        "bias": torch.randn(n, generator=g) * 0.1,
        "residual": torch.randn(m, n, generator=g) if residual else None,
    }


def qlinear(xq, x_scale, packed, weight_scale, bias, activation, residual) -> torch.Tensor:
    """oneDNN's quantised linear, float32 out: act(xq @ W^T * x_scale * weight_scale + bias)
    + residual, GELU or the residual add as its post-op. int8 ``xq`` goes in as uint8 with
    zero point 128 (the same integers): oneDNN 3.x runs signed int8 activations on its
    reference kernel here (ref_int8, measured ~1000x slower), unsigned on its VNNI one."""
    xu = xq.view(torch.uint8).bitwise_xor(128)
    zero = torch.zeros(weight_scale.shape, dtype=torch.int32)
    op = torch.ops.onednn.qlinear_pointwise
    if residual is not None:
        return op.binary(
            xu, x_scale, 128, packed, weight_scale, zero, residual, bias, 1.0, 0, torch.float32,
            1.0, 0, "add", 1.0, "none", [], "",
        )  # fmt: skip
    post = "gelu" if activation else "none"
    algorithm = "none" if activation else ""
    return op(xu, x_scale, 128, packed, weight_scale, zero, bias, 1.0, 0, torch.float32, post, [],
              algorithm)  # fmt: skip


def contenders(ops: dict, activation: str | None) -> dict:
    """The calls timed for one shape, by name."""
    x, weight, bias, residual = ops["x"], ops["weight"], ops["bias"], ops["residual"]
    with torch.inference_mode(False):  # a weight with a version counter, as a model's: packed
        wq, ws = reference.quantize_weight(weight)
    packed = torch.ops.onednn.qlinear_prepack(wq, list(x.shape))

    def per_token():
        xq, xs = torch_ops.quantize_rows(x)
        y = qlinear(xq, 1.0, packed, ws, None, None, None).mul_(xs[:, None]).add_(bias)
        y = F.gelu(y) if activation else y
        return y if residual is None else y.add_(residual)

    def per_tensor():
        amax = x.abs().amax()
        xq = torch.mul(x, 127.0 / amax).round_().to(torch.int8)
        return qlinear(xq, (amax / 127.0).item(), packed, ws, bias, activation, residual)

    packs = PackedWeights()
    engine_args = (x, wq, ws, bias, activation, residual, None)

    def engine_int_mm():
        with cpu_engine_int8.turned_off():
            return cpu_engine.OPS["linear_int8"](*engine_args, packs=packs)

    weight16, bias16, x16 = weight.bfloat16(), bias.bfloat16(), x.bfloat16()
    residual16 = None if residual is None else residual.bfloat16()
    return {
        "fastbert int8 (torch._int_mm)": lambda: torch_ops.linear_int8_unchecked(
            x, wq, ws, bias, activation, residual
        ),
        "CPU engine int8 (torch._int_mm)": engine_int_mm,
        "CPU engine int8, packed": lambda: cpu_engine.OPS["linear_int8"](*engine_args, packs=packs),
        "oneDNN qlinear, per-token": per_token,
        "oneDNN qlinear, per-tensor x": per_tensor,
        "float32 oneDNN (packed)": lambda: cpu_engine_linear.linear_unchecked(
            x, weight, bias, activation, residual, packs=packs
        ),
        "bfloat16 oneDNN (packed)": lambda: cpu_engine_linear.linear_unchecked(
            x16, weight16, bias16, activation, residual16, packs=packs
        ),
    }


def accuracy(ops: dict, activation: str | None, out: torch.Tensor) -> dict:
    """``out``'s largest error against the float64 int8 reference (over the reference's
    largest magnitude) and its relative error against the exact float64 linear."""
    x, weight, bias, residual = (None if t is None else t.double() for t in ops.values())
    wq, ws = reference.quantize_weight(ops["weight"])
    int8 = reference.linear_int8(x, wq, ws, bias, activation, residual)
    exact = F.linear(x, weight, bias)
    exact = F.gelu(exact) if activation else exact
    exact = exact if residual is None else exact + residual
    out = out.double()
    return {
        "max_err_vs_int8_reference": ((out - int8).abs().max() / int8.abs().max()).item(),
        "rel_err_vs_float64": ((out - exact).norm() / exact.norm()).item(),
    }


def measure(rounds: int) -> list[dict]:
    rows = []
    with torch.inference_mode():
        for name, k, n, activation, residual in SHAPES:
            for m in TOKENS:
                print(f"{name}, {m} tokens ...", file=sys.stderr, flush=True)
                ops = operands(m, k, n, residual)
                calls = contenders(ops, activation)
                errors = {key: accuracy(ops, activation, call()) for key, call in calls.items()}
                seconds = reporting.in_turns(calls, rounds)
                rows.append({"linear": name, "tokens": m, "seconds": seconds, "accuracy": errors})
    return rows


def quantiles(values: list[float]) -> tuple[float, float, float]:
    q = statistics.quantiles(values, n=10, method="inclusive")
    return q[1], statistics.median(values), q[7]


def markdown(report: dict) -> str:
    names = list(report["rows"][0]["seconds"])
    lines = [
        f"# int8 linears on a CPU ({report['threads']} threads, {report['rounds']} rounds "
        f"in turns; load average {report['load_before'][0]:.2f} before, "
        f"{report['load_after'][0]:.2f} after)",
        "",
        "Median ms (p20-p80); below, error vs the float64 int8 reference (max, over the "
        "reference's max magnitude) / relative error vs the float64 linear.",
        "",
        "| linear | tokens | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for row in report["rows"]:
        cells = []
        for name in names:
            low, mid, high = (s * 1e3 for s in quantiles(row["seconds"][name]))
            err = row["accuracy"][name]
            cells.append(
                f"{mid:.2f} ({low:.2f}-{high:.2f})<br>"
                f"{err['max_err_vs_int8_reference']:.1e} / {err['rel_err_vs_float64']:.1e}"
            )
        lines.append(f"| {row['linear']} | {row['tokens']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.int8_onednn", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--rounds", type=int, default=9, help="timed rounds (at least 7)")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--stem", default="int8-onednn", help="name of the two result files")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.rounds < 7:
        parser.error("--rounds must be at least 7")
    if not hasattr(torch.ops.onednn, "qlinear_pointwise"):
        print("this PyTorch build has no oneDNN quantised linear", file=sys.stderr)
        return 1
    from fastbert.bench import environment

    report = {"threads": torch.get_num_threads(), "rounds": args.rounds}
    report["load_before"] = os.getloadavg()
    report["rows"] = measure(args.rounds)
    report["load_after"] = os.getloadavg()
    report["environment"] = environment.capture()
    reporting.write_report(args.out, args.stem, report, markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
