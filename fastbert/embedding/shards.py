"""Parquet shards of embeddings. Shard k holds the good rows among input rows
[k * rows_per_shard, (k + 1) * rows_per_shard), in input order, with an ``id`` column and, by
the model's kind:

- embedding: ``embedding``, a fixed-size list of float32 (or float16; quantized: int8 or
  uint8, [dimensions] values, or ceil(dimensions / 8) bytes of packed bits);
- sparse: ``indices`` (list of int32, ascending) and ``values`` (list of float32), the
  non-zero entries over the vocabulary;
- multi-vector: ``vectors``, a list of fixed-size lists of float32 (one per token the model
  scores), and ``num_vectors`` (int32).

It is written to a temporary file and renamed, so a shard file on disk is always complete; its
Parquet metadata records its row range and counts (tokens, truncated, skipped) so that a
resumed run can total the whole job."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fastbert.embedding.quantized import Quantizer

SHARD_PATTERN = "part-{:05d}.parquet"
METADATA_KEY = b"fastbert"


@dataclass
class ShardStats:
    """One shard: its file, first input row, rows written and the counts of its rows."""

    file: str
    first_row: int
    rows: int = 0
    tokens: int = 0
    truncated: int = 0
    skipped: int = 0


@dataclass
class EmbeddedRows:
    """Rows embedded in one go, in parallel lists: their input row indices, ids, outputs (a
    dense model's [n, dim] array, a sparse model's rows of (indices, values), a multi-vector
    model's [tokens, dim] arrays), token counts and whether each was truncated."""

    rows: list[int]
    ids: list[Any]
    vectors: Any
    tokens: list[int]
    truncated: list[bool]


def shard_path(output: Path, number: int) -> Path:
    return output / SHARD_PATTERN.format(number)


def read_stats(path: Path) -> ShardStats:
    """The stats a shard file recorded in its metadata."""
    import pyarrow.parquet as pq

    meta = pq.read_schema(path).metadata or {}
    return ShardStats(**json.loads(meta[METADATA_KEY]))


class ShardWriter:
    """Collects embedded rows and writes each shard once all its input rows are accounted for.

    ``start``: the first shard to write (a resumed run's); ``kind``: the model's ("embedding",
    "sparse" or "multi-vector"); ``dimensions``: the output's width (may be set once the model
    has loaded, before the first row); ``store_dtype``: numpy float32 or float16;
    ``quantizer``: what quantizes a dense model's embeddings as they are added (None: stored
    as computed; may be set before the first row, once the ranges are known).
    """

    def __init__(
        self,
        output: Path,
        rows_per_shard: int,
        kind: str,
        dimensions: int | None,
        store_dtype: np.dtype,
        start: int = 0,
    ):
        self.output = output
        self.rows_per_shard = rows_per_shard
        self.kind = kind
        self.dimensions = dimensions
        self.store_dtype = np.dtype(store_dtype)
        self.next_shard = start
        self.quantizer: Quantizer | None = None
        self.written: list[ShardStats] = []
        self._rows: list[int] = []
        self._ids: list[Any] = []
        self._vectors: list[np.ndarray] = []
        self._tokens: dict[int, int] = {}
        self._truncated: set[int] = set()
        self._skipped: list[int] = []
        # The kind of the ids the rows carry (readers.IdKind, shared with the reader), or None
        # for row numbers.
        self.id_kind: Any = None

    def add(self, embedded: EmbeddedRows) -> None:
        """Rows embedded, to be written with their shards."""
        rows = embedded.rows
        if self.dimensions is None and self.kind != "sparse" and len(embedded.vectors):
            self.dimensions = int(np.asarray(embedded.vectors[0]).shape[-1])
        self._rows += rows
        self._ids += embedded.ids
        vectors = embedded.vectors
        if self.quantizer is not None and self.kind == "embedding" and len(rows):
            vectors = self.quantizer(np.asarray(vectors))
        self._vectors += list(vectors)
        self._tokens.update(zip(rows, embedded.tokens))
        self._truncated.update(r for r, cut in zip(rows, embedded.truncated) if cut)

    def skip(self, rows: list[int]) -> None:
        """Input rows left out (bad rows, with skip_bad)."""
        self._skipped += rows

    def advance(self, end: int) -> None:
        """Every input row before ``end`` has been added or skipped: write the shards it
        completes."""
        while (self.next_shard + 1) * self.rows_per_shard <= end:
            self._write_next()

    def finish(self, end: int) -> None:
        """The input ended at row ``end``: write what remains (the last shard may be short)."""
        self.advance(end)
        if self.next_shard * self.rows_per_shard < end:
            self._write_next()

    def _write_next(self) -> None:
        first = self.next_shard * self.rows_per_shard
        last = first + self.rows_per_shard
        taken = [i for i, r in enumerate(self._rows) if r < last]
        taken.sort(key=self._rows.__getitem__)
        stats = ShardStats(
            file=SHARD_PATTERN.format(self.next_shard),
            first_row=first,
            rows=len(taken),
            tokens=sum(self._tokens.pop(self._rows[i]) for i in taken),
            truncated=sum(self._rows[i] in self._truncated for i in taken),
            skipped=sum(r < last for r in self._skipped),
        )
        ids = [self._ids[i] for i in taken]
        width, dtype = self.dimensions, self.store_dtype
        if self.quantizer is not None and self.kind == "embedding":
            width, dtype = self.quantizer.width(self.dimensions), self.quantizer.dtype
        columns = output_columns(self.kind, [self._vectors[i] for i in taken], width, dtype)
        kind = None if self.id_kind is None else self.id_kind.kind
        write_shard(shard_path(self.output, self.next_shard), ids, columns, stats, kind)
        keep = [i for i, r in enumerate(self._rows) if r >= last]
        self._rows = [self._rows[i] for i in keep]
        self._ids = [self._ids[i] for i in keep]
        self._vectors = [self._vectors[i] for i in keep]
        self._truncated = {r for r in self._truncated if r >= last}
        self._skipped = [r for r in self._skipped if r >= last]
        self.written.append(stats)
        self.next_shard += 1


def output_columns(kind: str, outputs: list[Any], dimensions: int, dtype: np.dtype) -> dict:
    """The Parquet columns (pyarrow arrays) of ``outputs``, one per row, for a model of
    ``kind`` (see the module docstring) with outputs ``dimensions`` wide (a dense model's:
    values of ``dtype``, as stored)."""
    import pyarrow as pa

    if kind == "sparse":
        indices = [np.asarray(i, np.int32) for i, _ in outputs]
        values = [np.asarray(v, np.float32) for _, v in outputs]
        return {
            "indices": pa.array(indices, type=pa.list_(pa.int32())),
            "values": pa.array(values, type=pa.list_(pa.float32())),
        }
    if kind == "multi-vector":
        counts = [len(o) for o in outputs]
        flat = np.concatenate([np.asarray(o, np.float32).reshape(-1) for o in outputs] or [[]])
        tokens = pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()), dimensions)
        offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
        return {
            "vectors": pa.ListArray.from_arrays(offsets, tokens),
            "num_vectors": pa.array(counts, type=pa.int32()),
        }
    vectors = np.stack(outputs) if outputs else np.zeros((0, dimensions), dtype)
    flat = pa.array(vectors.reshape(-1), type=pa.from_numpy_dtype(vectors.dtype))
    return {"embedding": pa.FixedSizeListArray.from_arrays(flat, dimensions)}


def write_shard(
    path: Path, ids: list[Any], columns: dict, stats: ShardStats, id_kind: type | None = None
) -> None:
    """Write one shard atomically: a temporary file in the same folder, then a rename. The id
    column's type is that of ``id_kind`` (str, int or float: the job's ids, whose every shard,
    an empty one too, then has one type), else the ids' own (int64 when there are none)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    id_type = {str: pa.string(), int: pa.int64(), float: pa.float64()}.get(id_kind)
    if id_type is None and not ids:
        id_type = pa.int64()
    id_column = pa.array(ids, type=id_type)
    table = pa.table({"id": id_column, **columns})
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(asdict(stats))})
    temporary = path.with_name(f".{path.name}.tmp")
    pq.write_table(table, temporary)
    os.replace(temporary, path)
