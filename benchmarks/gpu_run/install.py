"""The GPU run's install stage: the serve stage's web stack from the wheels in ``.whl/``
(benchmarks/gpu_run/wheels.py; no index), then ``pip install --no-deps --no-build-isolation
-e .``. Where that cannot build (no setuptools, or one older than pyproject.toml's metadata
needs), fastbert still runs from the tree: every stage runs ``python -m ...`` from the
repository root, which puts fastbert/ on the path. Exit 0 when ``import fastbert.kernels``
works; the output says whether fastbert was installed or runs from the tree.

    python -m benchmarks.gpu_run.install [--wheels DIR]

Without the wheels (no folder, or pip refuses them) the install goes on and says so: only the
serve stage needs them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu_run import wheels

ROOT = Path(__file__).resolve().parents[2]


def pip_install(python: str) -> bool:
    command = [python, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-e", "."]
    return subprocess.run(command, cwd=ROOT).returncode == 0


def install_wheels(python: str, folder: Path) -> None:
    """Install the serve stage's packages from ``folder``, saying what became of them."""
    if not wheels.provided(folder):
        print(f"install: no wheels in {folder}; the serve stage needs fastapi, uvicorn and orjson")
        return
    if subprocess.run(wheels.install_command(python, folder), cwd=ROOT).returncode == 0:
        print(f"install: {', '.join(wheels.REQUIREMENTS)} installed from {folder}")
    else:
        print(f"install: pip could not install the wheels in {folder}")


def importable(python: str) -> bool:
    probe = "import fastbert.kernels, fastbert.cli"
    return subprocess.run([python, "-c", probe], cwd=ROOT).returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_run.install",
        description="install fastbert editable; else make it importable from the tree",
    )
    parser.add_argument("--python", default=sys.executable, help="the interpreter to install for")
    parser.add_argument(
        "--wheels", type=Path, default=wheels.FOLDER, help="the wheels' folder (default: .whl)"
    )
    args = parser.parse_args(argv)
    install_wheels(args.python, args.wheels)
    if pip_install(args.python) and importable(args.python):
        print("install: fastbert installed (editable)")
        return 0
    if importable(args.python):
        print("install: pip could not install fastbert; it runs from the tree")
        return 0
    print("install: fastbert is not importable", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
