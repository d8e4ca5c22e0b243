"""K.layer_norm (fused residual add + LayerNorm) against the float64 reference.

CPU (Triton interpreter): fp32, fp16 and bf16, hidden sizes off and on powers of two.
GPU (``gpu`` mark): hidden 128 to 4096 over thousands of rows.
"""

from __future__ import annotations

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import reference as R
from fastbert.kernels.fused_layer_norm import MAX_HIDDEN
from tests.bad_inputs import (
    bad_input_test,
    float64_case,
    interpreter_needed_test,
    meta_case,
    rows_case,
)
from tests.op_cases import ALL_DTYPES, ELEMENTWISE_DTYPES, check_op, dtype_params, randn


def operands(shape, dtype, device, seed=0, offset=0.0):
    """x and residual of ``shape`` (x shifted by ``offset``), weight and bias [shape[-1]]."""
    hidden = shape[-1]
    x = (offset + randn(shape, torch.float32, device, seed)).to(dtype)
    residual = randn(shape, dtype, device, seed + 1)
    weight = (1.0 + randn((hidden,), torch.float32, device, seed + 2, scale=0.3)).to(dtype)
    bias = randn((hidden,), dtype, device, seed + 3, scale=0.5)
    return x, residual, weight, bias


def check_layer_norm(x, weight, bias, eps, residual=None) -> torch.Tensor:
    out = check_op(
        K.layer_norm,
        R.layer_norm,
        (x, weight, bias, eps),
        {"residual": residual},
        what=f"layer_norm res={residual is not None}",
    )
    assert out.is_contiguous() and out.shape == x.shape
    return out


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 64, 100, 384, 768])
@pytest.mark.parametrize("with_residual", [False, True], ids=["x", "x+res"])
def test_hidden_sizes(device, dtype, hidden, with_residual) -> None:
    x, residual, weight, bias = operands((2, 5, hidden), dtype, device, seed=hidden)
    check_layer_norm(x, weight, bias, 1e-12, residual if with_residual else None)


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
@pytest.mark.parametrize("eps", [1e-5, 0.5])
def test_eps(device, dtype, eps) -> None:
    x, residual, weight, bias = operands((6, 100), dtype, device, seed=1)
    check_layer_norm(x, weight, bias, eps, residual)


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
@pytest.mark.parametrize("with_residual", [False, True], ids=["x", "x+res"])
def test_large_mean_offset(device, dtype, with_residual) -> None:
    """Rows at 1000 +- 1: E[x^2] - E[x]^2 in float32 would lose the variance; centring keeps it."""
    x, residual, weight, bias = operands((8, 384), dtype, device, seed=2, offset=1000.0)
    check_layer_norm(x, weight, bias, 1e-12, residual if with_residual else None)


def test_large_mean_offset_within_a_unit_of_the_input(device) -> None:
    """float32 rows of 768 at 1000 +- 1: within one unit in the last place of the inputs
    (6.1e-5) times the largest weight. The float32 sum of the row rounds at the sum's scale
    (~1e-4 off in the mean, 1.8e-4 in the output under the interpreter); the kernel corrects
    the mean with the centred values' own: 5.3e-5 (PyTorch's CPU LayerNorm: 1.5e-4)."""
    x, _, weight, bias = operands((64, 768), torch.float32, device, seed=4, offset=1000.0)
    out = K.layer_norm(x, weight, bias, 1e-12)
    ref = R.layer_norm(x.double(), weight.double(), bias.double(), 1e-12)
    unit = torch.finfo(torch.float32).eps * 512  # the spacing of float32 values in [512, 1024)
    assert (out.double() - ref).abs().max().item() <= unit * weight.abs().max().item()


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
@pytest.mark.parametrize("strided", ["x", "residual", "weight", "all"])
def test_non_contiguous(device, dtype, strided) -> None:
    x, residual, weight, bias = operands((3, 4, 100), dtype, device, seed=3)
    if strided in ("x", "all"):
        x = randn((4, 3, 100), dtype, device, 4).transpose(0, 1)
    if strided in ("residual", "all"):
        residual = randn((3, 4, 200), dtype, device, 5)[..., ::2]
    if strided in ("weight", "all"):
        weight = weight.repeat_interleave(2)[::2]
        bias = bias.repeat_interleave(3)[1::3]
    check_layer_norm(x, weight, bias, 1e-5, residual)


def test_constant_row(device) -> None:
    """Zero variance: the output is exactly the bias (rstd = 1 / sqrt(eps), centred = 0)."""
    x, residual, weight, bias = operands((3, 64), torch.float32, device)
    x = torch.full_like(x, 2.5)
    out = check_layer_norm(x, weight, bias, 1e-5)
    assert torch.equal(out, bias.expand_as(out))


def test_empty_rows(device) -> None:
    x, residual, weight, bias = operands((0, 32), torch.float32, device)
    assert K.layer_norm(x, weight, bias, 1e-5, residual).shape == (0, 32)


def _valid_args(device) -> dict:
    """Valid fp32 operands ([4, 16]): the keyword arguments of K.layer_norm."""
    x, residual, weight, bias = operands((4, 16), torch.float32, device)
    return {"x": x, "weight": weight, "bias": bias, "eps": 1e-5, "residual": residual}


BAD = {
    "mixed dtypes": (dict(weight=lambda a: a["weight"].half()), TypeError, "dtype mismatch"),
    "residual dtype": (dict(residual=lambda a: a["residual"].bfloat16()), TypeError, "dtype"),
    "float64": float64_case("x", "weight", "bias", "residual"),
    "weight shape": (dict(weight=lambda a: a["weight"][:8]), ValueError, r"weight must have sha"),
    "bias 2-d": (dict(bias=lambda a: a["bias"][None]), ValueError, "bias must have 1 dim"),
    "residual shape": rows_case("residual", 2, (4, 16)),
    "x on meta": meta_case("x"),
    "bias on meta": meta_case("bias"),
    "negative eps": (dict(eps=lambda a: -1e-5), ValueError, "eps must be a non-negative"),
    "nan eps": (dict(eps=lambda a: float("nan")), ValueError, "eps must be a non-negative"),
    "too wide": (
        {
            "x": lambda a: a["x"].new_zeros(2, MAX_HIDDEN + 1),
            "weight": lambda a: a["x"].new_zeros(MAX_HIDDEN + 1),
            "bias": lambda a: a["x"].new_zeros(MAX_HIDDEN + 1),
            "residual": lambda a: None,
        },
        ValueError,
        "hidden size 4097 is larger than the 4096",
    ),
}


test_bad_input_raises = bad_input_test(K.layer_norm, _valid_args, BAD)
test_cpu_without_interpreter_says_so = interpreter_needed_test(K.layer_norm, _valid_args)


# --- GPU: BERT hidden sizes over many rows ----------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params((), ALL_DTYPES))
@pytest.mark.parametrize("hidden", [128, 256, 384, 512, 768, 1000, 1024, 2048, 3072, 4096])
@pytest.mark.parametrize("with_residual", [False, True], ids=["x", "x+res"])
def test_gpu_hidden_sizes(dtype, hidden, with_residual) -> None:
    x, residual, weight, bias = operands((8, 512, hidden), dtype, "cuda", seed=hidden)
    check_layer_norm(x, weight, bias, 1e-12, residual if with_residual else None)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params((), ALL_DTYPES))
def test_gpu_large_mean_offset_strided(dtype) -> None:
    x, residual, weight, bias = operands((512, 32, 1024), dtype, "cuda", seed=9, offset=1000.0)
    check_layer_norm(x.transpose(0, 1), weight, bias, 1e-12, residual.transpose(0, 1))
