"""Compile cases for fastbert/kernels/flash_attention.py: autotune configs x head dims x dtypes x
variants.

Variants: dense masked (HAS_MASK=1, IS_VARLEN=0: the encoder's padded batches), dense unmasked
(HAS_MASK=0, IS_VARLEN=0) and padding-free (HAS_MASK=0, IS_VARLEN=1); ``attention_varlen``
never passes a mask, so HAS_MASK=1 with IS_VARLEN=1 is not a launched variant and is not
compiled. Head dims 32, 64, 80, 96, 128 (BLOCK_D 32, 64, 128).

- fp16: every autotune config that ``keep`` allows in the dense masked variant, and the
  heaviest kept config (the most fp32 values per thread, nearest to spilling) in the others.
- fp32: every kept config in every variant (its register budget is the tight one).
- bf16: the heaviest kept config in every variant (it compiles like fp16; the full bf16 sweep
  would add about a minute of compile time for no new code path).
- The mask is bool (``*i1``, what the encoder passes); one case reads an int64 mask (Hugging
  Face's attention_mask dtype).

The training variants (STORE_LSE=1 stores the log-sum-exp for the backward, HAS_DROPOUT=1 drops
probabilities) compile in the heaviest kept config: fp16 D=64 and D=128 dense masked with
dropout, D=64 dense masked without, D=64 padding-free with dropout; bf16 D=128 dense masked with
dropout. (The backward kernels: tests/compile_cases/attention_backward.py.)

The relative position bias (HAS_BIAS=1, MPNet) compiles in every kept fp16 config of D=64 (the
head dim of MPNet-base) dense masked, the heaviest kept config of each other head dim and of
the dense unmasked and padding-free variants, bf16 and fp32 D=64 dense masked, and the training
variant (fp16 D=64 dense masked, log-sum-exp stored, with and without dropout).

Rotary positions and the sliding window (ROTARY=1, WINDOW=1, ModernBERT's local layers; its
global layers: ROTARY=1 alone) compile in every kept fp16 config of D=64 (ModernBERT-base's
head dim) dense masked, the heaviest kept config of the dense unmasked and padding-free
variants and of D=32, 80, 96, 128 (the 128-wide block of 80 and 96 masks the rotated halves),
RoPE alone on the heaviest config of each variant, bf16 and fp32 D=64 dense masked, and fp32
D=80 dense masked storing the log-sum-exp (training), which keeps no config and runs the one
holding the fewest values.

Configs and the jit function come from the module itself, so the cases follow the code. A
contiguous mask has unit stride on S_k, which the JIT specialises to the constexpr 1. Each case
declares its dtype and BLOCK_M for the tensor-core instruction check in tests/test_compile.py.
"""

from __future__ import annotations

import functools

# The package re-exports same-named functions, so import the module itself.
from fastbert.kernels import flash_attention as mod
from fastbert.kernels.launch import next_power_of_2
from tests.compile_support import ELEMENT_SIZES, CompileCase

# Whether the kernels multiply tiles with tl.dot (tests/test_compile.py checks their MMA
# instructions; the cases declare dtype and block_m), or work row by row.
MATRIX = True

KERNEL = mod._attention_fwd_kernel.fn
CONFIGS = mod._attention_fwd_kernel.configs
VARIANTS = ((True, False), (False, False), (False, True))  # (HAS_MASK, IS_VARLEN)
STRIDES = [f"stride_{t}_{d}" for t in ("q", "k", "v", "o") for d in ("b", "h", "s")]


def _kept(head_dim: int, element_size: int, *variant: bool, **flags: bool) -> list:
    """The configs ``keep`` keeps for a head of ``head_dim``; ``variant`` and ``flags``: its
    variant flags (is_varlen, has_mask, then has_bias, has_rotary, has_dropout)."""
    block_d = next_power_of_2(head_dim)
    return [c for c in CONFIGS if mod.keep(c, block_d, element_size, *variant, **flags)]


def variant_constexprs(
    head_dim: int,
    has_mask: bool,
    is_varlen: bool,
    has_dropout: bool,
    has_bias: bool,
    rotary: bool,
    window: bool,
) -> dict[str, object]:
    """The constexpr flags the forward and backward kernels both take (their launchers':
    ``attention_launch.variant_flags``)."""
    flags = (has_mask, is_varlen, has_dropout, has_bias, rotary, window)
    names = ("HAS_MASK", "IS_VARLEN", "HAS_DROPOUT", "HAS_BIAS", "ROTARY", "WINDOW")
    return dict(HEAD_DIM=head_dim, BLOCK_D=next_power_of_2(head_dim), **dict(zip(names, flags)))


def _values_per_thread(config, head_dim: int, has_bias: bool = False, rotary: bool = False) -> int:
    """fp32 values per thread for the accumulator and the score tile, and with ``rotary`` the
    rotated key tile with its cos and sin (``keep``'s measure, ``load``)."""
    return mod.load(config, next_power_of_2(head_dim), 2, False, False, has_bias, rotary)


def _optional_inputs(
    signature: dict, constexprs: dict, has_mask: bool, is_varlen: bool, mask: str
) -> None:
    """The mask and cu_seqlens arguments: pointers when the variant reads them, else None."""
    signature.update(Mask=mask if has_mask else "constexpr")
    signature.update(CuSeqlens="*i32" if is_varlen else "constexpr")
    if has_mask:
        constexprs["stride_mask_s"] = 1
    else:
        constexprs["Mask"] = None
    if not is_varlen:
        constexprs["CuSeqlens"] = None


def _case(
    dtype: str,
    head_dim: int,
    config,
    has_mask: bool,
    is_varlen: bool,
    mask: str = "*i1",
    has_dropout: bool = False,
    store_lse: bool = False,
    has_bias: bool = False,
    rotary: bool = False,
    window: bool = False,
) -> CompileCase:
    ptr = f"*{dtype}"
    signature = {"Q": ptr, "K": ptr, "V": ptr, "Out": ptr}
    variant = (has_mask, is_varlen, has_dropout, has_bias, rotary, window)
    constexprs = {**variant_constexprs(head_dim, *variant), "STORE_LSE": store_lse}
    constexprs.update(config.kwargs)
    _optional_inputs(signature, constexprs, has_mask, is_varlen, mask)
    signature.update(Lse="*fp32" if store_lse else "constexpr")
    if not store_lse:
        constexprs["Lse"] = None
    signature.update(Bias="*fp32" if has_bias else "constexpr")
    if not has_bias:
        constexprs["Bias"] = None
    signature.update(Rotary="*fp32" if rotary else "constexpr")
    if not rotary:
        constexprs["Rotary"] = None
    signature.update(dict.fromkeys(STRIDES, "i32"))
    signature.update(stride_mask_b="i32", stride_mask_s="constexpr" if has_mask else "i32")
    signature.update(stride_lse_b="i32", stride_lse_h="i32", stride_bias_h="i32")
    signature.update(seq_q="i32", seq_k="i32", qk_scale="fp32", dropout_p="fp32", seed="i32")
    signature.update(window="i32")
    signature.update(seq_q_bucket="i32", seq_k_bucket="i32")
    signature.update({name: "constexpr" for name in constexprs if name not in signature})
    meta = config.kwargs
    training = f" lse=1 dropout={int(has_dropout)}" if store_lse else ""
    bias = " bias=1" if has_bias else ""
    bias += " rotary=1" if rotary else ""
    bias += " window=1" if window else ""
    name = (
        f"attention[{dtype} D={head_dim} {meta['BLOCK_M']}x{meta['BLOCK_N']} "
        f"s{config.num_stages} w{config.num_warps} mask={int(has_mask)}"
        f"{'' if mask == '*i1' or not has_mask else mask[1:]} varlen={int(is_varlen)}"
        f"{training}{bias}]"
    )
    return CompileCase.tuned(config, name, KERNEL, signature, constexprs, dtype)


def _heaviest(configs: list, head_dim: int):
    return max(configs, key=lambda c: _values_per_thread(c, head_dim))


def _cases() -> list[CompileCase]:
    cases = []
    for dtype, element_size in ELEMENT_SIZES.items():
        for head_dim in mod.SUPPORTED_HEAD_DIMS:
            for has_mask, is_varlen in VARIANTS:
                kept = _kept(head_dim, element_size, is_varlen, has_mask)
                if dtype == "fp32" or (dtype == "fp16" and has_mask):
                    chosen = kept
                else:
                    chosen = [_heaviest(kept, head_dim)]
                cases += [_case(dtype, head_dim, c, has_mask, is_varlen) for c in chosen]
    cases.append(_case("fp16", 64, _kept(64, 2, False, True)[0], True, False, mask="*i64"))
    return cases + _training_cases() + _bias_cases() + _rotary_cases()


# (dtype, head dim, HAS_MASK, IS_VARLEN, HAS_DROPOUT) of the training variants compiled.
TRAINING = (
    ("fp16", 64, True, False, True),
    ("fp16", 128, True, False, True),
    ("fp16", 64, True, False, False),
    ("fp16", 64, False, True, True),
    ("bf16", 128, True, False, True),
)


def _training_cases() -> list[CompileCase]:
    return [
        _case(
            dtype,
            d,
            _heaviest(_kept(d, ELEMENT_SIZES[dtype], varlen, mask, has_dropout=dropout), d),
            mask,
            varlen,
            has_dropout=dropout,
            store_lse=True,
        )
        for dtype, d, mask, varlen, dropout in TRAINING
    ]


def _heaviest_with_bias(dtype: str, head_dim: int, is_varlen: bool, has_mask: bool):
    kept = _kept(head_dim, ELEMENT_SIZES[dtype], is_varlen, has_mask, has_bias=True)
    return max(kept, key=lambda c: _values_per_thread(c, head_dim, has_bias=True))


def _bias_cases() -> list[CompileCase]:
    """The relative position bias variants (module docstring)."""
    kept = _kept(64, 2, False, True, has_bias=True)
    cases = [_case("fp16", 64, c, True, False, has_bias=True) for c in kept]
    for head_dim in mod.SUPPORTED_HEAD_DIMS:
        for has_mask, is_varlen in VARIANTS:
            if head_dim == 64 and has_mask:
                continue
            config = _heaviest_with_bias("fp16", head_dim, is_varlen, has_mask)
            cases.append(_case("fp16", head_dim, config, has_mask, is_varlen, has_bias=True))
    for dtype in ("bf16", "fp32"):
        config = _heaviest_with_bias(dtype, 64, False, True)
        cases.append(_case(dtype, 64, config, True, False, has_bias=True))
    config = _heaviest_with_bias("fp16", 64, False, True)
    for dropout in (False, True):
        cases.append(
            _case(
                "fp16", 64, config, True, False, has_dropout=dropout, store_lse=True, has_bias=True
            )
        )
    return cases


def _heaviest_rotary(dtype: str, head_dim: int, is_varlen: bool, has_mask: bool):
    """The kept config holding the most values; when none is kept, the one holding the fewest,
    which the pruner then runs."""
    kept = _kept(head_dim, ELEMENT_SIZES[dtype], is_varlen, has_mask, has_rotary=True)
    held = functools.partial(_values_per_thread, head_dim=head_dim, rotary=True)
    return max(kept, key=held) if kept else min(CONFIGS, key=held)


def _rotary_cases() -> list[CompileCase]:
    """The rotary and sliding-window variants (module docstring)."""
    kept = _kept(64, 2, False, True, has_rotary=True)
    cases = [_case("fp16", 64, c, True, False, rotary=True, window=True) for c in kept]
    for head_dim in mod.SUPPORTED_HEAD_DIMS:
        for has_mask, is_varlen in VARIANTS:
            config = _heaviest_rotary("fp16", head_dim, is_varlen, has_mask)
            if head_dim == 64:
                cases.append(_case("fp16", 64, config, has_mask, is_varlen, rotary=True))
                if has_mask:
                    continue
            elif not has_mask:
                continue
            cases.append(
                _case("fp16", head_dim, config, has_mask, is_varlen, rotary=True, window=True)
            )
    for dtype in ("bf16", "fp32"):
        config = _heaviest_rotary(dtype, 64, False, True)
        cases.append(_case(dtype, 64, config, True, False, rotary=True, window=True))
    # float32 at D=80 keeps no config: the one the pruner runs, as training runs it (the first
    # config, which ran before, needed 384 KiB of shared memory on an H200).
    config = _heaviest_rotary("fp32", 80, False, True)
    cases.append(_case("fp32", 80, config, True, False, store_lse=True, rotary=True, window=True))
    return cases


CASES = _cases()
