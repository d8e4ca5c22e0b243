"""Compile cases for the INT8 variant of fastbert/kernels/fused_linear.py's GEMM: int8 x and weight,
int32 accumulation, the dequantise / bias / GELU / residual epilogue, on every one-tile-per-
program config ``keep`` allows for one-byte operands with that epilogue (the persistent configs
take TMA descriptors of 16-bit operands only), with float16 outputs (a CUDA model's dtype) and
on one config with float32 outputs; and every epilogue variant on the sweep config.

The cases declare dtype "int8" and their BLOCK_M for tests/test_compile.py, which checks the
integer tensor-core instructions: IMMA on sm_80, the integer warpgroup MMA (IGMMA) on sm_90.
"""

from __future__ import annotations

import dataclasses

from fastbert.kernels import linear_configs, quantized_linear
from tests.compile_cases import linear
from tests.compile_support import ARCHS, CompileCase

MATRIX = True

INT8_SIZE = 1
OUTPUT_DTYPES = ("fp16", "fp32")


# Per quantised format: the operands' Triton type, the case's dtype and the targets with its
# tensor cores (float8 e4m3 MMAs start with sm_89; the cases compile it for sm_90).
FORMATS = {
    "int8": ("*i8", "int8", ARCHS),
    "fp8": ("*fp8e4nv", "fp8", (90,)),
}


def _case(
    out_dtype: str,
    config,
    has_bias: bool,
    activation: int,
    has_residual: bool,
    quantize: str = "int8",
) -> CompileCase:
    """The forward case of tests/compile_cases/linear.py with ``quantize``'s operands and their
    float32 scales, output in ``out_dtype``."""
    operand, dtype, archs = FORMATS[quantize]
    case = linear._case(out_dtype, config, has_bias, activation, has_residual)
    scales = ("x_scale_ptr", "weight_scale_ptr")
    case.signature.update(x_ptr=operand, weight_ptr=operand, **dict.fromkeys(scales, "*fp32"))
    for name in scales:
        del case.constexprs[name]
    case.constexprs["QUANT"] = quantized_linear.QUANT_CODES[quantize]
    variant = f"bias={int(has_bias)} act={activation} res={int(has_residual)}"
    name = f"linear_{quantize}[{out_dtype} out {linear_configs.config_name(config)} {variant}]"
    return dataclasses.replace(case, name=name, dtype=dtype, archs=archs)


def _kept(config, epilogue) -> bool:
    return linear_configs.keep(
        config,
        INT8_SIZE,
        linear.LARGEST_M_BUCKET,
        activation=epilogue[1],
        has_residual=epilogue[2],
        has_descriptors=False,
    )


def cases(quantize: str) -> list[CompileCase]:
    """The cases of one quantised format ("int8", or "fp8" for tests/compile_cases/linear_fp8.py:
    ``keep`` treats both one-byte formats alike)."""
    out = []
    for config in linear.POINTER_CONFIGS:
        kept = [e for e in linear.EPILOGUES if _kept(config, e)]
        chosen = [linear.FULL_EPILOGUE] if linear.FULL_EPILOGUE in kept else kept[-1:]
        out += [_case("fp16", config, *epilogue, quantize) for epilogue in chosen]
    full = [c for c in linear.POINTER_CONFIGS if _kept(c, linear.FULL_EPILOGUE)]
    sweep = full[-1]
    out += [
        _case("fp16", sweep, *epilogue, quantize)
        for epilogue in linear.EPILOGUES
        if epilogue != linear.FULL_EPILOGUE
    ]
    out.append(_case("fp32", full[0], *linear.FULL_EPILOGUE, quantize))
    return out


CASES = cases("int8")
