"""The torch backend of ``splade_max`` (the fused SPLADE head): the masked-LM decoder's logits
reduced to a max per sequence one slice of the vocabulary at a time, so that the [T, V] logits
never exist whole.

Since g = log1p(relu(.)) (once or twice) is monotone non-decreasing, the max over a sequence
of g(z) is g of the max of z: each chunk of ``chunk`` vocabulary columns is one GEMM (the
torch backend's linear: oneDNN on a CPU in float32 and bfloat16, F.linear elsewhere) giving
[T, chunk] logits in x's dtype, whose max per sequence goes into a float32 [B, V] output; g
then runs once, on [B, V]. Peak memory: one chunk's logits plus the output. By default a chunk
holds at most CHUNK_BYTES of logits (2,048 columns of a 4,096-token float32 batch: 32 MiB,
where the unfused head holds 477 MiB of [T, V] float32 logits for BERT's 30,522 words, and
as much again for each activation step it does not run in place).

The max per sequence: on a CPU, one ``amax`` over each sequence's rows (contiguous rows of
the chunk; ``cu_seqlens`` read on the host, which costs nothing there), measured on [4,096,
2,048] float32 logits of 32 sequences at 1.4 ms against 24 ms for an ``amax`` over a
[B, L, chunk] view of equal lengths, 33 ms for ``torch.segment_reduce`` and 72 ms for
``scatter_reduce``. Elsewhere (CUDA), and under ``torch.compile``, ``torch.segment_reduce`` on
the sequences' lengths, which reads nothing on the host.
"""

from __future__ import annotations

import torch

from . import checks
from .reference import splade_activation
from .torch_ops import linear_unchecked

# Logits one chunk of the vocabulary may hold, and the fewest columns a chunk takes (so that a
# very long batch still runs GEMMs of a useful width).
CHUNK_BYTES = 32 << 20
MIN_CHUNK = 256


def chunk_columns(tokens: int, element_size: int, vocab: int) -> int:
    """Vocabulary columns per GEMM: as many as CHUNK_BYTES of [tokens, columns] logits of
    ``element_size`` bytes hold, at least MIN_CHUNK, at most ``vocab`` (and at least 1)."""
    fitting = CHUNK_BYTES // max(tokens * element_size, 1)
    return max(1, min(vocab, max(MIN_CHUNK, fitting)))


def _reads_bounds_on_host(cu_seqlens: torch.Tensor) -> bool:
    return cu_seqlens.device.type == "cpu" and not torch.compiler.is_compiling()


def _segment_max(
    logits: torch.Tensor, bounds: list[int] | None, lengths: torch.Tensor | None
) -> torch.Tensor:
    """[T, C] logits -> float32 [B, C]: each sequence's max, floored at 0 (relu's floor, and
    an empty sequence's value). ``bounds``: the host copy of cu_seqlens; else ``lengths``
    [B]."""
    if bounds is None:
        best = torch.segment_reduce(logits, "max", lengths=lengths, axis=0, unsafe=True, initial=0)
        return best.float()
    out = logits.new_zeros((len(bounds) - 1, logits.shape[1]), dtype=torch.float32)
    for b, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end > start:
            out[b] = logits[start:end].amax(dim=0)
    return out.clamp_min_(0.0)


def splade_max_unchecked(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    log_steps: int = 1,
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """:func:`fastbert.kernels.reference.splade_max` by vocabulary chunks (module docstring),
    inputs not checked. ``chunk``: vocabulary columns per GEMM (default
    :func:`chunk_columns`). Returns float32 [B, V]."""
    tokens = x.shape[0]
    vocab = weight.shape[0]
    if cu_seqlens is None:
        cu_seqlens = torch.tensor([0, tokens], dtype=torch.int32, device=x.device)
    bounds = lengths = None
    if _reads_bounds_on_host(cu_seqlens):
        bounds = cu_seqlens.tolist()
    else:
        lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    out = torch.empty((cu_seqlens.shape[0] - 1, vocab), dtype=torch.float32, device=x.device)
    if chunk is None:
        chunk = chunk_columns(tokens, x.element_size(), vocab)
    for start in range(0, vocab, chunk):
        end = min(start + chunk, vocab)
        part_bias = None if bias is None else bias[start:end]
        logits = linear_unchecked(x, weight[start:end], part_bias)
        out[:, start:end] = _segment_max(logits, bounds, lengths)
        del logits  # before the next chunk's exist: one chunk's logits at a time
    return splade_activation(out, log_steps, in_place=not out.requires_grad)


def splade_max(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    log_steps: int = 1,
    *,
    chunk: int | None = None,
) -> torch.Tensor:
    """:func:`splade_max_unchecked`, inputs checked (``cu_seqlens``' values read on the
    host)."""
    checks.check_splade_max(x, weight, bias, cu_seqlens, log_steps)
    if cu_seqlens is not None:
        checks.check_cu_seqlens_values(cu_seqlens, x.shape[0])
    if chunk is not None and (type(chunk) is not int or chunk < 1):
        raise ValueError(f"chunk must be a positive int, got {chunk!r}")
    return splade_max_unchecked(x, weight, bias, cu_seqlens, log_steps, chunk=chunk)
