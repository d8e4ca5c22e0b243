"""The byte product (fastbert.kernels.cpu_int8_product), each of its builds this CPU runs (AVX2,
AVX-512 BW), gives the exact integer product of int8 operands, held to float64 (exact for these
sums), at every edge of its panels and at the operands whose pairs of products come nearest 16
bits."""

from __future__ import annotations

import pytest
import torch

from fastbert.kernels import cpu_int8_product, cpu_library
from fastbert.kernels.packed_weights import PackedWeights

# Which builds run on this CPU, asked before any test changes the flags.
HOST = {build: cpu_int8_product.available(build) for build in cpu_int8_product.BUILDS}
BUILDS = [
    pytest.param(
        build,
        marks=pytest.mark.skipif(not runs, reason=f"{build}: {cpu_int8_product.status(build)}"),
    )
    for build, runs in HOST.items()
]
ANY = next((build for build, runs in HOST.items() if runs), None)

pytestmark = pytest.mark.skipif(ANY is None, reason="no build of the byte product runs here")


def _exact(q: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (q.double() @ weight.double().T).to(torch.int32)


def _operands(m: int, k: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (m, k), generator=gen, dtype=torch.int8)
    weight = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    return q, weight


# Rows around the kernel's 4-row step and 64-row block, terms around its 4-term groups,
# columns around its panels of 24 (AVX2) and 32 (AVX-512) columns.
@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("m", [1, 3, 4, 5, 67, 300])
@pytest.mark.parametrize("k", [1, 3, 4, 5, 384, 1535])
@pytest.mark.parametrize("n", [1, 15, 17, 24, 25, 32, 33, 96])
def test_product_is_exact(build: str, m: int, k: int, n: int) -> None:
    q, weight = _operands(m, k, n, seed=m * 10_000 + k * 100 + n)
    panels = cpu_int8_product.pack(weight, build)
    assert panels is not None and panels.build == build
    assert torch.equal(cpu_int8_product.product(q, panels), _exact(q, weight))


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("a, w", [(-128, 127), (-128, -127), (127, 127), (127, -127), (-1, 127)])
def test_pairs_at_the_edge_of_16_bits_do_not_saturate(build: str, a: int, w: int) -> None:
    """Every pair of products at its largest magnitude (2 x 128 x 127 = 32,512 for a = -128),
    over 3,072 terms: a saturating 16-bit pair sum (32,767) or a lost sign would show."""
    q = torch.full((5, 3072), a, dtype=torch.int8)
    q[1, ::2] = 0  # a row of mixed pairs
    weight = torch.full((33, 3072), w, dtype=torch.int8)
    weight[3] = -weight[3]
    panels = cpu_int8_product.pack(weight, build)
    assert panels is not None
    assert torch.equal(cpu_int8_product.product(q, panels), _exact(q, weight))


def test_strided_rows_and_empty_shapes() -> None:
    q, weight = _operands(9, 64, 20, seed=1)
    wide = torch.zeros(9, 100, dtype=torch.int8)
    wide[:, 10:74] = q
    panels = cpu_int8_product.pack(weight, ANY)
    assert torch.equal(cpu_int8_product.product(wide[:, 10:74], panels), _exact(q, weight))
    assert cpu_int8_product.product(q[:0], panels).shape == (0, 20)
    empty = cpu_int8_product.pack(weight[:, :0], ANY)
    assert torch.equal(
        cpu_int8_product.product(q[:, :0], empty), torch.zeros(9, 20, dtype=torch.int32)
    )
    with pytest.raises(ValueError, match="63 columns, the packed weight 64"):
        cpu_int8_product.product(q[:, :63], panels)


def test_a_weight_holding_minus_128_is_refused_and_a_paused_product_packs_nothing() -> None:
    _, weight = _operands(1, 40, 8, seed=2)
    assert cpu_int8_product.pack(weight, ANY) is not None
    weight[7, 39] = -128
    assert cpu_int8_product.pack(weight, ANY) is None
    weight[7, 39] = 0
    with cpu_int8_product.turned_off():
        assert not any(cpu_int8_product.available(build) for build in cpu_int8_product.BUILDS)
        assert cpu_int8_product.pack(weight, ANY) is None
    assert cpu_int8_product.available(ANY)


def test_kept_panels_follow_writes_and_live_beside_other_copies() -> None:
    """PackedWeights keeps the panels as it keeps oneDNN's copies: made again after an
    in-place write; a weight's float32 copies are kept beside them, not in their place."""
    q, weight = _operands(6, 48, 24, seed=3)
    packs = PackedWeights()
    first = packs.int8_panels_for(weight, ANY)
    assert packs.int8_panels_for(weight, ANY) is first
    widened = packs.widened_for(weight, 1024)
    assert widened is not None and packs.int8_panels_for(weight, ANY) is first
    with torch.no_grad():
        weight.copy_(weight.flip(0))
    second = packs.int8_panels_for(weight, ANY)
    assert second is not first
    assert torch.equal(cpu_int8_product.product(q, second), _exact(q, weight))
    assert len(packs) == 1


@pytest.mark.parametrize(
    "flags, build",
    [
        ({"avx2"}, "avx2"),
        ({"avx2", "avx512f", "avx512bw"}, "avx512"),
        ({"avx2", "avx512f"}, None),  # AVX-512 without BW: float32's AVX-512 GEMMs
        ({"avx2", "avx_vnni"}, None),  # int8 dot products: torch._int_mm
        ({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, None),
    ],
)
def test_the_int8_linear_takes_the_build_of_its_cpu_class(monkeypatch, flags, build) -> None:
    """Without int8 dot products: AVX-512 BW's build where the CPU has it, AVX2's where it has
    no AVX-512 (where the build runs); the two blocks that stand in for those classes."""
    monkeypatch.setattr(cpu_library, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(cpu_int8_product, "cpu_flags", cpu_library.cpu_flags)
    monkeypatch.setattr(cpu_int8_product, "available", lambda b="avx2": HOST[b])
    assert cpu_int8_product.chosen() == (build if build is not None and HOST[build] else None)
    with cpu_library.int8_products_as_on_avx2_only():
        assert cpu_int8_product.chosen() == ("avx2" if HOST["avx2"] else None)
    with cpu_library.int8_dot_products_ignored():
        avx512 = "avx512bw" in flags and HOST["avx512"]
        assert cpu_int8_product.chosen() == (
            "avx512" if avx512 else None if "avx512f" in flags or not HOST["avx2"] else "avx2"
        )
    assert cpu_int8_product.chosen() == (build if build is not None and HOST[build] else None)


def test_operands_it_cannot_read_are_refused() -> None:
    q, weight = _operands(3, 8, 4, seed=5)
    panels = cpu_int8_product.pack(weight, ANY)
    with pytest.raises(TypeError, match="weight must be int8, got torch.float32"):
        cpu_int8_product.pack(weight.float(), ANY)
    with pytest.raises(ValueError, match="weight must be a 2-D CPU tensor, got 1-D"):
        cpu_int8_product.pack(weight[0], ANY)
    with pytest.raises(TypeError, match="q must be int8, got torch.int32"):
        cpu_int8_product.product(q.int(), panels)
    with pytest.raises(ValueError, match="q must be a 2-D CPU tensor, got 3-D"):
        cpu_int8_product.product(q[None], panels)
