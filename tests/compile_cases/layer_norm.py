"""Compile cases for kernels/fused_layer_norm.py: every row tile x residual flag x dtype.

The row tile BLOCK takes every power of two the launcher can choose (``block_size`` of hidden
sizes 1 to MAX_HIDDEN) with the launcher's ``num_warps``. Unit strides are the constexpr 1 the
JIT specialises them to for contiguous tensors.
"""

from __future__ import annotations

import itertools

from fastbert.kernels import fused_layer_norm as mod

from tests.compile_support import CompileCase

KERNEL = mod._layer_norm_fwd_kernel
DTYPES = ("fp16", "bf16", "fp32")
BLOCKS = sorted({mod.block_size(2**i) for i in range(mod.MAX_HIDDEN.bit_length())})
UNIT_STRIDES = (
    "stride_x_col",
    "stride_residual_col",
    "stride_weight",
    "stride_bias",
    "stride_out_col",
)


def _case(dtype: str, block: int, has_residual: bool) -> CompileCase:
    ptr = f"*{dtype}"
    signature = {
        "x_ptr": ptr,
        "residual_ptr": ptr if has_residual else "constexpr",
        "weight_ptr": ptr,
        "bias_ptr": ptr,
        "out_ptr": ptr,
        "N": "i32",
        "eps": "fp32",
        "stride_x_row": "i32",
        "stride_x_col": "constexpr",
        "stride_residual_row": "i32",
        "stride_residual_col": "constexpr",
        "stride_weight": "constexpr",
        "stride_bias": "constexpr",
        "stride_out_row": "i32",
        "stride_out_col": "constexpr",
        "HAS_RESIDUAL": "constexpr",
        "BLOCK": "constexpr",
    }
    constexprs = {name: 1 for name in UNIT_STRIDES}
    constexprs.update(HAS_RESIDUAL=has_residual, BLOCK=block)
    if not has_residual:
        constexprs["residual_ptr"] = None
    return CompileCase(
        name=f"layer_norm[{dtype} BLOCK={block} res={int(has_residual)}]",
        fn=KERNEL,
        signature=signature,
        constexprs=constexprs,
        num_warps=mod.num_warps(block),
    )


CASES = [
    _case(dtype, block, has_residual)
    for dtype, block, has_residual in itertools.product(DTYPES, BLOCKS, (False, True))
]
