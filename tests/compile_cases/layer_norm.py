"""Compile cases for fastbert/kernels/fused_layer_norm.py: every row tile x residual flag x dtype
for the inference forward; every row tile x dtype for the training forward (dropout, saved
statistics) and the backward with residual and dropout, plus the backward's other flags.

The row tile BLOCK takes every power of two the launcher can choose (``block_size`` of hidden
sizes 1 to MAX_HIDDEN) with the launcher's ``num_warps``. Unit strides are the constexpr 1 the
JIT specialises them to for contiguous tensors.
"""

from __future__ import annotations

import itertools

from fastbert.kernels import fused_layer_norm as mod
from fastbert.kernels.launch import FUSED, UNFUSED
from tests.compile_support import DTYPES, CompileCase, row_tiles

# Whether the kernels multiply tiles with tl.dot (tests/test_compile.py checks their MMA
# instructions; the cases declare dtype and block_m), or work row by row.
MATRIX = False

KERNEL = mod._layer_norm_fwd_kernel
BLOCKS = row_tiles(mod.block_size, mod.MAX_HIDDEN)
UNIT_STRIDES = (
    "stride_x_col",
    "stride_residual_col",
    "stride_weight",
    "stride_bias",
    "stride_out_col",
)


def _case(
    dtype: str, block: int, has_residual: bool, dropout: bool = False, backward: bool = False
) -> CompileCase:
    """The inference forward, the training forward (``dropout``: it saves the statistics too)
    or the backward."""
    kernel = mod._layer_norm_bwd_kernel if backward else KERNEL
    signature = dict.fromkeys(kernel.arg_names, "i32")  # sizes, seed and strides
    signature["dropout_p"] = "fp32"
    if backward:
        floats = ("dout", "x", "weight", "dx")
        fp32 = ("mean", "rstd", "dweight_partial", "dbias_partial")
        residuals = ("residual", "dresidual")
    else:
        signature["eps"] = "fp32"
        floats = ("x", "weight", "bias", "out")
        fp32 = ("mean", "rstd") if dropout else ()
        residuals = ("residual",)
    for name in floats:
        signature[f"{name}_ptr"] = f"*{dtype}"
    for name in fp32:
        signature[f"{name}_ptr"] = "*fp32"
    constexprs: dict[str, object] = dict(
        HAS_RESIDUAL=has_residual, HAS_DROPOUT=dropout, BLOCK=block
    )
    constexprs.update(dict.fromkeys((u for u in UNIT_STRIDES if u in kernel.arg_names), 1))
    for name in residuals:
        if has_residual:
            signature[f"{name}_ptr"] = f"*{dtype}"
        else:
            constexprs[f"{name}_ptr"] = None
    if not backward:
        # The training forward saves the statistics; the inference one does not.
        constexprs["SAVE_STATS"] = dropout
        if not dropout:
            constexprs.update(mean_ptr=None, rstd_ptr=None)
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    if backward:
        kind, variant = "layer_norm_bwd", f" drop={int(dropout)}"
    else:
        kind = "layer_norm"
        variant = " drop=1 save=1" if dropout else ""
    return CompileCase(
        name=f"{kind}[{dtype} BLOCK={block} res={int(has_residual)}{variant}]",
        fn=kernel,
        signature=signature,
        constexprs=constexprs,
        num_warps=mod.num_warps(block, heavy=dropout or backward),
        options=FUSED if backward else UNFUSED,  # as the launcher compiles them
    )


CASES = (
    [
        _case(dtype, block, has_residual)
        for dtype, block, has_residual in itertools.product(DTYPES, BLOCKS, (False, True))
    ]
    + [_case(dtype, block, True, True) for dtype, block in itertools.product(DTYPES, BLOCKS)]
    + [_case(dtype, block, True, True, True) for dtype, block in itertools.product(DTYPES, BLOCKS)]
    + [
        _case("fp16", 1024, has_residual, dropout, True)
        for has_residual, dropout in ((False, False), (True, False), (False, True))
    ]
)
