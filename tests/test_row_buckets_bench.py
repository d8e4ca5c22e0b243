"""benchmarks/row_buckets.py: its switch turns a dtype's buckets on and off and back, a short
run writes both rows of each precision on texts new to every pass (the figures are the
benchmark's, not a test's), and its usage errors."""

from __future__ import annotations

import json

import torch

from benchmarks import row_buckets
from fastbert.execution import backends, runtime
from tests.cli_usage import usage_error_test


def _filler(dtype: torch.dtype) -> int:
    call = runtime.Call(0.0, 0.0, lambda: False, lambda: None)
    hidden = torch.zeros(20, 8, dtype=dtype)
    return runtime.cpu_filler_rows(backends.get_ops("torch", "cpu"), hidden, call)


def test_the_switch_buckets_a_dtype_or_not_and_restores_the_setting() -> None:
    assert runtime.CPU_BUCKETED_DTYPES == (torch.bfloat16,)
    assert _filler(torch.bfloat16) == 12 and _filler(torch.float32) == 0
    with row_buckets.bucketing(torch.bfloat16, on=False):
        assert _filler(torch.bfloat16) == 0
    with row_buckets.bucketing(torch.float32, on=True):
        assert _filler(torch.float32) == 12 and _filler(torch.bfloat16) == 12
    assert runtime.CPU_BUCKETED_DTYPES == (torch.bfloat16,)


def test_each_pass_meets_texts_cut_anew() -> None:
    texts = ["one two three", "four five six seven"]
    assert row_buckets.cut(texts, 1) == ["two three", "five six seven"]
    assert row_buckets.cut(texts, 3) == ["one two three", "seven"]  # too short: kept whole


def test_a_short_run_writes_both_rows_of_each_precision(tmp_path, monkeypatch) -> None:
    fillers = []
    with_filler = runtime.with_filler

    def counted(hidden, *args):
        fillers.append(hidden.dtype)
        return with_filler(hidden, *args)

    monkeypatch.setattr(runtime, "with_filler", counted)
    out = tmp_path / "results"
    argv = ["--out", str(out), "--docs", "24", "--rounds", "2"]
    assert row_buckets.main([*argv, "--precisions", "bfloat16,float32"]) == 0
    report = json.loads((out / "row-buckets.json").read_text())
    assert report["bucketed_dtypes"] == ["bfloat16"]
    for precision in ("bfloat16", "float32"):
        result = report["results"][precision]
        assert result["speed_up"] > 0
        tokens = [result[row]["tokens"] for row in row_buckets.ROWS]
        # Every pass ran texts cut by more words than the one before it.
        passes = [n for pair in zip(*tokens, strict=True) for n in pair]
        assert passes == sorted(passes, reverse=True) and len(set(passes)) == 4
    # The "buckets" rows of both precisions ran their filler, float32's forced on.
    assert set(fillers) == {torch.bfloat16, torch.float32}
    assert runtime.CPU_BUCKETED_DTYPES == (torch.bfloat16,)
    table = (out / "row-buckets.md").read_text()
    assert "| bfloat16 | buckets |" in table and "| float32 | no buckets |" in table


def test_same_texts_passes_meet_sizes_met_before(tmp_path) -> None:
    out = tmp_path / "results"
    argv = ["--out", str(out), "--docs", "24", "--rounds", "2", "--texts", "same"]
    assert row_buckets.main(argv) == 0
    report = json.loads((out / "row-buckets.json").read_text())
    result = report["results"]["bfloat16"]
    passes = [n for row in row_buckets.ROWS for n in result[row]["tokens"]]
    assert report["texts"] == "same" and len(passes) == 4 and len(set(passes)) == 1
    assert "every pass on the same texts" in (out / "row-buckets.md").read_text()


test_usage_errors_exit_2 = usage_error_test(
    row_buckets.main,
    [["--precisions", "float64"], ["--precisions", ","], ["--rounds", "0"], ["--texts", "old"], []],
)
