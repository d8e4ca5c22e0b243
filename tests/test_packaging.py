"""pyproject.toml installs every package in the tree (an editable install hides a missing one)."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "fastbert").rglob("__init__.py")
    }
    found.add("fastbert.kernels")  # kernels/ is installed under fastbert (see package-dir)
    assert found == listed, f"pyproject lists {sorted(listed)}, the tree has {sorted(found)}"
    assert config["package-dir"]["fastbert.kernels"] == "kernels"
