"""Compile cases for kernels/fused_linear.py: every autotune config and every epilogue variant.

float16 compiles every autotune config (with the full epilogue) and every epilogue variant
(with one config); bfloat16 and float32 compile every epilogue variant, float32 with each
config its ``keep`` predicate lets through. Configs and the jit function come from the module
itself, so the cases follow the code.
"""

from __future__ import annotations

import itertools

from fastbert.kernels import fused_linear as mod

from tests.compile_support import CompileCase

KERNEL = mod._linear_fwd_kernel.fn
CONFIGS = mod._linear_fwd_kernel.configs
DTYPES = {"fp16": 2, "bf16": 2, "fp32": 4}
EPILOGUES = list(itertools.product((False, True), (0, 1, 2), (False, True)))
LARGEST_M_BUCKET = 65536
UNIT_STRIDES = (
    "stride_x_k",
    "stride_weight_k",
    "stride_bias_n",
    "stride_residual_n",
    "stride_out_n",
)


def _signature(dtype: str, has_bias: bool, has_residual: bool) -> dict[str, str]:
    ptr = f"*{dtype}"
    return {
        "x_ptr": ptr,
        "weight_ptr": ptr,
        "bias_ptr": ptr if has_bias else "constexpr",
        "residual_ptr": ptr if has_residual else "constexpr",
        "out_ptr": ptr,
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "M_BUCKET": "i32",
        "stride_x_m": "i32",
        "stride_x_k": "constexpr",
        "stride_weight_n": "i32",
        "stride_weight_k": "constexpr",
        "stride_bias_n": "constexpr",
        "stride_residual_m": "i32",
        "stride_residual_n": "constexpr",
        "stride_out_m": "i32",
        "stride_out_n": "constexpr",
        "HAS_BIAS": "constexpr",
        "ACTIVATION": "constexpr",
        "HAS_RESIDUAL": "constexpr",
        "BLOCK_M": "constexpr",
        "BLOCK_N": "constexpr",
        "BLOCK_K": "constexpr",
        "GROUP_M": "constexpr",
    }


def _case(dtype: str, config, has_bias: bool, activation: int, has_residual: bool) -> CompileCase:
    meta = config.kwargs
    constexprs = {
        "HAS_BIAS": has_bias,
        "ACTIVATION": activation,
        "HAS_RESIDUAL": has_residual,
        **meta,
        **dict.fromkeys(UNIT_STRIDES, 1),
    }
    if not has_bias:
        constexprs["bias_ptr"] = None
    if not has_residual:
        constexprs["residual_ptr"] = None
    tile = "x".join(str(meta[k]) for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K"))
    name = (
        f"linear[{dtype} {tile} s{config.num_stages} w{config.num_warps} "
        f"bias={int(has_bias)} act={activation} res={int(has_residual)}]"
    )
    return CompileCase(
        name=name,
        fn=KERNEL,
        signature=_signature(dtype, has_bias, has_residual),
        constexprs=constexprs,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        aligned_ints=("N", "K"),
    )


def _cases() -> list[CompileCase]:
    """fp16: each config with the full epilogue, then every epilogue on the sweep config."""
    cases = [_case("fp16", config, True, 1, True) for config in CONFIGS]
    for dtype, element_size in DTYPES.items():
        kept = [c for c in CONFIGS if mod.keep(c, element_size, LARGEST_M_BUCKET)]
        sweep = kept[-1]
        cases += [
            _case(dtype, sweep, *epilogue)
            for epilogue in EPILOGUES
            if dtype != "fp16" or epilogue != (True, 1, True)
        ]
        if dtype == "fp32":
            cases += [_case(dtype, c, True, 1, True) for c in kept[:-1]]
    return cases


CASES = _cases()
