"""The training examples run end to end (short runs) and keep to the CLI conventions."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pretrain_example_learns(capsys) -> None:
    assert (
        _load("pretrain").main(["--steps", "40", "--batch-size", "16", "--backend", "torch"]) == 0
    )
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    first, last = map(float, re.search(r"loss ([\d.]+) -> ([\d.]+)", summary).groups())
    assert last < first


def test_finetune_example_trains_and_saves(tmp_path, capsys) -> None:
    pytest.importorskip("accelerate")
    out = tmp_path / "model"
    assert (
        _load("finetune_classifier").main(
            ["--epochs", "1", "--train-size", "64", "--backend", "torch", "--output-dir", str(out)]
        )
        == 0
    )
    assert re.search(r"trained 2 steps.*saved to", capsys.readouterr().out)
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()


@pytest.mark.slow
def test_finetune_example_on_ray_trains_as_hugging_faces_own_model(tmp_path, capsys) -> None:
    """Two Ray Train workers run the Trainer data-parallel (a local Ray instance): the
    optimized model's losses and trained weights are Hugging Face's own model's (dropout off:
    fastbert draws its own masks)."""
    pytest.importorskip("accelerate")
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.train")
    import torch
    from safetensors.torch import load_file

    example = _load("finetune_classifier")
    arguments = ["--ray", "--workers", "2", "--epochs", "2", "--train-size", "128"]
    arguments += ["--dropout", "0", "--backend", "torch"]
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        runs = {}
        for name, extra in (("fastbert", []), ("plain", ["--plain"])):
            out = tmp_path / name
            assert example.main([*arguments, *extra, "--output-dir", str(out)]) == 0
            line = capsys.readouterr().out.strip().splitlines()[-1]
            loss = float(re.search(r"trained 4 steps, final train loss ([\d.]+)", line).group(1))
            runs[name] = loss, load_file(out / "model.safetensors")
    finally:
        ray.shutdown()
    (loss, weights), (plain_loss, plain_weights) = runs["fastbert"], runs["plain"]
    assert loss == pytest.approx(plain_loss, abs=1e-3)
    assert weights.keys() == plain_weights.keys()
    for name, value in weights.items():
        torch.testing.assert_close(value, plain_weights[name], atol=1e-4, rtol=1e-3, msg=name)


@pytest.mark.parametrize(
    "name, bad",
    [
        ("pretrain", ["--steps", "0"]),
        ("pretrain", ["--lr", "-1"]),
        ("pretrain", ["--lr", "nan"]),
        ("finetune_classifier", ["--epochs", "0"]),
        ("finetune_classifier", ["--epochs", "nan"]),
        ("finetune_classifier", ["--workers", "0"]),
        ("finetune_classifier", ["--dropout", "1"]),
    ],
)
def test_examples_reject_bad_arguments_with_usage_errors(name, bad) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _load(name).main(bad)
    assert exit_info.value.code == 2
