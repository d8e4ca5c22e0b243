"""The torch backend of ``splade_max`` (the fused SPLADE head): the masked-LM decoder's logits
reduced to a max per sequence one slice of the vocabulary at a time, so that the [T, V] logits
never exist whole.

Since g = log1p(relu(.)) (once or twice) is monotone non-decreasing, the max over a sequence
of g(z) is g of the max of z: each chunk of ``chunk`` vocabulary columns is one GEMM (the
torch backend's linear: oneDNN on a CPU in float32 and bfloat16, F.linear elsewhere) giving
[T, chunk] logits in x's dtype, whose max per sequence goes into a float32 [B, V] output; g
then runs once, in place, on [B, V]. Peak memory: one chunk's logits plus the output. By
default a chunk holds at most CHUNK_BYTES of logits, a small fraction of the [T, V] logits the
unfused head holds (and of sentence-transformers' pooling, which keeps a masked copy of them
besides; ``python -m benchmarks.splade_head`` measures both).

The max per sequence: ``scatter_reduce_`` ("amax") of the chunk's rows onto a fresh zeroed
[B, chunk], each row sent to its sequence (``searchsorted`` of the row numbers in
``cu_seqlens``), the zeros being relu's floor and an empty sequence's value; nothing is read
on the host, on any device, so it traces under ``torch.compile`` as one graph. On a CPU it
was the fastest of the ways tried: one ``amax`` per sequence (a parallel region each, at the
mercy of a loaded machine), ``torch.segment_reduce``, and the same scatter straight into the
output's column slice were each several times slower (docs/kernels.md, the fused SPLADE
head).
"""

from __future__ import annotations

import torch

from . import checks, reference
from .cpu_engine_linear import linear_unchecked
from .op import checked, implements
from .reference import splade_activation

# Logits one chunk of the vocabulary may hold, and the fewest columns a chunk takes (so that a
# very long batch still runs GEMMs of a useful width).
CHUNK_BYTES = 32 << 20
MIN_CHUNK = 256


def chunk_columns(tokens: int, element_size: int, vocab: int) -> int:
    """Vocabulary columns per GEMM: as many as CHUNK_BYTES of [tokens, columns] logits of
    ``element_size`` bytes hold, at least MIN_CHUNK, at most ``vocab`` (and at least 1)."""
    fitting = CHUNK_BYTES // max(tokens * element_size, 1)
    return max(1, min(vocab, max(MIN_CHUNK, fitting)))


def _sequence_of_rows(cu_seqlens: torch.Tensor, tokens: int) -> torch.Tensor:
    """int64 [T]: the sequence of each row, the number of bounds cu_seqlens[1:] at or below
    it (empty sequences are passed over)."""
    rows = torch.arange(tokens, dtype=cu_seqlens.dtype, device=cu_seqlens.device)
    return torch.searchsorted(cu_seqlens[1:], rows, right=True)


def _segment_max(logits: torch.Tensor, sequence: torch.Tensor, batch: int) -> torch.Tensor:
    """[T, C] logits -> [B, C] in their dtype: each sequence's max, floored at 0 (relu's
    floor, and an empty sequence's value); ``sequence``: the sequence of each row."""
    index = sequence[:, None].expand(logits.shape)
    best = logits.new_zeros((batch, logits.shape[1]))
    return best.scatter_reduce_(0, index, logits, "amax")


@implements(reference.splade_max)
def splade_max_unchecked(x, weight, bias, cu_seqlens, log_steps, *, chunk: int | None = None):
    """:func:`fastbert.kernels.reference.splade_max` by vocabulary chunks (module docstring),
    inputs not checked. ``chunk``: vocabulary columns per GEMM (default
    :func:`chunk_columns`). Returns float32 [B, V]."""
    tokens = x.shape[0]
    vocab = weight.shape[0]
    batch = 1 if cu_seqlens is None else cu_seqlens.shape[0] - 1
    if cu_seqlens is None:
        sequence = torch.zeros(tokens, dtype=torch.int64, device=x.device)
    else:
        sequence = _sequence_of_rows(cu_seqlens, tokens)
    out = torch.empty((batch, vocab), dtype=torch.float32, device=x.device)
    if chunk is None:
        chunk = chunk_columns(tokens, x.element_size(), vocab)
    for start in range(0, vocab, chunk):
        end = min(start + chunk, vocab)
        part_bias = None if bias is None else bias[start:end]
        logits = linear_unchecked(x, weight[start:end], part_bias)
        out[:, start:end] = _segment_max(logits, sequence, batch)
        del logits  # before the next chunk's exist: one chunk's logits at a time
    return splade_activation(out, log_steps, in_place=not out.requires_grad)


def _check_values_and_chunk(x: torch.Tensor, cu_seqlens: torch.Tensor | None, chunk) -> None:
    """ValueError unless ``cu_seqlens`` rises from 0 to T (its values read on the host) and
    ``chunk`` is None or a positive int."""
    if cu_seqlens is not None:
        checks.check_cu_seqlens_values(cu_seqlens, x.shape[0])
    if chunk is not None and (type(chunk) is not int or chunk < 1):
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")


splade_max = checked(splade_max_unchecked, checks.check_splade_max, _check_values_and_chunk)
""":func:`splade_max_unchecked`, inputs checked (``cu_seqlens``' values read on the host)."""
