"""Gradients of K.attention and K.attention_varlen (Triton backward kernels) against autograd of
the float64 reference (tests/accuracy.py rule), attention-probability dropout against the
reference applying the kernel's own keep mask, and the custom ops' autograd registration.

CPU (Triton interpreter): fp32 and fp16 on small shapes; bf16 on the GPU (``gpu`` mark).
"""

from __future__ import annotations

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import dropout
from fastbert.kernels import reference as R
from tests.accuracy import assert_within_rule
from tests.dropout_masks import next_seed
from tests.op_cases import DOT_DTYPES, padded_mask, randn
from tests.test_attention import qkv

F16, F32 = torch.float16, torch.float32
OPS = torch.ops.fastbert


def _grads(fn, inputs, grad_out, *args, **kwargs) -> tuple[torch.Tensor, ...]:
    """(out, dq, dk, dv) of ``fn(q, k, v, *args, **kwargs)`` for leaf copies of ``inputs``."""
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves, *args, **kwargs)
    return (out, *torch.autograd.grad(out, leaves, grad_out.to(out.dtype)))


def check_gradients(kernel, reference, inputs, args=(), kwargs=None, where=None, grad_out=None):
    """Hold the kernel's output and q / k / v gradients to the rule against the reference's
    autograd in the same dtype and in float64; return the kernel's (out, dq, dk, dv).
    ``grad_out`` defaults to a contiguous random tensor."""
    kwargs = kwargs or {}
    if grad_out is None:
        out = kernel(*inputs, *args, **kwargs)
        grad_out = randn(out.shape, F32, "cpu", seed=99).to(out.device)
    got = _grads(kernel, inputs, grad_out, *args, **kwargs)
    same_dtype = _grads(reference, inputs, grad_out, *args, **kwargs)
    wide = [t.double() for t in inputs]
    ref = _grads(reference, wide, grad_out, *args, **kwargs)
    for name, g, t, r, x in zip(
        ("out", "dq", "dk", "dv"), got, same_dtype, ref, (same_dtype[0], *inputs)
    ):
        assert g.shape == x.shape and g.dtype == x.dtype, f"{name}: {g.shape} {g.dtype}"
        mask = None if where is None else where[name]
        assert_within_rule(g, t, r, mask, what=name)
    return got


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80])
@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_dense_gradients(device, dtype, head_dim, masked) -> None:
    q, k, v = qkv(2, 2, 37, 37, head_dim, dtype, device, seed=head_dim)
    mask = padded_mask([37, 20], 37, device=device) if masked else None
    check_gradients(K.attention, R.attention, (q, k, v), (mask,))


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("seq_q, seq_k", [(7, 70), (70, 9), (1, 33)])
def test_query_and_key_lengths_differ(device, dtype, seq_q, seq_k) -> None:
    q, k, v = qkv(2, 2, seq_q, seq_k, 32, dtype, device, seed=seq_q + seq_k)
    mask = padded_mask([seq_k, (seq_k + 1) // 2], seq_k, device=device)
    check_gradients(K.attention, R.attention, (q, k, v), (mask,), {"scale": 0.3})


@pytest.mark.parametrize("layout", ["bshd", "fused"])
def test_strided_views(device, layout) -> None:
    """Hugging Face's transposed views and slices of a fused QKV buffer are read in place."""
    q, k, v = qkv(2, 2, 33, 33, 64, F16, device, seed=5, layout=layout)
    assert not q.is_contiguous()
    check_gradients(K.attention, R.attention, (q, k, v), (padded_mask([33, 9], 33, device=device),))


def test_output_gradient_in_any_layout(device) -> None:
    """The output gradient arrives in whatever layout the graph above produced: Hugging Face
    reshapes the output's [B, S, H, D] transpose, so its gradient comes as a transposed view."""
    q, k, v = qkv(2, 3, 17, 17, 64, F32, device, seed=6)
    mask = padded_mask([17, 5], 17, device=device)
    grad_out = randn((2, 17, 3, 64), F32, "cpu", seed=5).to(device).transpose(1, 2)
    check_gradients(K.attention, R.attention, (q, k, v), (mask,), grad_out=grad_out)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_fully_padded_row_and_masked_keys_get_zero_gradients(device, dtype) -> None:
    q, k, v = qkv(3, 2, 20, 20, 64, dtype, device, seed=7)
    mask = padded_mask([20, 0, 6], 20, device=device)
    _, dq, dk, dv = check_gradients(K.attention, R.attention, (q, k, v), (mask,))
    assert torch.equal(dq[1], torch.zeros_like(dq[1]))
    pad = ~mask[:, None, :, None].expand_as(dk)
    assert torch.equal(dk[pad], torch.zeros_like(dk[pad]))
    assert torch.equal(dv[pad], torch.zeros_like(dv[pad]))


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_nan_and_inf_in_masked_keys_do_not_reach_the_gradients(device, dtype) -> None:
    q, k, v = qkv(2, 2, 20, 20, 64, dtype, device, seed=8)
    mask = padded_mask([20, 11], 20, device=device)
    pad = ~mask[:, None, :, None]
    k_bad = torch.where(pad, torch.full_like(k, float("nan")), k)
    v_bad = torch.where(pad, torch.full_like(v, float("inf")), v)
    grad_out = randn(q.shape, F32, "cpu", seed=1).to(device)
    clean = _grads(K.attention, (q, k, v), grad_out, mask)
    dirty = _grads(K.attention, (q, k_bad, v_bad), grad_out, mask)
    for name, a, b in zip(("out", "dq", "dk", "dv"), clean, dirty):
        assert torch.isfinite(b).all(), f"{name}: non-finite values"
        assert torch.equal(a, b), name


def _varlen_inputs(dtype, device, head_dim=64):
    cu_seqlens = torch.tensor([0, 9, 9, 30, 31], dtype=torch.int32, device=device)
    q, k, v = (randn((31, 2, head_dim), dtype, device, seed=i) for i in range(3))
    return (q, k, v), cu_seqlens


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("head_dim", [64, 80])
def test_varlen_gradients(device, dtype, head_dim) -> None:
    inputs, cu_seqlens = _varlen_inputs(dtype, device, head_dim)
    check_gradients(K.attention_varlen, R.attention_varlen, inputs, (cu_seqlens, 21))


def test_varlen_max_seqlen_below_the_longest_is_still_correct(device) -> None:
    """The backward's grid-stride loops cover what a small max_seqlen leaves out of the grid."""
    inputs, cu_seqlens = _varlen_inputs(F32, device)
    check_gradients(K.attention_varlen, R.attention_varlen, inputs, (cu_seqlens, 1))


def test_no_gradient_needed_runs_the_inference_path(device) -> None:
    q, k, v = qkv(1, 2, 9, 9, 32, F32, device, seed=2)
    assert K.attention(q, k, v).grad_fn is None
    with torch.no_grad():
        assert K.attention(q, k, v.requires_grad_()).grad_fn is None
    assert K.attention(q, k, v).grad_fn is not None


# Dropout.


@pytest.mark.parametrize("dropout_p", [-0.1, 1.0, "0.1", True])
def test_bad_dropout_p_raises(device, dropout_p) -> None:
    q, k, v = qkv(1, 1, 4, 4, 32, F32, device, seed=0)
    with pytest.raises(ValueError, match="dropout_p"):
        K.attention(q, k, v, dropout_p=dropout_p)
    with pytest.raises(ValueError, match="dropout_p"):
        K.attention_varlen(
            q[0].transpose(0, 1),
            k[0].transpose(0, 1),
            v[0].transpose(0, 1),
            torch.tensor([0, 4], dtype=torch.int32, device=device),
            4,
            dropout_p=dropout_p,
        )


def test_dropout_zero_is_the_plain_kernel_bit_for_bit(device) -> None:
    q, k, v = qkv(2, 2, 33, 33, 64, F16, device, seed=3)
    mask = padded_mask([33, 5], 33, device=device)
    assert torch.equal(K.attention(q, k, v, mask, dropout_p=0.0), K.attention(q, k, v, mask))


@pytest.mark.parametrize("dropout_p", [0.1, 0.5])
def test_keep_rate_is_within_statistical_bounds(device, dropout_p) -> None:
    keep = dropout.keep_mask_of((4, 4, 64, 64), next_seed(0), dropout_p, device)
    n = keep.numel()
    sigma = (dropout_p * (1 - dropout_p) / n) ** 0.5
    assert abs(keep.float().mean().item() - (1 - dropout_p)) < 5 * sigma


def test_dropout_scales_the_kept_probabilities(device) -> None:
    """q = 0 gives uniform probabilities 1 / S_k; with V = 1 each output is the row's kept
    count times 1 / ((1 - p) S_k): the kept ones are scaled by 1 / (1 - p), the normaliser
    counts every key."""
    p, seq = 0.25, 40
    q = torch.zeros(1, 2, seq, 32, device=device)
    k = randn((1, 2, seq, 32), F32, device, seed=4)
    v = torch.ones(1, 2, seq, 32, device=device)
    torch.manual_seed(4)
    out = K.attention(q, k, v, dropout_p=p)
    keep = dropout.keep_mask_of((1, 2, seq, seq), next_seed(4), p, device)
    expected = keep.sum(-1, keepdim=True) / ((1 - p) * seq)
    torch.testing.assert_close(out, expected.expand_as(out), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_dense_dropout_matches_the_reference_with_the_kernels_mask(device, dtype) -> None:
    """Output and gradients of one call equal the reference's applying the kernel's keep mask
    (the backward regenerates the forward's mask)."""
    p = 0.3
    q, k, v = qkv(2, 2, 21, 29, 64, dtype, device, seed=11)
    mask = padded_mask([29, 8], 29, device=device)
    keep = dropout.keep_mask_of((2, 2, 21, 29), next_seed(6), p, device)

    def kernel(*qkv_, **kw):
        torch.manual_seed(6)
        return K.attention(*qkv_, **kw)

    def reference(*qkv_, **kw):
        return R.attention(*qkv_, **kw, dropout_mask=keep)

    check_gradients(kernel, reference, (q, k, v), (mask,), {"dropout_p": p})


def test_varlen_dropout_matches_the_reference_with_the_kernels_mask(device) -> None:
    p = 0.4
    inputs, cu_seqlens = _varlen_inputs(F32, device)
    tokens, heads = inputs[0].shape[:2]
    keep = dropout.keep_mask_of((heads, tokens, tokens), next_seed(7), p, device)

    def kernel(*args, **kw):
        torch.manual_seed(7)
        return K.attention_varlen(*args, **kw)

    def reference(*args, **kw):
        return R.attention_varlen(*args, **kw, dropout_mask=keep)

    check_gradients(kernel, reference, inputs, (cu_seqlens, 21), {"dropout_p": p})


def test_dropout_is_reproducible_under_manual_seed(device) -> None:
    q, k, v = qkv(1, 2, 17, 17, 32, F32, device, seed=12)
    runs = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        runs.append(K.attention(q, k, v, dropout_p=0.5))
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


# Custom ops: autograd registration, opcheck, torch.compile. The ops take the scale resolved
# (the public functions resolve None to D**-0.5 before calling them).
SCALE = 32**-0.5


def _op_args(device, requires_grad=True):
    q, k, v = (
        randn((2, 9, 2, 32), F32, device, seed=i).transpose(1, 2).requires_grad_(requires_grad)
        for i in range(3)
    )
    return q, k, v, padded_mask([9, 4], 9, device=device)


def test_opcheck_attention_with_gradients(device) -> None:
    q, k, v, mask = _op_args(device)
    torch.library.opcheck(
        OPS.attention.default, (q, k, v, mask, SCALE, 0.0, None, None, None, None, True)
    )


def test_opcheck_attention_varlen_with_gradients(device) -> None:
    inputs, cu_seqlens = _varlen_inputs(F32, device, head_dim=32)
    inputs = [t.requires_grad_() for t in inputs]
    torch.library.opcheck(
        OPS.attention_varlen.default,
        (*inputs, cu_seqlens, 21, 0.5, 0.0, None, None, None, None, True),
    )


def test_opcheck_backward_ops(device) -> None:
    """The backward ops' schemas and fake implementations (what torch.compile traces)."""
    q, k, v, mask = _op_args(device, requires_grad=False)
    seed = dropout.draw_seed_tensor()
    out, lse = OPS.attention(q, k, v, mask, SCALE, 0.1, None, None, None, seed, True)
    grad_out = randn(out.shape, F32, "cpu", seed=2).to(device)
    torch.library.opcheck(
        OPS.attention_backward.default,
        (grad_out, q, k, v, out, lse, mask, 0.4, 0.1, seed, None, None, None),
    )
    inputs, cu_seqlens = _varlen_inputs(F32, device, head_dim=32)
    out, lse = OPS.attention_varlen(
        *inputs, cu_seqlens, 21, SCALE, 0.0, None, None, None, None, True
    )
    torch.library.opcheck(
        OPS.attention_varlen_backward.default,
        (torch.ones_like(out), *inputs, out, lse, cu_seqlens, 21, 0.2, 0.0, None, None, None, None),
    )


def test_custom_op_gradients_match_the_kernels(device) -> None:
    """The custom op's registered autograd (the backward custom op) gives the reference's
    gradients, with dropout too (the kernel's keep mask applied to the reference)."""
    q, k, v, mask = _op_args(device)
    grad_out = randn(q.shape, F32, "cpu", seed=3).to(device)
    seed = dropout.draw_seed_tensor()
    out, _ = OPS.attention(q, k, v, mask, SCALE, 0.2, None, None, None, seed, True)
    got = torch.autograd.grad(out.transpose(1, 2), (q, k, v), grad_out)
    keep = dropout.keep_mask_of((2, 2, 9, 9), int(seed), 0.2, device)
    ref_out = R.attention(q, k, v, mask, dropout_p=0.2, dropout_mask=keep)
    expected = torch.autograd.grad(ref_out, (q, k, v), grad_out)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def test_compiled_training_step_fullgraph(device) -> None:
    """torch.compile(fullgraph=True) traces the op and its backward (aot_eager on the CPU)."""
    q, k, v, mask = _op_args(device)
    grad_out = randn(q.shape, F32, "cpu", seed=4).to(device)

    def step(q, k, v):
        return K.attention(q, k, v, mask)

    expected = torch.autograd.grad(step(q, k, v), (q, k, v), grad_out)
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(step, fullgraph=True, backend=backend)
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v), grad_out)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e)
