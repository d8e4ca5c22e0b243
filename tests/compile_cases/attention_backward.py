"""Compile cases for fastbert/kernels/flash_attention_backward.py: its kernel's dK / dV and dQ
passes.

Variants are the forward's (dense masked, dense unmasked, padding-free; see
tests/compile_cases/attention.py) times HAS_DROPOUT, which regenerates the Philox mask inside
the loop and is the heaviest on registers. The cases, for each of the two passes:

- fp16, D=64 and D=128: every autotune config that ``keep`` allows, dense masked with dropout
  (where registers run out first, so this is what the budgets were set against);
- fp16, the heaviest kept config: D=32, 80, 96 dense masked with dropout, D=64 dense unmasked
  without dropout, D=64 padding-free with dropout;
- bf16, the heaviest kept config: D=64 and D=128 dense masked with dropout;
- fp32, the heaviest kept config: D=64 dense masked with dropout and padding-free without
  (fp32 runs its exact IEEE products on the FMA units; its spills are reported, not checked).

The relative position bias (HAS_BIAS=1, MPNet: both passes add it, the dQ pass also sums dS
per bucket) compiles, for each pass, in every kept fp16 config of D=64 dense masked with
dropout, and in the heaviest kept config of fp16 D=64 dense masked without dropout, fp16 D=64
padding-free, fp16 D=32 dense masked and bf16 D=64 dense masked: the head dims of MPNet models
(wider heads with a bias spill; see ``keep``).

Rotary positions with the sliding window (ROTARY=1, WINDOW=1, ModernBERT's local layers;
both passes rotate the tiles they load and turn dQ / dK back at the end) compile, for each pass,
in every kept fp16 config of D=64 dense masked without dropout (ModernBERT has none), and in
the heaviest kept config of fp16 D=64 padding-free, bf16 and fp32 D=64 dense masked, and the
dK / dV pass of fp16 D=80 dense masked (see HEAVIEST_ROTARY). Rotary positions alone (ROTARY=1,
WINDOW=0, ModernBERT's global layers) compile in every kept fp16 config of D=64 dense masked
without dropout, for each pass.

A dK / dV case declares BLOCK_N, the row tile of its MMAs (k @ q^T, p^T @ dO, ds^T @ q), as its
block_m for the tensor-core checks of tests/test_compile.py, and BLOCK_M as its block_n (the
tile its loop steps over); a dQ case declares BLOCK_M and BLOCK_N.
"""

from __future__ import annotations

from fastbert.kernels import flash_attention_backward as mod
from fastbert.kernels.launch import next_power_of_2
from tests.compile_cases.attention import variant_constexprs
from tests.compile_support import ELEMENT_SIZES, CompileCase

# Whether the kernels multiply tiles with tl.dot (tests/test_compile.py checks their MMA
# instructions; the cases declare dtype and block_m), or work row by row.
MATRIX = True

# (name, the pass's autotuner, whether it is the dK / dV pass (DKDV)).
KERNELS = (
    ("attention_bwd_dkdv", mod._attention_bwd_dkdv_kernel, True),
    ("attention_bwd_dq", mod._attention_bwd_dq_kernel, False),
)


def _kept(
    kernel: tuple, dtype: str, head_dim: int, has_bias: bool = False, rotary: bool = False
) -> list:
    size, block_d = ELEMENT_SIZES[dtype], next_power_of_2(head_dim)
    variant = (kernel[2], has_bias, rotary)
    return [c for c in kernel[1].configs if mod.keep(c, block_d, size, *variant)]


def _heaviest(
    kernel: tuple, dtype: str, head_dim: int, has_bias: bool = False, rotary: bool = False
):
    """The kept config with the most values per thread (``keep``'s measure); when none is
    kept, the one with the fewest, which the pruner then runs."""

    def held(c) -> int:
        block_d = next_power_of_2(head_dim)
        return mod.load(c, block_d, ELEMENT_SIZES[dtype], kernel[2], has_bias, rotary)

    kept = _kept(kernel, dtype, head_dim, has_bias, rotary)
    return max(kept, key=held) if kept else min(kernel[1].configs, key=held)


def _case(
    kernel: tuple,
    dtype: str,
    head_dim: int,
    config,
    has_mask: bool,
    is_varlen: bool,
    has_dropout: bool,
    has_bias: bool = False,
    rotary: bool = False,
    window: bool | None = None,
) -> CompileCase:
    """``window``: the sliding window (None: with ``rotary``, as ModernBERT's local layers;
    False with ``rotary``: its global layers)."""
    window = rotary if window is None else window
    name, jit, is_dkdv = kernel
    tensors = ("Q", "K", "V", "DO", "DX", "DV")
    signature = dict.fromkeys(tensors, f"*{dtype}")
    signature.update(Mask="*i1" if has_mask else "constexpr")
    signature.update(CuSeqlens="*i32" if is_varlen else "constexpr")
    signature.update(Lse="*fp32", Delta="*fp32")
    signature.update(Bias="*fp32" if has_bias else "constexpr")
    signature.update(DBias="*fp32" if has_bias and not is_dkdv else "constexpr")
    signature.update(Rotary="*fp32" if rotary else "constexpr", window="i32")
    signature.update({f"stride_{t.lower()}_{d}": "i32" for t in tensors for d in ("b", "h", "s")})
    signature.update(stride_mask_b="i32", stride_mask_s="constexpr" if has_mask else "i32")
    signature.update(stride_lse_b="i32", stride_lse_h="i32", seq_q="i32", seq_k="i32")
    signature.update(stride_bias_h="i32", dbias_programs="i32")
    signature.update(qk_scale="fp32", sm_scale="fp32", dropout_p="fp32", seed="i32")
    signature.update(seq_q_bucket="i32", seq_k_bucket="i32")
    variant = (has_mask, is_varlen, has_dropout, has_bias, rotary, window)
    constexprs = {**variant_constexprs(head_dim, *variant), "DKDV": is_dkdv}
    constexprs.update(config.kwargs)
    if not has_bias:
        constexprs["Bias"] = None
    if not rotary:
        constexprs["Rotary"] = None
    if not has_bias or is_dkdv:
        constexprs["DBias"] = None
    if not is_dkdv:
        constexprs["DV"] = None
        signature["DV"] = "constexpr"
    if has_mask:
        constexprs["stride_mask_s"] = 1  # a contiguous mask: the JIT specialises the 1
    else:
        constexprs["Mask"] = None
    if not is_varlen:
        constexprs["CuSeqlens"] = None
    signature.update({n: "constexpr" for n in constexprs if n not in signature})
    m, n = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    case_name = (
        f"{name}[{dtype} D={head_dim} {m}x{n} s{config.num_stages} w{config.num_warps} "
        f"mask={int(has_mask)} varlen={int(is_varlen)} dropout={int(has_dropout)}"
        f"{' bias=1' if has_bias else ''}{' rotary=1' if rotary else ''}"
        f"{' window=1' if window else ''}]"
    )
    # A dK / dV case's MMAs have BLOCK_N rows; its loop steps over BLOCK_M (module docstring).
    tiles = {"block_m": n, "block_n": m} if is_dkdv else {}
    return CompileCase.tuned(config, case_name, jit.fn, signature, constexprs, dtype, **tiles)


# (dtype, head dim, HAS_MASK, IS_VARLEN, HAS_DROPOUT) compiled in the heaviest kept config.
HEAVIEST = (
    ("fp16", 32, True, False, True),
    ("fp16", 80, True, False, True),
    ("fp16", 96, True, False, True),
    ("fp16", 64, False, False, False),
    ("fp16", 64, False, True, True),
    ("bf16", 64, True, False, True),
    ("bf16", 128, True, False, True),
    ("fp32", 64, True, False, True),
    ("fp32", 64, False, True, False),
)


# The same for the relative position bias variants.
HEAVIEST_BIAS = (
    ("fp16", 64, True, False, False),
    ("fp16", 64, False, True, True),
    ("fp16", 32, True, False, True),
    ("bf16", 64, True, False, True),
)


# The same for rotary positions with the window: (dtype, head dim, HAS_MASK, IS_VARLEN, the passes
# compiled (DKDV values)). Wider heads find no config within ``keep``'s budget and run the one
# holding the fewest values (fastbert/kernels/attention_configs.py's backward_load): in 16 bits its
# dQ pass spills (12 to 36 bytes per thread at D=80 under Triton 3.9) and is not a case; the dK / dV
# pass of D=80 compiles without spills and checks the padded head's turn back (a gather of its
# halves). float32 at D=80 is a case in both passes for its shared memory: the first
# config, which ran before, needed 384 KiB on an H200. (Under Triton 3.6 the dK / dV pass keeps
# a 16x32 config of its own there: fastbert/kernels/flash_attention_backward.py.)
HEAVIEST_ROTARY = (
    ("fp16", 64, False, True, (True, False)),
    ("fp16", 80, True, False, (True,)),
    ("bf16", 64, True, False, (True, False)),
    ("fp32", 64, True, False, (True, False)),
    ("fp32", 80, True, False, (True, False)),
)


def _cases() -> list[CompileCase]:
    cases = []
    for kernel in KERNELS:
        cases += [
            _case(kernel, "fp16", d, c, True, False, True)
            for d in (64, 128)
            for c in _kept(kernel, "fp16", d)
        ]
        cases += [
            _case(kernel, dtype, d, _heaviest(kernel, dtype, d), mask, varlen, dropout)
            for dtype, d, mask, varlen, dropout in HEAVIEST
        ]
        cases += [
            _case(kernel, "fp16", 64, c, True, False, True, has_bias=True)
            for c in _kept(kernel, "fp16", 64, has_bias=True)
        ]
        cases += [
            _case(kernel, dtype, d, _heaviest(kernel, dtype, d, True), mask, varlen, dropout, True)
            for dtype, d, mask, varlen, dropout in HEAVIEST_BIAS
        ]
        cases += [
            _case(kernel, "fp16", 64, c, True, False, False, rotary=True, window=window)
            for c in _kept(kernel, "fp16", 64, rotary=True)
            for window in (True, False)
        ]
        for dtype, d, mask, varlen, passes in HEAVIEST_ROTARY:
            if kernel[2] not in passes:
                continue
            config = _heaviest(kernel, dtype, d, rotary=True)
            cases.append(_case(kernel, dtype, d, config, mask, varlen, False, rotary=True))
    return cases


CASES = _cases()
