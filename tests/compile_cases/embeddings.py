"""Compile cases for fastbert/kernels/fused_embeddings.py: every row tile x id-tensor flags x table
dtype for the inference forward; every row tile x table dtype for the training forward (dropout,
saved statistics) and the backward with all ids and dropout, plus the backward's other flags.

BLOCK takes every power of two the launcher can choose (``block_size`` of hidden sizes 1 to
MAX_HIDDEN) with the launcher's ``num_warps``; ids are int64 (torch's default), plus int32 ids
for each flag combination. Unit strides are the constexpr 1 the JIT specialises them to for
contiguous tensors.
"""

from __future__ import annotations

import itertools

from fastbert.kernels import fused_embeddings as mod
from fastbert.kernels import fused_layer_norm as layer_norm
from fastbert.kernels.launch import FUSED, UNFUSED
from tests.compile_support import DTYPES, CompileCase, row_tiles

# Whether the kernels multiply tiles with tl.dot (tests/test_compile.py checks their MMA
# instructions; the cases declare dtype and block_m), or work row by row.
MATRIX = False

KERNEL = mod._embeddings_layer_norm_fwd_kernel
BLOCKS = row_tiles(layer_norm.block_size, layer_norm.MAX_HIDDEN)
FLAGS = list(itertools.product((False, True), (False, True)))
UNIT_STRIDES = (
    "stride_word_emb_col",
    "stride_pos_emb_col",
    "stride_type_emb_col",
    "stride_weight",
    "stride_bias",
    "stride_out_col",
)


def _case(
    dtype: str,
    block: int,
    has_types: bool,
    has_positions: bool,
    ids: str,
    *,
    backward: bool = False,
    dropout: bool = False,
) -> CompileCase:
    kernel = mod._embeddings_layer_norm_bwd_kernel if backward else KERNEL
    signature = dict.fromkeys(kernel.arg_names, "i32")  # sizes, seed and strides
    signature["dropout_p"] = "fp32"
    floats = ("word_emb", "pos_emb", "type_emb", "weight")
    if backward:
        fp32 = ("mean", "rstd", "dword", "dpos", "dtype", "dweight_partial", "dbias_partial")
        floats += ("dout",)
    else:
        signature["eps"] = "fp32"
        floats += ("bias", "out")
        fp32 = ("mean", "rstd") if dropout else ()
    for name in floats:
        signature[f"{name}_ptr"] = f"*{dtype}"
    for name in fp32:
        signature[f"{name}_ptr"] = "*fp32"
    constexprs: dict[str, object] = dict(
        HAS_TOKEN_TYPES=has_types,
        HAS_POSITION_IDS=has_positions,
        HAS_DROPOUT=dropout,
        BLOCK=block,
    )
    unit_strides = [u for u in UNIT_STRIDES if u in kernel.arg_names]
    if not backward:
        # The training forward saves the statistics; the inference one does not.
        constexprs["SAVE_STATS"] = dropout
        if not dropout:
            constexprs.update(mean_ptr=None, rstd_ptr=None)
    present = {"input_ids": True, "token_type_ids": has_types, "position_ids": has_positions}
    for name, is_present in present.items():
        if is_present:
            signature[f"{name}_ptr"] = ids
            unit_strides.append(f"stride_{name}_s")
        else:
            constexprs[f"{name}_ptr"] = None
    constexprs.update(dict.fromkeys(unit_strides, 1))
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    kind = "embeddings_bwd" if backward else "embeddings"
    training = f" drop={int(dropout)}" if dropout else ""
    return CompileCase(
        name=(
            f"{kind}[{dtype} ids={ids[1:]} BLOCK={block} "
            f"types={int(has_types)} positions={int(has_positions)}{training}]"
        ),
        fn=kernel,
        signature=signature,
        constexprs=constexprs,
        num_warps=(
            mod.heavy_num_warps(block) if dropout or backward else layer_norm.num_warps(block)
        ),
        options=FUSED if backward else UNFUSED,  # as the launcher compiles them
    )


CASES = (
    [
        _case(dtype, block, has_types, has_positions, "*i64")
        for dtype, block, (has_types, has_positions) in itertools.product(DTYPES, BLOCKS, FLAGS)
    ]
    + [_case("fp16", 1024, has_types, has_positions, "*i32") for has_types, has_positions in FLAGS]
    + [
        _case(dtype, block, True, True, "*i64", backward=backward, dropout=True)
        for dtype, block, backward in itertools.product(DTYPES, BLOCKS, (False, True))
    ]
    + [
        _case("fp16", 1024, has_types, has_positions, "*i64", backward=True)
        for has_types, has_positions in FLAGS
    ]
)
