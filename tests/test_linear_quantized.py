"""K.linear_int8 (per-token activations, per-channel weights, int32 accumulation, fused
dequantise / bias / GELU / residual epilogue) against the reference that quantises the same way.

The quantised operands are the same bits in every implementation (the row quantisation is the
same float32 operations), and the int32 sums are exact, so the outputs differ from the float64
reference only by the float32 epilogue: a few roundings of the terms it adds. The bound is 8
units in the last place of float32 (2**-20) of the sum of those terms' magnitudes, per element;
measured, the errors reach 0.9 of those units (Triton, interpreter) and 1.8 (torch backend),
and the GPU's approximate exp2 / rsqrt in the GELU add about 2. A scale off by 1e-5 fails.
CPU: the Triton interpreter (32 x 32 x 32 tiles) and the torch backend (``torch._int_mm``).
"""

from __future__ import annotations

import itertools

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import reference as R
from fastbert.kernels import torch_ops as T
from fastbert.kernels.quantized_linear import QUANTIZE_MAX_BLOCK_K, quantize_rows
from tests.bad_inputs import bad_input_test
from tests.op_cases import randn

ACTIVATIONS = (None, "gelu", "gelu_tanh")
EPILOGUE_ULPS = 8 * 2.0**-23
INT8_DTYPES = (torch.float32, torch.float16)


def operands(m, n, k, dtype=torch.float32, device="cpu", seed=0, lead=None):
    """x [*lead, k], int8 weight [n, k] and its scales, bias [n], residual [*lead, n]."""
    lead = (m,) if lead is None else tuple(lead)
    x = randn((*lead, k), dtype, device, seed)
    weight = randn((n, k), torch.float32, device, seed + 1, scale=max(k, 1) ** -0.5)
    weight_q, weight_scale = R.quantize_weight(weight)
    bias = randn((n,), dtype, device, seed + 2)
    residual = randn((*lead, n), dtype, device, seed + 3)
    return x, weight_q, weight_scale, bias, residual


def bound(x, weight_q, weight_scale, bias, residual, input_scale=None) -> torch.Tensor:
    """Per element: 8 float32 ulps of |dequantised product| + |bias| + |residual| (+ the
    output's own magnitude, for the activation's rounding)."""
    q, scale = R.quantize_rows(x, input_scale)
    product = (q.double() @ weight_q.double().T).abs() * (scale.double()[..., None] * weight_scale)
    terms = product
    if bias is not None:
        terms = terms + bias.double().abs()
    if residual is not None:
        terms = terms + residual.double().abs()
    return EPILOGUE_ULPS * terms


def check(op, x, weight_q, weight_scale, bias=None, activation=None, residual=None, smooth=None):
    out = op(x, weight_q, weight_scale, bias, activation, residual, smooth)
    wide = (lambda t: None if t is None else t.double()) if x.dtype == torch.float32 else None
    if wide is None:  # float16: the reference's output rounded to float16 once, as the op's
        ref = R.linear_int8(x, weight_q, weight_scale, bias, activation, residual, smooth)
        assert out.dtype == x.dtype and out.shape == ref.shape
        ulp = torch.finfo(x.dtype).eps * ref.double().abs().clamp(min=2.0**-14)
        err = (out.double() - ref.double()).abs()
        limit = ulp + bound(x, weight_q, weight_scale, bias, residual, smooth)
        assert (err <= limit).all(), err.max()
        return out
    ref = R.linear_int8(
        x.double(), weight_q, weight_scale, wide(bias), activation, wide(residual), smooth
    )
    assert out.dtype == x.dtype and out.shape == ref.shape and out.is_contiguous()
    err = (out.double() - ref).abs()
    limit = bound(x, weight_q, weight_scale, bias, residual, smooth) + EPILOGUE_ULPS * ref.abs()
    assert (err <= limit).all(), f"max error {err.max():.3g}, at most {limit.max():.3g} allowed"
    return out


@pytest.fixture(params=["triton", "torch"])
def op(request):
    return K.linear_int8 if request.param == "triton" else T.linear_int8


@pytest.mark.parametrize(
    "has_bias, activation, has_residual",
    list(itertools.product((False, True), ACTIVATIONS, (False, True))),
    ids=lambda v: str(v),
)
def test_epilogues(device, op, has_bias, activation, has_residual) -> None:
    x, wq, ws, bias, residual = operands(33, 67, 45, device=device, seed=1)
    check(op, x, wq, ws, bias if has_bias else None, activation, residual if has_residual else None)


@pytest.mark.parametrize("dtype", INT8_DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 7, 33, 129])
def test_row_counts(device, op, dtype, m) -> None:
    x, wq, ws, bias, residual = operands(m, 40, 72, dtype, device, seed=m)
    check(op, x, wq, ws, bias, "gelu", residual)


@pytest.mark.parametrize("n, k", [(1, 1), (3, 5), (67, 45), (33, 130), (100, 31)])
def test_odd_sizes(device, op, n, k) -> None:
    x, wq, ws, bias, residual = operands(9, n, k, device=device, seed=n + k)
    check(op, x, wq, ws, bias, "gelu_tanh", residual)


def test_3d_and_strided_input(device, op) -> None:
    x, wq, ws, bias, residual = operands(0, 48, 40, device=device, seed=2, lead=(3, 11))
    out = check(op, x, wq, ws, bias, "gelu", residual)
    assert out.shape == (3, 11, 48)
    # A transposed view (unit stride along the rows, not along K).
    xt = randn((40, 13), torch.float32, device, 5).T
    check(op, xt, wq, ws, bias)


def test_input_scale(device, op) -> None:
    """SmoothQuant's input scale: x's columns multiplied before the quantisation; with the
    weight's columns divided by it, the product tracks the float linear, and an outlier column
    costs the other columns less precision than without it."""
    x, _, _, bias, residual = operands(17, 24, 40, device=device, seed=4)
    x[:, 3] *= 40.0  # an outlier channel, as LayerNorm outputs have
    weight = randn((24, 40), torch.float32, device, 9, scale=40**-0.5)
    smooth = torch.ones(40, device=device)
    smooth[3] = 1 / 16
    wq, ws = R.quantize_weight(weight / smooth)
    out = check(op, x, wq, ws, bias, "gelu", residual, smooth)
    exact = R.linear(x.double(), weight.double(), bias.double(), "gelu", residual.double())
    plain_q, plain_s = R.quantize_weight(weight)
    plain = op(x, plain_q, plain_s, bias, "gelu", residual)
    assert (out.double() - exact).norm() < 0.5 * (plain.double() - exact).norm()


def test_a_row_of_zeros_gets_the_bias(device, op) -> None:
    x, wq, ws, bias, _ = operands(5, 24, 40, device=device, seed=3)
    x[2] = 0.0
    out = check(op, x, wq, ws, bias)
    assert torch.equal(out[2], bias)


@pytest.mark.parametrize("k", [1, 45, QUANTIZE_MAX_BLOCK_K + 37])
def test_row_quantisation_is_the_reference_bit_for_bit(device, k) -> None:
    """The Triton kernel (several K tiles past QUANTIZE_MAX_BLOCK_K), the torch backend's and
    the reference's quantisation agree exactly, ties rounded to even included."""
    x = randn((6, k), torch.float32, device, k) * 3.0
    smooth = randn((k,), torch.float32, device, k + 1).abs() + 0.5
    x[1] = 0.0
    # Values whose product with 127 / max lands on a half: rounded to even.
    x[3, : min(k, 4)] = torch.tensor([127.0, 0.5, 1.5, -2.5][: min(k, 4)])
    expected_q, expected_scale = R.quantize_rows(x)
    for q, scale in (quantize_rows(x), T.quantize_rows(x)):
        assert q.dtype == torch.int8 and scale.dtype == torch.float32
        assert torch.equal(q, expected_q) and torch.equal(scale, expected_scale)
    smoothed = R.quantize_rows(x, smooth)
    for q, scale in (quantize_rows(x, smooth), T.quantize_rows(x, smooth)):
        assert torch.equal(q, smoothed[0]) and torch.equal(scale, smoothed[1])
    if k >= 4:
        assert expected_q[3, :4].tolist() == [127, 0, 2, -2]
    assert expected_q.abs().max() <= 127 and torch.all(expected_q[1] == 0)


def test_quantised_product_tracks_the_float_linear() -> None:
    """What int8 costs on one projection: within 1% of the float64 linear's scale (the
    rounding of 127 levels per row), and not equal to it (the test above would pass on an
    op that ignored the quantisation only if it rounded the same way)."""
    x, _, _, bias, _ = operands(64, 96, 128, seed=7)
    weight = randn((96, 128), torch.float32, "cpu", 8, scale=128**-0.5)
    wq, ws = R.quantize_weight(weight)
    exact = R.linear(x.double(), weight.double(), bias.double())
    out = T.linear_int8(x, wq, ws, bias)
    rel = ((out.double() - exact).norm() / exact.norm()).item()
    assert 1e-4 < rel < 1e-2


def test_gradients_are_refused(device, op) -> None:
    x, wq, ws, bias, _ = operands(4, 8, 16, device=device)
    with pytest.raises(RuntimeError, match="inference only"):
        op(x.requires_grad_(), wq, ws, bias)
    with torch.no_grad():
        op(x, wq, ws, bias)


def test_empty_inputs(device, op) -> None:
    x, wq, ws, bias, _ = operands(0, 8, 16, device=device)
    assert op(x, wq, ws, bias).shape == (0, 8)
    x, wq, ws, bias, _ = operands(3, 8, 0, device=device)
    assert torch.equal(op(x, wq, ws, bias), bias.expand(3, 8))


def _valid(device):
    x, wq, ws, bias, residual = operands(5, 8, 16, device=device)
    return {
        "x": x,
        "weight": wq,
        "weight_scale": ws,
        "bias": bias,
        "activation": "gelu",
        "residual": residual,
        "input_scale": torch.rand(16, device=device) + 0.5,
    }


BAD_CASES = {
    "float-weight": ({"weight": lambda a: a["weight"].float()}, TypeError, "weight must be int8"),
    "half-scale": ({"weight_scale": lambda a: a["weight_scale"].half()}, TypeError, "float32"),
    "int-x": ({"x": lambda a: a["x"].to(torch.int8)}, TypeError, "x must be float"),
    "k-mismatch": ({"x": lambda a: a["x"][:, :15]}, ValueError, "input features"),
    "scale-shape": ({"weight_scale": lambda a: a["weight_scale"][:7]}, ValueError, r"\(8,\)"),
    "bias-dtype": ({"bias": lambda a: a["bias"].half()}, TypeError, "dtype mismatch"),
    "residual-shape": ({"residual": lambda a: a["residual"][:4]}, ValueError, "residual"),
    "activation": ({"activation": lambda a: "relu"}, ValueError, "activation must be"),
    "input-scale-shape": ({"input_scale": lambda a: a["input_scale"][:9]}, ValueError, r"\(16,\)"),
    "input-scale-dtype": ({"input_scale": lambda a: a["input_scale"].half()}, TypeError, "float32"),
}

test_bad_inputs_triton = bad_input_test(K.linear_int8, _valid, BAD_CASES)
test_bad_inputs_torch = bad_input_test(T.linear_int8, _valid, BAD_CASES)
test_bad_inputs_reference = bad_input_test(R.linear_int8, _valid, BAD_CASES)


def test_the_op_is_declared_without_backward() -> None:
    op = K.OPS["linear_int8"]
    assert op.backward is None and op.reference is R.linear_int8
    assert op.torch is T.linear_int8_unchecked


def test_custom_op_matches_the_public_function(device) -> None:
    args = _valid(device)
    expected = K.linear_int8(**args)
    got = torch.ops.fastbert.linear_int8(*args.values(), False)
    assert torch.equal(got, expected)
    torch.library.opcheck(torch.ops.fastbert.linear_int8.default, (*args.values(), False))
