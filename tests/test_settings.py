"""fastbert's environment settings, declared once (fastbert.settings): each reads as its
declaration says (unset or empty: the default; a bad value: an error naming the variable),
every reader in the package goes through the declarations, and `fastbert info` lists them."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from fastbert import settings

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("setting", settings.SETTINGS, ids=lambda s: s.name)
def test_unset_and_empty_mean_the_default(setting) -> None:
    assert setting.read({}) == setting.default
    assert setting.read({setting.name: "  "}) == setting.default


@pytest.mark.parametrize(
    "setting", [s for s in settings.SETTINGS if s.kind == "on/off"], ids=lambda s: s.name
)
def test_on_off_values(setting) -> None:
    for text in ("1", "true", "ON", "yes"):
        assert setting.read({setting.name: text}) is True
    for text in ("0", "False", "off", "no"):
        assert setting.read({setting.name: text}) is False
    with pytest.raises(ValueError, match=setting.name):
        setting.read({setting.name: "maybe"})


def test_a_config_index_is_all_or_a_number() -> None:
    autotune = settings.AUTOTUNE
    assert autotune.read({autotune.name: "all"}) is None
    assert autotune.read({autotune.name: "3"}) == 3
    for text in ("fast", "²", "１"):  # not ASCII digits: "²" failed in int(), "１" read as 1
        with pytest.raises(ValueError, match="FASTBERT_AUTOTUNE"):
            autotune.read({autotune.name: text})


def test_the_cache_is_one_folder_for_every_reader(monkeypatch, tmp_path) -> None:
    from fastbert.kernels import cpu_library

    monkeypatch.setenv("FASTBERT_CACHE", "")  # empty: the default, for every reader
    assert settings.cache_dir() == Path.home() / ".cache" / "fastbert"
    monkeypatch.setenv("FASTBERT_CACHE", str(tmp_path))
    assert settings.cache_dir() == tmp_path
    assert cpu_library.kernels_dir() == tmp_path / "cpu-kernels"


def test_no_reader_of_a_fastbert_variable_outside_the_declarations() -> None:
    """No module of the package (kernels included) reads os.environ / os.getenv with a
    FASTBERT_ name of its own: every reader goes through fastbert.settings."""
    found = []
    for path in REPO.joinpath("fastbert").rglob("*.py"):
        if path.name == "settings.py" and path.parent.name == "fastbert":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith("FASTBERT_") and node.value.isupper():
                    found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value}")
    assert found == []


def test_every_declared_setting_is_documented() -> None:
    page = (REPO / "docs" / "settings.md").read_text()
    assert settings.markdown_table() in page


def test_fastbert_info_lists_the_settings_in_effect() -> None:
    env = {"FASTBERT_KEEP_CPU_MEMORY": "0", "FASTBERT_API_KEY": "s3cret", "PATH": "/usr/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "fastbert.cli", "info"],
        capture_output=True,
        text=True,
        env={**env, "HOME": str(Path.home())},
        cwd=REPO,
        check=True,
    ).stdout
    assert "FASTBERT_CACHE" in out
    assert "(default: all)" in next(row for row in out.splitlines() if "FASTBERT_AUTOTUNE" in row)
    # In the words the variable takes (it printed False).
    assert "FASTBERT_KEEP_CPU_MEMORY  0" in out.splitlines()
    line = next(row for row in out.splitlines() if "FASTBERT_API_KEY" in row)
    assert "(set)" in line and "s3cret" not in line  # a secret is never printed
