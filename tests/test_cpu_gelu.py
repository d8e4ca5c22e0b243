"""GELU of bfloat16 by table (fastbert.kernels.cpu_gelu): PyTorch's bits for every one of the
65,536 bfloat16 inputs, both approximations, at every length (the vector loop and its tail);
the CPU engine's bfloat16 linear with GELU gives PyTorch's eager result (GELU of the rounded
product); what it leaves to oneDNN's post-op."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fastbert.kernels import cpu_engine, cpu_gelu, reference
from fastbert.kernels.cpu_engine_linear import linear_unchecked

pytestmark = pytest.mark.skipif(
    not cpu_gelu.available(), reason=f"GELU by table: {cpu_gelu.status()}"
)


def _every_bfloat16() -> torch.Tensor:
    return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_every_bfloat16_value_gets_pytorchs_bits(approximate) -> None:
    values = _every_bfloat16()
    got = cpu_gelu.gelu_(values.clone(), approximate)
    expected = F.gelu(values, approximate=approximate)
    assert torch.equal(got.view(torch.int16), expected.view(torch.int16))


@pytest.mark.parametrize("count", [1, 31, 32, 33, 1000])
def test_every_length_and_its_tail(count) -> None:
    values = _every_bfloat16()[torch.randperm(2**16, generator=torch.Generator().manual_seed(0))]
    y = values[:count].clone()
    assert cpu_gelu.takes(y) and cpu_gelu.gelu_(y) is y
    assert torch.equal(y.view(torch.int16), F.gelu(values[:count]).view(torch.int16))


def test_calls_it_does_not_take() -> None:
    y = torch.randn(8, 64).bfloat16()
    assert not cpu_gelu.takes(y.float())
    assert not cpu_gelu.takes(y.t())
    assert not cpu_gelu.takes(y.clone().requires_grad_())
    with cpu_gelu.turned_off():
        assert not cpu_gelu.takes(y)
    with pytest.raises(ValueError, match="approximate"):
        cpu_gelu.table("erf")
    with pytest.raises(ValueError, match="contiguous bfloat16 CPU tensor"):
        cpu_gelu.gelu_(y.t())


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh"])
@pytest.mark.parametrize("rows", [1, 5, 200])
def test_bfloat16_linear_with_gelu_is_pytorchs_eager_result(activation, rows) -> None:
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 64, generator=gen).bfloat16()
    weight = nn.Parameter((0.2 * torch.randn(96, 64, generator=gen)).bfloat16())
    bias = torch.randn(96, generator=gen).bfloat16()
    residual = torch.randn(rows, 96, generator=gen).bfloat16()
    approximate = "tanh" if activation == "gelu_tanh" else "none"
    with torch.no_grad():
        product = torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
        got = linear_unchecked(x, weight, bias, activation, residual)
        with cpu_gelu.turned_off():
            post_op = linear_unchecked(x, weight, bias, activation, residual)
    assert torch.equal(got, F.gelu(product, approximate=approximate) + residual)
    # oneDNN's post-op (GELU of the float32 product) and the table agree within bfloat16's
    # rounding; both within it of the float32 reference.
    expected = reference.linear(
        x.float(), weight.float(), bias.float(), activation, residual.float()
    )
    for result in (got, post_op):
        assert (result.float() - expected).abs().max() <= 2**-7 * (1 + expected.abs().max())


def test_the_engine_says_so() -> None:
    assert "GELU by table" in cpu_engine.status()["linear"]
