"""The GEMM-config benchmark times every kept config of each projection for real (the
interpreter on a CPU) and writes its report."""

from __future__ import annotations

import json
import os

import pytest
import torch

from benchmarks import gemm_configs
from fastbert.kernels import fused_linear, linear_configs
from fastbert.kernels.launch import AUTOTUNE_ENV

SMALL = ["--tokens", "40", "--hidden", "32", "--intermediate", "64", "--warmup", "0", "--reps", "1"]


def test_every_kept_config_of_every_projection_is_timed(tmp_path) -> None:
    pinned_before = os.environ.get(AUTOTUNE_ENV)
    assert gemm_configs.main(["--out", str(tmp_path), *SMALL]) == 0
    assert os.environ.get(AUTOTUNE_ENV) == pinned_before
    payload = json.loads((tmp_path / "results.json").read_text())
    results = payload["results"]
    assert [r["projection"] for r in results] == [
        "QKV projection",
        "attention output",
        "FFN1 + GELU",
        "FFN2",
    ]
    assert [(r["n"], r["k"]) for r in results] == [(96, 32), (32, 32), (64, 32), (32, 64)]
    for r in results:
        x = torch.empty(r["m"], r["k"], dtype=torch.float16)
        weight = torch.empty(r["n"], r["k"], dtype=torch.float16)
        expected = [
            linear_configs.config_name(c)
            for c in fused_linear.kept_configs(x, weight, r["activation"])
        ]
        assert [c["config"] for c in r["configs"]] == expected
        assert any("persistent=" in name for name in expected)
        assert all(c["median_ms"] > 0 and c["tflops"] > 0 for c in r["configs"])
        assert r["autotuner_choice"] in expected
    text = (tmp_path / "results.md").read_text()
    assert "## FFN1 + GELU 40x64x32 + gelu" in text and "| yes |" in text


@pytest.mark.parametrize("bad", [["--reps", "0"], ["--tokens", "-1"], ["--dtype", "fp8"]])
def test_usage_errors_exit_2(tmp_path, bad) -> None:
    with pytest.raises(SystemExit) as exit_info:
        gemm_configs.main(["--out", str(tmp_path), *bad])
    assert exit_info.value.code == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_without_a_gpu_or_the_interpreter_it_says_so(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    assert gemm_configs.main(["--out", str(tmp_path), *SMALL]) == 2
    assert "TRITON_INTERPRET=1" in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()
