"""Every autotune config of the autotuned kernels (attention, linear), one at a time, on the GPU.

Autotuning times the configs but never checks what they compute, and the rest of the GPU suite
runs with FASTBERT_AUTOTUNE=0 (the first config each launch keeps; see tests/conftest.py). So
here each config is pinned in turn (FASTBERT_AUTOTUNE=i, the autotuner's cache cleared) and the
public op's output is held to the rule against the float64 reference, as in the per-op tests.
The configs a launch keeps come from the modules' own ``keep`` predicates.
"""

from __future__ import annotations

import pytest
import torch
import triton

from fastbert import kernels as K
from fastbert.kernels import flash_attention, fused_linear
from fastbert.kernels import reference as R
from fastbert.kernels.launch import AUTOTUNE_ENV
from tests.op_cases import check_op, padded_mask, randn
from tests.test_linear import linear_within_rule

pytestmark = pytest.mark.gpu

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _pinned(monkeypatch, autotuner, kept: list):
    """Yield (index, config) for each kept config, with the autotuner pinned to that one."""
    assert kept, "no config kept"
    try:
        for index, config in enumerate(kept):
            monkeypatch.setenv(AUTOTUNE_ENV, str(index))
            autotuner.cache.clear()
            yield index, config
    finally:
        autotuner.cache.clear()


def _attention_kept(head_dim: int, dtype: torch.dtype, is_varlen: bool, has_mask: bool) -> list:
    kernel = flash_attention._attention_fwd_kernel
    size = torch.tensor([], dtype=dtype).element_size()
    block_d = triton.next_power_of_2(head_dim)
    kept = [
        c for c in kernel.configs if flash_attention.keep(c, block_d, size, is_varlen, has_mask)
    ]
    return kept or kernel.configs[:1]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("head_dim, masked", [(32, True), (64, True), (80, True), (64, False)])
def test_every_attention_config(monkeypatch, dtype, head_dim, masked) -> None:
    batch, heads, seq = 3, 2, 200  # 200: a partial last block for every BLOCK_M / BLOCK_N
    q, k, v = (randn((batch, heads, seq, head_dim), dtype, "cuda", seed) for seed in range(3))
    mask = padded_mask([seq, 131, 1], seq, device="cuda") if masked else None
    kept = _attention_kept(head_dim, dtype, is_varlen=False, has_mask=masked)
    for index, config in _pinned(monkeypatch, flash_attention._attention_fwd_kernel, kept):
        check_op(
            K.attention,
            R.attention,
            (q, k, v),
            {"key_padding_mask": mask},
            what=f"attention config {index} {config}",
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_attention_varlen_config(monkeypatch, dtype) -> None:
    lengths, heads, head_dim = [200, 1, 77, 129], 2, 64
    tokens = sum(lengths)
    q, k, v = (randn((tokens, heads, head_dim), dtype, "cuda", seed) for seed in range(3))
    cu_seqlens = torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)
    kept = _attention_kept(head_dim, dtype, is_varlen=True, has_mask=False)
    for index, config in _pinned(monkeypatch, flash_attention._attention_fwd_kernel, kept):
        check_op(
            K.attention_varlen,
            R.attention_varlen,
            (q, k, v, cu_seqlens, max(lengths)),
            what=f"attention_varlen config {index} {config}",
        )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "activation, has_residual", [(None, False), ("gelu", False), ("gelu_tanh", True)]
)
@pytest.mark.parametrize("m", [77, 1000])
def test_every_linear_config(monkeypatch, dtype, activation, has_residual, m) -> None:
    n, k = 384, 256  # multiples of 16, as BERT's are; M off every tile grid
    x = randn((m, k), dtype, "cuda", 1)
    weight = randn((n, k), dtype, "cuda", 2, scale=k**-0.5)
    bias = randn((n,), dtype, "cuda", 3)
    residual = randn((m, n), dtype, "cuda", 4) if has_residual else None
    kernel = fused_linear._linear_fwd_kernel
    kept = fused_linear.kept_configs(x, weight, activation, residual)
    for index, config in _pinned(monkeypatch, kernel, kept):
        linear_within_rule(x, weight, bias, activation, residual, f"linear config {index} {config}")
