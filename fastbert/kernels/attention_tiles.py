"""Tile helpers of the attention forward (flash_attention.py) and backward
(flash_attention_backward.py) kernels: where a (sequence, head) starts, loading its rows,
rotating them (RoPE), which keys of a mask row need which checks (the forward's), the keys a
sliding window leaves to a query block, numbering its elements for dropout, the relative
position bias of a tile, and the grid limits."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .checks import RELATIVE_BUCKETS
from .reference import RELATIVE_MAX_DISTANCE, relative_position_bucket, rotary_angles

# CUDA's limit on grid axes 1 and 2 (heads, and batch or sequences).
MAX_GRID_YZ = 65535
LOG2_E = math.log2(math.e)
# Mask entries each step of the scan for whole tiles of real keys reads (see key_ranges).
MASK_SCAN_BLOCK = tl.constexpr(256)


def bucket_edges() -> tuple[int, ...]:
    """The least distance |j - i| of each log-spaced bucket of one direction (buckets
    RELATIVE_BUCKETS / 4 .. RELATIVE_BUCKETS / 2 - 1), read off the reference's float math, so
    the kernels compare integers and land exactly where Hugging Face's float logs do.

    Every edge lies below ``RELATIVE_MAX_DISTANCE`` (where the last bucket starts at the
    latest). The distances stay few on purpose: on a tensor of a few thousand, torch's log
    starts an OpenMP thread team on the thread importing fastbert, and with a second team (a
    server's model thread) libgomp counts more threads than cores and stops spin-waiting."""
    distance = torch.arange(2 * RELATIVE_MAX_DISTANCE)
    bucket = relative_position_bucket(-distance)  # key before the query: the lower half
    first = RELATIVE_BUCKETS // 4
    return tuple(int(distance[bucket == b][0]) for b in range(first, RELATIVE_BUCKETS // 2))


# Buckets per direction, the distances with a bucket each, and the edges of the other seven.
HALF_BUCKETS = tl.constexpr(RELATIVE_BUCKETS // 2)
MAX_EXACT = tl.constexpr(RELATIVE_BUCKETS // 4)
_EDGES = bucket_edges()
assert len(_EDGES) == 8 and _EDGES[0] == RELATIVE_BUCKETS // 4, _EDGES
EDGE_1, EDGE_2, EDGE_3, EDGE_4, EDGE_5, EDGE_6, EDGE_7 = (tl.constexpr(e) for e in _EDGES[1:])


@triton.jit
def relative_bucket(distance):
    """The bucket of each key - query ``distance`` (int32 tile), as
    reference.relative_position_bucket computes it: keys after the query in the upper half;
    distances below MAX_EXACT one bucket each, then the log-spaced buckets by integer
    comparison with their edges (the last one open-ended)."""
    n = tl.abs(distance)
    large = (
        MAX_EXACT
        + (n >= EDGE_1).to(tl.int32)
        + (n >= EDGE_2).to(tl.int32)
        + (n >= EDGE_3).to(tl.int32)
        + (n >= EDGE_4).to(tl.int32)
        + (n >= EDGE_5).to(tl.int32)
        + (n >= EDGE_6).to(tl.int32)
        + (n >= EDGE_7).to(tl.int32)
    )
    return tl.where(distance > 0, HALF_BUCKETS, 0) + tl.where(n < MAX_EXACT, n, large)


@triton.jit
def bias_tile(bias_base, offs_m, offs_n):
    """fp32 [len(offs_m), len(offs_n)]: the bias of queries ``offs_m`` and keys ``offs_n`` (their
    positions in the sequence) from one head's row ``bias_base`` of the table."""
    bucket = relative_bucket(offs_n[None, :] - offs_m[:, None])
    return tl.load(bias_base + bucket)


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
def load_all_rows(
    base,  # pointer to element (row 0, column 0) of a [rows, HEAD_DIM] tile source
    offs_row,
    stride_row,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """Rows ``offs_row`` of a row-major tile, all of them in bounds (zero-padded past
    HEAD_DIM to BLOCK_D): ``load_rows`` without the per-row predicate."""
    offs_d = tl.arange(0, BLOCK_D)
    ptrs = base + offs_row[:, None] * stride_row + offs_d[None, :]
    if HEAD_DIM == BLOCK_D:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)


def rotary_table(rotary: torch.Tensor, length: int) -> torch.Tensor:
    """float32 [length, D]: row p holds cos(p * rotary) then sin(p * rotary) (rotary: float32
    [D / 2] inverse frequencies), the angle rounded to float32 and cos / sin taken by torch in
    float32: the reference's arithmetic (reference.rotary_positions), so the kernels' RoPE
    factors are its bits on the same device."""
    angle = rotary_angles(torch.arange(length, device=rotary.device), rotary)
    return torch.cat((angle.cos(), angle.sin()), dim=1).contiguous()


@triton.jit
def rotate_rows(
    x,  # [len(offs_row), BLOCK_D] the rows as load_rows returned them
    base,  # pointer to element (row 0, column 0) of the rows' source
    offs_row,
    stride_row,
    row_ok,  # bool [len(offs_row)]: which rows were read
    positions,  # int32 [len(offs_row)]: each row's position in its sequence
    table,  # float32 [L, HEAD_DIM] cos then sin of each position (rotary_table)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """``x`` rotated by RoPE as reference.rotary_positions does ("rotate half": column d pairs
    with d + D / 2): x1 cos - x2 sin and x2 cos + x1 sin in float32, cast back to x's dtype,
    cos and sin loaded from the table.

    A power-of-two head splits the tile into its halves in registers (one [rows, D / 2] cos
    and sin load each). A head padded to BLOCK_D (80, 96) cannot be split there: its partner
    columns are a second load of the rows with the halves swapped (from L1 / L2, the first
    load brought the lines in) and cos / sin are loaded for every column."""
    if HEAD_DIM == BLOCK_D:
        offs_f = tl.arange(0, HEAD_DIM // 2)
        factors = table + positions[:, None] * HEAD_DIM + offs_f[None, :]
        cos = tl.load(factors, mask=row_ok[:, None], other=0.0)
        sin = tl.load(factors + HEAD_DIM // 2, mask=row_ok[:, None], other=0.0)
        halves = tl.reshape(x.to(tl.float32), [x.shape[0], 2, HEAD_DIM // 2])
        x1, x2 = tl.split(tl.permute(halves, (0, 2, 1)))
        rotated = tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        return tl.reshape(tl.permute(rotated, (0, 2, 1)), [x.shape[0], HEAD_DIM]).to(x.dtype)
    else:
        offs_d = tl.arange(0, BLOCK_D)
        first_half = offs_d < HEAD_DIM // 2
        ok = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
        swapped = tl.where(first_half, offs_d + HEAD_DIM // 2, offs_d - HEAD_DIM // 2)
        partner_ptrs = base + offs_row[:, None] * stride_row + swapped[None, :]
        partner = tl.load(partner_ptrs, mask=ok, other=0.0)
        frequency = tl.where(first_half, offs_d, offs_d - HEAD_DIM // 2)
        factors = table + positions[:, None] * HEAD_DIM + frequency[None, :]
        cos = tl.load(factors, mask=ok, other=0.0)
        sin = tl.load(factors + HEAD_DIM // 2, mask=ok, other=0.0)
        sin = tl.where(first_half[None, :], -sin, sin)
        return (x.to(tl.float32) * cos + partner.to(tl.float32) * sin).to(x.dtype)


@triton.jit
def unrotate_rows(
    x,  # float32 [len(positions), BLOCK_D]: a gradient with respect to rotated rows
    row_ok,  # bool [len(positions)]: which rows are real (the others' factors load as zeros)
    positions,  # int32 [len(positions)]: each row's position in its sequence
    table,  # float32 [L, HEAD_DIM] cos then sin of each position (rotary_table)
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """The gradient with respect to the unrotated rows: ``x`` turned back by the transposed
    rotation, x1 cos + x2 sin and x2 cos - x1 sin, in float32. A power-of-two head splits the
    tile into halves in registers; a padded one (80, 96) gathers its swapped halves along the
    columns, once per program."""
    if HEAD_DIM == BLOCK_D:
        offs_f = tl.arange(0, HEAD_DIM // 2)
        factors = table + positions[:, None] * HEAD_DIM + offs_f[None, :]
        cos = tl.load(factors, mask=row_ok[:, None], other=0.0)
        sin = tl.load(factors + HEAD_DIM // 2, mask=row_ok[:, None], other=0.0)
        halves = tl.reshape(x, [x.shape[0], 2, HEAD_DIM // 2])
        x1, x2 = tl.split(tl.permute(halves, (0, 2, 1)))
        turned = tl.join(x1 * cos + x2 * sin, x2 * cos - x1 * sin)
        return tl.reshape(tl.permute(turned, (0, 2, 1)), [x.shape[0], HEAD_DIM])
    else:
        offs_d = tl.arange(0, BLOCK_D)
        first_half = offs_d < HEAD_DIM // 2
        swapped = tl.where(first_half, offs_d + HEAD_DIM // 2, offs_d - HEAD_DIM // 2)
        index = tl.broadcast_to(swapped[None, :], x.shape)
        partner = tl.gather(x, tl.minimum(index, BLOCK_D - 1), 1)
        ok = row_ok[:, None] & (offs_d < HEAD_DIM)[None, :]
        frequency = tl.where(first_half, offs_d, offs_d - HEAD_DIM // 2)
        factors = table + positions[:, None] * HEAD_DIM + frequency[None, :]
        cos = tl.load(factors, mask=ok, other=0.0)
        sin = tl.load(factors + HEAD_DIM // 2, mask=ok, other=0.0)
        sin = tl.where(first_half[None, :], sin, -sin)
        return x * cos + partner * sin


@triton.jit
def key_ranges(
    mask_base,  # pointer to the key-padding mask row of this batch (HAS_MASK only)
    stride_mask_s,
    seq_k,
    BLOCK_N: tl.constexpr,
    HAS_MASK: tl.constexpr,
):
    """(full_end, bounded_end, end): keys [0, full_end) are whole BLOCK_N tiles of real keys,
    which need no masking at all; in keys [full_end, bounded_end) exactly those below ``end``
    are real (a bounds check suffices); keys [bounded_end, end) need the mask itself (holes,
    left padding); keys from ``end`` on are all masked (or past seq_k) and are skipped.

    Without a mask, full_end is seq_k rounded down to BLOCK_N and bounded_end = end = seq_k.
    With one, one pass over the mask row finds the first masked key (full_end rounds it down to
    BLOCK_N) and the last real key (end is one past it). A right-padded row (real keys a
    prefix) gets its whole tiles unmasked and at most one bounded tile, never a mask load; a
    row without real keys gets no tile at all.
    """
    if HAS_MASK:
        offs = tl.arange(0, MASK_SCAN_BLOCK)
        first_masked = tl.full([MASK_SCAN_BLOCK], seq_k, tl.int32)
        last_real = tl.full([MASK_SCAN_BLOCK], -1, tl.int32)
        for start in range(0, seq_k, MASK_SCAN_BLOCK):
            keys = start + offs
            inside = keys < seq_k
            token = tl.load(mask_base + keys * stride_mask_s, mask=inside, other=0)
            first_masked = tl.minimum(first_masked, tl.where(inside & (token == 0), keys, seq_k))
            last_real = tl.maximum(last_real, tl.where(token != 0, keys, -1))
        first_masked = tl.min(first_masked, 0)
        end = tl.max(last_real, 0) + 1
    else:
        first_masked = seq_k
        end = seq_k
    full_end = first_masked - first_masked % BLOCK_N
    bounded_end = tl.where(first_masked >= end, end, full_end)
    return full_end, bounded_end, end


@triton.jit
def window_keys(first_query, window, end, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """[lo, hi): the keys of the BLOCK_N tiles that hold a key within ``window`` positions of a
    query in first_query .. first_query + BLOCK_M - 1 (lo a multiple of BLOCK_N, hi at most
    ``end``). Tiles outside are never loaded; those inside mask |i - j| > window per score.
    The window is symmetric: with the roles swapped (a block of keys, tiles of queries) it
    gives the queries whose window holds one of the keys."""
    lo = tl.maximum(first_query - window, 0)
    return lo - lo % BLOCK_N, tl.minimum(first_query + BLOCK_M + window, end)


def window_key_range(
    first_query: int, window: int, end: int, block_m: int, block_n: int
) -> tuple[int, int]:
    """:func:`window_keys` on the host, in the same integer arithmetic: [lo, hi) of the keys
    the kernels' loop visits for the query block starting at ``first_query`` (for reports and
    tests; the kernels run the jit function)."""
    lo = max(first_query - window, 0)
    return lo - lo % block_n, min(first_query + block_m + window, end)


def clamp_window(window: int | None, length: int) -> int:
    """The kernels' window argument: ``window`` capped at ``length`` (a longer one changes
    nothing, and the cap keeps key bounds within int32); 0 (unused) without a window."""
    return 0 if window is None else min(window, length)


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
