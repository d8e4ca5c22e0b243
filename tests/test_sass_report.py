"""The static report's model (tests/sass_report.py) against hand arithmetic, on made-up
compiler facts: wave quantisation, the L2 feed bound, and the epilogue exposed at one CTA per
SM but overlapped at two; the sliding window's section: the host twin of the kernels'
window_keys against the jit function, its tile counts by hand, the rendered rows, and the
ModernBERT-base cases it compiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

from fastbert.kernels.attention_tiles import window_key_range, window_keys
from tests import sass_report as S


def _report(block_m: int, block_n: int, ctas_per_sm: int, outside: int = 100) -> dict:
    """Compiler facts of a GEMM config: a main loop of 90 instructions per thread and
    ``outside`` instructions per thread outside it, 8 warps."""
    return {
        "case": f"linear[{block_m}x{block_n}]",
        "block_m": block_m,
        "block_n": block_n,
        "num_warps": 8,
        "ctas_per_sm": ctas_per_sm,
        "sass": {"instructions": 90 + outside, "loop": {"size": 90}},
    }


FFN2 = S.Gemm("FFN2", S.HIDDEN, S.INTERMEDIATE, 0)


def test_wave_quantisation_of_bert_base_n768() -> None:
    """4096 x 768 in 128 x 256 tiles: 96 tiles on 132 SMs, one wave 72.7% full; in 64 x 128
    tiles at two CTAs per SM: 384 tiles, two waves of 264, 72.7% too; at one CTA per SM three
    waves of 132, 97.0%."""
    big = S.gemm_estimate(FFN2, _report(128, 256, 1))
    assert (big.programs, big.waves) == (96, 1)
    assert big.wave_efficiency == pytest.approx(96 / 132)
    small = S.gemm_estimate(FFN2, _report(64, 128, 2))
    assert (small.programs, small.slots, small.waves) == (384, 264, 2)
    assert small.wave_efficiency == pytest.approx(384 / 528)
    assert S.gemm_estimate(FFN2, _report(64, 128, 1)).wave_efficiency == pytest.approx(384 / 396)
    assert big.compute_s == pytest.approx(2 * 4096 * 768 * 3072 / (S.PEAK_FLOPS * 96 / 132))


def test_l2_feed_counts_each_tiles_operand_panels() -> None:
    """Every output tile loads BLOCK_M x K of x and BLOCK_N x K of the weight."""
    for bm, bn in ((128, 256), (128, 128), (64, 128)):
        e = S.gemm_estimate(FFN2, _report(bm, bn, 1))
        tiles = (4096 // bm) * (768 // bn)
        assert e.feed_bytes == tiles * 3072 * (bm + bn) * 2
        assert e.feed_s == pytest.approx(e.feed_bytes / (S.L2_BYTES_PER_CLOCK * S.CLOCK_HZ))
    # Same FLOPs, smaller tiles: more bytes from L2 per FLOP.
    feeds = [
        S.gemm_estimate(FFN2, _report(bm, bn, 1)).feed_bytes
        for bm, bn in ((128, 256), (128, 128), (64, 128))
    ]
    assert feeds == sorted(feeds)
    assert feeds[2] / feeds[1] == pytest.approx(1.5)


def test_epilogue_is_exposed_only_at_one_cta_per_sm() -> None:
    alone = S.gemm_estimate(FFN2, _report(128, 128, 1, outside=2000))
    shared = S.gemm_estimate(FFN2, _report(128, 128, 2, outside=2000))
    assert alone.exposed_s > 0 and alone.issue_s == 0
    assert shared.exposed_s == 0 and shared.issue_s > 0
    assert alone.modelled_s == pytest.approx(max(alone.bounds.values()) + alone.exposed_s)
    assert shared.modelled_s == pytest.approx(max(shared.bounds.values()))
    # 192 tiles x 2000 instructions x 8 warps at 4 per SM per clock on 132 SMs, one wave
    # 192 / 264 full at two CTAs per SM.
    expected = 192 * 2000 * 8 / (132 * 4 * S.CLOCK_HZ * (192 / 264))
    assert shared.issue_s == pytest.approx(expected)


def test_the_assumed_config_is_the_fastest_modelled() -> None:
    reports = [_report(128, 256, 1), _report(128, 128, 2, outside=5000), _report(64, 128, 3)]
    chosen = S._assumed(reports, lambda r: S.gemm_estimate(FFN2, r))
    times = {r["case"]: S.gemm_estimate(FFN2, r).modelled_s for r in reports}
    assert chosen.config == min(times, key=times.get)


def test_config_of_case_reads_the_config_name() -> None:
    assert S.config_of_case("linear[fp16 128x128x64 s4 w8 bias=1 act=0 res=0]") == (
        "128x128x64 s4 w8"
    )
    assert S.config_of_case("linear[fp16 64x128x64 s4 w4 persistent=2 bias=1 act=1 res=0]") == (
        "64x128x64 s4 w4 persistent=2"
    )


def test_measured_rows_set_each_config_beside_its_model() -> None:
    def report(bm, bn, ctas, name):
        r = _report(bm, bn, ctas)
        r["case"] = f"linear[fp16 {name} bias=1 act=0 res=0]"
        return {90: r}

    compiled = {
        "linear": {
            (0, False): [
                report(128, 256, 1, "128x256x64 s3 w8"),
                report(128, 128, 2, "128x128x32 s4 w8"),
            ],
            (1, False): [report(128, 128, 2, "128x128x32 s4 w8")],
        }
    }
    measured = {
        "results": [
            {
                "projection": "FFN2",
                "m": 4096,
                "n": 768,
                "k": 3072,
                "activation": None,
                "autotuner_choice": "128x256x64 s3 w8",
                "configs": [
                    {"config": "128x256x64 s3 w8", "median_ms": 0.05},
                    {"config": "128x128x32 s4 w8", "median_ms": 0.04},
                ],
            }
        ]
    }
    rows = S.measured_rows(compiled, measured)
    body = [row for row in rows[2:] if row.startswith("| FFN2 |")]
    assert len(body) == 2 and len(rows) == 4  # QKV / attention output were not measured
    modelled = S.gemm_estimate(FFN2, compiled["linear"][(0, False)][0][90]).modelled_s
    assert f"| 50.0 | {50e-6 / modelled:.2f} |" in body[0]
    assert "autotuner" in body[0] and "autotuner" not in body[1]


@pytest.mark.parametrize("quantize, code", [("int8", 1), ("fp8", 2)])
def test_the_report_holds_quantized_linears_of_each_bert_epilogue(quantize, code) -> None:
    cases = S.quantized_linear_cases(quantize)
    assert set(cases) == {(g.activation, g.has_residual) for g in S.GEMMS}
    for kept in cases.values():
        assert kept and all(c.dtype == quantize and c.constexprs["QUANT"] == code for c in kept)
        assert all(not c.constexprs["PERSISTENT"] for c in kept)
    if quantize == "fp8":  # no e4m3 tensor cores before sm_89
        assert all(c.archs == (90,) for kept in cases.values() for c in kept)


@triton.jit
def _window_bounds(first_ptr, out_ptr, window, end, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Stores (lo, hi) of window_keys for each first query of ``first_ptr``."""
    i = tl.program_id(0)
    lo, hi = window_keys(tl.load(first_ptr + i), window, end, BLOCK_M, BLOCK_N)
    tl.store(out_ptr + 2 * i, lo)
    tl.store(out_ptr + 2 * i + 1, hi)


def test_window_key_range_is_the_kernels_window_keys() -> None:
    """The host twin against the jit function the kernels call, run by the interpreter."""
    firsts = torch.arange(0, 600, 16, dtype=torch.int32)
    for window, end, block_m, block_n in ((64, 512, 64, 32), (64, 300, 128, 32), (5, 80, 16, 64)):
        out = torch.empty(2 * len(firsts), dtype=torch.int32)
        _window_bounds[(len(firsts),)](firsts, out, window, end, block_m, block_n)
        expected = [window_key_range(int(f), window, end, block_m, block_n) for f in firsts]
        assert [tuple(pair) for pair in out.view(-1, 2).tolist()] == expected


def test_window_tiles_of_a_512_sequence_by_hand() -> None:
    """Window 64, 64-query blocks, 32-key tiles: the first and last blocks visit 4 tiles (keys
    0..127 and 384..511), the six others 6; the dense loop 8 x 16 = 128."""
    tiles = S.WindowTiles(512, 64, 32, 64)
    assert tiles.ranges()[:3] == [(0, 128), (0, 192), (64, 256)]
    assert tiles.per_block() == [4, 6, 6, 6, 6, 6, 6, 4]
    assert tiles.dense == 128 and tiles.skipped == pytest.approx(1 - 44 / 128)
    # 512 x 129 pairs within 64 of each other less the 2 x (64 + 63 + ... + 1) cut at the ends,
    # over 64 rows x (128 + 6 x 192 + 128) keys computed.
    inside = 512 * 129 - 2 * (64 * 65 // 2)
    assert tiles.in_window() == pytest.approx(inside / (64 * (128 + 6 * 192 + 128)))
    # A window wider than the sequence skips nothing.
    assert S.WindowTiles(128, 64, 32, 512).skipped == 0.0


def _attention_report(case: str, block_m: int, block_n: int, reads: list[bool]) -> dict:
    return {
        "case": case,
        "block_m": block_m,
        "block_n": block_n,
        "sass": {"mma_loop_sizes": [100] * len(reads)},
        "loop_reads": {S.WINDOW_ARG: reads, S.CONTROL_ARG: [False] * len(reads)},
    }


def test_window_section_lists_tiles_and_loop_reads() -> None:
    reports = [
        _attention_report("attention[fp16 64x32 rotary=1 window=1]", 64, 32, [True]),
        _attention_report("attention[fp16 128x32 rotary=1 window=1]", 128, 32, [True]),
        _attention_report("attention[fp16 64x32 rotary=1]", 64, 32, [False] * 3),
        _attention_report("attention_bwd_dkdv[fp16 16x64 rotary=1 window=1]", 64, 16, [True]),
    ]
    lines = S.window_section(reports, 64, seqs=(512, 8192))
    text = "\n".join(lines)
    assert lines[0].startswith("## ModernBERT-base's sliding window")
    assert "| attention | 64 x 32 | 512 | 4-6 | 44 | 128 | 65.6% | 68.7% |" in lines
    assert "| attention | 128 x 32 | 512 | 6-8 | 28 | 64 | 56.2% |" in text
    assert "| attention_bwd_dkdv | 64 x 16 | 8192 | 8-12 | 1528 | 65536 | 97.7% |" in text
    assert "| attention[fp16 64x32 rotary=1 window=1] | 1 | yes | no |" in lines
    assert "| attention[fp16 64x32 rotary=1] | 3 | no / no / no | no / no / no |" in lines
    # Only the window variants get tile rows: 3 kernels x 2 lengths.
    assert sum(line.count(" | 512 | ") + line.count(" | 8192 | ") for line in lines) == 6


# The case modules list autotune configs as compiled (not as the interpreter sees them): read
# the cases in a process without TRITON_INTERPRET.
_CASES_SUMMARY = """
import json
from tests import sass_report as S
keys = ("ROTARY", "WINDOW", "HEAD_DIM", "HAS_MASK", "HAS_DROPOUT", "DKDV", "GATED",
        "ACTIVATION", "HAS_BIAS", "PERSISTENT")
print(json.dumps({
    group: [dict(name=c.name, dtype=c.dtype, **{k: c.constexprs[k] for k in keys
                                                 if k in c.constexprs}) for c in cases]
    for group, cases in S.modernbert_cases().items()
}))
"""


def test_modernbert_cases_cover_its_variants() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(
        [sys.executable, "-c", _CASES_SUMMARY], cwd=root, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    cases = json.loads(proc.stdout.strip().splitlines()[-1])
    forward, backward, gated = (
        cases["attention"],
        cases["attention_backward"],
        cases["linear_gated"],
    )
    assert forward and backward and gated
    for group in (forward, backward):
        assert all(c["ROTARY"] and c["HEAD_DIM"] == 64 for c in group)
        assert {bool(c["WINDOW"]) for c in group} == {False, True}
        assert all(c["dtype"] == "fp16" and c["HAS_MASK"] for c in group)
        assert all(("window=1" in c["name"]) == bool(c["WINDOW"]) for c in group)
    assert {bool(c["DKDV"]) for c in backward} == {False, True}
    assert all(not c["HAS_DROPOUT"] for c in backward)
    for c in gated:
        assert c["GATED"] and c["ACTIVATION"] == S.GELU
        assert not c["HAS_BIAS"] and not c["PERSISTENT"]
