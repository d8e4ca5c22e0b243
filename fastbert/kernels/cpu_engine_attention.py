"""The CPU engine's attention: the compiled kernel, per-length SDPA and the bfloat16 math path.

PyTorch's CPU attention spends most of its time around the arithmetic for the short
sequences of real text. On a CPU this module picks, per call, the fastest of:

- the compiled attention (fastbert.kernels.cpu_attention, bfloat16 and float32 where the
  CPU has AVX512_BF16 and a C++ compiler built it): the whole batch in one call, for an
  attention without dropout (MPNet's relative bias, ModernBERT's window and rotary positions
  included), and for a dense batch without a mask or with right padding;
- attention_varlen elsewhere: one unmasked SDPA call per run of consecutive sequences of
  equal length, on [n, H, L, D] views of the packed tensors (no gather, no padding, no mask;
  it reads ``cu_seqlens`` on the host, which costs nothing on a CPU, and per-sequence calls
  are faster than one masked call over the gathered batch, even with every length different:
  docs/results.md, "Measurements behind the code's choices"). In bfloat16 a run of up to
  about a hundred tokens takes a math attention in float32 instead (faster than the CPU flash
  kernel there, and more accurate: see MATH_ATTENTION_MAX_LENGTH);
- the plain backend's attention (fastbert.kernels.torch_ops) for everything else, and for
  every call while ``torch.compile`` traces (neither the compiled kernel nor the host read of
  the per-length path traces).

Same signatures and semantics as fastbert.kernels.reference. The ``*_unchecked`` functions are
the engine's ops, as the encoder calls them; :func:`attention` checks its inputs first, for
callers outside the encoder (the Hugging Face attention interface).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from . import cpu_attention, reference, torch_ops
from .op import checked, implements


def length_mask(
    relative_bias: torch.Tensor | None, window: int | None, length: int, dtype, device
) -> torch.Tensor | None:
    """SDPA's mask for sequences of ``length`` tokens without padding: None, the window's keys
    (bool [1, 1, L, L]; a query always sees itself), or the relative bias (float [H, L, L]),
    -inf outside the window."""
    keep = reference.keep_mask(None, window, length, length, device)
    if relative_bias is None:
        return keep
    bias = reference.relative_position_bias(relative_bias, length, length).to(dtype)
    return bias if keep is None else bias.masked_fill(keep.logical_not(), float("-inf"))


def additive_mask(
    relative_bias: torch.Tensor | None, window: int | None, length: int, device
) -> torch.Tensor | None:
    """The math path's mask for sequences of ``length`` tokens: None, or float32 [L, L] or
    [H, L, L] added to the scaled scores (the relative bias, kept in float32; -inf outside
    the window; a query always sees itself, so no row is all -inf)."""
    mask = length_mask(relative_bias, window, length, torch.float32, device)
    if mask is None or mask.dtype != torch.bool:
        return mask
    return torch.zeros(mask.shape[-2:], device=device).masked_fill_(
        mask.logical_not()[0, 0], float("-inf")
    )


# The math path on a CPU, per dtype and head dimension: the longest sequence length it takes
# (one SDPA call above). Measured by benchmarks/cpu_attention.py (the table and its conditions:
# docs/cpu.md, "Attention in bfloat16"): in bfloat16 the math path (float32 throughout, more
# accurate) was faster than PyTorch's CPU flash kernel at 16 to 44 tokens and about level
# from there to these lengths, where the summed savings peaked. In float32 the flash kernel
# was as fast or faster on average at every length (the math path won only at some lengths
# with many sequences, and lost as much elsewhere), so float32, like float16 and float64,
# always takes SDPA.
MATH_ATTENTION_MAX_LENGTH: dict[tuple[torch.dtype, int], int] = {
    (torch.bfloat16, 32): 124,
    (torch.bfloat16, 64): 108,
}

# Sequences per math-path chunk: as many as keep one chunk's float32 scores within this many
# bytes. Larger chunks were slower (docs/results.md, "Measurements behind the code's
# choices"): the temporaries outgrow the cache, and glibc serves allocations of a few MiB by
# mmap, each a new set of page faults.
MATH_SCORE_BYTES = 1 << 18


# The least scores per head (n * L * L) a run needs to take the math path: below it, its
# half-dozen op calls (against SDPA's one) cost more than it saves; the two were level just
# under this many scores (docs/results.md, "Measurements behind the code's choices").
MATH_ATTENTION_MIN_SCORES = 1024


def takes_math(q: torch.Tensor, n: int, length: int, dropout_p: float, *tensors) -> bool:
    """Whether a run of ``n`` sequences of ``length`` tokens takes the math path: an entry of
    MATH_ATTENTION_MAX_LENGTH at least ``length``, at least MATH_ATTENTION_MIN_SCORES scores
    per head, no dropout, and no autograd record (SDPA keeps training's dropout and
    memory-lean backward)."""
    longest = MATH_ATTENTION_MAX_LENGTH.get((q.dtype, q.shape[-1]), 0)
    if length > longest or n * length * length < MATH_ATTENTION_MIN_SCORES or dropout_p:
        return False
    recorded = (t is not None and t.requires_grad for t in (q, *tensors))
    return not (torch.is_grad_enabled() and any(recorded))


def math_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float | None,
    out: torch.Tensor,
) -> None:
    """softmax(scale * q k^T + mask) v for q, k, v [n, H, L, D] (float32 or bfloat16, any
    strides), written into ``out`` [n, H, L, D] (q's dtype, any strides).

    Every step in float32: q, k, v widened (exactly), the scores and the softmax, P @ V with
    P unrounded; the result rounded to ``out``'s dtype once. In bfloat16 that is more accurate
    than SDPA's flash kernel, which rounds P to bfloat16 for its P @ V product. ``scale`` None
    is 1 / sqrt(D), as SDPA. ``mask``: None or float32 [L, L] or [H, L, L], added to the scaled
    scores. Sequences go in chunks whose float32 scores fit MATH_SCORE_BYTES."""
    n, heads, length, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else scale
    chunk = max(1, MATH_SCORE_BYTES // (4 * heads * length * length))
    wide = dict(dtype=torch.float32, memory_format=torch.contiguous_format)
    for first in range(0, n, chunk):
        rows = slice(first, first + chunk)
        scores = torch.matmul(q[rows].to(**wide), k[rows].to(**wide).mT).mul_(scale)
        if mask is not None:
            scores.add_(mask)
        probs = torch.softmax(scores, dim=-1)
        out[rows].copy_(torch.matmul(probs, v[rows].to(**wide)))


def attention_by_length(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    scale: float | None,
    dropout_p: float,
    relative_bias: torch.Tensor | None,
    rotary: torch.Tensor | None,
    window: int | None,
) -> torch.Tensor:
    """attention_varlen per run of consecutive sequences of equal length, each on
    [n, H, L, D] views of the packed [T, H, D] tensors: no gather, no padding, and a mask only
    for a relative bias or a window (one per length). A run takes the math path
    (:func:`math_attention`) where :func:`takes_math` says so, one SDPA call otherwise.
    Reads ``cu_seqlens`` on the host: for a CPU only, where that costs nothing."""
    bounds = cu_seqlens.tolist()
    tokens, heads, head_dim = q.shape
    context = torch.empty_like(q)
    masks: dict[tuple[int, bool], torch.Tensor | None] = {}
    first, count = 0, len(bounds) - 1
    while first < count:
        length = bounds[first + 1] - bounds[first]
        last = first + 1
        while last < count and bounds[last + 1] - bounds[last] == length:
            last += 1
        start, end, n = bounds[first], bounds[last], last - first
        first = last
        if length == 0:
            continue
        group_q, group_k, group_v = (
            t[start:end].view(n, length, heads, head_dim).transpose(1, 2) for t in (q, k, v)
        )
        if rotary is not None:  # positions 0..L-1: each sequence's own
            group_q = reference.rotary_positions(group_q, rotary)
            group_k = reference.rotary_positions(group_k, rotary)
        out = context[start:end].view(n, length, heads, head_dim).transpose(1, 2)
        use_math = takes_math(q, n, length, dropout_p, k, v, relative_bias)
        if (length, use_math) not in masks:
            masks[length, use_math] = (
                additive_mask(relative_bias, window, length, q.device)
                if use_math
                else length_mask(relative_bias, window, length, q.dtype, q.device)
            )
        if use_math:
            math_attention(group_q, group_k, group_v, masks[length, True], scale, out)
        else:
            out.copy_(
                F.scaled_dot_product_attention(
                    group_q,
                    group_k,
                    group_v,
                    attn_mask=masks[length, False],
                    dropout_p=dropout_p,
                    scale=scale,
                )
            )
    return context


def takes_compiled(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    relative_bias: torch.Tensor | None = None,
) -> bool:
    """Whether an attention runs fastbert.kernels.cpu_attention: float32 on a CPU with AVX2,
    bfloat16 too with AVX512_BF16 (:func:`cpu_attention.takes`), no dropout, and no autograd
    record of the relative bias (the kernel has no backward); never under torch.compile, which
    cannot trace it."""
    if dropout_p or torch.compiler.is_compiling():
        return False
    if relative_bias is not None and torch.is_grad_enabled() and relative_bias.requires_grad:
        return False
    return cpu_attention.takes(q, k, v)


def compiled_dense(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    scale: float | None,
    positions: cpu_attention.Positions,
) -> torch.Tensor | None:
    """Attention of q, k, v [B, H, S, D] through fastbert.kernels.cpu_attention, on
    [B * S, H, D] views (copies where q, k, v are not views of a [B, S, ...] layout), the keys
    ``keep`` (bool [B, S]) marks, or all, with the bias, rotary positions and window of
    ``positions``; returns [B, H, S, D], a view of [B, S, H, D] memory (zeros on a query without
    keys). None when ``keep`` is not right padding (each row's real tokens first): SDPA takes
    that batch. Reads the row lengths on the host (a CPU: no cost)."""
    batch, heads, seq, head_dim = q.shape
    if keep is None:
        lengths = torch.full((batch,), seq, dtype=torch.int64)
    else:
        lengths = keep.sum(1)
        if not torch.equal(keep, torch.arange(seq) < lengths[:, None]):
            return None
    q, k, v = (t.transpose(1, 2).reshape(batch * seq, heads, head_dim) for t in (q, k, v))
    if not cpu_attention.takes(q, k, v):
        q, k, v = (t.contiguous() for t in (q, k, v))
    # Row b's tokens at b * S .., its queries all S of them (padded ones attend its real keys).
    starts = torch.arange(batch, dtype=torch.int64) * seq
    queries = torch.full((batch,), seq, dtype=torch.int64)
    out = cpu_attention.attention_sequences(
        q, k, v, starts, lengths.long(), queries, scale, positions
    )
    return out.view(batch, seq, heads, head_dim).transpose(1, 2)


@implements(reference.attention)
def attention_unchecked(
    q, k, v, key_padding_mask, scale, dropout_p, relative_bias, *, rotary, window
):
    """:func:`fastbert.kernels.torch_ops.attention_unchecked` on the compiled attention where
    it takes the call (:func:`takes_compiled`, no dropout, right-padded rows)."""
    if q.numel() and takes_compiled(q, k, v, dropout_p, relative_bias):
        keep = key_padding_mask
        if keep is not None and keep.dtype != torch.bool:
            keep = keep != 0
        scale = None if scale is None else float(scale)
        positions = cpu_attention.Positions(relative_bias, rotary, window)
        out = compiled_dense(q, k, v, keep, scale, positions)
        if out is not None:
            return out
    return torch_ops.attention_unchecked(
        q, k, v, key_padding_mask, scale, dropout_p, relative_bias, rotary=rotary, window=window
    )


@implements(reference.attention_varlen)
def attention_varlen_unchecked(
    q, k, v, cu_seqlens, max_seqlen, scale, dropout_p, relative_bias, *, rotary, window
):
    """:func:`fastbert.kernels.torch_ops.attention_varlen_unchecked` on the compiled attention
    (no dropout) or per run of equal lengths (:func:`attention_by_length`) on a CPU while
    nothing traces."""
    options = (scale, dropout_p, relative_bias)
    if q.shape[0] and max_seqlen and q.device.type == "cpu":
        scale = None if scale is None else float(scale)
        if takes_compiled(q, k, v, dropout_p, relative_bias):
            positions = cpu_attention.Positions(relative_bias, rotary, window)
            return cpu_attention.attention_varlen(q, k, v, cu_seqlens, scale, positions)
        if not torch.compiler.is_compiling():
            return attention_by_length(
                q, k, v, cu_seqlens, scale, dropout_p, relative_bias, rotary, window
            )
    return torch_ops.attention_varlen_unchecked(
        q, k, v, cu_seqlens, max_seqlen, *options, rotary=rotary, window=window
    )


attention = checked(attention_unchecked, *torch_ops.ATTENTION_CHECKS)
""":func:`attention_unchecked`, inputs checked: the CPU engine's attention for callers outside
the encoder (the Hugging Face attention interface)."""
