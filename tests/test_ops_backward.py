"""Gradients of the Triton ops (layer_norm, embeddings_layer_norm, linear,
scaled_masked_softmax) against autograd of the float64 reference.

float32: close to exact (relative 1e-5 of the gradient's magnitude). float16: the 2x rule of
tests/accuracy.py, PyTorch's own error being the reference op's gradient computed in float16.
bfloat16 runs on the GPU only (the interpreter's bf16 tl.dot is wrong, triton issue 11584).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import reference as R
from fastbert.kernels import torch_ops
from tests.accuracy import assert_within_rule

DTYPES = [torch.float32, torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]
FP32_RTOL = 1e-5


def _randn(*shape: int, dtype=torch.float32, device="cpu", seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype)


def _floats(args: tuple) -> list[torch.Tensor]:
    return [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]


def _as(args: tuple, dtype: torch.dtype) -> tuple:
    """``args`` with the floating tensors in ``dtype``, fresh leaves requiring grad."""
    return tuple(
        a.detach().to(dtype).requires_grad_()
        if isinstance(a, torch.Tensor) and a.is_floating_point()
        else a
        for a in args
    )


def _grads(fn, args: tuple, dout: torch.Tensor) -> list[torch.Tensor]:
    out = fn(*args)
    return list(torch.autograd.grad(out, _floats(args), dout.to(out.dtype)))


def check_gradients(kernel_fn, reference_fn, args: tuple, dout: torch.Tensor) -> None:
    """Gradients of ``kernel_fn`` to every floating tensor of ``args`` (given in the dtype under
    test) against ``reference_fn``'s in float64 (and, in half precision, in that dtype)."""
    dtype = _floats(args)[0].dtype
    got = _grads(kernel_fn, _as(args, dtype), dout)
    ref = _grads(reference_fn, _as(args, torch.float64), dout.double())
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.dtype == dtype and g.shape == r.shape, f"gradient {i}: {g.dtype} {g.shape}"
        if dtype == torch.float32:
            scale = max(1.0, r.abs().max().item()) if r.numel() else 1.0
            torch.testing.assert_close(
                g.double().cpu(),
                r.cpu(),
                rtol=FP32_RTOL,
                atol=FP32_RTOL * scale,
                msg=lambda m, i=i: f"gradient {i}: {m}",
            )
        else:
            torch_grads = _grads(reference_fn, _as(args, dtype), dout)
            assert_within_rule(g, torch_grads[i], r, what=f"gradient {i}")


# ---------------------------------------------------------------- layer_norm


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
def test_layer_norm_gradients(device, dtype, residual) -> None:
    x = _randn(3, 7, 40, dtype=dtype, device=device)
    weight = 1 + 0.2 * _randn(40, dtype=dtype, device=device, seed=1)
    bias = _randn(40, dtype=dtype, device=device, seed=2)
    res = _randn(3, 7, 40, dtype=dtype, device=device, seed=3) if residual else None
    dout = _randn(3, 7, 40, device=device, seed=4)
    check_gradients(K.layer_norm, R.layer_norm, (x, weight, bias, 1e-5, res), dout)


def test_layer_norm_gradients_of_strided_input(device) -> None:
    x = _randn(40, 6, device=device).t()  # [6, 40], column stride 6
    weight, bias = _randn(40, device=device, seed=1), _randn(40, device=device, seed=2)
    check_gradients(
        K.layer_norm,
        R.layer_norm,
        (x, weight, bias, 1e-5, None),
        _randn(6, 40, device=device, seed=4),
    )


def test_layer_norm_backward_reduces_many_rows_per_program(device, monkeypatch) -> None:
    """Fewer programs than rows: each program's dweight / dbias partial sums cover many rows,
    the last program fewer."""
    from fastbert.kernels import fused_layer_norm

    monkeypatch.setattr(fused_layer_norm, "MAX_PARTIALS", 3)
    x = _randn(11, 24, device=device)
    weight, bias = _randn(24, device=device, seed=1), _randn(24, device=device, seed=2)
    check_gradients(
        K.layer_norm,
        R.layer_norm,
        (x, weight, bias, 1e-5, x.flip(0)),
        _randn(11, 24, device=device, seed=4),
    )


# ---------------------------------------------------------------- linear


@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh"])
@pytest.mark.parametrize("has_bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_linear_gradients_fp32(device, activation, has_bias, residual) -> None:
    _check_linear(device, torch.float32, activation, has_bias, residual)


@pytest.mark.parametrize("dtype", DTYPES[1:])
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh"])
def test_linear_gradients_half(device, dtype, activation) -> None:
    _check_linear(device, dtype, activation, True, True)


def _check_linear(
    device, dtype, activation, has_bias, residual, m=(2, 5), k=40, n=36, gated=False
) -> None:
    # By default M = 10, K = 40, N = 36: neither a multiple of the interpreter's 32 x 32 x 32
    # tile. ``gated``: the product's N columns are a GLU's input and gate (output N / 2).
    x = _randn(*m, k, dtype=dtype, device=device)
    weight = 0.2 * _randn(n, k, dtype=dtype, device=device, seed=1)
    bias = _randn(n, dtype=dtype, device=device, seed=2) if has_bias else None
    width = n // 2 if gated else n
    res = _randn(*m, width, dtype=dtype, device=device, seed=3) if residual else None
    dout = _randn(*m, width, device=device, seed=4)
    kernel, reference = partial(K.linear, gated=gated), partial(R.linear, gated=gated)
    check_gradients(kernel, reference, (x, weight, bias, activation, res), dout)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [False, True], ids=["plain", "gated"])
def test_linear_gradients_of_model_sized_operands(device, dtype, gated) -> None:
    """M = 140, K = 260, N = 600: the forward, dx and dweight products each hold a whole
    interpreter wide tile (linear_configs.INTERPRETER_WIDE_TILES) and part of the next."""
    _check_linear(device, dtype, "gelu", True, True, m=(2, 70), k=260, n=600, gated=gated)


def test_linear_gradients_of_transposed_views(device) -> None:
    """x and weight as transposed views (HF passes such strides): the backward GEMMs read
    every operand through its strides."""
    x = _randn(40, 10, device=device).t()
    weight = _randn(40, 36, device=device, seed=1).t()
    bias = _randn(36, device=device, seed=2)
    dout = _randn(36, 10, device=device, seed=4).t()
    check_gradients(K.linear, R.linear, (x, weight, bias, "gelu", None), dout)


def test_linear_gradient_to_one_input_only(device) -> None:
    x = _randn(10, 40, device=device).requires_grad_()
    weight = _randn(36, 40, device=device, seed=1)
    out = K.linear(x, weight, None, "gelu")
    (dx,) = torch.autograd.grad(out, [x], torch.ones_like(out))
    x64 = x.detach().double().requires_grad_()
    out64 = R.linear(x64, weight.double(), None, "gelu")
    (ref,) = torch.autograd.grad(out64, [x64], torch.ones_like(out64))
    torch.testing.assert_close(dx.double(), ref, rtol=FP32_RTOL, atol=FP32_RTOL * 10)


# ---------------------------------------------------------------- embeddings_layer_norm


def _embedding_args(device, dtype, types: bool, positions: str | None):
    # Duplicates: word 3 four times, word 1 twice; position 1 twice in the [S] ids.
    ids = torch.tensor([[3, 1, 3, 0, 5], [3, 3, 1, 6, 2]], device=device)
    token_types = torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0]], device=device)
    position_ids = {
        None: None,
        "shared": torch.tensor([4, 1, 1, 0, 2], device=device),
        "per-row": torch.tensor([[0, 1, 2, 3, 4], [5, 5, 2, 0, 1]], device=device),
    }[positions]
    tables = [_randn(rows, 24, dtype=dtype, device=device, seed=rows) for rows in (7, 6, 2)]
    weight = 1 + 0.2 * _randn(24, dtype=dtype, device=device, seed=1)
    bias = _randn(24, dtype=dtype, device=device, seed=2)
    return (ids, token_types if types else None, position_ids, *tables, weight, bias, 1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("types, positions", [(False, None), (True, "shared"), (True, "per-row")])
def test_embeddings_gradients(device, dtype, types, positions) -> None:
    args = _embedding_args(device, dtype, types, positions)
    check_gradients(
        K.embeddings_layer_norm,
        R.embeddings_layer_norm,
        args,
        _randn(2, 5, 24, device=device, seed=4),
    )


@pytest.mark.parametrize("op", [K.embeddings_layer_norm, torch_ops.embeddings_layer_norm])
def test_embeddings_padding_rows_get_no_gradient(device, op) -> None:
    """padding_idx / position_padding_idx (word 3, position 1: both used twice or more) as
    ``nn.Embedding(padding_idx=...)``: those rows' gradients are zero, the others' the
    reference's."""
    args = _embedding_args(device, torch.float32, True, "shared")
    rows = {"padding_idx": 3, "position_padding_idx": 1}
    dout = _randn(2, 5, 24, device=device, seed=4)
    check_gradients(partial(op, **rows), partial(R.embeddings_layer_norm, **rows), args, dout)
    leaves = _as(args, torch.float32)
    out = op(*leaves, **rows)
    dword, dpos = torch.autograd.grad(out, [leaves[3], leaves[4]], dout)
    assert torch.equal(dword[3], torch.zeros(24, device=device))
    assert torch.equal(dpos[1], torch.zeros(24, device=device))
    assert dword[1].abs().max() > 0 and dpos[4].abs().max() > 0


def test_embeddings_gradient_rows_of_unused_ids_are_zero(device) -> None:
    args = _embedding_args(device, torch.float32, True, "shared")
    leaves = _as(args, torch.float32)
    out = K.embeddings_layer_norm(*leaves)
    dword, dpos = torch.autograd.grad(out, [leaves[3], leaves[4]], torch.ones_like(out))
    zeros = torch.zeros(24, device=dword.device)
    assert torch.equal(dword[4], zeros) and torch.equal(dpos[3], zeros)


# ---------------------------------------------------------------- scaled_masked_softmax


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("masked", [False, True])
def test_softmax_gradients(device, dtype, masked) -> None:
    scores = _randn(2, 2, 3, 37, dtype=dtype, device=device)
    mask = None
    if masked:  # batch row 1 has no real key: its rows are empty
        mask = torch.zeros(2, 37, dtype=torch.bool, device=device)
        mask[0, :20] = True
    dout = _randn(2, 2, 3, 37, device=device, seed=4)
    check_gradients(K.scaled_masked_softmax, R.scaled_masked_softmax, (scores, mask, 0.6), dout)


def test_softmax_gradient_is_zero_at_masked_keys_and_empty_rows(device) -> None:
    scores = _randn(2, 1, 2, 9, device=device).requires_grad_()
    mask = torch.tensor([[1] * 5 + [0] * 4, [0] * 9], device=device)
    probs = K.scaled_masked_softmax(scores, mask, 2.0)
    (grad,) = torch.autograd.grad(probs, [scores], _randn(2, 1, 2, 9, device=device, seed=1))
    assert torch.equal(grad[0, :, :, 5:], torch.zeros_like(grad[0, :, :, 5:]))
    assert torch.equal(grad[1], torch.zeros_like(grad[1]))
    assert grad[0, :, :, :5].abs().min() > 0


def test_softmax_gradient_of_non_contiguous_output_gradient(device) -> None:
    scores = _randn(1, 2, 3, 9, device=device)
    dout = _randn(9, 3, 2, 1, device=device, seed=4).permute(3, 2, 1, 0)
    check_gradients(K.scaled_masked_softmax, R.scaled_masked_softmax, (scores, None, 1.0), dout)


# ---------------------------------------------------------------- inference path


CALLS = {
    "layer_norm": lambda g, d: K.layer_norm(
        g(_randn(2, 8, device=d)), _randn(8, device=d), _randn(8, device=d), 1e-5
    ),
    "linear": lambda g, d: K.linear(
        _randn(2, 8, device=d), g(_randn(4, 8, device=d)), _randn(4, device=d), "gelu"
    ),
    "scaled_masked_softmax": lambda g, d: K.scaled_masked_softmax(g(_randn(1, 1, 2, 4, device=d))),
    "embeddings_layer_norm": lambda g, d: K.embeddings_layer_norm(
        torch.tensor([[1, 2, 3]], device=d),
        None,
        None,
        g(_randn(5, 8, device=d)),
        _randn(4, 8, device=d),
        _randn(1, 8, device=d),
        _randn(8, device=d),
        _randn(8, device=d),
        1e-12,
    ),
}


@pytest.mark.parametrize("op", sorted(CALLS))
def test_gradient_path_output_equals_inference_output(device, op) -> None:
    """With an input requiring grad the op records a backward and returns the same output
    as without (or under no_grad), where it records none."""
    call = CALLS[op]
    trained = call(lambda t: t.requires_grad_(), device)
    assert trained.grad_fn is not None
    with torch.no_grad():
        plain = call(lambda t: t.requires_grad_(), device)
    assert plain.grad_fn is None and not plain.requires_grad
    assert torch.equal(trained.detach(), plain)
    assert torch.equal(call(lambda t: t, device), plain)


@pytest.mark.parametrize("op", sorted(CALLS))
def test_a_gradient_of_the_gradient_is_refused(device, op) -> None:
    """The backward kernels record no graph: a gradient taken with create_graph=True (a
    gradient penalty) came back detached, and the loss built on it trained on gradients 0.1
    to 1.4 off (relative); it raises instead."""
    leaves = []

    def leaf(t: torch.Tensor) -> torch.Tensor:
        leaves.append(t.requires_grad_())
        return t

    out = CALLS[op](leaf, device)
    with pytest.raises(RuntimeError, match="differentiable once"):
        torch.autograd.grad(out.square().sum(), leaves, create_graph=True)
    assert torch.autograd.grad(CALLS[op](leaf, device).sum(), leaves[-1:])[0].grad_fn is None


def test_empty_batches_give_zero_parameter_gradients(device) -> None:
    x = torch.zeros(0, 40, device=device, requires_grad=True)
    weight = _randn(36, 40, device=device).requires_grad_()
    bias = _randn(36, device=device, seed=1).requires_grad_()
    out = K.linear(x, weight, bias, "gelu")
    dx, dweight, dbias = torch.autograd.grad(out, [x, weight, bias], torch.ones_like(out))
    assert dx.shape == (0, 40)
    assert torch.equal(dweight, torch.zeros_like(dweight))
    assert torch.equal(dbias, torch.zeros_like(dbias))
    gamma = _randn(40, device=device, seed=2).requires_grad_()
    out = K.layer_norm(x, gamma, bias[:1].expand(40), 1e-5)
    dx, dgamma = torch.autograd.grad(out, [x, gamma], torch.ones_like(out))
    assert dx.shape == (0, 40) and torch.equal(dgamma, torch.zeros_like(dgamma))


@pytest.mark.parametrize("activation", [None, "gelu"])
def test_linear_gradients_without_input_features(device, activation) -> None:
    """K = 0: the output is act(bias), and dbias is still the column sum of dY'."""
    x = torch.zeros(3, 0, device=device)
    weight = torch.zeros(5, 0, device=device)
    bias = _randn(5, device=device, seed=2)
    check_gradients(
        K.linear, R.linear, (x, weight, bias, activation, None), _randn(3, 5, device=device, seed=4)
    )
