"""The torch backend's CPU attention per run of equal-length sequences: the math path
(``cpu_engine_attention.math_attention``, float32 throughout) against float64, against SDPA's flash
kernel's own accuracy in bfloat16, and which runs ``attention_varlen`` sends to it where the
compiled kernel (fastbert.kernels.cpu_attention, tests/test_cpu_attention.py) does not run."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from fastbert.kernels import cpu_engine_attention as T
from fastbert.kernels import reference as R
from tests.op_cases import check_op, randn
from tests.test_attention import packed_qkv

HEADS = 12
BUCKETS = 32  # reference.RELATIVE_BUCKETS: the relative bias table's columns


@pytest.fixture(autouse=True)
def without_compiled_kernel(monkeypatch) -> None:
    """The path a CPU without AVX512_BF16 (or a C++ compiler) takes."""
    monkeypatch.setattr(T, "takes_compiled", lambda *tensors: False)


def group_views(n: int, length: int, head_dim: int, dtype, seed: int):
    """q, k, v [n, H, L, D] as the views ``attention_by_length`` passes (of packed
    [n * L, H, D] tensors), q scaled for sharper attention, and the packed output's view."""
    q, k, v = (
        randn((n * length, HEADS, head_dim), dtype, "cpu", seed + i, scale=2.0 if i == 0 else 1.0)
        .view(n, length, HEADS, head_dim)
        .transpose(1, 2)
        for i in range(3)
    )
    out = torch.empty(n * length, HEADS, head_dim, dtype=dtype)
    return q, k, v, out.view(n, length, HEADS, head_dim).transpose(1, 2)


def relative_error(out: torch.Tensor, expected: torch.Tensor) -> float:
    return float((out.double() - expected).norm() / expected.norm())


MASKS = ["none", "relative-bias", "window", "relative-bias-window"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("length", [1, 7, 24, 108, 125, 160])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("scale", [None, 0.3])
def test_math_attention_against_float64(dtype, head_dim, length, mask, scale) -> None:
    """The math path against the float64 reference on the same inputs, lengths on both sides
    of the thresholds: float32 to float32 accuracy (bfloat16 scores, or a wrong scale, fail
    it), and in bfloat16 no less accurate than SDPA's flash kernel with the mask it gets."""
    n = max(1, 96 // length)
    q, k, v, out = group_views(n, length, head_dim, dtype, seed=length + head_dim)
    bias = randn((HEADS, BUCKETS), torch.float32, "cpu", seed=3) if "bias" in mask else None
    window = 5 if "window" in mask else None
    T.math_attention(q, k, v, T.additive_mask(bias, window, length, "cpu"), scale, out)
    wide = (t.double() for t in (q, k, v))
    bias64 = None if bias is None else bias.double()
    expected = R.attention(*wide, None, scale, relative_bias=bias64, window=window)
    error = relative_error(out, expected)
    if dtype == torch.float32:
        assert error < 2e-6, error
        return
    flash_mask = T.length_mask(bias, window, length, dtype, "cpu")
    flash = F.scaled_dot_product_attention(q, k, v, attn_mask=flash_mask, scale=scale)
    # bfloat16 rounds the result once: a relative error of about 2**-9 / sqrt(3) at best.
    assert error <= relative_error(flash, expected), (error, relative_error(flash, expected))
    assert error < 2.5e-3, error


def test_math_attention_chunks_sequences() -> None:
    """A run larger than one chunk's score budget: the same output as chunks of one."""
    q, k, v, out = group_views(40, 64, 32, torch.bfloat16, seed=1)
    assert 40 * HEADS * 64 * 64 * 4 > T.MATH_SCORE_BYTES  # more than one chunk
    T.math_attention(q, k, v, None, None, out)
    for i in range(40):
        one = torch.empty_like(out[i : i + 1])
        T.math_attention(q[i : i + 1], k[i : i + 1], v[i : i + 1], None, None, one)
        assert torch.equal(out[i : i + 1], one)


def math_lengths(monkeypatch) -> list[int]:
    """Spy on ``math_attention``: the list of run lengths it is called with."""
    seen: list[int] = []
    real = T.math_attention

    def spy(q, *args):
        seen.append(q.shape[2])
        return real(q, *args)

    monkeypatch.setattr(T, "math_attention", spy)
    return seen


@pytest.mark.parametrize("head_dim", [32, 64])
@pytest.mark.parametrize("variant", ["plain", "relative-bias", "rotary-window"])
def test_attention_varlen_picks_the_math_path_by_length(monkeypatch, head_dim, variant) -> None:
    """bfloat16: runs up to MATH_ATTENTION_MAX_LENGTH take the math path, longer ones SDPA,
    and so do runs of fewer than MATH_ATTENTION_MIN_SCORES scores per head; every output
    against the float64 reference."""
    longest = T.MATH_ATTENTION_MAX_LENGTH[(torch.bfloat16, head_dim)]
    many = T.MATH_ATTENTION_MIN_SCORES // 36 + 1  # sequences of 6 tokens: just enough scores
    lengths = [3, 3, *[6] * many, 17, longest, longest + 1, longest + 1, 150, 2]
    q, k, v, cu = packed_qkv(lengths, 2, head_dim, torch.bfloat16, "cpu", seed=head_dim)
    fixed, widened = {}, {}
    if variant == "rotary-window":
        inverse = 1.0 / 10_000 ** (torch.arange(0, head_dim, 2) / head_dim)
        fixed = {"rotary": inverse.float(), "window": 8}
    if variant == "relative-bias":
        widened = {"relative_bias": randn((2, BUCKETS), torch.float32, "cpu", seed=5)}
    seen = math_lengths(monkeypatch)
    op = functools.partial(T.attention_varlen_unchecked, **fixed)
    check_op(op, functools.partial(R.attention_varlen, **fixed), (q, k, v, cu, 150), widened)
    assert seen == [6, longest]


@pytest.mark.parametrize(
    "dtype, head_dim, dropout_p, grad, expected",
    [
        (torch.bfloat16, 32, 0.0, False, [40, 60]),
        (torch.float32, 32, 0.0, False, []),
        (torch.float16, 32, 0.0, False, []),
        (torch.bfloat16, 80, 0.0, False, []),
        (torch.bfloat16, 32, 0.1, False, []),
        (torch.bfloat16, 32, 0.0, True, []),
    ],
    ids=["bfloat16", "float32", "float16", "head-dim-80", "dropout", "autograd"],
)
def test_attention_varlen_keeps_sdpa(monkeypatch, dtype, head_dim, dropout_p, grad, expected):
    """SDPA for a dtype or head dimension without a threshold, with dropout (training) and
    when autograd records the call; the same runs in plain bfloat16 take the math path."""
    q, k, v, cu = packed_qkv([40, 40, 60], 2, head_dim, dtype, "cpu", seed=2)
    q.requires_grad_(grad)
    seen = math_lengths(monkeypatch)
    T.attention_varlen_unchecked(q, k, v, cu, 60, dropout_p=dropout_p)
    assert seen == expected
