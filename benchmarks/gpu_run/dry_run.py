"""The dry run: whether every stage's command would start, checked on a CPU in seconds.

- ``python -m pytest ...``: the same arguments collect at least one test (``--collect-only``,
  in a process of its own; the worker options are left out, and their plugin must import);
- ``python -m MODULE ...``: the module imports and its argument parser accepts the
  arguments (its ``parse_args`` returns; the command stops there, before any work);
- anything else: the program is on the PATH;
- and the modules a stage ``needs`` are installed, or the wheels folder (``.whl``) holds them.

The run's summary and archive are then made from stand-ins of the stages' files
(benchmarks/gpu_run/samples.py).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import re
import runpy
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

from benchmarks.gpu_run import grid, wheels
from benchmarks.gpu_run.plan import Stage

COLLECT_TIMEOUT_S = 300
WORKER_OPTIONS = {"-n": True, "--dist": True}  # option -> takes a value


class _Parsed(Exception):
    """Raised by the patched parse_args once the arguments are accepted."""


def parses(module: str, args: Sequence[str]) -> str | None:
    """None when ``python -m module args`` gets past parsing its arguments, else why not.

    ``parse_known_args`` is what ``parse_args`` calls, and what a command may call itself; a
    subcommand's parser runs inside its parent's, so only the outermost call stops the run."""
    original = argparse.ArgumentParser.parse_known_args
    depth = 0

    def parse_known_args(self, args=None, namespace=None):
        nonlocal depth
        depth += 1
        try:
            parsed = original(self, args, namespace)
        finally:
            depth -= 1
        if depth == 0:
            raise _Parsed(parsed)
        return parsed

    argv, errors = sys.argv, io.StringIO()
    argparse.ArgumentParser.parse_known_args = parse_known_args
    sys.argv = [module, *args]
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # runpy's "found in sys.modules" notice
                runpy.run_module(module, run_name="__main__", alter_sys=True)
    except _Parsed as parsed:
        _, unknown = parsed.args[0]  # parse_args would refuse them; a command may route them
        return f"unrecognized arguments: {' '.join(unknown)}" if unknown else None
    except SystemExit as exc:
        last = (errors.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
        return f"exits before its arguments are parsed: {last}"
    except Exception as exc:  # noqa: BLE001 - any failure to start is the finding
        return f"{type(exc).__name__}: {exc}"
    finally:
        argparse.ArgumentParser.parse_known_args = original
        sys.argv = argv
    return "returned without parsing its arguments"


def missing(needs: Sequence[str], folder: Path) -> str | None:
    """None when each module of ``needs`` imports here or has a wheel in ``folder``."""
    bundled = wheels.provided(folder)
    absent = [
        m
        for m in needs
        if importlib.util.find_spec(m) is None and wheels.canonical(m) not in bundled
    ]
    if not absent:
        return None
    fetch = f"python -m benchmarks.gpu_run.wheels --out {folder}"
    return f"needs {', '.join(absent)}: not installed, and no wheels in {folder} ({fetch})"


def collect_command(command: Sequence[str]) -> list[str]:
    """``command`` (python -m pytest ...) as a collection, without the worker options."""
    out, skip = [*command[:3], "--collect-only"], False
    for arg in command[3:]:
        if skip:
            skip = False
            continue
        if arg in WORKER_OPTIONS:
            skip = WORKER_OPTIONS[arg]
            continue
        out.append(arg)
    return out


def collected(output: str, code: int) -> str | None:
    """None when a collection's output says it collected a test, else why not. Exit 1 with
    tests collected is an error in some test file (--continue-on-collection-errors), which
    the plain test run reports; the stage still starts."""
    match = re.search(r"(\d+)(?:/\d+)? tests? collected", output)
    count = int(match[1]) if match else 0
    if code in (0, 1) and count > 0:
        return None
    last = "\n".join(output.strip().splitlines()[-5:])
    return f"collected {count} tests (exit {code}): {last}"


def _grid_key(command: Sequence[str]) -> tuple[str, ...]:
    """``command`` with the value of --gpu-grid and the report paths blanked out: two stages
    with one key differ only in which part of the grid they run."""
    key, previous = [], ""
    for arg in command:
        blank = previous == "--gpu-grid" or arg.startswith("--junitxml=")
        key.append("*" if blank else arg)
        previous = arg
    return tuple(key)


def _grid_choice(command: Sequence[str]) -> str | None:
    for previous, arg in zip(command, command[1:]):
        if previous == "--gpu-grid":
            return arg
    return None


def check(
    stages: Sequence[Stage], cwd: Path, wheel_folder: Path = wheels.FOLDER
) -> dict[str, str | None]:
    """Stage name -> None (it would start) or the problem; test collections run in parallel
    processes while the other stages are checked here."""
    found: dict[str, str | None] = {}
    running: dict[str, subprocess.Popen] = {}
    started: dict[tuple[str, ...], str] = {}
    for stage in stages:
        command = stage.command
        if stage.needs and (problem := missing(stage.needs, wheel_folder)):
            found[stage.name] = problem
            continue
        module = command[2] if command[1:2] == ("-m",) and len(command) > 2 else None
        if module == "pytest":
            key = _grid_key(command)
            if key in started:  # the same tests, another part of the grid
                choice = _grid_choice(command)
                ok = choice in grid.CHOICES
                found[stage.name] = None if ok else f"--gpu-grid {choice!r} is no choice"
                continue
            started[key] = stage.name
            for arg in command:
                if arg in WORKER_OPTIONS and importlib.util.find_spec("xdist") is None:
                    found[stage.name] = f"{arg} needs pytest-xdist"
            running[stage.name] = subprocess.Popen(
                collect_command(command),
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        elif module is not None:
            found[stage.name] = parses(module, command[3:])
        else:
            found[stage.name] = None if shutil.which(command[0]) else f"{command[0]} not found"
    for name, process in running.items():
        try:
            output, _ = process.communicate(timeout=COLLECT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        found[name] = found.get(name) or collected(output, process.returncode)
    return {stage.name: found[stage.name] for stage in stages}
