"""Compile cases for fastbert/kernels/fused_linear.py: every autotune config and every epilogue
variant.

float16 compiles every autotune config (with the full epilogue, or, for a config ``keep``
allows only with lighter epilogues, with each epilogue it allows) and every epilogue variant
(with one config); bfloat16 and float32 compile every epilogue variant, float32 with each
config its ``keep`` predicate lets through. Configs and the jit function come from the module
itself, so the cases follow the code. Each case declares its dtype and BLOCK_M for the
tensor-core instruction check in tests/test_compile.py.

Training: the forward that stores the pre-activation (every config kept for the full epilogue,
each dtype), and the two backward products with the operands' strides the launcher passes:
dx = dY' @ weight (A = dY row-major, B = weight read transposed: unit stride along N) and
dweight = dY'^T @ x (A = dY^T and B = x^T: unit stride along M, strided along K), with the GELU
derivative prologue and, for dweight, the row sums of dbias, on every config ``keep`` allows
for each (the plain products on the biggest and smallest only).

Gated (GATED=1, ModernBERT's GeGLU input projection: two accumulators, the GELU of one times
the other in the epilogue): every one-tile-per-program config ``keep`` allows for it in fp16,
without bias (ModernBERT's) and with bias and residual, the training forward that stores both
pre-activations, and bf16 and fp32 on the heaviest kept config. Its backward (GATED_GRAD: the
dx and dweight products forming dY' of both halves in their prologue from dout and the two
stored pre-activations): every config ``keep`` allows for it with the erf GELU (GeGLU) in each
dtype, and the plain GLU product and the tanh GELU on the heaviest in fp16 and bf16.
"""

from __future__ import annotations

import itertools

from fastbert.kernels import fused_linear, linear_configs
from tests.compile_support import ARCHS, ELEMENT_SIZES, CompileCase

# Whether the kernels multiply tiles with tl.dot (tests/test_compile.py checks their MMA
# instructions; the cases declare dtype and block_m), or work row by row.
MATRIX = True

KERNEL = fused_linear._linear_fwd_kernel.fn
CONFIGS = fused_linear._linear_fwd_kernel.configs
POINTER_CONFIGS = [c for c in CONFIGS if not c.kwargs["PERSISTENT"]]
PERSISTENT_CONFIGS = [c for c in CONFIGS if c.kwargs["PERSISTENT"]]
EPILOGUES = list(itertools.product((False, True), (0, 1, 2), (False, True)))
FULL_EPILOGUE = (True, 1, True)  # (HAS_BIAS, ACTIVATION, HAS_RESIDUAL): BERT's heaviest
LARGEST_M_BUCKET = 65536
UNIT_STRIDES = (
    "stride_x_k",
    "stride_weight_k",
    "stride_bias_n",
    "stride_residual_n",
    "stride_out_n",
)


# The unit strides of the two backward products (the others are runtime integers).
DX_UNIT_STRIDES = ("stride_x_k", "stride_weight_n", "stride_out_n", "stride_pre_k")
DW_UNIT_STRIDES = ("stride_x_m", "stride_weight_n", "stride_out_n", "stride_pre_m")


def _signature(
    dtype: str,
    has_bias: bool,
    has_residual: bool,
    has_pre: bool = False,
    row_sum: bool = False,
    meta: dict | None = None,
) -> dict[str, str]:
    """The argument types; with the ``meta`` of a persistent config, its TMA descriptors'."""
    ptr = f"*{dtype}"
    persistent = meta is not None and meta["PERSISTENT"]
    if persistent:
        x_desc = f"tensordesc<{dtype}[{meta['BLOCK_M']},{meta['BLOCK_K']}]>"
        weight_desc = f"tensordesc<{dtype}[{meta['BLOCK_N']},{meta['BLOCK_K']}]>"
    return {
        "x_ptr": ptr,
        "weight_ptr": ptr,
        "x_desc": x_desc if persistent else "constexpr",
        "weight_desc": weight_desc if persistent else "constexpr",
        "bias_ptr": ptr if has_bias else "constexpr",
        "residual_ptr": ptr if has_residual else "constexpr",
        "out_ptr": ptr,
        "pre_ptr": ptr if has_pre else "constexpr",
        "row_sum_ptr": "*fp32" if row_sum else "constexpr",
        "x_scale_ptr": "constexpr",
        "weight_scale_ptr": "constexpr",
        "M": "i32",
        "N": "i32",
        "K": "i32",
        "M_BUCKET": "i32",
        "HAS_DESCRIPTORS": "i32",
        "stride_x_m": "i32",
        "stride_x_k": "constexpr",
        "stride_weight_n": "i32",
        "stride_weight_k": "constexpr",
        "stride_bias_n": "constexpr",
        "stride_residual_m": "i32",
        "stride_residual_n": "constexpr",
        "stride_out_m": "i32",
        "stride_out_n": "constexpr",
        "stride_pre_m": "i32",
        "stride_pre_k": "i32",
        "HAS_BIAS": "constexpr",
        "ACTIVATION": "constexpr",
        "HAS_RESIDUAL": "constexpr",
        "STORE_PRE_ACTIVATION": "constexpr",
        "GRAD_ACTIVATION": "constexpr",
        "HAS_ROW_SUM": "constexpr",
        "QUANT": "constexpr",
        "GATED": "constexpr",
        "GATED_GRAD": "constexpr",
        "BLOCK_M": "constexpr",
        "BLOCK_N": "constexpr",
        "BLOCK_K": "constexpr",
        "GROUP_M": "constexpr",
        "PERSISTENT": "constexpr",
    }


def _case(
    dtype: str,
    config,
    has_bias: bool,
    activation: int,
    has_residual: bool,
    *,
    store_pre: bool = False,
    grad: str | None = None,
    grad_activation: int = 0,
    gated: bool = False,
    gated_grad: bool = False,
) -> CompileCase:
    """A forward case (``store_pre``: the training forward), or with ``grad`` "dx" / "dw" one
    of the backward products with derivative ``grad_activation`` (``gated_grad``: of a gated
    linear, GATED_GRAD 1 for dx, 2 for dw)."""
    meta = config.kwargs
    unit = {None: UNIT_STRIDES, "dx": DX_UNIT_STRIDES, "dw": DW_UNIT_STRIDES}[grad]
    has_pre = store_pre or grad_activation != 0 or gated_grad
    row_sum = grad == "dw"
    gated_grad_code = {"dx": 1, "dw": 2}[grad] if gated_grad else 0
    constexprs = {
        "HAS_BIAS": has_bias,
        "ACTIVATION": activation,
        "HAS_RESIDUAL": has_residual,
        "STORE_PRE_ACTIVATION": store_pre,
        "GRAD_ACTIVATION": grad_activation,
        "HAS_ROW_SUM": row_sum,
        "QUANT": 0,
        "GATED": gated,
        "GATED_GRAD": gated_grad_code,
        "x_scale_ptr": None,
        "weight_scale_ptr": None,
        **meta,
        **dict.fromkeys(unit, 1),
    }
    if not has_bias:
        constexprs["bias_ptr"] = None
    if not has_residual:
        constexprs["residual_ptr"] = None
    if not has_pre:
        constexprs["pre_ptr"] = None
    if not row_sum:
        constexprs["row_sum_ptr"] = None
    if not meta["PERSISTENT"]:
        constexprs.update(x_desc=None, weight_desc=None)
    signature = _signature(dtype, has_bias, has_residual, has_pre, row_sum, meta)
    signature.update(dict.fromkeys(set(UNIT_STRIDES) - set(unit), "i32"))
    signature.update(dict.fromkeys(unit, "constexpr"))
    if grad is not None:
        variant = f"{grad} dact={grad_activation}"
        variant += " gated=1" if gated_grad else ""
    else:
        variant = f"bias={int(has_bias)} act={activation} res={int(has_residual)}"
        variant += " pre=1" if store_pre else ""
        variant += " gated=1" if gated else ""
    name = f"linear[{dtype} {linear_configs.config_name(config)} {variant}]"
    # N and K are multiples of 16 in BERT's launches; TMA and the persistent configs are for
    # sm_90 (keep() offers them nowhere else).
    # The gated dweight product's M is 2N' (ModernBERT's N' = 1152 and 2624 are multiples of 16).
    aligned = ("M", "N", "K") if gated_grad and grad == "dw" else ("N", "K")
    where = {"aligned_ints": aligned, "archs": (90,) if meta["PERSISTENT"] else ARCHS}
    return CompileCase.tuned(config, name, KERNEL, signature, constexprs, dtype, **where)


def _kept_epilogues(config, element_size: int) -> list[tuple[bool, int, bool]]:
    """The epilogues ``keep`` lets ``config`` run (at the largest M bucket)."""
    return [
        epilogue
        for epilogue in EPILOGUES
        if linear_configs.keep(
            config,
            element_size,
            LARGEST_M_BUCKET,
            activation=epilogue[1],
            has_residual=epilogue[2],
            has_descriptors=True,
        )
    ]


def _heaviest(dtype: str, config) -> list[CompileCase]:
    """``config`` with the full epilogue if kept for it, else with every epilogue it is kept for."""
    kept = _kept_epilogues(config, ELEMENT_SIZES[dtype])
    chosen = [FULL_EPILOGUE] if FULL_EPILOGUE in kept else kept
    return [_case(dtype, config, *epilogue) for epilogue in chosen]


def _cases() -> list[CompileCase]:
    """fp16: each config with its heaviest epilogues, then every epilogue on the sweep config."""
    cases = [case for config in CONFIGS for case in _heaviest("fp16", config)]
    for dtype, element_size in ELEMENT_SIZES.items():
        kept = [c for c in POINTER_CONFIGS if _kept_epilogues(c, element_size) == EPILOGUES]
        sweep = kept[-1]
        cases += [
            _case(dtype, sweep, *epilogue)
            for epilogue in EPILOGUES
            if dtype != "fp16" or epilogue != FULL_EPILOGUE
        ]
        if dtype == "fp32":
            others = [c for c in CONFIGS if c is not sweep]
            cases += [case for config in others for case in _heaviest(dtype, config)]
    # bf16 on the big-M tile too, so that its wgmma path on sm_90 is checked like fp16's.
    for family in (POINTER_CONFIGS, PERSISTENT_CONFIGS):
        big = next(c for c in family if FULL_EPILOGUE in _kept_epilogues(c, ELEMENT_SIZES["bf16"]))
        cases += _heaviest("bf16", big)
    return cases + _training_cases() + _gated_cases()


def _kept_for(config, element_size: int, **variant) -> bool:
    return linear_configs.keep(config, element_size, LARGEST_M_BUCKET, **variant)


def _backward_variant(g: str, **flags: int) -> dict:
    """``keep``'s arguments for the dx or dw product (``g``). The backward products read an
    operand transposed: never through descriptors."""
    variant = {"activation": 0, "has_residual": False, "has_descriptors": False}
    return {**variant, "row_sum": g == "dw", **flags}


def _training_cases() -> list[CompileCase]:
    """The forward storing the pre-activation, and the dx / dweight products, on each config
    ``keep`` allows for them (the plain products on the biggest and smallest)."""
    cases = []
    pre = {"activation": 1, "has_residual": True, "store_pre": True, "has_descriptors": True}
    for dtype, element_size in ELEMENT_SIZES.items():
        cases += [
            _case(dtype, c, *FULL_EPILOGUE, store_pre=True)
            for c in CONFIGS
            if _kept_for(c, element_size, **pre)
        ]
        for g in ("dx", "dw"):
            variant = _backward_variant(g)
            for act in (1, 2):
                cases += [
                    _case(dtype, c, False, 0, False, grad=g, grad_activation=act)
                    for c in CONFIGS
                    if _kept_for(c, element_size, **variant, grad_activation=act)
                    and (dtype == "fp16" or act == 1)
                ]
            kept = [c for c in CONFIGS if _kept_for(c, element_size, **variant)]
            cases += [_case(dtype, c, False, 0, False, grad=g) for c in (kept[0], kept[-1])]
    return cases


def _gated_cases() -> list[CompileCase]:
    """The gated (GeGLU) variants (module docstring)."""
    geglu = {"activation": 1, "has_residual": False, "gated": True}
    cases = []
    for dtype, element_size in ELEMENT_SIZES.items():
        kept = [c for c in POINTER_CONFIGS if _kept_for(c, element_size, **geglu)]
        chosen = kept if dtype == "fp16" else kept[:1]
        cases += [_case(dtype, c, False, 1, False, gated=True) for c in chosen]
    full = {"activation": 1, "has_residual": True, "gated": True}
    config = next(c for c in POINTER_CONFIGS if _kept_for(c, 2, **full))
    cases.append(_case("fp16", config, *FULL_EPILOGUE, gated=True))
    training = {**full, "store_pre": True}
    config = next(c for c in POINTER_CONFIGS if _kept_for(c, 2, **training))
    cases.append(_case("fp16", config, *FULL_EPILOGUE, store_pre=True, gated=True))
    return cases + _gated_backward_cases()


def _gated_backward_cases() -> list[CompileCase]:
    """The gated backward products (module docstring), with the launcher's strides."""
    cases = []
    for dtype, element_size in ELEMENT_SIZES.items():
        for g in ("dx", "dw"):
            variant = _backward_variant(g, gated_grad=1 if g == "dx" else 2)
            kept = [c for c in CONFIGS if _kept_for(c, element_size, **variant)]
            for config in kept:
                cases.append(
                    _case(
                        dtype, config, False, 0, False, grad=g, grad_activation=1, gated_grad=True
                    )
                )
            if dtype != "fp32":
                cases += [
                    _case(
                        dtype,
                        kept[0],
                        False,
                        0,
                        False,
                        grad=g,
                        grad_activation=act,
                        gated_grad=True,
                    )
                    for act in (0, 2)
                ]
    return cases


CASES = _cases()
