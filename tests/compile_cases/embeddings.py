"""Compile cases for kernels/fused_embeddings.py: every row tile x id-tensor flags x table dtype.

BLOCK takes every power of two the launcher can choose (``block_size`` of hidden sizes 1 to
MAX_HIDDEN) with the launcher's ``num_warps``; ids are int64 (torch's default), plus int32 ids
for each flag combination. Unit strides are the constexpr 1 the JIT specialises them to for
contiguous tensors.
"""

from __future__ import annotations

import itertools

from fastbert.kernels import fused_embeddings as mod
from fastbert.kernels import fused_layer_norm as layer_norm

from tests.compile_support import CompileCase

KERNEL = mod._embeddings_layer_norm_fwd_kernel
DTYPES = ("fp16", "bf16", "fp32")
BLOCKS = sorted({layer_norm.block_size(2**i) for i in range(layer_norm.MAX_HIDDEN.bit_length())})
FLAGS = list(itertools.product((False, True), (False, True)))
UNIT_STRIDES = (
    "stride_word_emb_col",
    "stride_pos_emb_col",
    "stride_type_emb_col",
    "stride_weight",
    "stride_bias",
    "stride_out_col",
)


def _case(dtype: str, block: int, has_types: bool, has_positions: bool, ids: str) -> CompileCase:
    signature = dict.fromkeys(KERNEL.arg_names, "i32")  # sizes and strides
    signature["eps"] = "fp32"
    for table in ("word_emb", "pos_emb", "type_emb", "weight", "bias", "out"):
        signature[f"{table}_ptr"] = f"*{dtype}"
    constexprs: dict[str, object] = dict(
        HAS_TOKEN_TYPES=has_types, HAS_POSITION_IDS=has_positions, BLOCK=block
    )
    unit_strides = list(UNIT_STRIDES)
    present = {"input_ids": True, "token_type_ids": has_types, "position_ids": has_positions}
    for name, is_present in present.items():
        if is_present:
            signature[f"{name}_ptr"] = ids
            unit_strides.append(f"stride_{name}_s")
        else:
            constexprs[f"{name}_ptr"] = None
    constexprs.update(dict.fromkeys(unit_strides, 1))
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    return CompileCase(
        name=(
            f"embeddings[{dtype} ids={ids[1:]} BLOCK={block} "
            f"types={int(has_types)} positions={int(has_positions)}]"
        ),
        fn=KERNEL,
        signature=signature,
        constexprs=constexprs,
        num_warps=layer_norm.num_warps(block),
    )


CASES = [
    _case(dtype, block, has_types, has_positions, "*i64")
    for dtype, block, (has_types, has_positions) in itertools.product(DTYPES, BLOCKS, FLAGS)
] + [_case("fp16", 1024, has_types, has_positions, "*i32") for has_types, has_positions in FLAGS]
