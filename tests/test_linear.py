"""K.linear (GEMM + bias / GELU / residual epilogue) against the float64 reference.

CPU (Triton interpreter): fp32 and fp16 with sizes off the tile grid, in 32 x 32 x 32 tiles,
and model-sized operands in the interpreter's wide tiles (linear_configs.INTERPRETER_WIDE_TILES,
which the model-level tests run).
GPU (``gpu`` mark): bf16 too, and the BERT-base / large projections up to M = 16384.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import fused_linear, linear_configs
from fastbert.kernels import reference as R
from tests.bad_inputs import (
    bad_input_test,
    float64_case,
    interpreter_needed_test,
    meta_case,
    rows_case,
)
from tests.op_cases import ALL_DTYPES, DOT_DTYPES, check_op, dtype_params, randn

ACTIVATIONS = (None, "gelu", "gelu_tanh")


def operands(m, n, k, dtype, device, seed=0, lead=None):
    """x [*lead, k] (lead defaults to (m,)), weight [n, k], bias [n], residual [*lead, n].

    Scaled so that the pre-activation values are O(1): GELU's curved part is exercised.
    """
    lead = (m,) if lead is None else tuple(lead)
    x = randn((*lead, k), dtype, device, seed)
    weight = randn((n, k), dtype, device, seed + 1, scale=max(k, 1) ** -0.5)
    bias = randn((n,), dtype, device, seed + 2)
    residual = randn((*lead, n), dtype, device, seed + 3)
    return x, weight, bias, residual


def linear_within_rule(x, weight, bias, activation, residual, what: str) -> torch.Tensor:
    """K.linear's output, held to the rule against the reference linear (``what`` names it in
    a failure). Shared with the tests that pin one config at a time."""
    kwargs = {"bias": bias, "activation": activation, "residual": residual}
    return check_op(K.linear, R.linear, (x, weight), kwargs, what=what)


def check_linear(x, weight, bias=None, activation=None, residual=None) -> torch.Tensor:
    what = f"linear act={activation} bias={bias is not None} res={residual is not None}"
    out = linear_within_rule(x, weight, bias, activation, residual, what)
    assert out.is_contiguous()
    return out


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize(
    "has_bias, activation, has_residual",
    list(itertools.product((False, True), ACTIVATIONS, (False, True))),
    ids=lambda v: str(v),
)
def test_epilogues(device, dtype, has_bias, activation, has_residual) -> None:
    x, weight, bias, residual = operands(33, 67, 45, dtype, device, seed=1)
    check_linear(
        x, weight, bias if has_bias else None, activation, residual if has_residual else None
    )


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("m", [1, 7, 33, 129])
def test_row_counts(device, dtype, m) -> None:
    x, weight, bias, residual = operands(m, 40, 72, dtype, device, seed=m)
    check_linear(x, weight, bias, "gelu", residual)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("n, k", [(1, 1), (3, 5), (67, 45), (33, 130), (100, 31)])
def test_odd_sizes(device, dtype, n, k) -> None:
    x, weight, bias, residual = operands(9, n, k, dtype, device, seed=n + k)
    check_linear(x, weight, bias, "gelu_tanh", residual)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_3d_input(device, dtype) -> None:
    x, weight, bias, residual = operands(0, 48, 40, dtype, device, seed=2, lead=(3, 11))
    out = check_linear(x, weight, bias, "gelu", residual)
    assert out.shape == (3, 11, 48)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("strided", ["x", "weight", "residual", "bias", "all", "x3d"])
def test_non_contiguous(device, dtype, strided) -> None:
    """Transposed / sliced views are read through their strides."""
    m, n, k = 37, 50, 70
    x, weight, bias, residual = operands(m, n, k, dtype, device, seed=3)
    if strided in ("x", "all"):
        x = randn((k, m), dtype, device, 4).t()
    if strided in ("weight", "all"):
        weight = randn((k, n), dtype, device, 5, scale=k**-0.5).t()
    if strided in ("residual", "all"):
        residual = randn((m, 2 * n), dtype, device, 6)[:, 1::2]
    if strided in ("bias", "all"):
        bias = randn((3 * n,), dtype, device, 7)[::3]
    if strided == "x3d":
        x = randn((5, 4, k), dtype, device, 8).transpose(0, 1)
        residual = randn((4, 5, n), dtype, device, 9)
    for t, name in ((x, "x"), (weight, "weight"), (residual, "residual"), (bias, "bias")):
        if strided in (name, "all") or (strided == "x3d" and name == "x"):
            assert not t.is_contiguous()
    check_linear(x, weight, bias, "gelu", residual)


def ran_a_wide_tile(device: str) -> bool:
    """Whether the last linear launch ran one of the interpreter's wide tiles (always true on a
    GPU, which has none)."""
    tile = linear_configs.tile_of(fused_linear._linear_fwd_kernel.best_config)
    return device != "cpu" or tile in linear_configs.INTERPRETER_WIDE_TILES


# (M, N, K): N and K hold a whole wide tile (the widest, then the narrower) and end part-way
# through the next one, as M does a row tile.
MODEL_SIZED = [(70, 300, 260), (37, 150, 140)]


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("m, n, k", MODEL_SIZED)
@pytest.mark.parametrize(
    "has_bias, activation, has_residual",
    [(False, None, False), (True, "gelu", True), (True, "gelu_tanh", False), (False, None, True)],
    ids=str,
)
def test_model_sized_operands(device, dtype, m, n, k, has_bias, activation, has_residual) -> None:
    x, weight, bias, residual = operands(m, n, k, dtype, device, seed=11)
    check_linear(
        x, weight, bias if has_bias else None, activation, residual if has_residual else None
    )
    assert ran_a_wide_tile(device)


@pytest.mark.parametrize("m, n, k", [(0, 8, 8), (4, 0, 8), (4, 8, 0)])
def test_empty_dimensions(device, m, n, k) -> None:
    """No rows or no outputs: an empty result; K = 0: act(bias) + residual."""
    x, weight, bias, residual = operands(m, n, k, torch.float32, device)
    out = check_linear(x, weight, bias, "gelu", residual)
    assert out.shape == (m, n)


def _valid_args(device) -> dict:
    """Valid fp32 operands (M=4, N=6, K=8): the keyword arguments of K.linear."""
    x, weight, bias, residual = operands(4, 6, 8, torch.float32, device)
    return {"x": x, "weight": weight, "bias": bias, "activation": "gelu", "residual": residual}


BAD = {
    "mixed dtypes": (dict(weight=lambda a: a["weight"].half()), TypeError, "dtype mismatch"),
    "bias dtype": (dict(bias=lambda a: a["bias"].bfloat16()), TypeError, "dtype mismatch"),
    "float64": float64_case("x", "weight", "bias", "residual"),
    "int x": (dict(x=lambda a: a["x"].int()), TypeError, "x must be float16"),
    "K mismatch": (dict(weight=lambda a: a["weight"][:, :5]), ValueError, "input features"),
    "3-d weight": (dict(weight=lambda a: a["weight"][None]), ValueError, "weight must have 2"),
    "bias shape": (dict(bias=lambda a: a["bias"][:5]), ValueError, r"bias must have shape \(6,\)"),
    "residual shape": rows_case("residual", 3, (4, 6)),
    "weight on meta": meta_case("weight"),
    "residual on meta": meta_case("residual"),
    "activation": (dict(activation=lambda a: "relu"), ValueError, "activation must be one of"),
}


test_bad_input_raises = bad_input_test(K.linear, _valid_args, BAD)
test_cpu_without_interpreter_says_so = interpreter_needed_test(K.linear, _valid_args)


# --- GPU: BERT-base / large projections, every dtype -----------------------------------------

# (K, N): attention projections, FFN up and down, for hidden 768 and 1024.
BERT_PROJECTIONS = [(768, 768), (768, 3072), (3072, 768), (1024, 1024), (1024, 4096), (4096, 1024)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params((), ALL_DTYPES))
@pytest.mark.parametrize("k, n", BERT_PROJECTIONS)
@pytest.mark.parametrize("m", [1, 128, 4103, 16384])
def test_gpu_bert_projections(dtype, k, n, m) -> None:
    x, weight, bias, residual = operands(m, n, k, dtype, "cuda", seed=k + n + m)
    if n > k:  # FFN up: bias + GELU
        check_linear(x, weight, bias, "gelu")
    else:  # attention output / FFN down: bias + residual
        check_linear(x, weight, bias, None, residual)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params((), ALL_DTYPES))
@pytest.mark.parametrize(
    "has_bias, activation, has_residual",
    list(itertools.product((False, True), ACTIVATIONS, (False, True))),
    ids=lambda v: str(v),
)
def test_gpu_epilogues(dtype, has_bias, activation, has_residual) -> None:
    x, weight, bias, residual = operands(1000, 3072, 1024, dtype, "cuda", seed=5)
    check_linear(
        x, weight, bias if has_bias else None, activation, residual if has_residual else None
    )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params((), ALL_DTYPES))
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 67, 45), (129, 1000, 771), (300, 2304, 768)])
def test_gpu_odd_and_strided(dtype, m, n, k) -> None:
    """Sizes off every tile grid, then transposed views of x, weight and residual."""
    x, weight, bias, residual = operands(m, n, k, dtype, "cuda", seed=m)
    check_linear(x, weight, bias, "gelu_tanh", residual)
    x_t = randn((k, m), dtype, "cuda", 7).t()
    weight_t = randn((k, n), dtype, "cuda", 6, scale=k**-0.5).t()
    residual_t = randn((n, m), dtype, "cuda", 8).t()
    check_linear(x_t, weight_t, bias, None, residual_t)
