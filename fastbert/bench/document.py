"""A results document (``results.json``): its schema, creating, reading and writing one.

Read by the reports (report.py) and the targets (targets.py)::

    {"schema": "fastbert-bench/1", "environment": {...}, "settings": {...},
     "complete": true, "results": [record, ...]}
"""

from __future__ import annotations

import json
from pathlib import Path

SCHEMA = "fastbert-bench/1"


def new_document(
    environment: dict, settings: dict, records: list[dict], complete: bool = True
) -> dict:
    return {
        "schema": SCHEMA,
        "environment": environment,
        "settings": settings,
        "complete": complete,
        "results": records,
    }


def read_document(path: str | Path) -> dict:
    """A results document; ValueError when the file is not one."""
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a fastbert results file (schema {SCHEMA})")
    return doc


def write_json(doc: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


__all__ = ["SCHEMA", "new_document", "read_document", "write_json"]
