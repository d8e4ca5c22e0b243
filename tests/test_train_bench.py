"""The training-step benchmark runs its contenders for real and writes its report."""

from __future__ import annotations

import json

import pytest

from benchmarks import train_step


def test_train_step_benchmark_writes_results(tmp_path) -> None:
    out = tmp_path / "train"
    assert (
        train_step.main(
            [
                "--out",
                str(out),
                "--model",
                "bert-tiny",
                "--shapes",
                "2x16p",
                "--contenders",
                "hf-sdpa,fastbert",
                "--warmup",
                "0",
                "--reps",
                "1",
            ]
        )
        == 0
    )
    payload = json.loads((out / "results.json").read_text())
    (row,) = payload["rows"]
    assert row["errors"] == {} and set(row["results"]) == {"hf-sdpa", "fastbert"}
    assert all(r["timing"]["median_ms"] > 0 for r in row["results"].values())
    assert set(row["first_step_s"]) == {"hf-sdpa", "fastbert"}
    assert "| 2x16 padded |" in (out / "results.md").read_text()


def test_profile_says_where_each_step_goes(tmp_path) -> None:
    """--profile: each contender's host time per step and PyTorch's profiler table (on CUDA
    also its kernel time and synchronisations, which a CPU has none of)."""
    out = tmp_path / "train"
    argv = ["--out", str(out), "--model", "bert-tiny", "--shapes", "2x16p", "--reps", "1"]
    assert (
        train_step.main(argv + ["--contenders", "hf-sdpa,fastbert", "--warmup", "0", "--profile"])
        == 0
    )
    (row,) = json.loads((out / "results.json").read_text())["rows"]
    for name in ("hf-sdpa", "fastbert"):
        where = row["results"][name]["where"]
        assert where["enqueue_ms"] > 0 and "device_ms" not in where
        table = (out / f"profile-2x16-padded-{name}.txt").read_text()
        assert "Self CPU" in table and "aten::" in table
    text = (out / "results.md").read_text()
    assert "Where a step goes" in text and "- 2x16 padded fastbert: host " in text


def test_an_interrupted_train_step_writes_what_it_measured(tmp_path, monkeypatch) -> None:
    """The GPU run stops a stage at its cap with SIGINT: the first steps done are kept."""
    out = tmp_path / "train"
    built = train_step.build

    def build(name, reference, device):
        if name == "fastbert":
            raise KeyboardInterrupt  # as the cap's SIGINT during fastbert's first step
        return built(name, reference, device)

    monkeypatch.setattr(train_step, "build", build)
    argv = ["--out", str(out), "--model", "bert-tiny", "--shapes", "2x16", "--reps", "1"]
    assert train_step.main(argv + ["--contenders", "hf-sdpa,fastbert", "--warmup", "0"]) == 130
    payload = json.loads((out / "results.json").read_text())
    assert payload["interrupted"] and set(payload["rows"][0]["first_step_s"]) == {"hf-sdpa"}
    assert "interrupted" in (out / "results.md").read_text()


@pytest.mark.parametrize(
    "bad", [["--contenders", "hf-magic"], ["--reps", "0"], ["--shapes", "0x16"]]
)
def test_train_step_benchmark_usage_errors_exit_2(tmp_path, bad) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train_step.main(["--out", str(tmp_path), "--model", "bert-tiny", *bad])
    assert exit_info.value.code == 2
