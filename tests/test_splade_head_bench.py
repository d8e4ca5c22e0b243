"""benchmarks/splade_head.py end to end on a tiny head (its timings are the benchmark's, not a
test's): both CPU contenders run, agree, and the files are written; and its usage errors."""

from __future__ import annotations

import json

import pytest

from benchmarks import splade_head
from tests.cli_usage import usage_error_test


def test_a_tiny_run_writes_both_files(tmp_path) -> None:
    pytest.importorskip("sentence_transformers")
    out = tmp_path / "results"
    argv = ["--out", str(out), "--sequences", "3", "--length", "5", "--hidden", "16"]
    assert splade_head.main([*argv, "--vocab", "97", "--rounds", "2", "--log-steps", "2"]) == 0
    report = json.loads((out / "splade-head.json").read_text())
    assert report["shape"]["log_steps"] == 2
    assert report["logits_bytes"] == 3 * 5 * 97 * 4
    contenders = report["contenders"]
    assert list(contenders) == ["unfused", "torch"]
    for result in contenders.values():
        assert len(result["seconds"]) == 2
        assert result["peak_bytes"] >= 0
        assert result["max_abs_difference"] < 1e-5
    table = (out / "splade-head.md").read_text()
    assert "| unfused |" in table and "| torch |" in table
    assert "vocabulary 97, float32, cpu" in table


test_usage_errors_exit_2 = usage_error_test(
    splade_head.main,
    [
        ["--rounds", "0"],
        ["--vocab", "0"],
        ["--dtype", "float64"],
        ["--log-steps", "3"],
        ["--device", "tpu"],
        [],  # no --out
    ],
)
