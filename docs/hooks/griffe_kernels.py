"""Griffe extension: ``fastbert.kernels`` for the API reference.

The repository keeps the kernels in the top-level folder kernels/, which pyproject.toml
installs as ``fastbert.kernels`` (``[tool.setuptools.package-dir]``). Griffe reads fastbert/
from the source tree and so does not see that subpackage; this extension loads kernels/ and
attaches it to the ``fastbert`` package under the name it is imported by.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import griffe


class KernelsPackage(griffe.Extension):
    """Attach kernels/ to the fastbert package as ``fastbert.kernels``."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "fastbert" or "kernels" in pkg.members:
            return
        folder = Path(pkg.filepath).parent.parent / "kernels"
        kernels = loader.load(str(folder), try_relative_path=True)
        pkg.set_member("kernels", kernels)
