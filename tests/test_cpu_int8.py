"""The compiled passes around the CPU's int8 GEMM (fastbert.kernels.cpu_int8) give the bits of
the PyTorch ops they replace, and the CPU engine's int8 linear built on them gives the plain
backend's results (which tests/test_linear_quantized.py holds to the float64 reference)."""

from __future__ import annotations

import pytest
import torch

from fastbert.kernels import cpu_engine, cpu_int8, torch_ops

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
