"""Compile cases for fastbert/kernels/sparse_head.py (the fused SPLADE head: a GEMM whose epilogue
keeps each sequence's max through integer atomics): every autotune config ``keep`` allows for
each dtype, with the decoder's bias (BERT's), and without it on the widest tile of each dtype.
x and weight have unit stride along K (the launcher refuses others); the other strides and
V (BERT's 30,522 is no multiple of 16) are runtime integers. Each case declares its dtype and
BLOCK_T (the row tile: the M of the MMA) for the tensor-core checks of tests/test_compile.py.
"""

from __future__ import annotations

from fastbert.kernels import sparse_head as mod
from tests.compile_support import ELEMENT_SIZES, CompileCase

# The kernel multiplies tiles with tl.dot.
MATRIX = True

KERNEL = mod._splade_max_fwd_kernel.fn
CONFIGS = mod._splade_max_fwd_kernel.configs
LARGEST_T_BUCKET = 65536


def _case(dtype: str, config, has_bias: bool) -> CompileCase:
    ptr = f"*{dtype}"
    signature = {
        "x_ptr": ptr,
        "weight_ptr": ptr,
        "bias_ptr": ptr if has_bias else "constexpr",
        "cu_seqlens_ptr": "*i32",
        "out_ptr": "*i32",
        "T": "i32",
        "V": "i32",
        "K": "i32",
        "B": "i32",
        "T_BUCKET": "i32",
        "stride_x_t": "i32",
        "stride_x_k": "constexpr",
        "stride_weight_v": "i32",
        "stride_weight_k": "constexpr",
        "stride_bias_v": "constexpr",
        "HAS_BIAS": "constexpr",
        **dict.fromkeys(("BLOCK_T", "BLOCK_V", "BLOCK_K", "GROUP_T"), "constexpr"),
    }
    constexprs = {
        "stride_x_k": 1,
        "stride_weight_k": 1,
        "stride_bias_v": 1,
        "HAS_BIAS": has_bias,
        **config.kwargs,
    }
    if not has_bias:
        constexprs["bias_ptr"] = None
    meta = config.kwargs
    tile = f"{meta['BLOCK_T']}x{meta['BLOCK_V']}x{meta['BLOCK_K']}"
    name = (
        f"splade_max[{dtype} {tile} s{config.num_stages} w{config.num_warps} bias={int(has_bias)}]"
    )
    return CompileCase(
        name,
        KERNEL,
        signature,
        constexprs,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
        aligned_ints=("K",),
        dtype=dtype,
        block_m=meta["BLOCK_T"],
        block_n=meta["BLOCK_V"],
    )


def _cases() -> list[CompileCase]:
    cases = []
    for dtype, element_size in ELEMENT_SIZES.items():
        kept = [c for c in CONFIGS if mod.keep(c, element_size, LARGEST_T_BUCKET)]
        cases += [_case(dtype, c, True) for c in kept]
        cases.append(_case(dtype, kept[0], False))
    return cases


CASES = _cases()
