"""The serve stage's web stack as wheels, for a GPU machine with no network.

The GPU machines fastbert is verified on hold torch, triton, transformers,
sentence-transformers, pytest and matplotlib, but not what ``fastbert serve`` runs on
(fastapi, uvicorn, orjson, httptools and what they need), and cannot fetch them. On a machine
with a package index, before the run:

    python -m benchmarks.gpu_run.wheels --out .whl --python-version 3.12

fetches them into ``.whl/`` (ignored by git; about 4 MB): the versions installed here, which
are the ones CI tests, as binary wheels for Linux x86-64 and that Python. The folder travels
with the repository, and the run's install stage (benchmarks/gpu_run/install.py) installs
from it with no index; pip keeps what the machine has where it already satisfies a
requirement.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FOLDER = REPO / ".whl"
# fastbert serve's server and its JSON (the serve extra), and the HTTP parser uvicorn picks
# when it is installed, as in CI.
REQUIREMENTS = ("fastapi", "uvicorn", "httptools", "orjson")
# pip matches a manylinux tag exactly: the common ones, oldest first.
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 34)) + (
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
)


def canonical(name: str) -> str:
    """The name as pip compares distributions: lower case, runs of -_. as one -."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(names: Iterable[str], python_version: str) -> dict[str, str]:
    """``names`` and everything they need (no extras) under Python ``python_version``
    ("3.12"), as installed here: canonical name -> version."""
    from packaging.requirements import Requirement

    environment = {"python_version": python_version, "python_full_version": python_version + ".0"}
    found: dict[str, str] = {}
    pending = [canonical(name) for name in names]
    while pending:
        name = pending.pop()
        if name in found:
            continue
        distribution = importlib.metadata.distribution(name)
        found[name] = distribution.version
        for line in distribution.requires or ():
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or marker.evaluate({**environment, "extra": ""}):
                pending.append(canonical(requirement.name))
    return dict(sorted(found.items()))


def download_command(pins: dict[str, str], out: Path, python_version: str) -> list[str]:
    """The pip command that fetches ``pins`` (name -> version) as wheels for Linux x86-64
    and CPython ``python_version`` into ``out``."""
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    command += ["--only-binary=:all:", "--implementation", "cp"]
    command += ["--python-version", python_version, "--dest", str(out)]
    for platform in PLATFORMS:
        command += ["--platform", platform]
    return command + [f"{name}=={version}" for name, version in pins.items()]


def provided(folder: Path) -> set[str]:
    """The canonical names of the distributions that ``folder`` holds wheels of."""
    return {canonical(path.name.split("-")[0]) for path in folder.glob("*.whl")}


def install_command(python: str, folder: Path) -> list[str]:
    """The pip command that installs REQUIREMENTS from ``folder`` alone."""
    command = [python, "-m", "pip", "install", "--quiet", "--no-index"]
    return command + ["--find-links", str(folder), *REQUIREMENTS]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_run.wheels", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, default=FOLDER, help="the folder (default: .whl)")
    parser.add_argument(
        "--python-version",
        default="3.12",
        help="the GPU machine's Python, major.minor (default: 3.12)",
    )
    args = parser.parse_args(argv)
    if not re.fullmatch(r"3\.\d+", args.python_version):
        parser.error(f"argument --python-version: must be like 3.12, got {args.python_version!r}")
    try:
        pins = closure(REQUIREMENTS, args.python_version)
    except importlib.metadata.PackageNotFoundError as exc:
        print(f"{exc.name} is not installed here: pip install -e '.[dev]' first", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    if subprocess.run(download_command(pins, args.out, args.python_version)).returncode != 0:
        return 1
    print(f"{len(pins)} wheels in {args.out}: " + ", ".join(f"{n}=={v}" for n, v in pins.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
