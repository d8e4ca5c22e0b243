"""benchmarks/int8_onednn.py end to end on small shapes (its timings are the benchmark's, not a
test's): every contender runs, the per-token oneDNN path keeps fastbert's int8 numerics, the
files are written; and its usage errors."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import int8_onednn
from fastbert.kernels.cpu_library import has_int8_dot_products
from tests.cli_usage import usage_error_test

# oneDNN's int8 product is exact on a CPU with an int8 dot-product instruction (VNNI, AMX);
# without one (AVX2 only) it sums pairs of u8 x s8 products in 16 bits, which saturate.
ONEDNN_INT8_EXACT = has_int8_dot_products()


@pytest.mark.skipif(
    not hasattr(torch.ops.onednn, "qlinear_pointwise"),
    reason="this PyTorch build has no oneDNN quantised linear",
)
def test_a_short_run_writes_both_files(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(int8_onednn, "TOKENS", (16, 130))  # 130: the engine's oneDNN rows
    out = tmp_path / "results"
    argv = ["--out", str(out), "--rounds", "7", "--threads", "1", "--stem", "small"]
    assert int8_onednn.main(argv) == 0
    report = json.loads((out / "small.json").read_text())
    assert len(report["rows"]) == len(int8_onednn.SHAPES) * 2
    for row in report["rows"]:
        assert all(len(seconds) == 7 for seconds in row["seconds"].values())
        errors = row["accuracy"]
        # The same integers and scales as the reference: float32 rounding only.
        same_numerics = [name for name in row["seconds"] if "int8" in name or "per-token" in name]
        assert len(same_numerics) == 4
        for name in same_numerics:
            if name.startswith("oneDNN") and not ONEDNN_INT8_EXACT:
                # vpmaddubsw's 16-bit pair sums saturate on full-range weights: the report shows it
                assert errors[name]["max_err_vs_int8_reference"] > 1e-3, (row["linear"], name)
                continue
            assert errors[name]["max_err_vs_int8_reference"] < 1e-6, (row["linear"], name)
        # One scale for the whole batch is another quantisation, far coarser on outliers.
        assert errors["oneDNN qlinear, per-tensor x"]["max_err_vs_int8_reference"] > 1e-3
    table = (out / "small.md").read_text()
    assert "| ffn in 384->1536 +GELU | 130 |" in table


test_usage_errors_exit_2 = usage_error_test(int8_onednn.main, [["--rounds", "6"], []])
