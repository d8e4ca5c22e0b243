"""K.scaled_masked_softmax against the float64 reference (tests/accuracy.py rule).

CPU (Triton interpreter): fp32, fp16 and bf16 (no tl.dot here), S_k up to a few hundred.
GPU (``gpu`` mark): rows up to the kernel's 16384 keys.
"""

from __future__ import annotations

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import reference as R
from fastbert.kernels.masked_softmax import MAX_KEYS
from tests.accuracy import assert_within_rule
from tests.op_cases import (
    ALL_DTYPES,
    ELEMENTWISE_DTYPES,
    check_op,
    dtype_params,
    lengths_for,
    padded_mask,
    randn,
)


def check_softmax(scores, mask=None, scale=1.0) -> torch.Tensor:
    out = check_op(
        K.scaled_masked_softmax,
        R.scaled_masked_softmax,
        (scores,),
        {"key_padding_mask": mask, "scale": scale},
    )
    assert out.is_contiguous()
    return out


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
@pytest.mark.parametrize("seq_q, seq_k", [(1, 1), (7, 7), (5, 33), (3, 129), (2, 300)])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_matches_reference(device, dtype, seq_q, seq_k, masked) -> None:
    scores = randn((3, 2, seq_q, seq_k), dtype, device, seed=seq_k, scale=3.0)
    mask = padded_mask(lengths_for(3, seq_k), seq_k, device=device) if masked else None
    check_softmax(scores, mask, scale=0.7)


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
@pytest.mark.parametrize("scale", [1, 0.125, 40.0])
def test_scale(device, dtype, scale) -> None:
    """A large scale pushes exp(scale * scores) far past overflow without the max shift."""
    scores = randn((2, 2, 4, 65), dtype, device, seed=1, scale=4.0)
    check_softmax(scores, padded_mask([65, 30], 65, device=device), scale=scale)


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
@pytest.mark.parametrize("view", ["transposed", "sliced"])
def test_non_contiguous_scores(device, dtype, view) -> None:
    if view == "transposed":  # stride 1 on S_q, not S_k
        scores = randn((2, 3, 40, 9), dtype, device, seed=2).transpose(2, 3)
    else:  # every other key of a wider buffer, heads and batch permuted
        scores = randn((3, 2, 9, 80), dtype, device, seed=2).transpose(0, 1)[..., ::2]
    assert not scores.is_contiguous()
    check_softmax(scores, padded_mask([40, 11], 40, device=device), scale=0.5)


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
def test_fully_masked_rows_are_zero(device, dtype) -> None:
    scores = randn((3, 2, 5, 33), dtype, device, seed=3)
    out = check_softmax(scores, padded_mask([33, 0, 4], 33, device=device))
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(out[2, ..., 4:], torch.zeros_like(out[2, ..., 4:]))


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_a_row_whose_real_keys_all_score_minus_inf_is_nan(device, dtype, masked) -> None:
    """Scores of -inf at every real key (an additive -inf mask) give NaN, as torch.softmax and
    the reference do, not zeros: only a row with no real key is zeros."""
    scores = randn((2, 2, 3, 9), dtype, device, seed=6)
    scores[0, 1, 2] = float("-inf")
    scores[1, 0, 0, :4] = float("-inf")
    mask = padded_mask([9, 4], 9, device=device) if masked else None
    out = K.scaled_masked_softmax(scores, mask)
    ref = R.scaled_masked_softmax(scores.double(), mask)
    assert torch.equal(out.isnan(), ref.isnan())
    assert out[0, 1, 2].isnan().all() and out[1, 0, 0].isnan().all() == masked
    assert_within_rule(out, R.scaled_masked_softmax(scores, mask), ref, where=~ref.isnan())


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
def test_masked_scores_have_no_influence(device, dtype) -> None:
    scores = randn((2, 2, 6, 50), dtype, device, seed=4)
    mask = padded_mask([50, 17], 50, device=device)
    out = K.scaled_masked_softmax(scores, mask)
    big = torch.full_like(scores, torch.finfo(dtype).max / 2)
    changed = torch.where(mask[:, None, None, :], scores, big)
    assert torch.equal(K.scaled_masked_softmax(changed, mask), out)


@pytest.mark.parametrize("dtype", ELEMENTWISE_DTYPES)
@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")], ids=str)
@pytest.mark.parametrize("transposed", [False, True], ids=["contiguous", "transposed"])
def test_nonfinite_masked_scores_are_excluded(device, dtype, poison, transposed) -> None:
    """NaN / Inf scores at masked keys: probability exactly 0 there, valid keys unaffected."""
    lengths = [50, 17, 1, 0]
    scores = randn((4, 2, 6, 50), dtype, device, seed=6, scale=3.0)
    if transposed:  # the [B, S_q, H, S_k] buffer of Hugging Face's eager attention, viewed
        scores = randn((4, 6, 2, 50), dtype, device, seed=6, scale=3.0).transpose(1, 2)
    mask = padded_mask(lengths, 50, device=device)
    bad = scores.clone().masked_fill_(~mask[:, None, None, :], poison)
    for op in (K.scaled_masked_softmax, R.scaled_masked_softmax):
        out = op(bad, mask, scale=0.7)
        assert torch.isfinite(out).all()
        assert torch.equal(out, op(scores, mask, scale=0.7))
        assert (out.masked_select(~mask[:, None, None, :]) == 0).all()
    check_softmax(scores, mask, scale=0.7)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.int64, torch.int32, torch.uint8])
def test_mask_dtypes(device, mask_dtype) -> None:
    """Any 0/1 mask dtype, and a non-contiguous mask, give the bool mask's output exactly."""
    scores = randn((2, 2, 3, 20), torch.float32, device, seed=5)
    lengths = [20, 6]
    expected = check_softmax(scores, padded_mask(lengths, 20, device=device))
    mask = padded_mask(lengths, 20, mask_dtype, device)
    assert torch.equal(K.scaled_masked_softmax(scores, mask), expected)
    strided = mask.t().contiguous().t()
    assert not strided.is_contiguous()
    assert torch.equal(K.scaled_masked_softmax(scores, strided), expected)


def test_empty_scores(device) -> None:
    scores = torch.zeros(2, 0, 3, 5, device=device)
    assert K.scaled_masked_softmax(scores).shape == (2, 0, 3, 5)


def _zeros(device, *shape, dtype=torch.float32):
    return torch.zeros(shape, dtype=dtype, device=device)


def _ones_mask(device, *shape, dtype=torch.bool):
    return torch.ones(shape, dtype=dtype, device=device)


# case: (make(device) -> (scores, mask), exception, message pattern); valid scores: [2, 2, 3, 8].
BAD = {
    "float64": (lambda d: (_zeros(d, 2, 2, 3, 8, dtype=torch.float64), None), TypeError, "float64"),
    "int scores": (
        lambda d: (_zeros(d, 2, 2, 3, 8, dtype=torch.int32), None),
        TypeError,
        "scores must be float16, bfloat16 or float32",
    ),
    "3-d scores": (lambda d: (_zeros(d, 2, 3, 8), None), ValueError, "scores must have 4 dim"),
    "float mask": (
        lambda d: (_zeros(d, 2, 2, 3, 8), _ones_mask(d, 2, 8, dtype=torch.float32)),
        TypeError,
        "additive float masks",
    ),
    "mask shape": (
        lambda d: (_zeros(d, 2, 2, 3, 8), _ones_mask(d, 2, 3)),
        ValueError,
        r"key_padding_mask must have shape \(2, 8\)",
    ),
    "3-d mask": (
        lambda d: (_zeros(d, 2, 2, 3, 8), _ones_mask(d, 2, 1, 8)),
        ValueError,
        "key_padding_mask must have 2 dimensions",
    ),
    "mask on meta": (
        lambda d: (_zeros(d, 2, 2, 3, 8), _ones_mask("meta", 2, 8)),
        ValueError,
        "device mismatch",
    ),
    "too many keys": (
        lambda d: (_zeros(d, 1, 1, 1, MAX_KEYS + 1), None),
        ValueError,
        f"{MAX_KEYS + 1} keys per row, more than the {MAX_KEYS}",
    ),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_bad_input_raises(device, case) -> None:
    make, exc, match = BAD[case]
    scores, mask = make(device)
    with pytest.raises(exc, match=match):
        K.scaled_masked_softmax(scores, mask)


def test_cpu_without_interpreter_says_so(interpreter_off) -> None:
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        K.scaled_masked_softmax(torch.zeros(1, 1, 2, 4))


def test_bad_scale_raises(device) -> None:
    with pytest.raises(TypeError, match="scale must be a Python number"):
        K.scaled_masked_softmax(torch.zeros(1, 1, 2, 4, device=device), scale=None)
    scores = torch.zeros(1, 1, 2, 4, device=device)
    with pytest.raises(TypeError, match="scale must be a Python number"):
        K.scaled_masked_softmax(scores, scale=True)
    with pytest.raises(ValueError, match="scale must be a finite number"):
        K.scaled_masked_softmax(scores, scale=float("nan"))


# --- GPU: long rows, every dtype --------------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params((), ALL_DTYPES))
@pytest.mark.parametrize("seq_k", [127, 511, 512, 1024, 4096, 16384])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_gpu_long_rows(dtype, seq_k, masked) -> None:
    batch, heads, seq_q = (4, 12, 64) if seq_k <= 1024 else (2, 2, 16)
    scores = randn((batch, heads, seq_q, seq_k), dtype, "cuda", seed=seq_k, scale=4.0)
    lengths = lengths_for(batch, seq_k)
    lengths[-1] = 0
    mask = padded_mask(lengths, seq_k, torch.int64, "cuda") if masked else None
    out = check_softmax(scores, mask, scale=0.125)
    if masked:
        assert torch.equal(out[-1], torch.zeros_like(out[-1]))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params((), ALL_DTYPES))
def test_gpu_bert_base_probabilities(dtype) -> None:
    """The HF eager layout: scores [B, H, S, S] from a [B, S, H, S] buffer, padded batch."""
    scores = randn((32, 128, 12, 128), dtype, "cuda", seed=7, scale=3.0).transpose(1, 2)
    mask = padded_mask(lengths_for(32, 128), 128, device="cuda")
    check_softmax(scores, mask, scale=64**-0.5)
