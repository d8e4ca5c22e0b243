"""The GPU run's install stage: ``pip install --no-deps --no-build-isolation -e .``, and where
that cannot build (no setuptools, or one older than pyproject.toml's metadata needs), fastbert
importable from the tree itself.

The repository keeps the kernels in ``kernels/`` and installs them as ``fastbert.kernels``
(pyproject.toml's package-dir): without an install, a link ``fastbert/kernels`` -> ``../kernels``
(ignored by git) gives that name, and every stage runs ``python -m ...`` from the repository
root, which puts the tree on the path. Exit 0 when ``import fastbert.kernels`` works after
either; the output says which one it was.

    python -m benchmarks.gpu_run.install
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = ROOT / "fastbert" / "kernels"


def pip_install(python: str) -> bool:
    command = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."]
    return subprocess.run(command, cwd=ROOT).returncode == 0


def link_kernels() -> None:
    """``fastbert/kernels`` -> ``../kernels``, unless a link or folder is there already."""
    if not LINK.exists() and not LINK.is_symlink():
        LINK.symlink_to(Path("..") / "kernels", target_is_directory=True)


def importable(python: str) -> bool:
    probe = "import fastbert.kernels, fastbert.cli"
    return subprocess.run([python, "-c", probe], cwd=ROOT).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_run.install",
        description="install fastbert editable; else make it importable from the tree",
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter to install for")
    args = parser.parse_args(argv)
    if pip_install(args.python) and importable(args.python):
        print("install: fastbert installed (editable)")
        return 0
    link_kernels()
    if importable(args.python):
        print("install: pip could not install fastbert; it runs from the tree (kernels linked)")
        return 0
    print("install: fastbert is not importable", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
