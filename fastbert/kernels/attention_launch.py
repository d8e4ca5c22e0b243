"""Host-side pieces the attention forward (flash_attention.py) and backward
(flash_attention_backward.py) share: their autotune configs and pruning, the checks of what
the kernels read, the sequences one launch covers (a padded batch or
packed sequences) and the arguments every attention kernel takes for them."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import triton

from . import checks, dropout
from .attention_tiles import LOG2_E, check_grid, clamp_window, rotary_table
from .launch import check_triton_device, interpreting, next_power_of_2, tuned

SUPPORTED_HEAD_DIMS = (32, 64, 80, 96, 128)

# What both kernels' autotuners key on (the forward adds STORE_LSE). The buckets are the next
# powers of two of the longest query and key lengths.
AUTOTUNE_KEY = (
    "seq_q_bucket",
    "seq_k_bucket",
    "HEAD_DIM",
    "HAS_MASK",
    "IS_VARLEN",
    "HAS_DROPOUT",
    "HAS_BIAS",
    "ROTARY",
    "WINDOW",
)


def tune_configs(
    space: tuple[tuple[int, int, int, int], ...],
    maxnreg: dict[tuple[int, int, int, int], int] | None = None,
) -> list[triton.Config]:
    """Autotune configs of (BLOCK_M, BLOCK_N, num_warps, num_stages) tuples, with the register
    cap ``maxnreg`` gives a tuple (none by default); the first alone under the interpreter (it
    runs every config it is given, and timing there would be meaningless)."""
    maxnreg = maxnreg or {}
    space = space[:1] if interpreting() else space
    return [
        triton.Config(
            {"BLOCK_M": m, "BLOCK_N": n},
            num_warps=w,
            num_stages=s,
            maxnreg=maxnreg.get((m, n, w, s)),
        )
        for m, n, w, s in space
    ]


def pruner(
    keep: Callable[..., bool],
    variant: Callable[[dict], tuple[bool, ...]],
    load: Callable[..., int] | None = None,
) -> Callable[..., list[triton.Config]]:
    """An autotuner's ``early_config_prune`` hook: the configs for which
    ``keep(config, BLOCK_D, element size of Q, *variant(launch arguments))`` holds; when none
    does, the one of least ``load`` (same arguments), or the first without one; only one of
    them when FASTBERT_AUTOTUNE names it."""

    def prune(configs: list[triton.Config], named_args: dict, **kwargs: object) -> list:
        args = {**named_args, **kwargs}
        measure = (args["BLOCK_D"], args["Q"].element_size(), *variant(args))
        kept = [c for c in configs if keep(c, *measure)]
        if not kept:
            kept = [min(configs, key=lambda c: load(c, *measure))] if load else configs[:1]
        return tuned(kept)

    return prune


def check_kernel_inputs(tensors: dict[str, torch.Tensor | None], head_dim: int) -> None:
    """What the kernels need beyond the checks every backend shares (checks.py): a
    Triton device for each tensor given, a supported head dim, unit stride on D of q, k, v."""
    for name, t in tensors.items():
        if t is not None:
            check_triton_device(name, t)
    if head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(
            f"head dim {head_dim} is not supported by the Triton attention kernel; "
            f"supported head dims: {SUPPORTED_HEAD_DIMS}"
        )
    for name in ("q", "k", "v"):
        t = tensors[name]
        if t.stride(-1) != 1:
            raise ValueError(
                f"{name} must have unit stride on the head dim, got strides {tuple(t.stride())}"
            )


def resolve_scale(q: torch.Tensor, scale: float | None) -> float:
    """The softmax scale: ``scale``, or D**-0.5 when it is None."""
    return q.shape[-1] ** -0.5 if scale is None else float(scale)


def checked_variants(
    q: torch.Tensor,
    relative_bias: torch.Tensor | None,
    rotary: torch.Tensor | None,
    window: int | None,
    dropout_p: float,
) -> float:
    """Validate the variant arguments both ops take; dropout_p as the forward takes it."""
    checks.check_relative_bias(relative_bias, q)
    checks.check_rotary(rotary, window, q)
    return dropout.check_dropout_p(dropout_p)


def scaled_bias_table(bias: torch.Tensor | None) -> torch.Tensor | None:
    """The relative position bias table as the kernels read it: fp32, contiguous, times
    log2(e) (the kernels' scores are in log2 units)."""
    return None if bias is None else (bias.float() * LOG2_E).contiguous()


class Sequences(NamedTuple):
    """The sequences one launch covers, as every attention kernel takes them: a padded batch
    (:func:`dense`) or packed sequences (:func:`packed`)."""

    count: int  # the batch, or the number of packed sequences (the grid's axis 2)
    seq_q: int  # the dense query length; 0 when packed (the kernels read cu_seqlens)
    seq_k: int  # the dense key length; 0 when packed
    max_seqlen_q: int  # the longest query sequence: it sizes the grid and keys the autotuner
    max_seqlen_k: int  # the longest key sequence: it keys the autotuner
    positions: int  # a bound on every position: the RoPE table's length, the window's cap
    mask: torch.Tensor | None  # dense: the [B, S_k] key-padding mask, or None
    cu_seqlens: torch.Tensor | None  # packed: int32 [B + 1] sequence boundaries


def dense(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> Sequences:
    """The sequences of [B, H, S_q, D] queries and [B, H, S_k, D] keys, ``mask`` their
    key-padding mask (or None)."""
    batch, _, seq_q, _ = q.shape
    seq_k = k.shape[2]
    return Sequences(batch, seq_q, seq_k, seq_q, seq_k, max(seq_q, seq_k), mask, None)


def packed(q: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int) -> Sequences:
    """The sequences of [T, H, D] packed tokens: a sequence's positions are below T whatever
    max_seqlen says."""
    count = cu_seqlens.numel() - 1
    return Sequences(count, 0, 0, max_seqlen, max_seqlen, q.shape[0], None, cu_seqlens)


def head_strides(*tensors: torch.Tensor) -> tuple[int, ...]:
    """(batch, head, row) strides of each [B, H, S, D] tensor, or (0, head, row) of [T, H, D]."""
    out: list[int] = []
    for t in tensors:
        out += t.stride()[:3] if t.dim() == 4 else (0, t.stride(1), t.stride(0))
    return tuple(out)


def row_strides(sequences: Sequences, lse: torch.Tensor | None) -> tuple[int, ...]:
    """The strides of the key-padding mask (batch, key) and of the per-query statistics laid
    out like ``lse``, fp32 [B, H, S_q] or [H, T] (batch, head); zeros for what is absent."""
    mask = sequences.mask
    mask_strides = (0, 0) if mask is None else (mask.stride(0), mask.stride(1))
    if lse is None:
        return (*mask_strides, 0, 0)
    if sequences.cu_seqlens is not None:
        return (*mask_strides, 0, lse.stride(0))
    return (*mask_strides, lse.stride(0), lse.stride(1))


def variant_flags(
    sequences: Sequences,
    head_dim: int,
    dropout_p: float,
    bias: torch.Tensor | None,
    rotary: torch.Tensor | None,
    window: int | None,
) -> dict[str, object]:
    """The constexpr arguments every attention kernel takes: the head dim and its power-of-two
    block, and which variant runs."""
    return dict(
        HEAD_DIM=head_dim,
        BLOCK_D=next_power_of_2(head_dim),
        HAS_MASK=sequences.mask is not None,
        IS_VARLEN=sequences.cu_seqlens is not None,
        HAS_DROPOUT=dropout_p > 0.0,
        HAS_BIAS=bias is not None,
        ROTARY=rotary is not None,
        WINDOW=window is not None,
    )


def checked_grid(sequences: Sequences, heads: int) -> None:
    """Raise unless the heads and sequences fit the grid's axes 1 and 2."""
    check_grid("the number of heads", heads)
    check_grid("the batch size (number of sequences)", sequences.count)


def rotary_factors(rotary: torch.Tensor | None, sequences: Sequences) -> torch.Tensor | None:
    """The kernels' RoPE table (``rotary_table``) for these sequences, or None without one."""
    return None if rotary is None else rotary_table(rotary, sequences.positions)


def trailing_scalars(sequences: Sequences, window: int | None) -> tuple[int, int, int]:
    """The last runtime arguments of every attention kernel: the window (capped) and the two
    autotune buckets."""
    return (
        clamp_window(window, sequences.positions),
        next_power_of_2(sequences.max_seqlen_q),
        next_power_of_2(sequences.max_seqlen_k),
    )
