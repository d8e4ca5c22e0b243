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


@pytest.mark.parametrize(
    "name, bad",
    [
        ("pretrain", ["--steps", "0"]),
        ("pretrain", ["--lr", "-1"]),
        ("pretrain", ["--lr", "nan"]),
        ("finetune_classifier", ["--epochs", "0"]),
        ("finetune_classifier", ["--epochs", "nan"]),
    ],
)
def test_examples_reject_bad_arguments_with_usage_errors(name, bad) -> None:
    with pytest.raises(SystemExit) as exit_info:
        _load(name).main(bad)
    assert exit_info.value.code == 2
