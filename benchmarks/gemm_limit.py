"""The GEMM limit of a CPU for an encoder: the tokens/s at which its linear layers alone would
run if every product went at the rate this CPU's matrix multiply reaches, measured here.

The rate is that of the model's largest product (the feed-forward up-projection, [tokens,
hidden] x [hidden, intermediate]) at a batch of ``tokens`` rows, through PyTorch: in float32
and bfloat16 the faster of ``torch.mm`` (MKL) and oneDNN's linear (the inference GEMM
fastbert's torch backend runs on a CPU); for int8 (int32 accumulation) ``torch._int_mm``, and
on a CPU with AMX-INT8 also oneDNN's quantised linear on a packed weight (what fastbert's CPU
engine runs there: fastbert.kernels.cpu_engine_int8); on a CPU without int8 dot products the
fastest of the float32 GEMM of the int8 values, oneDNN's quantised linear on uint8 rows and
fastbert's byte product (fastbert.kernels.cpu_int8_product, each build the CPU runs). The
work per token is that of the linear layers, ``2 * layers * (4 hidden^2 + 2 hidden
intermediate)`` FLOPs (the Q, K, V and output projections, the two feed-forward products; a
gated FFN's input projection is twice as wide, ``3 hidden intermediate``, and the largest);
attention's own products (a few percent at the lengths of real text) and everything else are
not counted, so a contender's fraction of this limit is a lower bound of how close to the
GEMM rate its products run.
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable

import torch

from fastbert.kernels import cpu_int8_product, packed_weights
from fastbert.kernels.cpu_library import has_int8_dot_products

PRECISIONS = ("float32", "bfloat16", "int8")


def linear_flops_per_token(hidden: int, intermediate: int, layers: int, glu: bool = False) -> int:
    """FLOPs of the linear layers of one token through ``layers`` encoder layers (``glu``: the
    FFN's input projection is twice the intermediate width, GeGLU's gate and input)."""
    ffn = (3 if glu else 2) * hidden * intermediate
    return 2 * layers * (4 * hidden * hidden + ffn)


def products(
    precision: str, tokens: int, hidden: int, intermediate: int
) -> dict[str, Callable[[], torch.Tensor]]:
    """The ways PyTorch multiplies [tokens, hidden] x [hidden, intermediate] in ``precision``
    on a CPU, by name."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision {precision!r}: one of {', '.join(PRECISIONS)}")
    generator = torch.Generator().manual_seed(0)
    if precision == "int8":
        a = torch.randint(-127, 128, (tokens, hidden), dtype=torch.int8, generator=generator)
        b = torch.randint(-127, 128, (hidden, intermediate), dtype=torch.int8, generator=generator)
        if not has_int8_dot_products():
            # torch._int_mm is oneDNN's reference loop here (~2 GFLOP/s on an AVX2-only CPU):
            # the exact float32 GEMM of the int8 values, oneDNN's quantised linear on uint8
            # rows, which adds the products in 16-bit pairs (exact only when one operand has 7
            # bits), and fastbert's exact byte product, each build this CPU runs.
            uint8_rows = a.to(torch.int16).add_(128).to(torch.uint8)
            ways = {
                "float32 GEMM of the int8 values (exact)": _widened_mm(a, b),
                "onednn qlinear, uint8 (16-bit pairs)": _qlinear(uint8_rows, 128, b),
            }
            for build in cpu_int8_product.BUILDS:
                panels = cpu_int8_product.pack(b.t(), build)
                if panels is not None:
                    name = f"fastbert {cpu_int8_product.REGISTERS[build]} byte product (exact)"
                    ways[name] = functools.partial(cpu_int8_product.product, a, panels)
            return ways
        ways = {"torch._int_mm": lambda: torch._int_mm(a, b)}
        if packed_weights.int8_available():
            ways["onednn qlinear (packed)"] = _qlinear(a, 0, b)
        return ways
    dtype = getattr(torch, precision)
    a = torch.randn(tokens, hidden, generator=generator).to(dtype)
    b = torch.randn(hidden, intermediate, generator=generator).to(dtype)
    if dtype == torch.bfloat16 and not packed_weights.onednn_serves(dtype):
        # No bfloat16 instructions: PyTorch's bfloat16 GEMM is a loop (~1 GFLOP/s on an
        # AVX2-only CPU); the fastest bfloat16 product is float32's on widened operands.
        return {"torch.mm in float32 (operands widened)": _widened_mm(a, b)}
    ways = {"torch.mm": lambda: torch.mm(a, b)}
    onednn = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    if onednn and packed_weights.onednn_serves(dtype):  # bfloat16 needs AVX-512 or AVX-NE-CONVERT
        weight = b.t().contiguous()  # [out, in], as a linear layer holds it
        ways["onednn linear"] = lambda: torch.ops.mkldnn._linear_pointwise(
            a, weight, None, "none", [], ""
        )
    return ways


def _widened_mm(a: torch.Tensor, b: torch.Tensor) -> Callable[[], torch.Tensor]:
    """``a @ b`` in float32, ``a`` widened on each call, ``b`` once (a kept weight copy)."""
    wide = b.float()
    return lambda: torch.mm(a.float(), wide)


def _qlinear(rows: torch.Tensor, zero_point: int, b: torch.Tensor) -> Callable[[], torch.Tensor]:
    """oneDNN's quantised linear of int8 or uint8 ``rows`` (``zero_point``) by the int8 ``b``
    [K, N] packed once, unit scales, into float32."""
    packed = torch.ops.onednn.qlinear_prepack(b.t().contiguous(), None)
    n = b.shape[1]
    unit, zeros = torch.ones(n), torch.zeros(n, dtype=torch.int32)
    return lambda: torch.ops.onednn.qlinear_pointwise(
        rows, 1.0, zero_point, packed, unit, zeros, None, 1.0, 0, torch.float32, "none", [], ""
    )


def flops_per_s(product: Callable[[], torch.Tensor], flops: int, seconds: float) -> float:
    """``flops`` / the median time of repeated ``product()`` calls for about ``seconds``
    after a warm-up."""
    product()
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(samples) < 3 or time.perf_counter() < deadline:
        start = time.perf_counter()
        product()
        samples.append(time.perf_counter() - start)
    return flops / statistics.median(samples)


def gemm_flops_per_s(
    precision: str, tokens: int, hidden: int, intermediate: int, seconds: float = 1.0
) -> tuple[float, str]:
    """(FLOP/s, integer operations for int8, of [tokens, hidden] x [hidden, intermediate] in
    ``precision`` on this CPU's torch threads by the fastest way PyTorch has, that way's name);
    each way timed for about ``seconds``."""
    flops = 2 * tokens * hidden * intermediate
    rates = {
        name: flops_per_s(product, flops, seconds)
        for name, product in products(precision, tokens, hidden, intermediate).items()
    }
    fastest = max(rates, key=rates.__getitem__)
    return rates[fastest], fastest


def measure(
    hidden: int,
    intermediate: int,
    layers: int,
    tokens: int = 4096,
    precisions: tuple[str, ...] = PRECISIONS,
    seconds: float = 1.0,
    glu: bool = False,
) -> dict:
    """The limit of each precision: {"shape", "flops_per_token", "threads", precision:
    {"gflops", "tokens_per_s", "kernel"}}; with ``glu`` the largest product is the gated
    FFN's [hidden, 2 * intermediate] input projection."""
    flops = linear_flops_per_token(hidden, intermediate, layers, glu)
    intermediate = 2 * intermediate if glu else intermediate
    limits: dict = {
        "shape": [tokens, hidden, intermediate],
        "flops_per_token": flops,
        "threads": torch.get_num_threads(),
    }
    for precision in precisions:
        rate, kernel = gemm_flops_per_s(precision, tokens, hidden, intermediate, seconds)
        limits[precision] = {"gflops": rate / 1e9, "tokens_per_s": rate / flops, "kernel": kernel}
    return limits


def highest(*runs: dict) -> dict:
    """The limit of several :func:`measure` runs of one shape: each precision at its highest
    rate (the most this CPU's products reached)."""
    return _merged(runs, lambda rates: max(rates, key=lambda rate: rate["gflops"]))


def median(*runs: dict) -> dict:
    """The limit of several :func:`measure` runs of one shape taken in turn with the rounds
    of a benchmark: each precision at its median rate (of an even count, the higher of the
    middle two), the statistic the benchmark takes of its contenders, so that on a host whose
    speed wanders both sample the same mixture of fast and slow spells."""
    return _merged(
        runs, lambda rates: sorted(rates, key=lambda rate: rate["gflops"])[len(rates) // 2]
    )


def _merged(runs: tuple[dict, ...], pick: Callable[[list[dict]], dict]) -> dict:
    merged = dict(runs[0])
    for precision in PRECISIONS:
        rates = [run[precision] for run in runs if precision in run]
        if rates:
            merged[precision] = pick(rates)
    return merged
