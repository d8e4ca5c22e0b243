"""What the benchmark scripts share: timing contenders in turns, and writing a result's two
files (``<stem>.json``, ``<stem>.md``) into its folder, the sentence naming a CPU result's
machine, the lines of a markdown table, and the precisions a corpus benchmark runs."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fastbert.bench.environment import ISA_CAPS

# A corpus benchmark's precision -> the options fastbert.load (and EmbedOptions) take for it.
PRECISIONS = {
    "float32": {},
    "bfloat16": {"dtype": "bfloat16"},
    "int8": {"quantize": "int8"},
}


def in_turns(calls: Mapping[str, Callable[[], Any]], rounds: int) -> dict[str, list[float]]:
    """Seconds of each call, ``rounds`` times, the calls taking turns (one of each a round,
    in order), so that a slow spell of the machine slows them alike."""
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def parser(
    module: str, description: str, docs: int, rounds: int | None, out_required: bool = True
) -> argparse.ArgumentParser:
    """The command line every corpus benchmark opens with: ``python -m benchmarks.<module>``
    with ``--out DIR``, ``--docs N`` and ``--rounds N`` (their defaults shown in ``--help``;
    no ``--rounds`` where ``rounds`` is None)."""
    cli = argparse.ArgumentParser(
        prog=f"python -m benchmarks.{module}",
        description=description,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    cli.add_argument("--out", type=Path, required=out_required, help="folder for the results")
    cli.add_argument("--docs", type=int, default=docs, help="documents of the corpus")
    if rounds is not None:
        cli.add_argument("--rounds", type=int, default=rounds, help="timed rounds")
    return cli


def add_precisions(cli: argparse.ArgumentParser, choices: Sequence[str], default: str) -> None:
    """``--precisions``: a comma-separated subset of ``choices`` (``default``, the same form),
    parsed into a list; an empty list or another name is a usage error (exit 2)."""

    def subset(text: str) -> list[str]:
        chosen = [p.strip() for p in text.split(",") if p.strip()]
        unknown = [p for p in chosen if p not in choices]
        if unknown or not chosen:
            named = ", ".join(unknown) or "none"
            raise argparse.ArgumentTypeError(f"{named}; each one of {', '.join(choices)}")
        return chosen

    cli.add_argument(
        "--precisions",
        type=subset,
        default=default,
        help="comma-separated subset of " + ", ".join(choices),
    )


def write_report(out: Path, stem: str, report: dict, markdown: str, indent: int = 2) -> None:
    """``report`` as ``out/<stem>.json`` and ``markdown`` as ``out/<stem>.md`` (``out`` made
    when missing); the markdown printed too."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(report, indent=indent) + "\n")
    (out / f"{stem}.md").write_text(markdown)
    print(markdown)


def cpu_line(env: dict) -> str:
    """The sentence a CPU result names its machine and build with, from the report's
    ``environment``: its CPU, torch threads and flags (and any cap set on the CPU libraries'
    instruction sets), torch, commit and date."""
    caps = "".join(f"; {name}={env[name]}" for name in ISA_CAPS if env.get(name))
    return (
        f"CPU: {env['cpu']} ({env['cpu_threads']} torch threads; flags: {env['cpu_flags']}"
        f"{caps}); torch {env['torch']}; commit {env['commit']}; {env['date']}."
    )


def table(columns: Sequence[str], align: str, rows: Iterable[Sequence[object]]) -> list[str]:
    """A markdown table's lines: the header naming ``columns``, the rule aligning them (a
    letter a column in ``align``: ``l`` left, ``r`` right) and a line a row of ``rows``, each
    cell as ``str`` writes it."""
    if len(align) != len(columns) or set(align) - {"l", "r"}:
        raise ValueError(f"align needs an l or r for each of {len(columns)} columns: {align!r}")
    rule = "|" + "".join("---|" if side == "l" else "---:|" for side in align)
    return [_table_row(columns), rule, *(_table_row(cells) for cells in rows)]


def _table_row(cells: Sequence[object]) -> str:
    return "| " + " | ".join(str(cell) for cell in cells) + " |"
