"""_manifest.json of an output folder, and resuming.

The manifest records the job (what decides the embeddings and the shard layout: model,
inputs, fields, pooling, normalisation, lengths, dtypes, rows per shard), the fastbert version
and a ``complete`` flag; once complete, the shards and the totals. A run into a folder that
holds a manifest continues after its complete shards when the job is the same, has nothing to
do when that job is complete (:func:`finished_run`), and refuses a job with other settings
unless told to overwrite.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastbert.embedding.shards import SHARD_PATTERN, ShardStats, read_stats, shard_path

# Its leading underscore keeps the folder a Parquet dataset: pyarrow and pandas read a folder's
# files but those whose names start with "_" or "." (Spark's _SUCCESS convention).
MANIFEST = "_manifest.json"
EARLIER_MANIFEST = "manifest.json"  # its name in outputs written before: read, then moved
FORMAT = "fastbert-embeddings/1"


# Manifest keys that are not settings of the job: comparing jobs ignores them (``model_name``:
# the name the model was given by; the same folder by another name is the same job).
_NOT_SETTINGS = ("complete", "fastbert_version", "model_name")
# The job record's entry of each input file's size and modification time (bytes,
# nanoseconds): an input changed since a run makes it another job.
INPUT_STATE = "input_sizes_and_times"
# The job record's entry of the model folder's files: [path in the folder, size, modification
# time] each (fastbert.embedding.loading.model_files); other files make it another job.
MODEL_STATE = "model_files"
# What a complete manifest adds to the job's record.
TOTALS = ("rows", "tokens", "truncated", "skipped")


class OutputError(ValueError):
    """The output folder cannot be used as asked (written for another job)."""


def finished_run(output: Path, job: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of a complete run of ``job`` in ``output`` (nothing left to do), or None
    when there is none. OutputError, naming the first setting that differs, when ``output``
    holds a complete run of another job."""
    manifest = read_manifest(output)
    if manifest is None or not manifest.get("complete"):
        return None
    key = _first_difference(manifest, job)
    if key is not None:
        raise OutputError(
            f"{output} holds a complete run of another job ({_describe(key, manifest, job)}); "
            "give another output folder, or pass --overwrite / overwrite=True to replace it"
        )
    if (output / EARLIER_MANIFEST).exists():  # the same job done: its manifest takes its name
        os.replace(output / EARLIER_MANIFEST, output / MANIFEST)
    return manifest


def start_output(output: Path, job: dict[str, Any], overwrite: bool) -> int:
    """Make ``output`` ready for ``job``; return the first shard still to write (0 for a new
    job, the number of complete shards for a resumed one).

    Raises OutputError, before changing anything, for a job with other settings (unless
    ``overwrite``, which removes this job's files only); an unfinished run without a shard
    holds nothing to resume, and is started again with this job's settings. A complete run of
    the same job is the caller's to find first (:func:`finished_run`); here it is an
    OutputError.
    """
    manifest = read_manifest(output)
    if manifest is not None and not manifest.get("complete") and not shard_path(output, 0).exists():
        manifest = None  # a run that stopped before its first shard (its model failed to load)
    if manifest is not None and not overwrite:
        _check_resumable(output, manifest, job)
    if manifest is None and not overwrite and any(output.glob("part-*.parquet")):
        raise OutputError(
            f"{output} holds shards but no {MANIFEST}: not a run to resume "
            "(pass --overwrite / overwrite=True to replace them)"
        )
    if manifest is not None and overwrite:
        _remove_job_files(output)
        manifest = None
    output.mkdir(parents=True, exist_ok=True)
    for stale in output.glob(".part-*.tmp"):
        stale.unlink()
    if manifest is None:
        for stale in output.glob("part-*.parquet"):
            stale.unlink()
        write_manifest(output, {**job, "complete": False})
        return 0
    return complete_shards(output)


def _check_resumable(output: Path, manifest: dict, job: dict) -> None:
    if manifest.get("complete"):
        raise OutputError(
            f"{output} already holds a complete run "
            "(pass --overwrite / overwrite=True to replace it)"
        )
    key = _first_difference(manifest, job)
    if key in (INPUT_STATE, MODEL_STATE):  # no arguments resume it: its files changed
        raise OutputError(
            f"{output} holds an unfinished run whose files changed since "
            f"({_describe(key, manifest, job)}); pass --overwrite / overwrite=True to start again"
        )
    if key is not None:
        raise OutputError(
            f"{output} holds an unfinished run with other settings "
            f"({_describe(key, manifest, job)}); resume it with the same arguments, or pass "
            "--overwrite / overwrite=True to start again"
        )


def _describe(key: str, manifest: dict, job: dict) -> str:
    """The difference at ``key`` between ``manifest`` and ``job``, as the errors say it: the
    input files changed since the run, by name, or the setting's two values."""
    if key == INPUT_STATE and manifest.get("inputs") == job.get("inputs"):
        was, now = manifest[key], job[key]
        changed = [path for path, a, b in zip(job["inputs"], was, now, strict=True) if a != b]
        return f"input changed since that run (size or time): {', '.join(changed)}"
    if key == INPUT_STATE:  # other files: say which
        key = "inputs"
    if key == MODEL_STATE:
        was, now = ({f[0]: f[1:] for f in files} for files in (manifest[key], job[key]))
        changed = sorted(p for p in {*was, *now} if was.get(p) != now.get(p))
        return f"model folder changed since that run (size or time): {', '.join(changed)}"
    return f"{key}: {manifest.get(key)!r} there, {job.get(key)!r} now"


def _first_difference(manifest: dict, job: dict) -> str | None:
    """The first setting (by name) that ``manifest`` records otherwise than ``job``, or None
    (totals, shards and :data:`_NOT_SETTINGS` are no settings)."""
    ignored = (*_NOT_SETTINGS, *TOTALS, "shards")
    # In the order the job records them: a setting before what follows from it (precision
    # before its calibration).
    keys = [*job, *(k for k in manifest if k not in job)]
    for state in (INPUT_STATE, MODEL_STATE):
        if state not in manifest:  # written before they were recorded: not compared
            ignored = (*ignored, state)
    return next(
        (k for k in keys if k not in ignored and manifest.get(k) != job.get(k)),
        None,
    )


def same_job(manifest: dict, job: dict) -> bool:
    """Whether ``manifest`` records a run of ``job`` (every setting alike)."""
    return _first_difference(manifest, job) is None


def complete_shards(output: Path) -> int:
    """How many shards, from the first, are on disk (later ones, past a gap, are removed)."""
    count = 0
    while shard_path(output, count).exists():
        count += 1
    for later in output.glob("part-*.parquet"):
        if later.name >= SHARD_PATTERN.format(count):
            later.unlink()
    return count


def finish_output(output: Path, job: dict[str, Any]) -> dict[str, Any]:
    """Record the job complete, with every shard's stats and the totals; return the manifest."""
    shards = [read_stats(shard_path(output, i)) for i in range(complete_shards(output))]
    totals = {key: sum(getattr(s, key) for s in shards) for key in TOTALS}
    manifest = {**job, "complete": True, **totals, "shards": [asdict(s) for s in shards]}
    write_manifest(output, manifest)
    return manifest


def read_manifest(output: Path) -> dict | None:
    path = output / MANIFEST
    if not path.exists():
        path = output / EARLIER_MANIFEST
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise OutputError(f"{path}: not a readable manifest ({exc})") from exc


def write_manifest(output: Path, manifest: dict[str, Any]) -> None:
    path = output / MANIFEST
    temporary = path.with_name(f".{MANIFEST}.tmp")
    temporary.write_text(json.dumps(manifest, indent=2) + "\n")
    os.replace(temporary, path)
    (output / EARLIER_MANIFEST).unlink(missing_ok=True)


def _remove_job_files(output: Path) -> None:
    for path in [*output.glob("part-*.parquet"), *output.glob(".part-*.tmp")]:
        path.unlink(missing_ok=True)
    for name in (MANIFEST, EARLIER_MANIFEST):
        (output / name).unlink(missing_ok=True)


__all__ = [
    "MANIFEST",
    "OutputError",
    "ShardStats",
    "complete_shards",
    "finish_output",
    "finished_run",
    "read_manifest",
    "same_job",
    "start_output",
    "write_manifest",
]
