"""The persistent, TMA-descriptor path of K.linear against the float64 reference.

The persistent configs (a fixed number of programs walking the output tiles, operands loaded
through host tensor descriptors) are offered only where descriptors apply: sm_90 or newer, or
the interpreter; 16-bit inputs with K the unit-stride dimension of both operands, 16-byte
aligned. On the CPU the interpreter runs them with 3 programs, each walking several tiles.
Each test pins the persistent config it checks (FASTBERT_AUTOTUNE) and asserts it ran.
"""

from __future__ import annotations

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import fused_linear
from fastbert.kernels import reference as R
from fastbert.kernels.launch import AUTOTUNE_ENV
from tests.op_cases import check_op, dtype_params
from tests.test_linear import linear_within_rule, operands

KERNEL = fused_linear._linear_fwd_kernel
SIXTEEN_BIT = dtype_params((torch.float16,), (torch.bfloat16,))


def _persistent_indices(kept: list) -> list[int]:
    return [i for i, c in enumerate(kept) if c.kwargs["PERSISTENT"]]


@pytest.fixture
def fresh_autotuner():
    KERNEL.cache.clear()
    yield
    KERNEL.cache.clear()


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
@pytest.mark.parametrize(
    "has_bias, activation, has_residual",
    [(False, None, False), (True, None, False), (True, "gelu", True), (True, "gelu_tanh", False)],
    ids=str,
)
def test_every_persistent_config(
    monkeypatch, fresh_autotuner, device, dtype, has_bias, activation, has_residual
) -> None:
    # 200 x 100 x 72: partial tiles along M, N and K; more tiles than programs.
    x, weight, bias, residual = operands(200, 100, 72, dtype, device, seed=3)
    bias = bias if has_bias else None
    residual = residual if has_residual else None
    kept = fused_linear.kept_configs(x, weight, activation, residual)
    persistent = _persistent_indices(kept)
    assert persistent, "no persistent config kept for an aligned 16-bit launch"
    for index in persistent:
        monkeypatch.setenv(AUTOTUNE_ENV, str(index))
        KERNEL.cache.clear()
        what = f"persistent linear config {index} {kept[index]}"
        linear_within_rule(x, weight, bias, activation, residual, what)
        assert KERNEL.best_config.kwargs["PERSISTENT"], "the persistent config did not run"


def test_programs_walk_several_tiles(monkeypatch, fresh_autotuner, device) -> None:
    """With fewer programs than tiles each program walks several, and the output is right."""
    rows = 97  # grown until the tiles outnumber the programs (a GPU runs one per SM)
    while True:
        x, weight, _, _ = operands(rows, 130, 40, torch.float16, device, seed=5)
        kept = fused_linear.kept_configs(x, weight, None, None)
        config = kept[_persistent_indices(kept)[0]].kwargs
        tiles = -(-rows // config["BLOCK_M"]) * -(-130 // config["BLOCK_N"])
        if tiles > fused_linear.persistent_programs(x.device, config["PERSISTENT"]):
            break
        rows *= 4
    monkeypatch.setenv(AUTOTUNE_ENV, str(_persistent_indices(kept)[0]))
    check_op(K.linear, R.linear, (x, weight), {}, what="persistent linear, several tiles")


def _misaligned(x: torch.Tensor) -> torch.Tensor:
    """x's values in a tensor whose base is 2 bytes off a 16-byte boundary."""
    storage = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    out = storage[1:].view(x.shape)
    out.copy_(x)
    return out


@pytest.mark.parametrize(
    "case",
    ["float32", "transposed x", "misaligned base", "row stride not 16-byte aligned", "few rows"],
)
def test_no_descriptors_where_tma_does_not_apply(fresh_autotuner, device, case) -> None:
    """Those launches keep no persistent config, and still compute the right result."""
    m, n, k = (8, 48, 64) if case == "few rows" else (96, 48, 64)
    k = 36 if case == "row stride not 16-byte aligned" else k
    dtype = torch.float32 if case == "float32" else torch.float16
    x, weight, bias, _ = operands(m, n, k, dtype, device, seed=7)
    if case == "transposed x":
        x = x.t().contiguous().t()
    if case == "misaligned base":
        x = _misaligned(x)
    x_desc, w_desc = fused_linear.descriptors(x, x.stride(), weight, weight.stride(), m, n, k)
    assert x_desc is None and w_desc is None
    assert not _persistent_indices(fused_linear.kept_configs(x, weight, "gelu", None))
    check_op(K.linear, R.linear, (x, weight), {"bias": bias, "activation": "gelu"}, what=case)


def test_the_autotune_key_tells_launches_with_and_without_descriptors(
    monkeypatch, fresh_autotuner, device
) -> None:
    """A persistent config chosen for an aligned launch is not reused for a launch of the same
    shape without descriptors (it would have no operands to read)."""
    x, weight, bias, _ = operands(96, 48, 64, torch.float16, device, seed=9)
    kept = fused_linear.kept_configs(x, weight, None, None)
    monkeypatch.setenv(AUTOTUNE_ENV, str(_persistent_indices(kept)[0]))
    K.linear(x, weight, bias)
    assert KERNEL.best_config.kwargs["PERSISTENT"]
    monkeypatch.delenv(AUTOTUNE_ENV)
    check_op(K.linear, R.linear, (_misaligned(x), weight), {"bias": bias}, what="misaligned")
    assert not KERNEL.best_config.kwargs["PERSISTENT"]
