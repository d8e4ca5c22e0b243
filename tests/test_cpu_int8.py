"""The compiled passes around the CPU's int8 GEMM (fastbert.kernels.cpu_int8) give the bits of
the PyTorch ops they replace, and the CPU engine's int8 linear built on them gives the plain
backend's results (which tests/test_linear_quantized.py holds to the float64 reference)."""

from __future__ import annotations

import pytest
import torch

from fastbert.kernels import (
    cpu_engine,
    cpu_engine_int8,
    cpu_int8,
    cpu_int8_product,
    packed_weights,
    torch_ops,
)
from fastbert.kernels.packed_weights import PackedWeights

pytestmark = pytest.mark.skipif(
    not cpu_int8.available(), reason=f"compiled int8 passes: {cpu_int8.status()}"
)


def _activations(rows: int, cols: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * torch.rand(rows, 1, generator=gen) * 4
    x[0] = 0.0  # a row of zeros: scale 0, q 0
    if rows > 2:
        x[2, 3] = 1e4  # an outlier
    return x


@pytest.mark.parametrize("rows, cols", [(1, 7), (5, 384), (67, 1536), (300, 33)])
@pytest.mark.parametrize("with_input_scale", [False, True])
def test_quantize_rows_gives_the_torch_bits(rows: int, cols: int, with_input_scale: bool):
    x = _activations(rows, cols, seed=rows + cols)
    scale = torch.rand(cols, generator=torch.Generator().manual_seed(1)) + 0.5
    input_scale = scale if with_input_scale else None
    q, row_scale = cpu_int8.quantize_rows(x, input_scale)
    want_q, want_scale = torch_ops.quantize_rows(x, input_scale)
    assert torch.equal(q, want_q) and torch.equal(row_scale, want_scale)


def test_quantize_rows_reads_strided_rows():
    """Rows of a wider tensor (a column slice): the row stride is honoured."""
    wide = _activations(9, 50, seed=3)
    q, scale = cpu_int8.quantize_rows(wide[:, 5:45])
    want_q, want_scale = torch_ops.quantize_rows(wide[:, 5:45].contiguous())
    assert torch.equal(q, want_q) and torch.equal(scale, want_scale)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_dequantize_gives_the_torch_bits(bias: bool, residual: bool):
    gen = torch.Generator().manual_seed(4)
    acc = torch.randint(-(2**20), 2**20, (37, 96), generator=gen, dtype=torch.int32)
    row_scale = torch.rand(37, generator=gen)
    col_scale = torch.rand(96, generator=gen)
    bias_t = torch.randn(96, generator=gen) if bias else None
    residual_t = torch.randn(37, 96, generator=gen) if residual else None
    want = acc.float().mul_(row_scale[:, None])
    if bias_t is not None:
        torch.addcmul(bias_t, want, col_scale, out=want)
    else:
        want.mul_(col_scale)
    if residual_t is not None:
        want.add_(residual_t)
    got = cpu_int8.dequantize(acc.clone(), row_scale, col_scale, bias_t, residual_t)
    assert torch.equal(got, want)


@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh"])
@pytest.mark.parametrize("residual", [False, True])
def test_engine_int8_linear_matches_the_plain_one(activation, residual):
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 23, 64, generator=gen)
    weight = torch.randint(-127, 128, (48, 64), generator=gen, dtype=torch.int8)
    weight_scale = torch.rand(48, generator=gen) / 100
    bias = torch.randn(48, generator=gen)
    res = torch.randn(2, 23, 48, generator=gen) if residual else None
    input_scale = torch.rand(64, generator=gen) + 0.5
    args = (x, weight, weight_scale, bias, activation, res, input_scale)
    got = cpu_engine.OPS["linear_int8"](*args)
    want = torch_ops.linear_int8_unchecked(*args)
    assert got.shape == want.shape == (2, 23, 48)
    assert torch.equal(got, want)


def test_turned_off_takes_the_torch_ops(monkeypatch):
    calls = []
    monkeypatch.setattr(cpu_int8, "quantize_rows", lambda *a: calls.append(a))
    x = torch.randn(4, 16)
    weight = torch.ones(8, 16, dtype=torch.int8)
    with cpu_int8.turned_off():
        cpu_engine.OPS["linear_int8"](x, weight, torch.ones(8))
    assert calls == []


def test_dequantize_reads_a_float_product_as_the_int_one():
    gen = torch.Generator().manual_seed(7)
    acc = torch.randint(-(2**26), 2**26, (19, 40), generator=gen, dtype=torch.int32)
    row_scale, col_scale = torch.rand(19, generator=gen), torch.rand(40, generator=gen)
    bias, residual = torch.randn(40, generator=gen), torch.randn(19, 40, generator=gen)
    want = cpu_int8.dequantize(acc.clone(), row_scale, col_scale, bias, residual)
    got = cpu_int8.dequantize(acc.float(), row_scale, col_scale, bias, residual)
    assert torch.equal(got, want)


needs_onednn_int8 = pytest.mark.skipif(
    not packed_weights.int8_available(),
    reason="int8 weights are packed for oneDNN only on a CPU with AMX-INT8",
)


def _int8_linear_args(rows: int, seed: int, activation=None, residual=False, saturated=False):
    """Arguments of linear_int8 with x [rows / 2, 2, 1536]; ``saturated``: every x row at its
    largest magnitude (q = 127 throughout) and the first weight row 127, so that a product
    reaches 127 * 127 * 1536, past the integers float32 holds exactly (2**24)."""
    gen = torch.Generator().manual_seed(seed)
    x = _activations(rows, 1536, seed=seed)
    if saturated:
        x = x.abs().amax(dim=-1, keepdim=True).expand_as(x).contiguous()
    weight = torch.randint(-127, 128, (96, 1536), generator=gen, dtype=torch.int8)
    weight[0] = 127
    weight_scale = torch.rand(96, generator=gen) / 100
    bias = torch.randn(96, generator=gen)
    res = torch.randn(rows // 2, 2, 96, generator=gen) if residual else None
    input_scale = torch.ones(1536) if saturated else torch.rand(1536, generator=gen) + 0.5
    return (x.view(rows // 2, 2, 1536), weight, weight_scale, bias, activation, res, input_scale)


@needs_onednn_int8
@pytest.mark.parametrize("rows", [cpu_engine_int8.ONEDNN_MIN_ROWS, 600])
@pytest.mark.parametrize("activation, residual", [(None, False), ("gelu", False), (None, True)])
@pytest.mark.parametrize("saturated", [False, True])
def test_onednn_product_gives_the_plain_int8_linears_bits(rows, activation, residual, saturated):
    args = _int8_linear_args(rows, rows, activation, residual, saturated)
    packs = PackedWeights()
    got = cpu_engine.OPS["linear_int8"](*args, packs=packs)
    assert len(packs) == 1  # the product ran on the packed weight
    assert torch.equal(got, torch_ops.linear_int8_unchecked(*args))


@needs_onednn_int8
def test_onednn_product_follows_writes_to_the_weight_and_skips_few_rows():
    args = list(_int8_linear_args(300, seed=10))
    packs = PackedWeights()
    cpu_engine.OPS["linear_int8"](*args, packs=packs)
    with torch.no_grad():
        args[1].copy_(args[1].flip(0))  # an in-place write, as quantising again does
    assert torch.equal(
        cpu_engine.OPS["linear_int8"](*args, packs=packs), torch_ops.linear_int8_unchecked(*args)
    )
    few = PackedWeights()
    args[0] = args[0][:10]
    cpu_engine.OPS["linear_int8"](*args, packs=few)
    assert len(few) == 0  # torch._int_mm below ONEDNN_MIN_ROWS


@pytest.mark.parametrize("rows", [2, 16, 300])
@pytest.mark.parametrize("activation, residual", [(None, False), ("gelu", False), (None, True)])
@pytest.mark.parametrize("saturated", [False, True])
@pytest.mark.parametrize("product", ["avx2", "avx512", "float32"])
def test_products_without_int8_dot_products_give_the_plain_int8_linears_bits(
    rows, activation, residual, saturated, product
):
    """On a CPU without int8 dot products the engine's integer product runs on the byte
    multiply-adds of AVX2 or AVX-512 over the weight's kept panels (fastbert.kernels.
    cpu_int8_product), or, where those are not built, as float32 GEMMs on the weight's kept
    float32 copies in blocks of at most FLOAT32_EXACT_TERMS columns: each exact, so the plain
    int8 linear's bits (torch._int_mm's where the CPU has them), the saturated case's sums
    past 2**24 and its pairs of 127 x 127 products included."""
    if product != "float32" and not cpu_int8_product.available(product):
        pytest.skip(f"the byte product: {cpu_int8_product.status(product)}")
    args = _int8_linear_args(rows, rows, activation, residual, saturated)
    want = torch_ops.linear_int8_unchecked(*args)
    packs = PackedWeights()
    with cpu_int8_product.taken(product):
        got = cpu_engine.OPS["linear_int8"](*args, packs=packs)
        if product != "float32":
            assert cpu_int8_product.chosen() == product
            assert isinstance(packs.int8_panels_for(args[1], product), cpu_int8_product.Panels)
        else:
            assert len(packs.widened_for(args[1], 1024)) == 2
        assert len(packs) == 1 and torch.equal(got, want)
        assert torch.equal(cpu_engine.OPS["linear_int8"](*args), want)  # unpacked: per call


@pytest.mark.skipif(not cpu_int8_product.available(), reason=cpu_int8_product.status())
def test_a_weight_holding_minus_128_takes_the_float32_product():
    """The byte product cannot give -128 a positive sign: such a weight is not packed for it,
    and its product runs as float32 GEMMs, still the plain linear's bits."""
    args = list(_int8_linear_args(16, seed=4))
    args[1][5, 7] = -128
    want = torch_ops.linear_int8_unchecked(*args)
    packs = PackedWeights()
    with cpu_int8_product.taken("avx2"):
        assert torch.equal(cpu_engine.OPS["linear_int8"](*args, packs=packs), want)
        assert packs.int8_panels_for(args[1], "avx2") is None
        assert len(packs.widened_for(args[1], 1024)) == 2
        assert torch.equal(cpu_engine.OPS["linear_int8"](*args), want)


def test_int8_weights_are_packed_only_where_oneDNN_runs_them(monkeypatch):
    from fastbert.kernels import cpu_library

    weight = torch.ones(8, 16, dtype=torch.int8)
    packed_weights.int8_available.cache_clear()
    monkeypatch.setattr(cpu_library, "cpu_flags", lambda: frozenset({"avx512_vnni"}))
    monkeypatch.setattr(packed_weights, "cpu_flags", cpu_library.cpu_flags)
    try:
        assert not packed_weights.int8_available()
        assert PackedWeights().int8_weight_for(weight) is None
    finally:
        packed_weights.int8_available.cache_clear()
    monkeypatch.setattr(packed_weights, "int8_available", lambda: True)
    packs = PackedWeights()
    with torch.inference_mode():
        inference_weight = torch.ones(8, 16, dtype=torch.int8)
    assert packs.int8_weight_for(inference_weight) is None  # no version counter to follow
    assert packs.int8_weight_for(weight.float()) is None
    assert packs.int8_weight_for(weight.t()) is None
    assert packs.int8_weight_for(weight) is not None
