"""The machine a GPU run measured on, as files: environment.json (fastbert.bench.environment:
GPU, driver, CUDA, versions, commit, date), fastbert-info.txt, nvidia-smi.txt and
pip-freeze.txt.

    python -m benchmarks.gpu_run.environment --out DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ENVIRONMENT_JSON = "environment.json"
# Quickest first: a stage interrupted at its cap keeps what was written.
COMMANDS = {
    "nvidia-smi.txt": ["nvidia-smi"],
    "pip-freeze.txt": [sys.executable, "-m", "pip", "freeze"],
    "fastbert-info.txt": [sys.executable, "-m", "fastbert.cli", "info"],
}


def _output(command: list[str]) -> str:
    """What ``command`` printed (stdout and stderr), or why it could not run."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"could not run {' '.join(command)}: {exc}\n"
    return proc.stdout + proc.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_run.environment", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="the folder for the files")
    args = parser.parse_args(argv)
    from fastbert.bench import environment

    args.out.mkdir(parents=True, exist_ok=True)
    env = environment.capture()
    (args.out / ENVIRONMENT_JSON).write_text(json.dumps(env, indent=1) + "\n")
    for name, command in COMMANDS.items():
        (args.out / name).write_text(_output(command))
    print(json.dumps(env, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
