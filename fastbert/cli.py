"""The ``fastbert`` command. Each subcommand is a module in fastbert/commands/ with
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; list it in COMMANDS.
Building the parser imports none of torch, triton, transformers or pyarrow (``--help``
answers at once): a command module imports them inside ``run``, and tests/test_cli.py checks.

Exit codes: 0 done; 2 a usage error (argparse's own, or a command's
:class:`~fastbert.commands.options.UsageError`: the usage line and one error line on stderr);
1 the command failed (:class:`~fastbert.commands.options.CommandError`: one line on stderr).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings
from pathlib import Path

from fastbert import settings
from fastbert.commands.options import CommandError, UsageError
from fastbert.execution.cpu_tuning import apply_process_tuning
from fastbert.version import __version__

COMMANDS = ("info", "models", "demo", "bench", "accuracy", "embed", "serve")


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The top-level parser and each subcommand's, by name."""
    parser = argparse.ArgumentParser(
        prog="fastbert", description="A BERT encoder whose hot paths are Triton kernels."
    )
    parser.add_argument("--version", action="version", version=f"fastbert {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    commands = {}
    for name in COMMANDS:
        module = importlib.import_module(f"fastbert.commands.{name}")
        command = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
        commands[module.NAME] = command
    return parser, commands


def build_parser() -> argparse.ArgumentParser:
    return _parsers()[0]


def main(argv: list[str] | None = None) -> int:
    # Before any command imports torch, which reads the per-shape caches' sizes as it loads.
    try:
        apply_process_tuning()
        settings.check()
    except ValueError as exc:  # a FASTBERT_* setting's value it refuses, naming it
        print(f"fastbert: error: {exc}", file=sys.stderr)
        return 2
    parser, commands = _parsers()
    args, unknown = parser.parse_known_args(argv)
    command = commands[args.command]
    if unknown:  # the subcommand's usage, which lists its options (exits 2)
        command.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warnings(command.prog, warnings.showwarning)
            return args.run(args)
    except UsageError as exc:
        command.print_usage(sys.stderr)
        print(f"{command.prog}: error: {exc}", file=sys.stderr)
        return 2
    except CommandError as exc:
        print(f"{command.prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C: a line, not a traceback (the shell's code for SIGINT)
        print(f"\n{command.prog}: interrupted", file=sys.stderr)
        return 130


def _one_line_warnings(prog: str, show):
    """A ``warnings.showwarning`` that prints fastbert's own warnings as one line naming the
    command (``fastbert embed: warning: ...``) and passes others to ``show``."""
    package = Path(__file__).parent

    def show_warning(message, category, filename, lineno, file=None, line=None):
        if not Path(filename).is_relative_to(package):
            return show(message, category, filename, lineno, file, line)
        print(f"{prog}: warning: {message}", file=sys.stderr if file is None else file)

    return show_warning


if __name__ == "__main__":
    sys.exit(main())
