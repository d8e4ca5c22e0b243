"""Dropout in layer_norm (on x, before the residual add) and embeddings_layer_norm (on the
output): the kernels' Philox keep mask (fastbert/kernels/dropout.py), its rate and scaling,
reproducibility under torch.manual_seed, gradients through the forward's mask, and the
reference / torch backends' dropout_p."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fastbert import kernels as K
from fastbert.kernels import reference as R
from fastbert.kernels import torch_ops
from fastbert.kernels.dropout import keep_mask_of
from tests.dropout_masks import next_seed
from tests.test_ops_backward import _as, _embedding_args, _grads, _randn

P = 0.3


def _layer_norm_args(device: str, dtype=torch.float32, residual: bool = True) -> tuple:
    x = _randn(6, 40, dtype=dtype, device=device)
    weight = 1 + 0.2 * _randn(40, dtype=dtype, device=device, seed=1)
    bias = _randn(40, dtype=dtype, device=device, seed=2)
    res = _randn(6, 40, dtype=dtype, device=device, seed=3) if residual else None
    return x, weight, bias, 1e-5, res


def _masked_layer_norm(keep: torch.Tensor):
    """The float64 oracle of layer_norm with the kernel's keep mask applied to x."""

    def fn(x, weight, bias, eps, residual):
        return R.layer_norm(x * keep / (1 - P), weight, bias, eps, residual)

    return fn


def _masked_embeddings(keep: torch.Tensor):
    def fn(*args):
        return R.embeddings_layer_norm(*args) * keep / (1 - P)

    return fn


def test_keep_rate(device) -> None:
    keep = keep_mask_of((200, 100), next_seed(0), P, device)
    assert abs(keep.float().mean().item() - (1 - P)) < 0.015


def test_keep_masks_differ_between_seeds(device) -> None:
    a, b = (keep_mask_of((64, 64), seed, P, device) for seed in (1, 2))
    assert not torch.equal(a, b)


@pytest.mark.parametrize("residual", [False, True])
def test_layer_norm_applies_the_seeds_mask_with_scaling(device, residual) -> None:
    args = _layer_norm_args(device, residual=residual)
    keep = keep_mask_of((6, 40), next_seed(5), P, device)
    torch.manual_seed(5)
    out = K.layer_norm(*args, dropout_p=P)
    expected = _masked_layer_norm(keep.double())(*(_as(args, torch.float64)))
    torch.testing.assert_close(out.double(), expected.detach(), rtol=1e-5, atol=1e-5)
    # ...and it is not the output without dropout.
    assert not torch.allclose(out, K.layer_norm(*args))


def test_embeddings_applies_the_seeds_mask_with_scaling(device) -> None:
    args = _embedding_args(device, torch.float32, True, "shared")
    keep = keep_mask_of((2, 5, 24), next_seed(6), P, device)
    torch.manual_seed(6)
    out = K.embeddings_layer_norm(*args, dropout_p=P)
    assert torch.equal(out == 0, ~keep)
    expected = _masked_embeddings(keep.double())(*_as(args, torch.float64))
    torch.testing.assert_close(out.double(), expected.detach(), rtol=1e-5, atol=1e-5)


def test_masks_are_reproducible_under_manual_seed(device) -> None:
    args = _layer_norm_args(device)
    outs = []
    for seed in (7, 7, 8):
        torch.manual_seed(seed)
        outs.append(K.layer_norm(*args, dropout_p=P))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])
    # Each call draws a new seed: two calls in a row differ.
    assert not torch.equal(K.layer_norm(*args, dropout_p=P), K.layer_norm(*args, dropout_p=P))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_layer_norm_backward_uses_the_forwards_mask(device, dtype) -> None:
    args = _as(_layer_norm_args(device, dtype), dtype)
    dout = _randn(6, 40, device=device, seed=9)
    keep = keep_mask_of((6, 40), next_seed(11), P, device)
    torch.manual_seed(11)
    got = _grads(lambda *a: K.layer_norm(*a, dropout_p=P), args, dout)
    assert torch.equal(got[0] == 0, ~keep)  # dx is zero exactly where x was dropped
    ref = _grads(_masked_layer_norm(keep.double()), _as(args, torch.float64), dout.double())
    torch_grads = _grads(_masked_layer_norm(keep.to(dtype)), _as(args, dtype), dout)
    _compare(got, ref, torch_grads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_embeddings_backward_uses_the_forwards_mask(device, dtype) -> None:
    args = _as(_embedding_args(device, dtype, True, "per-row"), dtype)
    dout = _randn(2, 5, 24, device=device, seed=9)
    keep = keep_mask_of((2, 5, 24), next_seed(12), P, device)
    torch.manual_seed(12)
    got = _grads(lambda *a: K.embeddings_layer_norm(*a, dropout_p=P), args, dout)
    ref = _grads(_masked_embeddings(keep.double()), _as(args, torch.float64), dout.double())
    torch_grads = _grads(_masked_embeddings(keep.to(dtype)), _as(args, dtype), dout)
    _compare(got, ref, torch_grads)


def _compare(got, ref, torch_grads) -> None:
    from tests.accuracy import assert_within_rule

    for i, (g, r, t) in enumerate(zip(got, ref, torch_grads)):
        if g.dtype == torch.float32:
            scale = max(1.0, r.abs().max().item())
            torch.testing.assert_close(g.double(), r, rtol=1e-5, atol=1e-5 * scale)
        else:
            assert_within_rule(g, t, r, what=f"gradient {i}")


def test_zero_dropout_draws_no_seed(device) -> None:
    """dropout_p=0 runs today's path: no random number drawn, the same output bit for bit."""
    args = _layer_norm_args(device)
    state = torch.get_rng_state()
    out = K.layer_norm(*args, dropout_p=0.0)
    emb = _embedding_args(device, torch.float32, True, None)
    out_emb = K.embeddings_layer_norm(*emb, dropout_p=0.0)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(out, K.layer_norm(*args))
    assert torch.equal(out_emb, K.embeddings_layer_norm(*emb))


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, "0.1", True, None])
@pytest.mark.parametrize(
    "op",
    [
        K.layer_norm,
        R.layer_norm,
        torch_ops.layer_norm,
        K.embeddings_layer_norm,
        R.embeddings_layer_norm,
        torch_ops.embeddings_layer_norm,
    ],
)
def test_bad_dropout_p_raises(device, op, bad) -> None:
    embeddings = op.__name__ == "embeddings_layer_norm"
    args = (
        _embedding_args(device, torch.float32, False, None)
        if embeddings
        else _layer_norm_args(device)
    )
    with pytest.raises(ValueError, match="dropout_p"):
        op(*args, dropout_p=bad)


@pytest.mark.parametrize("backend", [R, torch_ops])
def test_reference_backends_drop_with_pytorchs_mask(backend) -> None:
    """The reference and torch backends apply F.dropout at the interface's places: on x before
    the residual add, on the embeddings' output."""
    x, weight, bias, eps, res = _layer_norm_args("cpu")
    torch.manual_seed(3)
    out = backend.layer_norm(x, weight, bias, eps, res, dropout_p=P)
    torch.manual_seed(3)
    mask = F.dropout(torch.ones_like(x), P)
    torch.testing.assert_close(out, R.layer_norm(x * mask, weight, bias, eps, res))

    args = _embedding_args("cpu", torch.float32, True, "shared")
    torch.manual_seed(4)
    out = backend.embeddings_layer_norm(*args, dropout_p=P)
    torch.manual_seed(4)
    mask = F.dropout(torch.ones(2, 5, 24), P)
    torch.testing.assert_close(out, R.embeddings_layer_norm(*args) * mask)
