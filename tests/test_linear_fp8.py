"""K.linear_fp8 (float8 e4m3: per-token activations, per-channel weights, float32 accumulation,
fused dequantise / bias / GELU / residual epilogue) against the reference that quantises the
same way.

The quantised operands are the same bits in every implementation: the Triton kernel rounds to
e4m3 in float32 arithmetic (kernels/quantized_linear.py's ``_round_to_e4m3``), the reference and
the torch backend with PyTorch's own float8_e4m3fn conversion, and a test below runs every
e4m3 value, every midpoint between two (ties) and their neighbours through both. Each product
of two e4m3 values is exact in float32; only the float32 sums and epilogue round, where the
float64 reference does not. The bound per element is the float32 summation's
(K * 2**-24 of the sum of the products' magnitudes, the classical worst case) plus 8 float32
units of the terms the epilogue adds; a scale off by 1e-5 fails it. On a GPU, sm_90's FP8
warpgroup MMA adds in reduced precision within a K tile (the kernel adds each tile's partial
sum into the float32 accumulator): there the summation unit is 2**-13 (unmeasured here; no
GPU ran these yet).
CPU: the Triton interpreter (its tl.dot widens e4m3 to float16 exactly and multiplies in
float32) and the torch backend (an emulation: the same e4m3 operands multiplied in float32).
"""

from __future__ import annotations

import itertools
import types

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import checks
from fastbert.kernels import reference as R
from fastbert.kernels import torch_ops as T
from fastbert.kernels.quantized_linear import QUANTIZE_MAX_BLOCK_K, quantize_rows
from tests.bad_inputs import bad_input_test
from tests.op_cases import randn

ACTIVATIONS = (None, "gelu", "gelu_tanh")
EPILOGUE_ULPS = 8 * 2.0**-23
FP8_DTYPES = (torch.float32, torch.float16)


def summation_unit(device) -> float:
    """The relative rounding of one float32 addition of the product's sums: float32's unit
    roundoff on the CPU, the FP8 tensor cores' narrower internal adder on a GPU."""
    return 2.0**-13 if torch.device(device).type == "cuda" else 2.0**-24


def operands(m, n, k, dtype=torch.float32, device="cpu", seed=0, lead=None):
    """x [*lead, k], e4m3 weight [n, k] and its scales, bias [n], residual [*lead, n]."""
    lead = (m,) if lead is None else tuple(lead)
    x = randn((*lead, k), dtype, device, seed)
    weight = randn((n, k), torch.float32, device, seed + 1, scale=max(k, 1) ** -0.5)
    weight_q, weight_scale = R.quantize_weight(weight, "fp8")
    bias = randn((n,), dtype, device, seed + 2)
    residual = randn((*lead, n), dtype, device, seed + 3)
    return x, weight_q, weight_scale, bias, residual


def bound(x, weight_q, weight_scale, bias, residual, input_scale=None) -> torch.Tensor:
    """Per element: the float32 summation of K products (K units of the sum of their
    magnitudes) plus 8 float32 ulps of |dequantised product| + |bias| + |residual|."""
    q, scale = R.quantize_rows(x, input_scale, "fp8")
    k = weight_q.shape[1]
    product = (q.double().abs() @ weight_q.double().abs().T) * (
        scale.double()[..., None] * weight_scale
    )
    terms = product * (1 + k * summation_unit(x.device) / EPILOGUE_ULPS)
    if bias is not None:
        terms = terms + bias.double().abs()
    if residual is not None:
        terms = terms + residual.double().abs()
    return EPILOGUE_ULPS * terms


def check(op, x, weight_q, weight_scale, bias=None, activation=None, residual=None, smooth=None):
    out = op(x, weight_q, weight_scale, bias, activation, residual, smooth)
    wide = (lambda t: None if t is None else t.double()) if x.dtype == torch.float32 else None
    if wide is None:  # float16: the reference's output rounded to float16 once, as the op's
        ref = R.linear_fp8(x, weight_q, weight_scale, bias, activation, residual, smooth)
        assert out.dtype == x.dtype and out.shape == ref.shape
        ulp = torch.finfo(x.dtype).eps * ref.double().abs().clamp(min=2.0**-14)
        err = (out.double() - ref.double()).abs()
        limit = ulp + bound(x, weight_q, weight_scale, bias, residual, smooth)
        assert (err <= limit).all(), err.max()
        return out
    ref = R.linear_fp8(
        x.double(), weight_q, weight_scale, wide(bias), activation, wide(residual), smooth
    )
    assert out.dtype == x.dtype and out.shape == ref.shape and out.is_contiguous()
    err = (out.double() - ref).abs()
    limit = bound(x, weight_q, weight_scale, bias, residual, smooth) + EPILOGUE_ULPS * ref.abs()
    assert (err <= limit).all(), f"max error {err.max():.3g}, at most {limit.max():.3g} allowed"
    return out


@pytest.fixture(params=["triton", "torch"])
def op(request):
    return K.linear_fp8 if request.param == "triton" else T.linear_fp8


@pytest.mark.parametrize(
    "has_bias, activation, has_residual",
    list(itertools.product((False, True), ACTIVATIONS, (False, True))),
    ids=lambda v: str(v),
)
def test_epilogues(device, op, has_bias, activation, has_residual) -> None:
    x, wq, ws, bias, residual = operands(33, 67, 45, device=device, seed=1)
    check(op, x, wq, ws, bias if has_bias else None, activation, residual if has_residual else None)


@pytest.mark.parametrize("dtype", FP8_DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 7, 33, 129])
def test_row_counts(device, op, dtype, m) -> None:
    x, wq, ws, bias, residual = operands(m, 40, 72, dtype, device, seed=m)
    check(op, x, wq, ws, bias, "gelu", residual)


@pytest.mark.parametrize("n, k", [(1, 1), (3, 5), (67, 45), (33, 130), (100, 31)])
def test_odd_sizes(device, op, n, k) -> None:
    x, wq, ws, bias, residual = operands(9, n, k, device=device, seed=n + k)
    check(op, x, wq, ws, bias, "gelu_tanh", residual)


def test_3d_strided_input_and_input_scale(device, op) -> None:
    x, wq, ws, bias, residual = operands(0, 48, 40, device=device, seed=2, lead=(3, 11))
    smooth = torch.rand(40, device=device) + 0.5
    out = check(op, x, wq, ws, bias, "gelu", residual, smooth)
    assert out.shape == (3, 11, 48)
    # A transposed view (unit stride along the rows, not along K).
    xt = randn((40, 13), torch.float32, device, 5).T
    check(op, xt, wq, ws, bias)


def test_a_row_of_zeros_gets_the_bias(device, op) -> None:
    x, wq, ws, bias, _ = operands(5, 24, 40, device=device, seed=3)
    x[2] = 0.0
    out = check(op, x, wq, ws, bias)
    assert torch.equal(out[2], bias)


def e4m3_values_and_midpoints() -> torch.Tensor:
    """Every finite non-negative e4m3 value, every midpoint between two neighbours (ties, which
    round to the even one) and the float32 numbers just either side of each midpoint."""
    codes = torch.arange(0x7F, dtype=torch.uint8)  # 0x7F is NaN
    values = codes.view(torch.float8_e4m3fn).float()
    mid = (values[:-1] + values[1:]) / 2
    return torch.cat([values, mid, mid.nextafter(values[1:]), mid.nextafter(values[:-1])])


def test_e4m3_rounding_is_pytorchs_bit_for_bit(device) -> None:
    """The Triton kernel's e4m3 rounding in float32 arithmetic against PyTorch's conversion on
    every value, tie and near-tie (subnormals included), both signs: rows whose maximum is
    448, so that the scale is 1 and each value is rounded as it is."""
    v = e4m3_values_and_midpoints()
    row = torch.cat([v, -v, torch.tensor([448.0])]).to(device)
    q, scale = quantize_rows(row[None, :], quantize="fp8")
    assert scale.item() == 1.0
    expected = row.to(torch.float8_e4m3fn)
    assert torch.equal(q.view(torch.uint8), expected.view(torch.uint8)[None, :])
    # Ties went to even: 17 (between 16 and 18) -> 16, 19 -> 20.
    ties = torch.tensor([17.0, 19.0, 448.0], device=device)
    assert quantize_rows(ties[None], quantize="fp8")[0].float().tolist() == [[16.0, 20.0, 448.0]]


@pytest.mark.parametrize("k", [1, 45, QUANTIZE_MAX_BLOCK_K + 37])
def test_row_quantisation_is_the_reference_bit_for_bit(device, k) -> None:
    """The Triton kernel (several K tiles past QUANTIZE_MAX_BLOCK_K), the torch backend's and
    the reference's e4m3 quantisation agree exactly, signed zeros and saturation included."""
    x = randn((6, k), torch.float32, device, k) * torch.logspace(-8, 2, k, device=device)
    smooth = randn((k,), torch.float32, device, k + 1).abs() + 0.5
    x[1] = 0.0
    expected_q, expected_scale = R.quantize_rows(x, quantize="fp8")
    for q, scale in (quantize_rows(x, quantize="fp8"), T.quantize_rows(x, quantize="fp8")):
        assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        assert torch.equal(q.view(torch.uint8), expected_q.view(torch.uint8))
        assert torch.equal(scale, expected_scale)
    smoothed = R.quantize_rows(x, smooth, "fp8")
    for q, scale in (quantize_rows(x, smooth, "fp8"), T.quantize_rows(x, smooth, "fp8")):
        assert torch.equal(q.view(torch.uint8), smoothed[0].view(torch.uint8))
        assert torch.equal(scale, smoothed[1])
    assert expected_q.float().abs().max() == 448.0 and torch.all(expected_q[1].float() == 0)


def test_quantised_product_tracks_the_float_linear() -> None:
    """What e4m3 costs on one projection: a few percent of the float64 linear's scale (3
    fraction bits per element, errors averaging over K), more than int8's 127 levels per row
    on Gaussian rows, and not nothing."""
    x, _, _, bias, _ = operands(64, 96, 128, seed=7)
    weight = randn((96, 128), torch.float32, "cpu", 8, scale=128**-0.5)
    exact = R.linear(x.double(), weight.double(), bias.double())
    wq, ws = R.quantize_weight(weight, "fp8")
    out = T.linear_fp8(x, wq, ws, bias)
    rel = ((out.double() - exact).norm() / exact.norm()).item()
    assert 1e-3 < rel < 5e-2
    iq, iscale = R.quantize_weight(weight)
    int8 = T.linear_int8(x, iq, iscale, bias)
    assert rel > ((int8.double() - exact).norm() / exact.norm()).item()


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


def test_gpus_without_fp8_tensor_cores_are_refused(monkeypatch) -> None:
    """sm_89 and sm_90 pass; an A100 (sm_80) gets an error naming the requirement."""
    gpu = types.SimpleNamespace(device=torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    for capability in ((8, 9), (9, 0), (10, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, c=capability: c)
        checks.check_fp8_device("x", gpu)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(ValueError, match=r"NVIDIA A100 \(sm_80\).*sm_89.*sm_90"):
        checks.check_fp8_device("x", gpu)


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
    "float-weight": (
        {"weight": lambda a: a["weight"].float()},
        TypeError,
        "weight must be float8_e4m3fn",
    ),
    "int8-weight": (
        {"weight": lambda a: a["weight"].float().to(torch.int8)},
        TypeError,
        "got torch.int8",
    ),
    "half-scale": ({"weight_scale": lambda a: a["weight_scale"].half()}, TypeError, "float32"),
    "int-x": ({"x": lambda a: a["x"].to(torch.int8)}, TypeError, "x must be float"),
    "k-mismatch": ({"x": lambda a: a["x"][:, :15]}, ValueError, "input features"),
    "scale-shape": ({"weight_scale": lambda a: a["weight_scale"][:7]}, ValueError, r"\(8,\)"),
    "bias-dtype": ({"bias": lambda a: a["bias"].half()}, TypeError, "dtype mismatch"),
    "residual-shape": ({"residual": lambda a: a["residual"][:4]}, ValueError, "residual"),
    "activation": ({"activation": lambda a: "relu"}, ValueError, "activation must be"),
    "input-scale-shape": ({"input_scale": lambda a: a["input_scale"][:9]}, ValueError, r"\(16,\)"),
}

test_bad_inputs_triton = bad_input_test(K.linear_fp8, _valid, BAD_CASES)
test_bad_inputs_torch = bad_input_test(T.linear_fp8, _valid, BAD_CASES)
test_bad_inputs_reference = bad_input_test(R.linear_fp8, _valid, BAD_CASES)


def test_the_op_is_declared_without_backward() -> None:
    op = K.OPS["linear_fp8"]
    assert op.backward is None and op.reference is R.linear_fp8
    assert op.torch is T.linear_fp8_unchecked


def test_custom_op_matches_the_public_function(device) -> None:
    args = _valid(device)
    expected = K.linear_fp8(**args)
    got = torch.ops.fastbert.linear_fp8(*args.values(), False)
    assert torch.equal(got, expected)
    # opcheck's schema test compares the inputs before and after with arithmetic PyTorch does
    # not implement for float8 tensors on the CPU; that the op leaves its inputs alone is
    # checked on their bytes instead.
    before = [t.clone() if isinstance(t, torch.Tensor) else t for t in args.values()]
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    op = torch.ops.fastbert.linear_fp8.default
    torch.library.opcheck(op, (*args.values(), False), test_utils=utils)
    for old, new in zip(before, args.values()):
        if isinstance(old, torch.Tensor):
            assert torch.equal(old.view(torch.uint8), new.view(torch.uint8))
