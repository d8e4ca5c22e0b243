"""AVX2's byte product (fastbert.kernels.cpu_int8_product) gives the exact integer product of
int8 operands, held to float64 (exact for these sums), at every edge of its panels and at the
operands whose pairs of products come nearest 16 bits."""

from __future__ import annotations

import pytest
import torch

from fastbert.kernels import cpu_int8_product, cpu_library
from fastbert.kernels.packed_weights import PackedWeights

pytestmark = pytest.mark.skipif(
    not cpu_int8_product.available(), reason=f"the byte product: {cpu_int8_product.status()}"
)


def _exact(q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (q.double() @ weight.double().T).to(torch.int32)


def _operands(m: int, k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    weight = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    return q, weight


# Rows around the kernel's 4-row step and 64-row block, terms around its 4-term groups,
# columns around its 16-column panels.
@pytest.mark.parametrize("m", [1, 3, 4, 5, 67, 300])
@pytest.mark.parametrize("k", [1, 3, 4, 5, 384, 1535])
@pytest.mark.parametrize("n", [1, 15, 16, 17, 96])
def test_product_is_exact(m: int, k: int, n: int) -> None:
    q, weight = _operands(m, k, n, seed=m * 10_000 + k * 100 + n)
    panels = cpu_int8_product.pack(weight)
    assert panels is not None
    assert torch.equal(cpu_int8_product.product(q, panels), _exact(q, weight))


@pytest.mark.parametrize("a, w", [(-128, 127), (-128, -127), (127, 127), (127, -127), (-1, 127)])
def test_pairs_at_the_edge_of_16_bits_do_not_saturate(a: int, w: int) -> None:
    """Every pair of products at its largest magnitude (2 x 128 x 127 = 32,512 for a = -128),
    over 3,072 terms: a saturating 16-bit pair sum (32,767) or a lost sign would show."""
    q = torch.full((5, 3072), a, dtype=torch.int8)
    q[1, ::2] = 0  # a row of mixed pairs
    weight = torch.full((17, 3072), w, dtype=torch.int8)
    weight[3] = -weight[3]
    panels = cpu_int8_product.pack(weight)
    assert panels is not None
    assert torch.equal(cpu_int8_product.product(q, panels), _exact(q, weight))


def test_strided_rows_and_empty_shapes() -> None:
    q, weight = _operands(9, 64, 20, seed=1)
    wide = torch.zeros(9, 100, dtype=torch.int8)
    wide[:, 10:74] = q
    panels = cpu_int8_product.pack(weight)
    assert torch.equal(cpu_int8_product.product(wide[:, 10:74], panels), _exact(q, weight))
    assert cpu_int8_product.product(q[:0], panels).shape == (0, 20)
    empty = cpu_int8_product.pack(weight[:, :0])
    assert torch.equal(
        cpu_int8_product.product(q[:, :0], empty), torch.zeros(9, 20, dtype=torch.int32)
    )
    with pytest.raises(ValueError, match="63 columns, the packed weight 64"):
        cpu_int8_product.product(q[:, :63], panels)


def test_a_weight_holding_minus_128_is_refused_and_a_paused_product_packs_nothing() -> None:
    _, weight = _operands(1, 40, 8, seed=2)
    assert cpu_int8_product.pack(weight) is not None
    weight[7, 39] = -128
    assert cpu_int8_product.pack(weight) is None
    weight[7, 39] = 0
    with cpu_int8_product.turned_off():
        assert not cpu_int8_product.available() and cpu_int8_product.pack(weight) is None


def test_kept_panels_follow_writes_and_live_beside_other_copies() -> None:
    """PackedWeights keeps the panels as it keeps oneDNN's copies: made again after an
    in-place write; a weight's float32 copies are kept beside them, not in their place."""
    q, weight = _operands(6, 48, 24, seed=3)
    packs = PackedWeights()
    first = packs.int8_panels_for(weight)
    assert packs.int8_panels_for(weight) is first
    widened = packs.widened_for(weight, 1024)
    assert widened is not None and packs.int8_panels_for(weight) is first
    with torch.no_grad():
        weight.copy_(weight.flip(0))
    second = packs.int8_panels_for(weight)
    assert second is not first
    assert torch.equal(cpu_int8_product.product(q, second), _exact(q, weight))
    assert len(packs) == 1


@pytest.mark.parametrize(
    "flags, chosen",
    [
        ({"avx2"}, True),
        ({"avx2", "avx512f", "avx512bw"}, False),  # float32's AVX-512 GEMMs ran faster
        ({"avx2", "avx_vnni"}, False),  # int8 dot products: torch._int_mm
        ({"avx2", "avx512f", "avx512_vnni"}, False),
    ],
)
def test_the_int8_linear_takes_it_without_int8_dot_products_or_avx512(monkeypatch, flags, chosen):
    monkeypatch.setattr(cpu_library, "cpu_flags", lambda: frozenset(flags))
    assert cpu_int8_product.chosen() == chosen
    with cpu_library.int8_products_as_on_avx2_only():
        assert cpu_int8_product.chosen()
    assert cpu_int8_product.chosen() == chosen


def test_operands_it_cannot_read_are_refused() -> None:
    q, weight = _operands(3, 8, 4, seed=5)
    panels = cpu_int8_product.pack(weight)
    with pytest.raises(TypeError, match="weight must be int8, got torch.float32"):
        cpu_int8_product.pack(weight.float())
    with pytest.raises(ValueError, match="weight must be a 2-D CPU tensor, got 1-D"):
        cpu_int8_product.pack(weight[0])
    with pytest.raises(TypeError, match="q must be int8, got torch.int32"):
        cpu_int8_product.product(q.int(), panels)
    with pytest.raises(ValueError, match="q must be a 2-D CPU tensor, got 3-D"):
        cpu_int8_product.product(q[None], panels)
