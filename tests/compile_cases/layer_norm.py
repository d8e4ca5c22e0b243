"""Compile cases for kernels/fused_layer_norm.py: every row tile x residual flag x dtype for
the inference forward; every row tile x dtype for the training forward (dropout, saved
statistics) and the backward with residual and dropout, plus the backward's other flags.

The row tile BLOCK takes every power of two the launcher can choose (``block_size`` of hidden
sizes 1 to MAX_HIDDEN) with the launcher's ``num_warps``. Unit strides are the constexpr 1 the
JIT specialises them to for contiguous tensors.
"""

from __future__ import annotations

import itertools

from fastbert.kernels import fused_layer_norm as mod
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
    dtype: str, block: int, has_residual: bool, dropout: bool = False, save: bool = False
) -> CompileCase:
    ptr = f"*{dtype}"
    signature = {
        "x_ptr": ptr,
        "residual_ptr": ptr if has_residual else "constexpr",
        "weight_ptr": ptr,
        "bias_ptr": ptr,
        "out_ptr": ptr,
        "mean_ptr": "*fp32" if save else "constexpr",
        "rstd_ptr": "*fp32" if save else "constexpr",
        "N": "i32",
        "eps": "fp32",
        "seed": "i32",
        "dropout_p": "fp32",
        "stride_x_row": "i32",
        "stride_x_col": "constexpr",
        "stride_residual_row": "i32",
        "stride_residual_col": "constexpr",
        "stride_weight": "constexpr",
        "stride_bias": "constexpr",
        "stride_out_row": "i32",
        "stride_out_col": "constexpr",
        "HAS_RESIDUAL": "constexpr",
        "HAS_DROPOUT": "constexpr",
        "SAVE_STATS": "constexpr",
        "BLOCK": "constexpr",
    }
    constexprs = {name: 1 for name in UNIT_STRIDES}
    constexprs.update(HAS_RESIDUAL=has_residual, HAS_DROPOUT=dropout, SAVE_STATS=save, BLOCK=block)
    if not has_residual:
        constexprs["residual_ptr"] = None
    if not save:
        constexprs.update(mean_ptr=None, rstd_ptr=None)
    training = f" drop={int(dropout)} save={int(save)}" if dropout or save else ""
    return CompileCase(
        name=f"layer_norm[{dtype} BLOCK={block} res={int(has_residual)}{training}]",
        fn=KERNEL,
        signature=signature,
        constexprs=constexprs,
        num_warps=mod.num_warps(block, heavy=dropout),
    )


def _backward_case(dtype: str, block: int, has_residual: bool, dropout: bool) -> CompileCase:
    kernel = mod._layer_norm_bwd_kernel
    signature = dict.fromkeys(kernel.arg_names, "i32")  # sizes, seed and strides
    for name in ("dout", "x", "weight", "dx"):
        signature[f"{name}_ptr"] = f"*{dtype}"
    for name in ("mean", "rstd", "dweight_partial", "dbias_partial"):
        signature[f"{name}_ptr"] = "*fp32"
    signature["dropout_p"] = "fp32"
    constexprs: dict[str, object] = dict(
        HAS_RESIDUAL=has_residual,
        HAS_DROPOUT=dropout,
        BLOCK=block,
        stride_x_col=1,
        stride_residual_col=1,
        stride_weight=1,
    )
    if has_residual:
        signature["residual_ptr"] = signature["dresidual_ptr"] = f"*{dtype}"
    else:
        constexprs.update(residual_ptr=None, dresidual_ptr=None)
    signature.update(dict.fromkeys(constexprs, "constexpr"))
    return CompileCase(
        name=f"layer_norm_bwd[{dtype} BLOCK={block} res={int(has_residual)} drop={int(dropout)}]",
        fn=kernel,
        signature=signature,
        constexprs=constexprs,
        num_warps=mod.num_warps(block, heavy=True),
    )


CASES = (
    [
        _case(dtype, block, has_residual)
        for dtype, block, has_residual in itertools.product(DTYPES, BLOCKS, (False, True))
    ]
    + [_case(dtype, block, True, True, True) for dtype, block in itertools.product(DTYPES, BLOCKS)]
    + [
        _backward_case(dtype, block, True, True)
        for dtype, block in itertools.product(DTYPES, BLOCKS)
    ]
    + [
        _backward_case("fp16", 1024, has_residual, dropout)
        for has_residual, dropout in ((False, False), (True, False), (False, True))
    ]
)
