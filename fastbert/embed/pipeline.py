"""The one-process job over files: rows -> the embedding loop
(:mod:`~fastbert.embed.run`) -> Parquet shards with a manifest, continuing an unfinished run
of the same job."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastbert.embed import manifest, model, readers
from fastbert.embed.options import EmbedOptions
from fastbert.embed.run import Summary, run_rows
from fastbert.embed.shards import ShardWriter
from fastbert.embed.text_model import load_options, resolve
from fastbert.model.sentence_folder import CLASSIFICATION, FolderSpec
from fastbert.version import __version__


def job_record(
    inputs: Sequence[Path], options: EmbedOptions, spec: FolderSpec, dimensions: int | None
) -> dict:
    """The manifest's description of a job: what decides its embeddings and shard layout
    (``quantize``, ``prompt`` and ``max_active_dims`` only when set, so that the records of
    earlier runs without them still match). ``spec``: the model folder as read (its kind:
    "embedding", "sparse", "multi-vector"); ``dimensions``: the output's width (None when only
    the loaded model tells it)."""
    record = {
        "format": manifest.FORMAT,
        "fastbert_version": __version__,
        "model": str(Path(options.model).resolve()),
        "kind": spec.kind,
        "inputs": [str(p.resolve()) for p in inputs],
        "text_field": options.text_field,
        "id_field": options.id_field,
        "pooling": model.pooling_name(spec, options.pooling),
        "normalize": options.normalize,
        "max_length": options.max_length,
        "dimensions": dimensions,
        "dtype": options.dtype,
        "store_dtype": options.store_dtype,
        "rows_per_shard": options.rows_per_shard,
        "skip_bad": options.skip_bad,
    }
    if options.quantize is not None:
        record["quantize"] = options.quantize
    for name in ("prompt", "max_active_dims"):
        if getattr(options, name):
            record[name] = getattr(options, name)
    return record


@dataclass
class Job:
    """A job writing Parquet shards, started: its resolved options, output folder and manifest
    record; the shard writer, which starts after the shards an earlier run finished; and the
    first input row still to embed."""

    options: EmbedOptions
    output: Path
    record: dict
    writer: ShardWriter
    first_row: int

    def finish(self, summary: Summary) -> Summary:
        """``summary`` of the run, with the output folder and the final manifest written."""
        summary.output = self.output
        summary.manifest = manifest.finish_output(self.output, self.record)
        return summary


def start_job(
    files: Sequence[Path],
    output: str | Path,
    options: EmbedOptions,
    tokenizer: Any,
    device: torch.device | None = None,
) -> Job:
    """Resolve ``options`` (see :func:`resolve`) and start the job's output in ``output``, or
    continue an unfinished run of the same job there. Called before the model loads, so that
    an output it must not write (manifest.OutputError) costs nothing."""
    options, spec, dimensions = resolve(options, tokenizer, device)
    if spec.kind == CLASSIFICATION:
        raise ValueError(
            f"{options.model} is a classification model (a cross-encoder): it scores text "
            "pairs, it does not embed (serve it with fastbert serve for /rerank)"
        )
    output = Path(output)
    record = job_record(files, options, spec, dimensions)
    start = manifest.start_output(output, record, options.overwrite)
    store_dtype = np.dtype(options.store_dtype)
    writer = ShardWriter(output, options.rows_per_shard, spec.kind, dimensions, store_dtype, start)
    return Job(options, output, record, writer, start * options.rows_per_shard)


def embed_files(inputs: Sequence[str | Path], output: str | Path, options: EmbedOptions) -> Summary:
    """Embed the rows of ``inputs`` (files or folders) into Parquet shards in ``output``,
    continuing an unfinished run of the same job. Raises readers.InputError for unreadable input
    or a bad row (without skip_bad), manifest.OutputError for an output it must not write."""
    files = readers.list_inputs(inputs)
    tokenizer = model.load_tokenizer(Path(options.model))
    job = start_job(files, output, options, tokenizer)
    loaded = load_options(job.options, tokenizer)
    rows = (
        r
        for r in readers.read_rows(files, job.options.text_field, job.options.id_field)
        if r.index >= job.first_row
    )
    job.writer.dimensions = loaded.dimensions
    return job.finish(run_rows(rows, loaded.job(job.options.progress), job.writer, job.first_row))
