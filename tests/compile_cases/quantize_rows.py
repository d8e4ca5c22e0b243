"""Compile cases for the row quantisation of fastbert/kernels/quantized_linear.py (linear_int8's and
linear_fp8's activations, one row per program): every K tile the launcher can choose (powers
of two up to QUANTIZE_MAX_BLOCK_K), with and without the input scale, from fp16, bf16 and
fp32 rows with unit stride along K, and one case reading strided rows (a transposed view);
to float8 e4m3 (sm_90 only), every K tile from fp16 rows and the widest from each dtype."""

from __future__ import annotations

import itertools

from fastbert.kernels import quantized_linear as mod
from fastbert.kernels.launch import UNFUSED
from tests.compile_cases.linear_int8 import FORMATS
from tests.compile_support import DTYPES, CompileCase

# Whether the kernels multiply tiles with tl.dot, or work row by row.
MATRIX = False

KERNEL = mod._quantize_rows_kernel
BLOCKS = [2**i for i in range(mod.QUANTIZE_MAX_BLOCK_K.bit_length())]


def _case(
    dtype: str, block: int, input_scale: bool, unit_stride: bool = True, quantize: str = "int8"
) -> CompileCase:
    signature = {
        "x_ptr": f"*{dtype}",
        "input_scale_ptr": "*fp32" if input_scale else "constexpr",
        "q_ptr": "*i8" if quantize == "int8" else "*fp8e4nv",
        "scale_ptr": "*fp32",
        "K": "i32",
        "stride_x_m": "i32",
        "stride_x_k": "constexpr" if unit_stride else "i32",
        "HAS_INPUT_SCALE": "constexpr",
        "QUANT": "constexpr",
        "BLOCK_K": "constexpr",
    }
    constexprs: dict[str, object] = {
        "HAS_INPUT_SCALE": input_scale,
        "QUANT": mod.QUANT_CODES[quantize],
        "BLOCK_K": block,
    }
    if unit_stride:
        constexprs["stride_x_k"] = 1
    if not input_scale:
        constexprs["input_scale_ptr"] = None
    strided = "" if unit_stride else " strided"
    fp8 = " fp8" if quantize == "fp8" else ""
    variant = f"{dtype} BLOCK_K={block} input_scale={int(input_scale)}{strided}{fp8}"
    return CompileCase(
        name=f"quantize_rows[{variant}]",
        fn=KERNEL,
        signature=signature,
        constexprs=constexprs,
        # float8 e4m3 conversions need sm_89 or newer: the fp8 targets.
        archs=FORMATS[quantize][2],
        options=UNFUSED,  # as the launcher compiles them
    )


CASES = [
    _case(dtype, block, input_scale)
    for dtype, block, input_scale in itertools.product(DTYPES, BLOCKS, (False, True))
] + [_case("fp32", mod.QUANTIZE_MAX_BLOCK_K, True, unit_stride=False)]
# float8 e4m3 rows: every K tile from fp16 (a CUDA model's activations), the widest from each
# dtype with the input scale.
CASES += [_case("fp16", block, False, quantize="fp8") for block in BLOCKS]
CASES += [_case(dtype, mod.QUANTIZE_MAX_BLOCK_K, True, quantize="fp8") for dtype in DTYPES]
