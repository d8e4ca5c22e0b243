"""The static report's model (tests/sass_report.py) against hand arithmetic, on made-up
compiler facts: wave quantisation, the L2 feed bound, and the epilogue exposed at one CTA per
SM but overlapped at two."""

from __future__ import annotations

import pytest

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
