"""K.linear_int8 and K.linear_fp8 (per-token activations, per-channel weights, fused
dequantise / bias / GELU / residual epilogue) against the reference that quantises the same way.

The quantised operands are the same bits in every implementation: the row quantisation is the
same float32 operations (for e4m3, the Triton kernel rounds in float32 arithmetic,
fastbert/kernels/quantized_linear.py's ``_round_to_e4m3``, the reference and the torch backend with
PyTorch's own float8_e4m3fn conversion; a test below runs every e4m3 value, every midpoint
between two (ties) and their neighbours through both).

int8: the int32 sums are exact, so the outputs differ from the float64 reference only by the
float32 epilogue: a few roundings of the terms it adds. The bound is 8 units in the last place
of float32 (2**-20) of the sum of those terms' magnitudes, per element; measured, the errors
reach 0.9 of those units (Triton, interpreter) and 1.8 (torch backend), and the GPU's
approximate exp2 / rsqrt in the GELU add about 2. A scale off by 1e-5 fails.

fp8: each product of two e4m3 values is exact in float32; only the float32 sums and epilogue
round, where the float64 reference does not. The bound per element adds the float32
summation's (K * 2**-24 of the sum of the products' magnitudes, the classical worst case); a
scale off by 1e-5 fails it. On a GPU, sm_90's FP8 warpgroup MMA adds in reduced precision
within a K tile (the kernel adds each tile's partial sum into the float32 accumulator): there
the summation unit is 2**-13 (unmeasured here; no GPU ran these yet).

CPU: the Triton interpreter (32 x 32 x 32 tiles, and for model-sized operands its wide tiles,
linear_configs.INTERPRETER_WIDE_TILES; its tl.dot widens e4m3 to float16 exactly and
multiplies in float32) and the torch backend (``torch._int_mm``; for fp8 an emulation, the
same e4m3 operands multiplied in float32).
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
from fastbert.kernels.quantized_linear import QUANT_DTYPES, QUANTIZE_MAX_BLOCK_K, quantize_rows
from tests.bad_inputs import assert_refused
from tests.op_cases import randn
from tests.test_linear import MODEL_SIZED, ran_a_wide_tile

ACTIVATIONS = (None, "gelu", "gelu_tanh")
EPILOGUE_ULPS = 8 * 2.0**-23
QUANTISED_DTYPES = (torch.float32, torch.float16)
FORMATS = tuple(QUANT_DTYPES)
# Each format's implementations: the Triton kernels, the torch backend and the reference.
IMPLEMENTATIONS = {
    "int8": {"triton": K.linear_int8, "torch": T.linear_int8, "reference": R.linear_int8},
    "fp8": {"triton": K.linear_fp8, "torch": T.linear_fp8, "reference": R.linear_fp8},
}
# The largest quantised magnitude of each format.
Q_MAX = {"int8": 127.0, "fp8": 448.0}


def format_of(weight_q: torch.Tensor) -> str:
    """The format ("int8" or "fp8") of a quantised weight, from its dtype."""
    return {dtype: name for name, dtype in QUANT_DTYPES.items()}[weight_q.dtype]


def summation_unit(device) -> float:
    """fp8: the relative rounding of one float32 addition of the product's sums: float32's
    unit roundoff on the CPU, the FP8 tensor cores' narrower internal adder on a GPU."""
    return 2.0**-13 if torch.device(device).type == "cuda" else 2.0**-24


def operands(quantize, m, n, k, dtype=torch.float32, device="cpu", seed=0, lead=None):
    """x [*lead, k], ``quantize``'s weight [n, k] and its scales, bias [n], residual [*lead, n]."""
    lead = (m,) if lead is None else tuple(lead)
    x = randn((*lead, k), dtype, device, seed)
    weight = randn((n, k), torch.float32, device, seed + 1, scale=max(k, 1) ** -0.5)
    weight_q, weight_scale = R.quantize_weight(weight, quantize)
    bias = randn((n,), dtype, device, seed + 2)
    residual = randn((*lead, n), dtype, device, seed + 3)
    return x, weight_q, weight_scale, bias, residual


def bound(x, weight_q, weight_scale, bias, residual, input_scale=None) -> torch.Tensor:
    """Per element: 8 float32 ulps of |dequantised product| + |bias| + |residual| (+ the
    output's own magnitude, for the activation's rounding, added by :func:`check`); for fp8
    the product's magnitude is that of its terms, plus the float32 summation of K of them (K
    units of the sum of their magnitudes)."""
    quantize = format_of(weight_q)
    q, scale = R.quantize_rows(x, input_scale, quantize)
    scales = scale.double()[..., None] * weight_scale
    if quantize == "int8":  # exact int32 sums
        terms = (q.double() @ weight_q.double().T).abs() * scales
    else:
        k = weight_q.shape[1]
        product = (q.double().abs() @ weight_q.double().abs().T) * scales
        terms = product * (1 + k * summation_unit(x.device) / EPILOGUE_ULPS)
    if bias is not None:
        terms = terms + bias.double().abs()
    if residual is not None:
        terms = terms + residual.double().abs()
    return EPILOGUE_ULPS * terms


def check(op, x, weight_q, weight_scale, bias=None, activation=None, residual=None, smooth=None):
    """``op``'s output held to the reference of the weight's format (:func:`bound`)."""
    out = op(x, weight_q, weight_scale, bias, activation, residual, smooth)
    reference = IMPLEMENTATIONS[format_of(weight_q)]["reference"]
    wide = (lambda t: None if t is None else t.double()) if x.dtype == torch.float32 else None
    if wide is None:  # float16: the reference's output rounded to float16 once, as the op's
        ref = reference(x, weight_q, weight_scale, bias, activation, residual, smooth)
        assert out.dtype == x.dtype and out.shape == ref.shape
        ulp = torch.finfo(x.dtype).eps * ref.double().abs().clamp(min=2.0**-14)
        err = (out.double() - ref.double()).abs()
        limit = ulp + bound(x, weight_q, weight_scale, bias, residual, smooth)
        assert (err <= limit).all(), err.max()
        return out
    ref = reference(
        x.double(), weight_q, weight_scale, wide(bias), activation, wide(residual), smooth
    )
    assert out.dtype == x.dtype and out.shape == ref.shape and out.is_contiguous()
    err = (out.double() - ref).abs()
    limit = bound(x, weight_q, weight_scale, bias, residual, smooth) + EPILOGUE_ULPS * ref.abs()
    assert (err <= limit).all(), f"max error {err.max():.3g}, at most {limit.max():.3g} allowed"
    return out


@pytest.fixture(params=FORMATS)
def quantize(request) -> str:
    return request.param


@pytest.fixture(params=["triton", "torch"])
def op(request, quantize):
    return IMPLEMENTATIONS[quantize][request.param]


@pytest.mark.parametrize(
    "has_bias, activation, has_residual",
    list(itertools.product((False, True), ACTIVATIONS, (False, True))),
    ids=lambda v: str(v),
)
def test_epilogues(device, quantize, op, has_bias, activation, has_residual) -> None:
    x, wq, ws, bias, residual = operands(quantize, 33, 67, 45, device=device, seed=1)
    check(op, x, wq, ws, bias if has_bias else None, activation, residual if has_residual else None)


@pytest.mark.parametrize("dtype", QUANTISED_DTYPES, ids=str)
@pytest.mark.parametrize("m", [1, 7, 33, 129])
def test_row_counts(device, quantize, op, dtype, m) -> None:
    x, wq, ws, bias, residual = operands(quantize, m, 40, 72, dtype, device, seed=m)
    check(op, x, wq, ws, bias, "gelu", residual)


@pytest.mark.parametrize("n, k", [(1, 1), (3, 1), (3, 5), (67, 45), (33, 130), (100, 31)])
def test_odd_sizes(device, quantize, op, n, k) -> None:
    x, wq, ws, bias, residual = operands(quantize, 9, n, k, device=device, seed=n + k)
    check(op, x, wq, ws, bias, "gelu_tanh", residual)


@pytest.mark.parametrize("dtype", QUANTISED_DTYPES, ids=str)
@pytest.mark.parametrize("m, n, k", MODEL_SIZED)
def test_model_sized_operands(device, quantize, op, dtype, m, n, k) -> None:
    """N and K hold a whole wide interpreter tile and part of the next."""
    x, wq, ws, bias, residual = operands(quantize, m, n, k, dtype, device, seed=5)
    check(op, x, wq, ws, bias, "gelu", residual)
    assert op is not IMPLEMENTATIONS[quantize]["triton"] or ran_a_wide_tile(device)


def test_3d_strided_input_and_input_scale(device, quantize, op) -> None:
    x, wq, ws, bias, residual = operands(quantize, 0, 48, 40, device=device, seed=2, lead=(3, 11))
    smooth = torch.rand(40, device=device) + 0.5
    out = check(op, x, wq, ws, bias, "gelu", residual, smooth)
    assert out.shape == (3, 11, 48)
    # A transposed view (unit stride along the rows, not along K).
    xt = randn((40, 13), torch.float32, device, 5).T
    check(op, xt, wq, ws, bias)


@pytest.mark.parametrize("view", ["strided", "expanded"])
def test_scale_vectors_of_any_strides(device, quantize, op, view) -> None:
    """The weight's and the input's scales as views: every other element of a longer vector,
    or one per-tensor scale expanded (stride 0). The kernels read them as contiguous vectors
    (they read other elements, or past the end of the storage, where the view has strides)."""
    x, wq, ws, bias, residual = operands(quantize, 9, 24, 40, device=device, seed=6)
    smooth = torch.rand(40, device=device) + 0.5
    if view == "strided":
        ws = torch.stack([ws, ws + 1.0], dim=1).reshape(-1)[::2]
        smooth = torch.stack([smooth, smooth + 3.0], dim=1).reshape(-1)[::2]
    else:
        ws = ws.max().reshape(1).expand(24)
        smooth = smooth[:1].expand(40)
    assert not ws.is_contiguous() and not smooth.is_contiguous()
    check(op, x, wq, ws, bias, "gelu", residual, smooth)


@pytest.mark.parametrize("quantize", ["int8"])
def test_input_scale(device, quantize, op) -> None:
    """SmoothQuant's input scale: x's columns multiplied before the quantisation; with the
    weight's columns divided by it, the product tracks the float linear, and an outlier column
    costs the other columns less precision than without it."""
    x, _, _, bias, residual = operands(quantize, 17, 24, 40, device=device, seed=4)
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


def test_a_row_of_zeros_gets_the_bias(device, quantize, op) -> None:
    x, wq, ws, bias, _ = operands(quantize, 5, 24, 40, device=device, seed=3)
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
def test_row_quantisation_is_the_reference_bit_for_bit(device, quantize, k) -> None:
    """The Triton kernel (several K tiles past QUANTIZE_MAX_BLOCK_K), the torch backend's and
    the reference's quantisation agree exactly, with and without the input scale: int8's ties
    rounded to even, e4m3's signed zeros and saturation included."""
    # int8: Gaussian rows; e4m3: values across its exponents, subnormals included.
    spread = 3.0 if quantize == "int8" else torch.logspace(-8, 2, k, device=device)
    x = randn((6, k), torch.float32, device, k) * spread
    smooth = randn((k,), torch.float32, device, k + 1).abs() + 0.5
    x[1] = 0.0
    if quantize == "int8":  # values whose product with 127 / max lands on a half
        x[3, : min(k, 4)] = torch.tensor([127.0, 0.5, 1.5, -2.5][: min(k, 4)])
    for input_scale in (None, smooth):
        expected_q, expected_scale = R.quantize_rows(x, input_scale, quantize)
        implementations = (quantize_rows, T.quantize_rows)
        for q, scale in (f(x, input_scale, quantize) for f in implementations):
            assert q.dtype == QUANT_DTYPES[quantize] and scale.dtype == torch.float32
            assert torch.equal(q.view(torch.uint8), expected_q.view(torch.uint8))
            assert torch.equal(scale, expected_scale)
    expected_q = R.quantize_rows(x, quantize=quantize)[0].float()
    assert expected_q.abs().max() == Q_MAX[quantize] and torch.all(expected_q[1] == 0)
    if quantize == "int8" and k >= 4:
        assert expected_q[3, :4].tolist() == [127, 0, 2, -2]


def relative_error(quantize: str) -> float:
    """The torch backend's relative error against the float64 linear on one projection."""
    x, _, _, bias, _ = operands(quantize, 64, 96, 128, seed=7)
    weight = randn((96, 128), torch.float32, "cpu", 8, scale=128**-0.5)
    exact = R.linear(x.double(), weight.double(), bias.double())
    wq, ws = R.quantize_weight(weight, quantize)
    out = IMPLEMENTATIONS[quantize]["torch"](x, wq, ws, bias)
    return ((out.double() - exact).norm() / exact.norm()).item()


def test_quantised_product_tracks_the_float_linear() -> None:
    """What quantising costs on one projection, and not nothing (the tests above would pass on
    an op that ignored the quantisation only if it rounded the same way): int8 within 1% of
    the float64 linear's scale (the rounding of 127 levels per row), e4m3 a few percent (3
    fraction bits per element, errors averaging over K), more than int8 on Gaussian rows."""
    int8, fp8 = relative_error("int8"), relative_error("fp8")
    assert 1e-4 < int8 < 1e-2
    assert 1e-3 < fp8 < 5e-2
    assert fp8 > int8


@pytest.mark.parametrize("k", [1, 384, 1024, 1025, 1536, 3072])
@pytest.mark.parametrize("operands", ["random", "largest", "opposite"])
def test_int_product_in_float32_is_exact(k: int, operands: str) -> None:
    """The int8 product by float32 GEMMs (a CPU without int8 dot products) gives the exact
    integers, where one sum of 1,025 or more products of 127s passes 2**24 (float32's exact
    integers) and only the split into GEMMs of at most FLOAT32_EXACT_TERMS keeps it exact."""
    gen = torch.Generator().manual_seed(k)
    q = torch.randint(-127, 128, (5, k), generator=gen, dtype=torch.int8)
    weight = torch.randint(-127, 128, (7, k), generator=gen, dtype=torch.int8)
    if operands != "random":
        q[:] = 127
        weight[:] = 127 if operands == "largest" else -127
    exact = torch.matmul(q.double(), weight.double().t())
    got = T.int_product_in_float32(q, weight)
    assert got.dtype == (torch.float32 if k <= T.FLOAT32_EXACT_TERMS else torch.int32)
    assert torch.equal(got.double(), exact)


@pytest.mark.parametrize("dot_products", [False, True])
def test_int_product_takes_float32_gemms_without_int8_dot_products(
    monkeypatch, dot_products: bool
) -> None:
    """On a CPU torch._int_mm runs only where the CPU has int8 dot products (elsewhere it is
    oneDNN's reference loop, ~50x slower than float32); both give the exact product."""
    monkeypatch.setattr(T, "has_int8_dot_products", lambda: dot_products)
    calls = []
    int_mm = torch._int_mm
    monkeypatch.setattr(torch, "_int_mm", lambda *a: calls.append(a) or int_mm(*a))
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(-127, 128, (24, 64), generator=gen, dtype=torch.int8)
    weight = torch.randint(-127, 128, (16, 64), generator=gen, dtype=torch.int8)
    got = T.int_product(q, weight)
    assert len(calls) == int(dot_products)
    assert torch.equal(got.double(), torch.matmul(q.double(), weight.double().t()))


def test_gradients_are_refused(device, quantize, op) -> None:
    x, wq, ws, bias, _ = operands(quantize, 4, 8, 16, device=device)
    with pytest.raises(RuntimeError, match="inference only"):
        op(x.requires_grad_(), wq, ws, bias)
    with torch.no_grad():
        op(x, wq, ws, bias)


def test_empty_inputs(device, quantize, op) -> None:
    x, wq, ws, bias, _ = operands(quantize, 0, 8, 16, device=device)
    assert op(x, wq, ws, bias).shape == (0, 8)
    x, wq, ws, bias, _ = operands(quantize, 3, 8, 0, device=device)
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


def valid_args(quantize: str, device) -> dict:
    x, wq, ws, bias, residual = operands(quantize, 5, 8, 16, device=device)
    return {
        "x": x,
        "weight": wq,
        "weight_scale": ws,
        "bias": bias,
        "activation": "gelu",
        "residual": residual,
        "input_scale": torch.rand(16, device=device) + 0.5,
    }


COMMON_BAD_CASES = {
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


def bad_cases(quantize: str) -> dict:
    """The bad inputs of ``quantize``'s linear: a float weight, the other format's weight and
    :data:`COMMON_BAD_CASES`."""
    weight_dtype = QUANT_DTYPES[quantize]
    other = next(dtype for dtype in QUANT_DTYPES.values() if dtype != weight_dtype)
    name = str(weight_dtype).removeprefix("torch.")
    other_weight = {"weight": lambda a: a["weight"].float().to(other)}
    return {
        "float-weight": ({"weight": lambda a: a["weight"].float()}, TypeError, f"must be {name}"),
        "other-weight": (other_weight, TypeError, f"got {other}"),
        **COMMON_BAD_CASES,
    }


BAD_CASES = [(q, case) for q in FORMATS for case in bad_cases(q)]


@pytest.mark.parametrize("quantize, case", BAD_CASES, ids=[f"{q}-{case}" for q, case in BAD_CASES])
@pytest.mark.parametrize("implementation", ["triton", "torch", "reference"])
def test_bad_inputs(device, quantize, implementation, case) -> None:
    op = IMPLEMENTATIONS[quantize][implementation]
    assert_refused(op, valid_args(quantize, device), bad_cases(quantize)[case])


def test_the_op_is_declared_without_backward(quantize) -> None:
    op = K.OPS[f"linear_{quantize}"]
    assert op.backward is None and op.reference is IMPLEMENTATIONS[quantize]["reference"]
    assert op.torch is getattr(T, f"linear_{quantize}_unchecked")


def test_custom_op_matches_the_public_function(device, quantize) -> None:
    args = valid_args(quantize, device)
    expected = IMPLEMENTATIONS[quantize]["triton"](**args)
    op = getattr(torch.ops.fastbert, f"linear_{quantize}")
    assert torch.equal(op(*args.values(), False), expected)
    # opcheck's schema test compares the inputs before and after with arithmetic PyTorch does
    # not implement for float8 tensors on the CPU; there, that the op leaves its inputs alone
    # is checked on their bytes instead.
    before = [t.clone() if isinstance(t, torch.Tensor) else t for t in args.values()]
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    utils = (*utils, "test_schema") if quantize == "int8" else utils
    torch.library.opcheck(op.default, (*args.values(), False), test_utils=utils)
    for old, new in zip(before, args.values()):
        if isinstance(old, torch.Tensor):
            assert torch.equal(old.view(torch.uint8), new.view(torch.uint8))
