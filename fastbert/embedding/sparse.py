"""Sparse embeddings (what a SPLADE model gives): rows over a vocabulary-wide space with few
non-zero values, held as compressed rows."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class SparseVectors:
    """n sparse vectors of width ``dimensions``, as compressed sparse rows: row i's non-zero
    entries are ``indices[indptr[i]:indptr[i + 1]]`` (int32, ascending) with
    ``values[indptr[i]:indptr[i + 1]]`` (float32). ``len()`` is n; iterating gives each row's
    (indices, values)."""

    indptr: np.ndarray
    indices: np.ndarray
    values: np.ndarray
    dimensions: int

    @classmethod
    def from_dense(cls, dense: torch.Tensor, max_active_dims: int | None = None) -> SparseVectors:
        """The non-zero entries of ``dense`` [n, dimensions]; with ``max_active_dims``, each
        row keeps only its that-many values largest in magnitude (a module after the SPLADE
        pooling may give negative ones), as sentence-transformers' ``max_active_dims`` does
        (``torch.topk`` on the CPU: among equal magnitudes at the cut, which it keeps is
        topk's choice, not always the lower index)."""
        dense = dense.detach().float().cpu()
        if max_active_dims is not None and max_active_dims < dense.shape[1]:
            top = dense.abs().topk(max_active_dims, dim=1).indices
            dense = torch.zeros_like(dense).scatter_(1, top, dense.gather(1, top))
        rows, columns = torch.nonzero(dense, as_tuple=True)
        counts = torch.bincount(rows, minlength=dense.shape[0])
        indptr = np.concatenate([[0], np.cumsum(counts.numpy())]).astype(np.int64)
        return cls(
            indptr,
            columns.numpy().astype(np.int32),
            dense[rows, columns].numpy().astype(np.float32),
            int(dense.shape[1]),
        )

    @classmethod
    def from_rows(
        cls, rows: Sequence[tuple[np.ndarray, np.ndarray]], dimensions: int
    ) -> SparseVectors:
        """Rows of (indices, values), in order."""
        counts = [len(indices) for indices, _ in rows]
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        empty = (np.zeros(0, np.int32), np.zeros(0, np.float32))
        indices = np.concatenate([r[0] for r in rows] or [empty[0]]).astype(np.int32)
        values = np.concatenate([r[1] for r in rows] or [empty[1]]).astype(np.float32)
        return cls(indptr, indices, values, dimensions)

    def __len__(self) -> int:
        return len(self.indptr) - 1

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        for i in range(len(self)):
            yield self.row(i)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.row(i)

    def row(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Row i's (indices, values)."""
        start, stop = self.indptr[i], self.indptr[i + 1]
        return self.indices[start:stop], self.values[start:stop]

    def to_dense(self) -> np.ndarray:
        """float32 [n, dimensions]."""
        dense = np.zeros((len(self), self.dimensions), np.float32)
        rows = np.repeat(np.arange(len(self)), np.diff(self.indptr))
        dense[rows, self.indices] = self.values
        return dense

    def to_torch(self) -> torch.Tensor:
        """A torch sparse COO tensor [n, dimensions], as sentence-transformers' SparseEncoder
        encodes."""
        rows = np.repeat(np.arange(len(self)), np.diff(self.indptr))
        positions = torch.from_numpy(np.stack([rows, self.indices.astype(np.int64)]))
        shape = (len(self), self.dimensions)
        return torch.sparse_coo_tensor(positions, torch.from_numpy(self.values), shape).coalesce()
