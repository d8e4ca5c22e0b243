"""fastbert models: the models available here, by the names ``--model`` takes (packaged
models, installed or not, and the Hugging Face cache's models fastbert can run)."""

from __future__ import annotations

import argparse
import json

NAME = "models"
HELP = "list the models available here (packaged and in the Hugging Face cache), by name"
COLUMNS = ("NAME", "FAMILY", "PARAMETERS", "KIND", "WHERE")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the list as JSON (for machines)")


def parameters_text(count: int | None, exact: bool) -> str:
    """A parameter count for people: 22.7M, 1.2B ("~" where estimated from a file's size)."""
    if count is None:
        return "-"
    value = f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"
    return value if exact else f"~{value}"


def rows(entries: list) -> list[tuple[str, ...]]:
    """The table's rows (see COLUMNS) of catalog entries."""
    table = []
    for entry in entries:
        described = entry.description
        if entry.source == "packaged":
            name = f"{entry.name} ({entry.id.rsplit('/', 1)[-1]})"
            where = f"not installed: {entry.install}" if entry.folder is None else "packaged"
        else:
            name, where = entry.name, "Hugging Face cache"
        if described is None:
            table.append((name, "-", "-", "-", where))
        else:
            size = parameters_text(described.parameters, described.exact)
            table.append((name, described.family, size, described.kind, where))
    return table


def run(args: argparse.Namespace) -> int:
    from fastbert.integrations.model_catalog import catalog

    found = catalog()
    if args.json:
        print(json.dumps(found.to_dict(), indent=2))
        return 0
    table = [COLUMNS, *rows(found.models)]
    widths = [max(len(row[i]) for row in table) for i in range(len(COLUMNS) - 1)]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    print(f"\nHugging Face cache: {found.cache}")
    for model_id, reason in found.skipped:
        print(f"  not runnable by fastbert: {model_id}: {reason}")
    print(
        "--model NAME (and fastbert.load / fastbert.embed) takes these names in any case, and "
        "a packaged model's id (sentence-transformers/all-MiniLM-L6-v2) or name.\nfastbert "
        "never downloads: `hf download org/name` puts a model in the Hugging Face cache."
    )
    return 0
