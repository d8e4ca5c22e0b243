"""Compile cases for fastbert/kernels/masked_softmax.py: every row tile x mask flag x dtype.

The row tile BLOCK takes every power of two the launcher can choose (``block_size`` of key
counts 1 to MAX_KEYS) with the launcher's ``num_warps``; each with and without a mask, in fp16,
bf16 and fp32. Scores are contiguous (unit stride on S_k, the constexpr 1 the JIT specialises
it to) and the mask is bool with unit stride; two more cases read strided scores (a transposed
view) and an int64 mask (Hugging Face's attention_mask dtype). The backward kernel compiles
for every row tile and dtype.
"""

from __future__ import annotations

import itertools

# The package re-exports same-named functions, so import the module itself.
from fastbert.kernels import masked_softmax as mod
from fastbert.kernels.launch import UNFUSED
from tests.compile_support import DTYPES, CompileCase, row_tiles

# Whether the kernels multiply tiles with tl.dot (tests/test_compile.py checks their MMA
# instructions; the cases declare dtype and block_m), or work row by row.
MATRIX = False

KERNEL = mod._scaled_masked_softmax_fwd_kernel
BLOCKS = row_tiles(mod.block_size, mod.MAX_KEYS)


def _case(
    dtype: str, block: int, has_mask: bool, mask: str = "*i1", unit_key_stride: bool = True
) -> CompileCase:
    ptr = f"*{dtype}"
    signature = {
        "scores_ptr": ptr,
        "mask_ptr": mask if has_mask else "constexpr",
        "out_ptr": ptr,
        "H": "i32",
        "S_q": "i32",
        "S_k": "i32",
        "scale": "fp32",
        "stride_scores_b": "i32",
        "stride_scores_h": "i32",
        "stride_scores_q": "i32",
        "stride_scores_k": "constexpr" if unit_key_stride else "i32",
        "stride_mask_b": "i32",
        "stride_mask_k": "constexpr" if has_mask else "i32",
        "HAS_MASK": "constexpr",
        "BLOCK": "constexpr",
    }
    constexprs: dict[str, object] = {"HAS_MASK": has_mask, "BLOCK": block}
    if unit_key_stride:
        constexprs["stride_scores_k"] = 1
    if has_mask:
        constexprs["stride_mask_k"] = 1
    else:
        constexprs["mask_ptr"] = None
    variant = ("" if mask == "*i1" or not has_mask else f" {mask[1:]}") + (
        "" if unit_key_stride else " strided"
    )
    return CompileCase(
        name=f"softmax[{dtype} BLOCK={block} mask={int(has_mask)}{variant}]",
        fn=KERNEL,
        signature=signature,
        constexprs=constexprs,
        num_warps=mod.num_warps(block),
        options=UNFUSED,  # as the launcher compiles them
    )


def _backward_case(dtype: str, block: int) -> CompileCase:
    kernel = mod._scaled_masked_softmax_bwd_kernel
    ptr = f"*{dtype}"
    signature = {
        "probs_ptr": ptr,
        "dprobs_ptr": ptr,
        "dscores_ptr": ptr,
        "S_k": "i32",
        "scale": "fp32",
        "stride_dprobs_row": "i32",
        "BLOCK": "constexpr",
    }
    return CompileCase(
        name=f"softmax_bwd[{dtype} BLOCK={block}]",
        fn=kernel,
        signature=signature,
        constexprs={"BLOCK": block},
        num_warps=mod.num_warps(block),
    )


CASES = (
    [
        _case(dtype, block, has_mask)
        for dtype, block, has_mask in itertools.product(DTYPES, BLOCKS, (False, True))
    ]
    + [
        _case("fp16", 512, True, mask="*i64"),
        _case("bf16", 128, True, unit_key_stride=False),
    ]
    + [_backward_case(dtype, block) for dtype, block in itertools.product(DTYPES, BLOCKS)]
)
