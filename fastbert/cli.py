"""The ``fastbert`` command. Each subcommand is a module in fastbert/commands/ with
``NAME``, ``HELP``, ``add_arguments(parser)`` and ``run(args) -> int``; list it in COMMANDS."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("info", "demo", "bench", "accuracy")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastbert", description="A BERT encoder whose hot paths are Triton kernels."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        module = importlib.import_module(f"fastbert.commands.{name}")
        command = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
