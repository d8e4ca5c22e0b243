"""Compile cases for the row quantisation of kernels/fused_linear.py (linear_int8's
activations, one row per program): every K tile the launcher can choose (powers of two up to
QUANTIZE_MAX_BLOCK_K), with and without the input scale, from fp16, bf16 and fp32 rows with
unit stride along K, and one case reading strided rows (a transposed view)."""

from __future__ import annotations

import itertools

from fastbert.kernels import fused_linear as mod
from tests.compile_support import DTYPES, CompileCase

# Whether the kernels multiply tiles with tl.dot, or work row by row.
MATRIX = False

KERNEL = mod._quantize_rows_kernel
BLOCKS = [2**i for i in range(mod.QUANTIZE_MAX_BLOCK_K.bit_length())]


def _case(dtype: str, block: int, input_scale: bool, unit_stride: bool = True) -> CompileCase:
    signature = {
        "x_ptr": f"*{dtype}",
        "input_scale_ptr": "*fp32" if input_scale else "constexpr",
        "q_ptr": "*i8",
        "scale_ptr": "*fp32",
        "K": "i32",
        "stride_x_m": "i32",
        "stride_x_k": "constexpr" if unit_stride else "i32",
        "HAS_INPUT_SCALE": "constexpr",
        "BLOCK_K": "constexpr",
    }
    constexprs: dict[str, object] = {"HAS_INPUT_SCALE": input_scale, "BLOCK_K": block}
    if unit_stride:
        constexprs["stride_x_k"] = 1
    if not input_scale:
        constexprs["input_scale_ptr"] = None
    strided = "" if unit_stride else " strided"
    return CompileCase(
        name=f"quantize_rows[{dtype} BLOCK_K={block} input_scale={int(input_scale)}{strided}]",
        fn=KERNEL,
        signature=signature,
        constexprs=constexprs,
    )


CASES = [
    _case(dtype, block, input_scale)
    for dtype, block, input_scale in itertools.product(DTYPES, BLOCKS, (False, True))
] + [_case("fp32", mod.QUANTIZE_MAX_BLOCK_K, True, unit_stride=False)]
