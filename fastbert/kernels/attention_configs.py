"""Which autotune configs each attention kernel keeps for a launch: the register budgets of the
forward (flash_attention.py) and of the backward's two passes
(flash_attention_backward.py), each with what was measured above it. The kernels'
autotuners prune their tune spaces with these (``attention_launch.pruner``); the compile cases
(tests/compile_cases/attention*.py) compile what they keep.
"""

from __future__ import annotations

import triton

from .launch import TRITON_3_6


def keep_forward(
    config: triton.Config,
    block_d: int,
    elem_bytes: int,
    is_varlen: bool = False,
    has_mask: bool = False,
    has_bias: bool = False,
    has_rotary: bool = False,
    has_dropout: bool = False,
) -> bool:
    """Whether ``config`` suits a BLOCK_D-wide head in a dtype of ``elem_bytes`` bytes.

    The budget is the fp32 values each thread holds for the accumulator and the score tile,
    (BLOCK_M * BLOCK_D + BLOCK_M * BLOCK_N) / threads: up to 80 for fp16/bf16 (tensor-core
    products); for fp32, whose exact IEEE products run on the FMA units with both operands in
    registers, up to 40, up to 32 with the key-padding mask (V's load then depends on the
    mask's values: at 40 it spills about 1 KB per thread on sm_90), and up to 24 in the
    padding-free variant, whose grid-stride loop over query blocks keeps more values live (at
    32 to 40 it spills 80 to 280 bytes per thread). Within these budgets every config compiles
    for sm_80 and sm_90 without register spills, or with at most a few dozen bytes
    (tests/compile_cases/attention.py reports them). With a relative position bias the score
    tile counts twice (the bias tile and its buckets are live beside it) and 16-bit gets 80, 64
    padding-free: above, sm_80 spilled (40 bytes per thread at 64x64 D=64, kilobytes at
    128x128 D=32; padding-free, 8 to 28 bytes at 64x32 D=128). With rotary positions the key
    tile is rotated in float32 beside its cos and sin: 2 * BLOCK_N * BLOCK_D more values
    (above the budget, sm_80 spilled 4 to 224 bytes per thread: 64x64 D=64 in every variant,
    128x64 D=64, 128x128 D=32, 64x32 D=128; and a 4-stage 64x32 tile of D=80 or 96, whose
    partner and table loads are pipelined too, needed 192 KB of shared memory).

    Triton 3.6 (``TRITON_3_6``) holds more: with rotary positions 16-bit gets 72 (at 80, 64x32
    D=64 spilled 8 bytes on sm_80 whatever the register cap), and padding-free with dropout
    (``has_dropout``) 48 (at 64, 64x64 D=64 spilled 32 bytes on sm_80 at 255 registers).
    """
    values_per_thread = forward_load(
        config, block_d, elem_bytes, is_varlen, has_mask, has_bias, has_rotary
    )
    if elem_bytes != 4:
        budget = 64 if has_bias and is_varlen else 80
        if TRITON_3_6 and has_rotary:
            budget = 72
        if TRITON_3_6 and has_dropout and is_varlen:
            budget = 48
        return values_per_thread <= budget
    if is_varlen:
        return values_per_thread <= 24
    return values_per_thread <= (32 if has_mask else 40)


def forward_load(config: triton.Config, block_d: int, elem_bytes: int, *variant: bool) -> int:
    """:func:`keep_forward`'s measure: the fp32 values each thread of ``config`` holds for the
    accumulator and the score tile (twice with a bias), and with rotary positions the rotated
    key tile with its cos and sin. Where no config is kept, the pruner runs the one holding the
    fewest (the first of the list, which ran before, needed 384 KiB of shared memory for
    float32 rotary heads of 80 on an H200, which has 227). ``variant``: keep_forward's flags
    (is_varlen, has_mask, has_bias, has_rotary, has_dropout); the bias and the rotary positions
    count."""
    _, _, has_bias, has_rotary, *_ = (*variant, False, False, False, False, False)
    block_m, block_n = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    scores = 2 * block_n if has_bias else block_n
    threads = 32 * config.num_warps
    rotated = 2 * block_n * block_d // threads if has_rotary else 0
    return block_m * (block_d + scores) // threads + rotated


def keep_backward(
    config: triton.Config,
    block_d: int,
    elem_bytes: int,
    is_dkdv: bool,
    has_bias: bool = False,
    has_rotary: bool = False,
) -> bool:
    """Whether ``config`` suits a BLOCK_D-wide head in a dtype of ``elem_bytes`` bytes.

    The measure is the fp32 values each thread holds for the program's accumulators (dK and
    dV, or dQ) and two score-sized tiles. For fp16 / bf16 the budgets (72 for dK / dV, 96 for
    dQ) are where the compiles for sm_80 and sm_90 stop spilling registers, dropout included
    (tests/compile_cases/attention_backward.py); fp32, whose exact IEEE products hold both
    operands in registers, gets 40 and 48 (it may still spill a little; the compile report
    lists it).

    A relative position bias adds score-sized tiles: the bias (one more in the dK / dV pass)
    and, in the dQ pass, the buckets and the per-bucket sums of dS (two more), and the dQ pass
    keeps 64-row tiles (with 32 rows it held loop state on the stack on sm_90). Within these
    budgets the bias variants of head dims 32 and 64 (MPNet's) compile without spills; wider
    heads find no config and run the one holding the fewest values (:func:`backward_load`),
    which may spill.

    Rotary positions rotate a tile per step (a query tile in dK / dV, a key tile in dQ): the
    loaded tile, its rotated halves and their cos and sin count as four tiles of it. Above
    that, sm_80 spilled 224 to 408 bytes per thread (dK / dV 32x64, dQ 128x64 and 64x32 at
    D=64); D=128 finds no config and runs the one holding the fewest values (16-bit dK / dV
    16x64: 144 bytes of spills on sm_80; float32 dQ 32x32: about 12 KB, reported).

    With Triton 3.6 (``TRITON_3_6``) the fp16 / bf16 budgets are lower: dQ 80 (at 96, 64x32 on
    4 warps spilled 20 to 52 bytes with dropout: D=128, 80 and 96 on sm_90, D=64 with a bias on
    sm_80), and dK / dV with rotary positions 48 (at 56, 16x64 on 8 warps spilled 4 to 76 bytes
    on sm_80 at D=64, on one stage or two, where 3.9 fits it in 255 registers).
    """
    if has_bias and not is_dkdv and config.kwargs["BLOCK_M"] < 64:
        return False
    values_per_thread = backward_load(config, block_d, elem_bytes, is_dkdv, has_bias, has_rotary)
    if elem_bytes == 4:
        return values_per_thread <= (40 if is_dkdv else 48)
    if is_dkdv:
        budget = 48 if TRITON_3_6 and has_rotary else 72
    else:
        budget = 80 if TRITON_3_6 else 96
    return values_per_thread <= budget


def backward_load(config: triton.Config, block_d: int, elem_bytes: int, *variant: bool) -> int:
    """:func:`keep_backward`'s measure: the fp32 values each thread of ``config`` holds (the
    accumulators, the score-sized tiles, the rotated ones). Where no config is kept, the
    pruner runs the one holding the fewest. ``variant``: keep_backward's flags (is_dkdv,
    has_bias, has_rotary)."""
    is_dkdv, has_bias, has_rotary = (*variant, False, False)[:3]
    block_m, block_n = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    held = 2 * block_n * block_d if is_dkdv else block_m * block_d
    tiles = 2 + (1 if is_dkdv else 2) * has_bias
    rotated = 4 * (block_m if is_dkdv else block_n) * block_d if has_rotary else 0
    return (held + tiles * block_m * block_n + rotated) // (32 * config.num_warps)
