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


HF_PACKAGES = ("transformers", "sentence_transformers")


def _imported_packages(path: Path) -> set[str]:
    """Top-level names of every import statement in a Python file (at any depth)."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_integration_modules_import_hugging_face() -> None:
    """The import rule: kernels/ never, fastbert/ only in hf.py and integrations/."""
    allowed = {ROOT / "fastbert" / "hf.py", *(ROOT / "fastbert" / "integrations").glob("*.py")}
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("fastbert", "kernels")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if path not in allowed and _imported_packages(path) & set(HF_PACKAGES)
    ]
    assert not offenders, f"these import transformers / sentence-transformers: {offenders}"
