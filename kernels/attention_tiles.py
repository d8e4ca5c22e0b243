"""Helpers shared by the attention forward (flash_attention.py) and backward
(flash_attention_backward.py) kernels: where a (sequence, head) starts, loading its rows,
numbering its elements for dropout, and the grid limits."""

from __future__ import annotations

import math

import triton
import triton.language as tl

# CUDA's limit on grid axes 1 and 2 (heads, and batch or sequences).
MAX_GRID_YZ = 65535
LOG2_E = math.log2(math.e)


@triton.jit
def load_rows(
    base,  # pointer to element (row 0, column 0) of a [rows, HEAD_DIM] tile source
    offs_row,
    stride_row,
    row_ok,  # bool [len(offs_row)]: which rows to read; the others load as zeros
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Rows ``offs_row`` of a row-major tile where ``row_ok``, zeros elsewhere and past
    HEAD_DIM (zero-padded to BLOCK_D)."""
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = base + offs_row[:, None] * stride_row + offs_d[None, :]
    if HEAD_DIM == BLOCK_D:
        return tl.load(ptrs, mask=row_ok[:, None], other=0.0)
    else:
        return tl.load(ptrs, mask=row_ok[:, None] & (offs_d[None, :] < HEAD_DIM), other=0.0)


@triton.jit
def dropout_origin(CuSeqlens, batch, head, first, seq_q, seq_k, IS_VARLEN: tl.constexpr):
    """(offset of query 0 / key 0 of this (sequence, head), offset step of one query row): the
    dropout offset of each element is its flat index in a [B, H, S_q, S_k] array (dense) or in
    an [H, T, T] array of global token indices (varlen, T = cu_seqlens[-1]), so no two elements
    of a call share one. The grid's axis 1 runs over heads and axis 2 over the sequences."""
    if IS_VARLEN:
        total = tl.load(CuSeqlens + tl.num_programs(2)).to(tl.int64)
        return (head * total + first) * total + first, total
    else:
        row_step = seq_k.to(tl.int64)
        return (batch.to(tl.int64) * tl.num_programs(1) + head) * seq_q * row_step, row_step


@triton.jit
def head_base(ptr, batch, first, head, stride_b, stride_h, stride_s, IS_VARLEN: tl.constexpr):
    """Pointer to row 0, column 0 of one (sequence, head) of a [B, H, S, D] / [T, H, D] tensor
    (varlen: the sequence's tokens start at packed row ``first``)."""
    if IS_VARLEN:
        return ptr + first * stride_s + head * stride_h
    else:
        return ptr + batch.to(tl.int64) * stride_b + head * stride_h


def check_grid(what: str, n: int) -> None:
    if n > MAX_GRID_YZ:
        raise ValueError(f"{what} = {n} exceeds the CUDA grid limit of {MAX_GRID_YZ}")
