"""Static performance report for BERT-base shapes: compiler output plus a roofline model.

``python -m tests.sass_report --out benchmarks/results/static-sm90.md`` compiles, for sm_90 and
sm_80, the kernel configs a BERT-base layer launches in fp16 (batch 32 x sequence 128 = 4096
tokens, hidden 768, 12 heads of 64, intermediate 3072), reads their SASS (tests/sass.py) and
writes a Markdown report: per config the MMA instructions, TMA / cp.async loads, load widths,
registers, spills, shared memory, CTAs per SM and the main loop's instruction mix; then a
roofline model with wave quantisation per op and per layer for an H100 SXM. The first part is
what the compiler produced; the second is an estimate built on it, not a measurement.

ModernBERT-base's kernel variants (rotary attention with and without the sliding window,
forward and both backward passes, and the GeGLU input projection) get the same compiler facts
per target, and the sliding window a section of its own: the tiles each program's loop visits
under the kernels' bounds (``window_keys``) against the dense loop at 512 to 8192 tokens, and,
from the PTX (tests/ptx_flow.py), whether the ``window`` argument reaches the loop's exit test.
It must run in a process WITHOUT ``TRITON_INTERPRET`` set.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fastbert.kernels.attention_tiles import window_key_range
from tests.compile_support import CompileCase, compile_case
from tests.sass import tile_normalised

# BERT-base, fp16, batch 32 x sequence 128.
BATCH, SEQ, HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE, LAYERS = 32, 128, 768, 12, 64, 3072, 12
TOKENS = BATCH * SEQ
ELEMENT = 2  # bytes of an fp16 value
# The quantised linears the report lists, with their operands and accumulation.
QUANTIZED_FORMATS = {
    "int8": "int8 operands, int32 accumulation",
    "fp8": "float8 e4m3 operands, float32 accumulation",
}
# H100 SXM: SMs, achievable dense fp16 tensor throughput, HBM bandwidth, sustained clock.
SMS = 132
PEAK_FLOPS = 800e12
HBM_BYTES_PER_S = 3.0e12
CLOCK_HZ = 1.755e9
ISSUE_PER_SM_PER_CLOCK = 4  # four warp schedulers, one warp instruction each per clock
# Bytes per clock that L2 delivers to the SMs (A100's published L2 read bandwidth; NVIDIA
# publishes no H100 figure, so the same per clock is assumed).
L2_BYTES_PER_CLOCK = 5120
L2_BYTES_PER_S = L2_BYTES_PER_CLOCK * CLOCK_HZ


@dataclass(frozen=True)
class Gemm:
    """One linear layer of the layer: out[M, N] = act(x[M, K] @ W^T + bias) (+ residual)."""

    name: str
    n: int
    k: int
    activation: int  # fastbert.kernels.fused_linear ACTIVATION code
    has_residual: bool = False


GEMMS = (
    Gemm("QKV projection", 3 * HIDDEN, HIDDEN, 0),
    Gemm("attention output", HIDDEN, HIDDEN, 0),
    Gemm("FFN1 + GELU", INTERMEDIATE, HIDDEN, 1),
    Gemm("FFN2", HIDDEN, INTERMEDIATE, 0),
)


def linear_cases() -> dict[tuple[int, bool], list[CompileCase]]:
    """fp16 cases of every config the autotuner may time for each epilogue BERT launches
    (bias, bias + GELU), keyed by (ACTIVATION, HAS_RESIDUAL); largest tile first."""
    from fastbert.kernels import linear_configs as mod
    from tests.compile_cases import linear

    out = {}
    for activation, has_residual in sorted({(g.activation, g.has_residual) for g in GEMMS}):
        kept = [
            c
            for c in linear.CONFIGS
            if mod.keep(
                c,
                ELEMENT,
                mod.m_bucket(TOKENS),
                activation=activation,
                has_residual=has_residual,
                has_descriptors=True,
            )
        ]
        out[(activation, has_residual)] = [
            linear._case("fp16", c, True, activation, has_residual) for c in kept
        ]
    return out


def quantized_linear_cases(quantize: str = "int8") -> dict[tuple[int, bool], list[CompileCase]]:
    """linear_int8 (``quantize="int8"``: int8 operands, int32 accumulation) or linear_fp8
    ("fp8": e4m3 operands, float32 accumulation, sm_90 only) cases with fp16 output, of every
    config the autotuner may time for each epilogue BERT launches, keyed as
    :func:`linear_cases`."""
    from fastbert.kernels import linear_configs as mod
    from tests.compile_cases import linear, linear_int8

    out = {}
    for activation, has_residual in sorted({(g.activation, g.has_residual) for g in GEMMS}):
        kept = [
            c
            for c in linear.POINTER_CONFIGS
            if mod.keep(
                c,
                linear_int8.INT8_SIZE,
                mod.m_bucket(TOKENS),
                activation=activation,
                has_residual=has_residual,
            )
        ]
        out[(activation, has_residual)] = [
            linear_int8._case("fp16", c, True, activation, has_residual, quantize) for c in kept
        ]
    return out


def attention_cases() -> list[CompileCase]:
    """fp16 D=64 masked (the encoder's padded batch) cases of every kept config."""
    from tests.compile_cases import attention

    kept = attention._kept(HEAD_DIM, ELEMENT, False, True)
    return [attention._case("fp16", HEAD_DIM, c, True, False) for c in kept]


def row_cases() -> dict[str, CompileCase]:
    """The fp16 LayerNorm (with residual) and embeddings + LayerNorm kernels at hidden 768."""
    from fastbert.kernels import fused_layer_norm
    from tests.compile_cases import embeddings, layer_norm

    block = fused_layer_norm.block_size(HIDDEN)
    return {
        "layer_norm": _with_dtype(layer_norm._case("fp16", block, True)),
        "embeddings": _with_dtype(embeddings._case("fp16", block, True, False, "*i64")),
    }


# ModernBERT-base (fastbert.bench.shapes "modernbert-base"), fp16, the same batch x sequence:
# head dim 64, a GeGLU input projection (GATED, exact GELU, no bias), sliding-window layers.
MODERNBERT = "modernbert-base"
GELU = 1  # fused_linear's ACTIVATION code of the exact GELU (ModernBERT's hidden_activation)
# Sequence lengths of the sliding window's tile count (ModernBERT reads up to 8192 tokens).
WINDOW_SEQS = (512, 2048, 8192)
# The argument whose data path to a loop's exit test the report looks for, and a control that
# only addresses rows (every attention kernel, forward and backward, has it).
WINDOW_ARG, CONTROL_ARG = "window", "stride_q_s"


def modernbert_cases() -> dict[str, list[CompileCase]]:
    """ModernBERT-base's kernel variants in fp16, D=64, with the key-padding mask: the
    attention forward and both backward passes with rotary positions alone (the global layers)
    and with the sliding window (the local ones), every config ``keep`` allows for rotary; the
    GATED (GeGLU) input projection without bias, every one-tile-per-program config ``keep``
    allows for it at M = TOKENS."""
    from fastbert.kernels import linear_configs as mod
    from tests.compile_cases import attention, linear
    from tests.compile_cases import attention_backward as backward

    kept = attention._kept(HEAD_DIM, ELEMENT, False, True, has_rotary=True)
    forward = [
        attention._case("fp16", HEAD_DIM, c, True, False, rotary=True, window=window)
        for window in (False, True)
        for c in kept
    ]
    passes = [
        backward._case(k, "fp16", HEAD_DIM, c, True, False, False, rotary=True, window=window)
        for k in backward.KERNELS
        for window in (False, True)
        for c in backward._kept(k, "fp16", HEAD_DIM, rotary=True)
    ]
    geglu = {"activation": GELU, "has_residual": False, "gated": True}
    gated = [
        linear._case("fp16", c, False, GELU, False, gated=True)
        for c in linear.POINTER_CONFIGS
        if mod.keep(c, ELEMENT, mod.m_bucket(TOKENS), **geglu)
    ]
    return {"attention": forward, "attention_backward": passes, "linear_gated": gated}


def window_loop_reads(case: CompileCase, ptx: str) -> dict[str, list[bool]]:
    """For each innermost loop of ``case``'s PTX holding an MMA: whether its exit test has a
    data path from the ``window`` argument, and from the control argument (tests/ptx_flow.py)."""
    from tests import ptx_flow

    names = list(case.fn.arg_names)
    return {
        arg: ptx_flow.mma_loop_bounds_read(ptx, ptx_flow.param_index(names, case.signature, arg))
        for arg in (WINDOW_ARG, CONTROL_ARG)
    }


@dataclass(frozen=True)
class WindowTiles:
    """The tiles one loop of a sliding-window kernel visits over a sequence of ``seq``
    positions: one program per ``block`` rows (query rows in the forward and the dQ pass, key
    rows in the dK / dV pass), each looping over tiles of ``tile`` positions of the other side
    within [lo, hi) of window_key_range (the kernels' window_keys), against all of them."""

    seq: int
    block: int
    tile: int
    window: int

    def ranges(self) -> list[tuple[int, int]]:
        """[lo, hi) of each program's loop: window_key_range of its first row."""
        return [
            window_key_range(first, self.window, self.seq, self.block, self.tile)
            for first in range(0, self.seq, self.block)
        ]

    def per_block(self) -> list[int]:
        """Tiles each program's loop visits: ceil((hi - lo) / tile) for its (lo, hi)."""
        return [max(0, -(-(hi - lo) // self.tile)) for lo, hi in self.ranges()]

    @property
    def dense(self) -> int:
        """Tiles the loop without a window visits: every tile of the sequence, per program."""
        return math.ceil(self.seq / self.block) * math.ceil(self.seq / self.tile)

    @property
    def skipped(self) -> float:
        return 1.0 - sum(self.per_block()) / self.dense

    def in_window(self) -> float:
        """Of the (row, position) pairs the visited tiles compute, the fraction within the
        window (|i - j| <= window, both below seq): the others are masked score by score."""
        inside = sum(
            min(i + self.window, self.seq - 1) - max(i - self.window, 0) + 1
            for i in range(self.seq)
        )
        computed = sum(
            min(self.block, self.seq - first) * min(tiles * self.tile, self.seq - lo)
            for first, (lo, _), tiles in zip(
                range(0, self.seq, self.block), self.ranges(), self.per_block()
            )
        )
        return inside / computed


def _with_dtype(case: CompileCase) -> CompileCase:
    """``case`` marked fp16 so that compile_case reads its SASS out too."""
    case.dtype = "fp16"
    return case


def compile_all(archs: tuple[int, ...]) -> dict[str, object]:
    """Compile every case of the report for ``archs``: reports keyed like the cases."""

    def run(case: CompileCase, loop_reads: bool = False) -> dict[int, dict]:
        """``loop_reads``: also read the MMA loops' exit tests off the PTX (window_loop_reads)."""
        print(f"compiling {case.name}", file=sys.stderr, flush=True)
        reports = {}
        for arch in (a for a in archs if a in case.archs):
            report = compile_case(case, arch, keep_ptx=loop_reads)
            ptx = report.pop("ptx", None)
            if ptx is not None:
                report["loop_reads"] = window_loop_reads(case, ptx)
            reports[arch] = report
        return reports

    return {
        "linear": {key: [run(c) for c in cases] for key, cases in linear_cases().items()},
        **{
            f"linear_{q}": {
                key: [run(c) for c in cases] for key, cases in quantized_linear_cases(q).items()
            }
            for q in QUANTIZED_FORMATS
        },
        "attention": [run(c) for c in attention_cases()],
        "rows": {name: run(c) for name, c in row_cases().items()},
        "modernbert": {
            name: [run(c, loop_reads=name.startswith("attention")) for c in cases]
            for name, cases in modernbert_cases().items()
        },
    }


def _mma(report: dict) -> str:
    mma = report["sass"]["mma"]
    return ", ".join(f"{op} x{n}" for op, n in mma.items()) or "none"


def _loads(report: dict) -> str:
    loads = report["sass"]["global_loads"]
    return ", ".join(f"{op} x{n}" for op, n in loads.items()) or "none"


def _spills(report: dict) -> str:
    s = report["sass"]
    ptxas = f"{report['spill_stores']} B / {report['spill_loads']} B"
    return f"{s['stl']} STL / {s['ldl']} LDL ({ptxas})"


def _config_rows(reports: list[dict], normalise: bool, gemm: bool = False) -> list[str]:
    """Compiler facts per config; ``normalise``: attention's per-64x64-tile columns; ``gemm``:
    the instructions per thread outside the main loop, and per accumulator value."""
    head = (
        "| config | regs | spills (STL/LDL, ptxas bytes) | smem B | CTAs/SM | MMA (whole kernel) "
        "| TMA / cp.async | global loads | main loop instr. |"
        + (" per 64x64 tile | MMA loops per 64x64 tile |" if normalise else "")
        + (" outside the loop (per acc. value) |" if gemm else "")
    )
    rows = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in reports:
        if "error" in r:
            rows.append(f"| {r['case']} | compile error: {r['error'][:200]} |")
            continue
        loop = r["sass"]["loop"]
        size = loop["size"] if loop else "-"
        row = (
            f"| {r['case']} | {r['registers']} | {_spills(r)} | {r['shared']} | "
            f"{r['ctas_per_sm']} | {_mma(r)} | {r['sass']['tma']} / {r['sass']['cp_async']} | "
            f"{_loads(r)} | {size} |"
        )
        if normalise:
            per_tile = tile_normalised(loop["size"], r["block_m"], r["block_n"], r["num_warps"])
            every = (
                tile_normalised(n, r["block_m"], r["block_n"], r["num_warps"])
                for n in r["sass"]["mma_loop_sizes"]
            )
            row += f" {per_tile:.0f} | {' / '.join(f'{n:.0f}' for n in every)} |"
        if gemm:
            acc_values = r["block_m"] * r["block_n"] // (32 * r["num_warps"])
            outside = outside_main_loop(r)
            row += f" {outside} ({outside / acc_values:.1f}) |"
        rows.append(row)
    return rows


def _mix_rows(reports: list[dict]) -> list[str]:
    classes = next(r["sass"]["loop"]["classes"] for r in reports if r["sass"]["loop"])
    head = "| config | " + " | ".join(classes) + " | total |"
    rows = [head, "|" + "---|" * (len(classes) + 2)]
    for r in reports:
        loop = r["sass"]["loop"]
        if loop:
            counts = " | ".join(str(n) for n in loop["classes"].values())
            rows.append(f"| {r['case']} | {counts} | {loop['size']} |")
    return rows


@dataclass
class Estimate:
    """A modelled op: its work, its assumed config and the bounds of the model (seconds).

    ``feed_bytes``: operand bytes L2 delivers to the SMs (the GEMMs' tiles); ``exposed_s``:
    work that no other resident CTA overlaps (a GEMM's epilogue at one CTA per SM), added to
    the largest bound rather than bounded by it.
    """

    op: str
    config: str
    flops: float
    bytes: float
    programs: int
    slots: int  # SMS x CTAs per SM
    issue_s: float = 0.0
    feed_bytes: float = 0.0
    exposed_s: float = 0.0

    @property
    def waves(self) -> int:
        return math.ceil(self.programs / self.slots) if self.slots else 0

    @property
    def wave_efficiency(self) -> float:
        return self.programs / (self.waves * self.slots) if self.slots else 1.0

    @property
    def compute_s(self) -> float:
        return self.flops / (PEAK_FLOPS * self.wave_efficiency)

    @property
    def memory_s(self) -> float:
        return self.bytes / HBM_BYTES_PER_S

    @property
    def feed_s(self) -> float:
        return self.feed_bytes / L2_BYTES_PER_S

    @property
    def bounds(self) -> dict[str, float]:
        return {
            "compute": self.compute_s,
            "memory": self.memory_s,
            "L2 feed": self.feed_s,
            "issue": self.issue_s,
        }

    @property
    def modelled_s(self) -> float:
        return max(self.bounds.values()) + self.exposed_s


def _assumed(reports: list[dict], model) -> Estimate:
    """The config the model assumes the autotuner picks: of the compiled configs, the lowest
    modelled time, then the lowest issue time, then the largest tile. ``model`` maps a report
    to its :class:`Estimate`."""
    ok = [r for r in reports if "error" not in r]
    ranked = [
        (model(r).modelled_s, model(r).issue_s, -r["block_m"] * r["block_n"], i)
        for i, r in enumerate(ok)
    ]
    return model(ok[min(ranked)[-1]])


def outside_main_loop(report: dict) -> int:
    """Instructions per thread outside the main loop: address set-up, the epilogue and its
    stores, run once per output tile (the SASS has no loop there)."""
    sass = report["sass"]
    return sass["instructions"] - sass["loop"]["size"]


def gemm_estimate(gemm: Gemm, report: dict) -> Estimate:
    """Output tiles as programs; HBM traffic each tensor once; the tiles' operand loads over K
    from L2; the instructions outside the main loop as the epilogue's issue time, exposed at
    one CTA per SM, overlapped by the other CTAs' main loops at two or more."""
    bm, bn = report["block_m"], report["block_n"]
    tiles = math.ceil(TOKENS / bm) * math.ceil(gemm.n / bn)
    traffic = TOKENS * gemm.k + gemm.n * gemm.k + gemm.n + TOKENS * gemm.n
    if gemm.has_residual:
        traffic += TOKENS * gemm.n
    slots = SMS * report["ctas_per_sm"]
    estimate = Estimate(
        op=f"{gemm.name} {TOKENS}x{gemm.n}x{gemm.k}",
        config=report["case"],
        flops=2.0 * TOKENS * gemm.n * gemm.k,
        bytes=traffic * ELEMENT,
        programs=tiles,
        slots=slots,
        feed_bytes=tiles * gemm.k * (bm + bn) * ELEMENT,
    )
    epilogue_warp_instructions = tiles * outside_main_loop(report) * report["num_warps"]
    issue_rate = SMS * ISSUE_PER_SM_PER_CLOCK * CLOCK_HZ * estimate.wave_efficiency
    epilogue_s = epilogue_warp_instructions / issue_rate
    if report["ctas_per_sm"] == 1:
        estimate.exposed_s = epilogue_s
    else:
        estimate.issue_s = epilogue_s
    return estimate


def attention_estimate(report: dict) -> Estimate:
    """Every key assumed real, so every key tile runs the main loop (whole tiles of real keys);
    Q, K, V read once, O written once; the issue bound from the main loop's instructions per
    iteration."""
    key_tiles = math.ceil(SEQ / report["block_n"])
    programs = BATCH * HEADS * math.ceil(SEQ / report["block_m"])
    warp_instructions = programs * key_tiles * report["sass"]["loop"]["size"] * report["num_warps"]
    slots = SMS * report["ctas_per_sm"]
    estimate = Estimate(
        op=f"attention {BATCH}x{HEADS}x{SEQ}x{SEQ}x{HEAD_DIM} masked",
        config=report["case"],
        flops=4.0 * BATCH * HEADS * SEQ * SEQ * HEAD_DIM,
        bytes=4.0 * TOKENS * HIDDEN * ELEMENT + BATCH * SEQ,
        programs=programs,
        slots=slots,
    )
    issue_rate = SMS * ISSUE_PER_SM_PER_CLOCK * CLOCK_HZ * estimate.wave_efficiency
    estimate.issue_s = warp_instructions / issue_rate
    return estimate


def row_estimate(name: str, report: dict, traffic_elements: float, extra_bytes: float) -> Estimate:
    """A memory-bound row kernel (one program per token row)."""
    return Estimate(
        op=name,
        config=report["case"],
        flops=0.0,
        bytes=traffic_elements * ELEMENT + extra_bytes,
        programs=TOKENS,
        slots=SMS * report["ctas_per_sm"],
    )


# The GEMM config families the report compares: every config, or one kind only.
GEMM_FAMILIES = {
    "every config": lambda case: True,
    "one tile per program only": lambda case: "persistent=" not in case,
    "persistent (TMA) only": lambda case: "persistent=" in case,
}


def estimates(compiled: dict, gemm_family: str = "every config") -> tuple[list[Estimate], Estimate]:
    """The layer's ops (sm_90 reports) and the embeddings, as modelled, the GEMMs' configs
    chosen within ``gemm_family`` (a key of :data:`GEMM_FAMILIES`)."""
    in_family = GEMM_FAMILIES[gemm_family]
    gemm_reports = {
        key: [c[90] for c in cases if 90 in c and in_family(c[90]["case"])]
        for key, cases in compiled["linear"].items()
    }
    qkv, out_proj, ffn1, ffn2 = (
        _assumed(gemm_reports[(g.activation, g.has_residual)], lambda r, g=g: gemm_estimate(g, r))
        for g in GEMMS
    )
    attention = _assumed([c[90] for c in compiled["attention"]], attention_estimate)
    layer_norm = compiled["rows"]["layer_norm"][90]
    ln_elements = 3 * TOKENS * HIDDEN + 2 * HIDDEN  # x, residual, out; weight, bias
    ln1 = row_estimate("LayerNorm 1 (+ residual)", layer_norm, ln_elements, 0)
    ln2 = row_estimate("LayerNorm 2 (+ residual)", layer_norm, ln_elements, 0)
    layer = [qkv, attention, out_proj, ln1, ffn1, ffn2, ln2]  # launch order
    embed_elements = 3 * TOKENS * HIDDEN + TOKENS * HIDDEN + 2 * HIDDEN  # 3 gathers, out, LN
    embeddings = row_estimate(
        "embeddings + LayerNorm",
        compiled["rows"]["embeddings"][90],
        embed_elements,
        2 * TOKENS * 8,  # int64 input and token-type ids
    )
    return layer, embeddings


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.1f}"


def _model_rows(layer: list[Estimate], embeddings: Estimate) -> list[str]:
    head = (
        "| op | assumed config | programs | CTA slots (132 x CTAs/SM) | waves | wave eff. | "
        "GFLOP | MB | compute us | memory us | L2 feed us | issue us | exposed us | "
        "modelled us | bound |"
    )
    rows = [head, "|" + "---|" * 15]
    for e in [*layer, embeddings]:
        bound = max(e.bounds, key=e.bounds.get) + (" + exposed" if e.exposed_s else "")
        rows.append(
            f"| {e.op} | {e.config} | {e.programs} | {e.slots} | {e.waves} | "
            f"{e.wave_efficiency:.1%} | {e.flops / 1e9:.2f} | {e.bytes / 1e6:.1f} | "
            f"{_us(e.compute_s)} | {_us(e.memory_s)} | {_us(e.feed_s)} | {_us(e.issue_s)} | "
            f"{_us(e.exposed_s)} | {_us(e.modelled_s)} | {bound} |"
        )
    return rows


def _versions() -> str:
    import torch
    import triton

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    return (
        f"triton {triton.__version__}, torch {torch.__version__}, git commit {commit} "
        f"(the tree the report was generated from), {datetime.date.today().isoformat()}"
    )


ASSUMPTIONS = f"""\
Assumptions of the model (each one an assumption, none measured):

- H100 SXM: {SMS} SMs, {PEAK_FLOPS / 1e12:.0f} TFLOP/s dense fp16 achievable by a full wave of
  tensor-core tiles (what cuBLAS reaches; the per-tile efficiency of the Triton kernel is
  assumed equal to it), {HBM_BYTES_PER_S / 1e12:.1f} TB/s HBM, {CLOCK_HZ / 1e9:.3f} GHz
  sustained clock, {ISSUE_PER_SM_PER_CLOCK} warp instructions issued per SM per clock.
- The autotuner is assumed to pick, among the configs `keep` lets it time for the launch, the
  one this model rates fastest (then the fewest issue slots, then the largest tile). The
  tables below list every kept config, so other choices can be read off.
- L2 feed (GEMMs): each output tile loads its BLOCK_M x K and BLOCK_N x K operand panels
  from L2, {L2_BYTES_PER_CLOCK} B per clock for the whole chip ({L2_BYTES_PER_S / 1e12:.1f} TB/s
  at the assumed clock: A100's published L2 read bandwidth per clock, assumed unchanged on
  H100, for which NVIDIA publishes none). This is the bound that makes small tiles slow: a
  64 x 128 tile loads 1.5x the bytes per FLOP of a 128 x 128 one, 2x those of 128 x 256.
- Epilogue (GEMMs): the SASS instructions outside the main loop (address set-up, bias,
  activation, residual, stores) run once per output tile, issued at 4 warp instructions per SM
  per clock. At one CTA per SM nothing overlaps them: their time is added to the op's
  (`exposed`); at two or more, the other CTAs' main loops run meanwhile, and they are one more
  bound (`issue`). The persistent configs are modelled the same way (no overlap of a tile's
  epilogue with the next tile's loads: their tile loop is not flattened).
- Waves: programs (output tiles, or query blocks x heads x batch) fill 132 SMs x the CTAs per SM
  the compiled registers, shared memory and threads allow (the sm_90 limits: 64K registers,
  228 KB shared memory with 1 KB reserved per CTA, 2048 threads, 32 CTAs). A partial last wave
  costs a full wave: compute time = FLOPs / (800 TFLOP/s x wave efficiency), wave efficiency =
  programs / (waves x slots).
- Memory time = bytes / 3.0 TB/s, each tensor read or written once (re-reads of the weight or
  of K/V across programs assumed to hit L2).
- Attention: all 128 keys of every row are assumed real, so every key tile runs the main loop
  (whole tiles of real keys, no masking). In a padded batch each row's whole tiles run that
  loop, at most one partial tile runs the bounded loop (the second of `MMA loops` in the
  attention tables) and the keys after the last real one are skipped; a mask that is not a
  prefix of real keys runs the masked loop (the third) from its first masked key on. The scan
  of the mask row before the loop is not modelled. Attention has a third bound, instruction
  issue: main-loop instructions per thread x warps x iterations x programs, over 132 x 4 issue
  slots per clock at the assumed clock, divided by the wave efficiency. The softmax's MUFU
  and FP32 work sit inside that count.
- LayerNorm and embeddings are memory-bound row kernels: memory time only.
- Modelled time of an op = the largest of its bounds, plus its exposed epilogue; per layer =
  the sum over its seven launches (launch gaps, which CUDA graphs remove, are not modelled).
- Not modelled: TMA's saving of address instructions and registers (the GEMM main loop is
  never the issue bound here), the pipeline's fill at each tile's start, L2 misses on the
  re-read operands, clusters and TMA multicast (not used).

The compiler facts in the tables below are what tests/test_compile.py checks in CI (HGMMA on
sm_90 for 16-bit tiles of BLOCK_M >= 64, no spills in 16-bit, the attention main loop within
its instruction budget); the model is not checked.
"""


def _family_rows(compiled: dict) -> list[str]:
    """Modelled per layer with the GEMMs' configs chosen within each family."""
    rows = [
        "| GEMM configs the model may choose | QKV | attn. output | FFN1 | FFN2 | per layer |",
        "|---|---|---|---|---|---|",
    ]
    for family in GEMM_FAMILIES:
        layer, _ = estimates(compiled, family)
        gemms = [layer[i] for i in (0, 2, 4, 5)]
        cells = " | ".join(f"{_us(e.modelled_s)} us ({e.wave_efficiency:.0%})" for e in gemms)
        total = sum(e.modelled_s for e in layer)
        rows.append(f"| {family} | {cells} | {_us(total)} us |")
    return rows


WINDOW_TEXT = """\
A local layer attends |i - j| <= {window} (local_attention {width}). Its kernels loop `for start
in range(lo, hi, TILE)` with `lo, hi = window_keys(first row, window, end, BLOCK, TILE)`
(fastbert/kernels/attention_tiles.py; the forward's `_attend_rows` in
fastbert/kernels/flash_attention.py, the dK / dV and dQ passes in
fastbert/kernels/flash_attention_backward.py), `window` a runtime int32 argument. The tiles
outside [lo, hi) are never loaded; those inside mask |i - j| > window score by score. The counts
below are that arithmetic (`window_key_range`, the host twin of `window_keys`, checked against
it in tests/test_sass_report.py) for every fp16 D=64 config `keep` lets the autotuner time,
against the dense loop, which visits every tile of the sequence (the global layers, no padding).
`block`: the rows of one program (queries; keys in the dK / dV pass); `tile`: the step of its
loop; `in window`: of the scores the visited tiles compute, the fraction within the window (the
others are masked). Counts of the kernels' own bounds, not a timing.
"""

LOOP_READS_TEXT = f"""\
That the window bounds the loop in the code that runs: in the PTX of each rotary case (sm_90),
for each innermost loop holding an MMA (in address order, as `MMA loops` counts them in the
SASS), whether its exit test has a data path from the `{WINDOW_ARG}` argument and, as a
control, from `{CONTROL_ARG}` (it only addresses rows). tests/ptx_flow.py follows register data
flow to a fixed point (not through memory nor branches: a "no" is no proof). The forward's
window variant has one such loop where the other variants have three (whole tiles, a bounded
tile, masked tiles); the backward passes nest it in their grid-stride loop over blocks, bounded
by the sequence length. The global layers' kernels (no window=1) are compiled with the window
off.
"""


def _is_window(report: dict) -> bool:
    return "window=1" in report["case"]


def _reads(flags: list[bool]) -> str:
    return " / ".join("yes" if f else "no" for f in flags) or "no MMA loop"


def window_section(
    reports: list[dict], window: int, seqs: tuple[int, ...] = WINDOW_SEQS
) -> list[str]:
    """The sliding window's visited tiles per loop config and sequence length, then what the
    PTX says of each rotary attention case's MMA loops (``reports``: their sm_90 reports,
    with ``loop_reads``)."""
    lines = [
        "## ModernBERT-base's sliding window: tiles the loop visits against the dense loop",
        "",
        WINDOW_TEXT.format(window=window, width=2 * window),
        "| kernel | block x tile | seq | tiles per program (min-max) | visited | dense | "
        "skipped | in window |",
        "|---|---|---|---|---|---|---|---|",
    ]
    window_reports = [r for r in reports if _is_window(r) and "error" not in r]
    seen = set()
    for r in window_reports:
        kernel = r["case"].split("[", 1)[0]
        key = (kernel, r["block_m"], r["block_n"])
        if key in seen:
            continue
        seen.add(key)
        for seq in seqs:
            tiles = WindowTiles(seq, r["block_m"], r["block_n"], window)
            per_block = tiles.per_block()
            lines.append(
                f"| {kernel} | {r['block_m']} x {r['block_n']} | {seq} | "
                f"{min(per_block)}-{max(per_block)} | {sum(per_block)} | {tiles.dense} | "
                f"{tiles.skipped:.1%} | {tiles.in_window():.1%} |"
            )
    lines += [
        "",
        LOOP_READS_TEXT,
        f"| case | MMA loops (SASS) | exit test reads `{WINDOW_ARG}` | exit test reads "
        f"`{CONTROL_ARG}` |",
        "|---|---|---|---|",
    ]
    for r in reports:
        if "error" in r or "loop_reads" not in r:
            continue
        reads = r["loop_reads"]
        lines.append(
            f"| {r['case']} | {len(r['sass']['mma_loop_sizes'])} | {_reads(reads[WINDOW_ARG])} | "
            f"{_reads(reads[CONTROL_ARG])} |"
        )
    return lines


def _modernbert_rows(compiled: dict, arch: int) -> list[str]:
    """ModernBERT-base's kernel variants on ``arch``: compiler facts and main-loop mixes."""
    sections = (
        (
            "attention",
            "attention (fp16, D=64, key-padding mask, rotary positions: the global layers, and "
            "with window=1 the local layers' sliding window), every config kept for rotary",
            {"normalise": True},
        ),
        (
            "attention_backward",
            "attention backward, dK / dV and dQ passes (fp16, D=64, key-padding mask, no "
            "dropout, rotary positions, with window=1 the sliding window), every config kept "
            "for rotary",
            {"normalise": False},
        ),
        (
            "linear_gated",
            f"GeGLU input projection (linear GATED, fp16, exact GELU, no bias, M = {TOKENS}), "
            "every one-tile-per-program config kept for it",
            {"normalise": False, "gemm": True},
        ),
    )
    lines = []
    for name, title, columns in sections:
        reports = [c[arch] for c in compiled.get("modernbert", {}).get(name, []) if arch in c]
        if not reports:
            continue
        lines += [f"## sm_{arch}: ModernBERT-base {title}", ""]
        lines += _config_rows(reports, **columns) + [""]
        lines += ["Main-loop instruction mix (per thread per iteration):", ""]
        lines += _mix_rows(reports) + [""]
    return lines


def render(compiled: dict) -> str:
    layer, embeddings = estimates(compiled)
    per_layer = sum(e.modelled_s for e in layer)
    flops = sum(e.flops for e in layer)
    lines = [
        "# Static performance report: BERT-base, fp16, batch 32 x sequence 128 (and "
        "ModernBERT-base's kernel variants)",
        "",
        "**This is compiler output plus a model, not a measurement.** The first part is read from",
        "the SASS that ptxas produced for sm_90 and sm_80 (no GPU was used); the second part is a",
        "roofline model with wave quantisation built on those facts, with its assumptions stated.",
        "",
        f"Generated by `python -m tests.sass_report --out benchmarks/results/static-sm90.md` "
        f"({_versions()}).",
        "",
        f"Shapes: M = {TOKENS} tokens, hidden {HIDDEN}, {HEADS} heads x {HEAD_DIM}, "
        f"intermediate {INTERMEDIATE}.",
        "",
        "ModernBERT-base's kernel variants (attention with rotary positions, alone for the",
        "global layers and with the sliding window for the local ones, forward and both",
        "backward passes; the GeGLU input projection) follow each target's BERT tables, with",
        "the same columns; the sliding window's visited tiles close the sm_90 part. The",
        "roofline model covers BERT-base only.",
        "",
        "Columns: registers per thread; spills as STL / LDL instructions in the SASS and the",
        "bytes ptxas reports; shared memory per CTA; resident CTAs per SM from registers, shared",
        "memory and threads; MMA opcodes with their shapes and counts in the whole kernel",
        "(HGMMA = Hopper's warpgroup MMA, HMMA = Ampere's; IGMMA and IMMA their int8 forms,",
        "the integer tensor cores of linear_int8; QGMMA the float8 e4m3 warpgroup MMA of",
        "linear_fp8); UTMALDG (TMA) / LDGSTS (cp.async)",
        "counts; global load opcodes (the suffix is the width per thread: .128 = 16 bytes); the",
        "main loop's instructions per thread per iteration (the innermost backward branch whose",
        "body holds the MMAs, NOPs left out). For attention, `per 64x64 tile` = main-loop",
        "instructions x (num_warps / 4) x 4096 / (BLOCK_M x BLOCK_N): issue slots per 64x64 tile",
        "of a 4-warp program; `MMA loops per 64x64 tile`: the same for every innermost loop",
        "holding MMAs, in address order (attention: whole tiles of real keys, a bounded partial",
        "tile, the masked step that reads the mask).",
        "",
        "## Modelled time per op and per layer (H100 SXM, a model)",
        "",
        *_model_rows(layer, embeddings),
        "",
        f"Modelled per layer: **{per_layer * 1e6:.1f} us** ({flops / 1e9:.1f} GFLOP, "
        f"{flops / per_layer / 1e12:.0f} TFLOP/s modelled); 12 layers + embeddings: "
        f"**{(LAYERS * per_layer + embeddings.modelled_s) * 1e3:.3f} ms**.",
        "",
        "The same model with the GEMM configs restricted to one kind (modelled us, wave",
        "efficiency of the chosen tiles):",
        "",
        *_family_rows(compiled),
        "",
        ASSUMPTIONS,
    ]
    for arch in (90, 80):
        lines += [f"## sm_{arch}: attention (fp16, D=64, key-padding mask), every kept config", ""]
        attention = [c[arch] for c in compiled["attention"]]
        lines += _config_rows(attention, normalise=True) + [""]
        lines += ["Main-loop instruction mix (per thread per iteration):", ""]
        lines += _mix_rows(attention) + [""]
        for (activation, _), cases in compiled["linear"].items():
            epilogue = "bias + GELU" if activation else "bias"
            lines += [f"## sm_{arch}: linear, fp16, epilogue {epilogue}, every kept config", ""]
            reports = [c[arch] for c in cases if arch in c]
            lines += _config_rows(reports, normalise=False, gemm=True) + [""]
            lines += ["Main-loop instruction mix (per thread per K step):", ""]
            lines += _mix_rows(reports) + [""]
        for quantize, operands in QUANTIZED_FORMATS.items():
            for (activation, _), cases in compiled.get(f"linear_{quantize}", {}).items():
                reports = [c[arch] for c in cases if arch in c]
                if not reports:
                    continue
                epilogue = "bias + GELU" if activation else "bias"
                lines += [
                    f"## sm_{arch}: linear_{quantize} ({operands}, fp16 output), "
                    f"epilogue dequantise + {epilogue}, every kept config",
                    "",
                ]
                lines += _config_rows(reports, normalise=False, gemm=True) + [""]
                lines += ["Main-loop instruction mix (per thread per K step):", ""]
                lines += _mix_rows(reports) + [""]
        lines += [f"## sm_{arch}: LayerNorm and embeddings (hidden {HIDDEN})", ""]
        rows = [c[arch] for c in compiled["rows"].values()]
        lines += _config_rows(rows, normalise=False) + [""]
        lines += _modernbert_rows(compiled, arch)
        if arch == 90 and "modernbert" in compiled:
            from fastbert.bench.shapes import model_config

            attention = [
                c[90]
                for name in ("attention", "attention_backward")
                for c in compiled["modernbert"][name]
                if 90 in c
            ]
            lines += window_section(attention, model_config(MODERNBERT).window) + [""]
    return "\n".join(lines)


def config_of_case(case: str) -> str:
    """The config name (linear_configs.config_name) inside a forward linear case's name:
    "128x128x64 s4 w8" from "linear[fp16 128x128x64 s4 w8 bias=1 act=0 res=0]"."""
    return case.split(" ", 1)[1].rsplit(" bias=", 1)[0]


def measured_rows(compiled: dict, measured: dict) -> list[str]:
    """Each GEMM config's modelled time against its measured median (gemm-configs.json of
    benchmarks/gemm_configs.py, same shapes), with the model's and the autotuner's picks."""
    by_projection = {r["projection"]: r for r in measured["results"]}
    rows = [
        "| op | config | modelled us | measured us | measured / modelled | picked by |",
        "|---|---|---|---|---|---|",
    ]
    for gemm in GEMMS:
        result = by_projection.get(gemm.name)
        if result is None or (result["m"], result["n"], result["k"]) != (TOKENS, gemm.n, gemm.k):
            continue
        times = {c["config"]: c["median_ms"] * 1e-3 for c in result["configs"]}
        reports = [
            c[90]
            for c in compiled["linear"][(gemm.activation, gemm.has_residual)]
            if 90 in c and "error" not in c[90]
        ]
        model = lambda r, g=gemm: gemm_estimate(g, r)
        modelled_pick = config_of_case(_assumed(reports, model).config)
        for r in reports:
            config = config_of_case(r["case"])
            if config not in times:
                continue
            modelled, seconds = model(r).modelled_s, times[config]
            picks = [
                name
                for name, pick in (
                    ("model", modelled_pick),
                    ("autotuner", result["autotuner_choice"]),
                )
                if pick == config
            ]
            rows.append(
                f"| {gemm.name} | {config} | {_us(modelled)} | {_us(seconds)} | "
                f"{seconds / modelled:.2f} | {', '.join(picks)} |"
            )
    return rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sass_report", description=__doc__)
    parser.add_argument("--out", type=Path, required=True, help="Markdown file to write")
    parser.add_argument(
        "--measured",
        type=Path,
        help="gemm-configs.json of benchmarks/gemm_configs.py (fp16, BERT-base, M = 4096) to "
        "set each GEMM config's measured time beside the model's",
    )
    args = parser.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("the report compiles kernels: run it without TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    measured = None
    if args.measured is not None:
        try:
            measured = json.loads(args.measured.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--measured {args.measured}: {exc}")
    compiled = compile_all((90, 80))
    text = render(compiled)
    if measured is not None:
        device = measured.get("environment", {}).get("gpu", "the GPU")
        text += "\n".join(
            [
                "",
                f"## Measured against modelled: GEMM configs on {device}",
                "",
                f"From {args.measured} (benchmarks/gemm_configs.py, {measured.get('dtype')}).",
                "",
                *measured_rows(compiled, measured),
            ]
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
