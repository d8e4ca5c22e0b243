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
    """A results document; ValueError naming ``path`` when it cannot be read as one (missing
    or unreadable, not JSON, another schema, or its settings or records malformed)."""
    problem = f"{path} could not be read as fastbert results"
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"{problem}: {error.strerror or error}") from error
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{problem}: not valid JSON ({error})") from error
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{problem}: not a fastbert results file (schema {SCHEMA})")
    records = doc.get("results")
    if (
        not isinstance(doc.get("settings"), dict)
        or not isinstance(doc.get("complete"), bool)
        or not isinstance(records, list)
        or not all(isinstance(r, dict) and {"shape", "peer"} <= r.keys() for r in records)
    ):
        raise ValueError(
            f"{problem}: its settings, complete flag or result records are missing or malformed"
        )
    return doc


def write_json(doc: dict, path: str | Path) -> None:
    Path(path).write_text(json.dumps(doc, indent=1) + "\n")


__all__ = ["SCHEMA", "new_document", "read_document", "write_json"]
