"""A test that a benchmark script's command line refuses bad arguments as argparse does: exit
2 and its usage on stderr; the bad model folders the commands that load one refuse."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest


def usage_error_test(
    main: Callable[[list[str]], int], cases: Sequence[list[str]]
) -> Callable[..., None]:
    """A test, parametrised over ``cases`` (each the arguments after ``--out DIR``; an empty
    list means no ``--out`` at all), that ``main`` exits 2 with its usage: assign it to a
    module-level ``test_...`` name."""

    @pytest.mark.parametrize("argv", cases, ids=[" ".join(c) or "no --out" for c in cases])
    def test(tmp_path, argv: list[str], capsys) -> None:
        out = [] if argv == [] else ["--out", str(tmp_path)]
        with pytest.raises(SystemExit) as exit_info:
            main([*out, *argv])
        assert exit_info.value.code == 2
        assert "usage:" in capsys.readouterr().err

    return test


# A model folder a command refuses, by what is wrong with it; each holds a tiny BERT's config.
BAD_MODEL_FOLDERS = ("no weights", "malformed config.json")
TINY_BERT_CONFIG = {
    "model_type": "bert",
    "vocab_size": 50,
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 16,
    "max_position_embeddings": 64,
}


def bad_model_folder(tmp_path: Path, problem: str) -> tuple[Path, str]:
    """(a model folder under ``tmp_path`` with ``problem``, one of BAD_MODEL_FOLDERS; the
    message a command's error line holds for it, as fastbert's loader words it)."""
    folder = tmp_path / "model"
    folder.mkdir()
    config = json.dumps(TINY_BERT_CONFIG)
    if problem == "no weights":
        (folder / "config.json").write_text(config)
        return folder, f"{folder} holds no weights (model.safetensors"
    if problem == "malformed config.json":
        (folder / "config.json").write_text(config[:-1])  # cut short: not valid JSON
        return folder, f"{folder / 'config.json'} is not valid JSON: "
    raise ValueError(f"unknown problem {problem!r}")
