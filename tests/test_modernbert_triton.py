"""ModernBERT on the Triton kernels: rotary positions and the sliding window in the attention
kernel, the gated (GeGLU) linear, against the float64 reference (tests/accuracy.py rule) and,
end to end, against Hugging Face's ModernBERT (fp32, eager attention).

CPU: the Triton interpreter, fp32 and fp16, small shapes, forward and backward; the
sequences are longer than the window. That key tiles outside the window are never loaded is
checked by poisoning them.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import torch.nn.functional as F

import fastbert
from fastbert import kernels as K
from fastbert.kernels import flash_attention
from fastbert.kernels import reference as R
from tests.conftest import HAS_CUDA
from tests.op_cases import DOT_DTYPES, check_op, randn
from tests.test_modernbert import BOUND, _max_error, hf_modernbert, inputs
from tests.test_training import assert_grads_match, grads, weighted_sum


def inverse_frequencies(dim: int, base: float = 10000.0, device: str = "cpu") -> torch.Tensor:
    """float32 [dim / 2] RoPE inverse frequencies, as Hugging Face's default rotary init."""
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return (1.0 / base**exponents).to(device)


def padding_mask(lengths: list[int], seq: int, device: str) -> torch.Tensor:
    return (torch.arange(seq)[None] < torch.tensor(lengths)[:, None]).to(device)


def with_positions(rotary: torch.Tensor | None, window: int | None):
    """(kernel op, reference op) of dense attention with these positions bound (check_op
    widens its float keywords to float64; the frequencies stay float32)."""
    bind = functools.partial
    return bind(K.attention, rotary=rotary, window=window), bind(
        R.attention, rotary=rotary, window=window
    )


def qkv(batch, heads, seq, dim, dtype, device, seed=0):
    return tuple(randn((batch, heads, seq, dim), dtype, device, seed + i) for i in range(3))


# --- attention: rotary positions and the sliding window -----------------------------------


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize(
    "rotary, window", [(True, None), (False, 9), (True, 9), (True, 0)], ids=str
)
def test_attention_rotary_and_window(device, dtype, rotary, window) -> None:
    """Dense, with a right-padded row, a fully padded row and an unpadded one; 150 positions
    (past a 64-key tile and far past the window); the RoPE base puts angles near 150 rad."""
    lengths, seq, dim = [150, 70, 0], 150, 64
    q, k, v = qkv(3, 2, seq, dim, dtype, device, seed=window or 1)
    frequencies = inverse_frequencies(dim, device=device) if rotary else None
    kernel, reference = with_positions(frequencies, window)
    mask = padding_mask(lengths, seq, device)
    out = check_op(kernel, reference, (q, k, v), {"key_padding_mask": mask})
    assert torch.equal(out[2], torch.zeros_like(out[2]))  # no real key: zeros, never NaN
    check_op(kernel, reference, (q, k, v))


@pytest.mark.parametrize("head_dim", [32, 80, 128])
def test_attention_rotary_head_dims(device, head_dim) -> None:
    """The rotated halves of every head dim, 80's inside a 128-wide block."""
    q, k, v = qkv(1, 2, 70, head_dim, torch.float32, device, seed=head_dim)
    kernel, reference = with_positions(inverse_frequencies(head_dim, device=device), 20)
    check_op(kernel, reference, (q, k, v))


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_attention_varlen_rotary_and_window(device, dtype) -> None:
    """Padding-free: each sequence's own positions (the RoPE angle and the window restart at
    its first token), with max_seqlen below the longest sequence (still correct)."""
    lengths, heads, dim = [130, 1, 45, 0, 77], 2, 64
    tokens = sum(lengths)
    q, k, v = (randn((tokens, heads, dim), dtype, device, seed=i) for i in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    cu = cu.to(device)
    positions = {"rotary": inverse_frequencies(dim, device=device), "window": 12}
    kernel = functools.partial(K.attention_varlen, **positions)
    reference = functools.partial(R.attention_varlen, **positions)
    for max_seqlen in (130, 64):
        check_op(kernel, reference, (q, k, v, cu, max_seqlen))


def test_rotary_positions_are_the_sequences_own(device) -> None:
    """The same tokens packed after another sequence and alone give the same output: the
    rotation restarts at each sequence's first token."""
    dim = 32
    q, k, v = (randn((60, 1, dim), torch.float32, device, seed=i) for i in range(3))
    rotary = inverse_frequencies(dim, device=device)
    cu = torch.tensor([0, 25, 60], dtype=torch.int32, device=device)
    packed = K.attention_varlen(q, k, v, cu, 35, rotary=rotary, window=5)
    one = torch.tensor([0, 35], dtype=torch.int32, device=device)
    alone = K.attention_varlen(q[25:], k[25:], v[25:], one, 35, rotary=rotary, window=5)
    assert (packed[25:] - alone).abs().max() <= 1e-6


def _tiles_touching_window(block: int, block_m: int, block_n: int, window: int, seq: int):
    """The key tiles holding a key within ``window`` of one of the query block's queries:
    the tiles the kernel must visit (stated from the definition, not from the kernel's
    arithmetic)."""
    queries = range(block * block_m, min((block + 1) * block_m, seq))
    keys = {j for i in queries for j in range(max(0, i - window), min(seq, i + window + 1))}
    return {j // block_n for j in keys}


@pytest.mark.skipif(HAS_CUDA, reason="reads the interpreter's one tile config")
def test_key_tiles_outside_the_window_are_never_loaded() -> None:
    """A NaN value in a key tile reaches a query block's output when the block loads that
    tile (p = 0 times NaN is NaN) and cannot when it skips it: each query block's output is
    NaN exactly when its window touches the poisoned key's tile. Without the loop bound every
    block would load every tile and every row would be NaN."""
    block_m, block_n = flash_attention._INTERPRETER_CONFIG[:2]
    seq, window, dim = 4 * block_n, 8, 32
    q, k, v = qkv(1, 1, seq, dim, torch.float32, "cpu", seed=3)
    rotary = inverse_frequencies(dim)
    clean = K.attention(q, k, v, rotary=rotary, window=window)
    poisoned_key = seq - 6  # in the last tile, within the window of the last queries only
    v[0, 0, poisoned_key] = float("nan")
    out = K.attention(q, k, v, rotary=rotary, window=window)
    loaded_by = []
    for block in range(seq // block_m):
        rows = slice(block * block_m, (block + 1) * block_m)
        tiles = _tiles_touching_window(block, block_m, block_n, window, seq)
        assert len(tiles) < seq // block_n  # the window leaves tiles out
        if poisoned_key // block_n in tiles:
            loaded_by.append(block)
            assert torch.isnan(out[0, 0, rows]).any(), f"block {block} should load the tile"
        else:
            assert torch.equal(out[0, 0, rows], clean[0, 0, rows]), f"block {block} loaded it"
    assert 0 < len(loaded_by) < seq // block_m


def _attention_gradients(function, tensors: list, extra: tuple, grad_out, **positions) -> tuple:
    """dq, dk, dv of ``function(q, k, v, *extra, **positions)`` at copies of ``tensors``."""
    tensors = [t.detach().clone().requires_grad_() for t in tensors]
    out = function(*tensors, *extra, **positions)
    return torch.autograd.grad(out, tensors, grad_out.to(out.dtype))


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "varlen"])
@pytest.mark.parametrize("head_dim", [64, 80])
def test_attention_gradients_rotary_and_window(device, dtype, packed, head_dim) -> None:
    """dQ and dK (turned back from the rotated rows' gradients) and dV with RoPE and a window,
    the key and query loops bounded by the window, against float64 autograd of the reference
    by the 2x rule; a fully padded row (dense) or an empty sequence (varlen) included. Head
    dim 80 turns its gradients back by a gather of the swapped halves."""
    lengths, heads = [100, 0, 37], 2
    seq = max(lengths)
    positions = {"rotary": inverse_frequencies(head_dim, device=device), "window": 11}
    if packed:
        shape = (sum(lengths), heads, head_dim)
        bounds = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        cu = torch.tensor(bounds, dtype=torch.int32, device=device)
        extra, where = (cu, seq), None
    else:
        shape = (len(lengths), heads, seq, head_dim)
        mask = padding_mask(lengths, seq, device)
        extra, where = (mask,), mask[:, None, :, None].expand(shape)
    inputs = [randn(shape, dtype, device, seed=i) for i in range(3)]
    grad_out = randn(shape, dtype, device, seed=9)
    grad_out = grad_out if where is None else grad_out * where
    kernel = K.attention_varlen if packed else K.attention
    op = R.attention_varlen if packed else R.attention
    got = _attention_gradients(kernel, inputs, extra, grad_out, **positions)
    same = _attention_gradients(op, inputs, extra, grad_out, **positions)
    wide = [t.double() for t in inputs]
    exact = _attention_gradients(op, wide, extra, grad_out.double(), **positions)
    from tests.accuracy import assert_within_rule

    for name, g, s_, e in zip(("dq", "dk", "dv"), got, same, exact):
        assert torch.isfinite(g).all(), name
        assert_within_rule(g, s_, e, where, name)


# --- the gated linear ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh"])
@pytest.mark.parametrize("extras", [False, True], ids=["plain", "bias-residual"])
def test_gated_linear(device, dtype, activation, extras) -> None:
    """One GEMM for both halves (rows n and n + N / 2 of the weight), the product in the
    epilogue; N / 2 = 50 is not a multiple of the tile, M = 37 neither."""
    x = randn((37, 40), dtype, device, seed=1)
    weight = randn((100, 40), dtype, device, seed=2) / 6
    kwargs = {"activation": activation, "gated": True}
    if extras:
        kwargs["bias"] = randn((100,), dtype, device, seed=3)
        kwargs["residual"] = randn((37, 50), dtype, device, seed=4)
    out = check_op(K.linear, R.linear, (x, weight), kwargs)
    assert out.shape == (37, 50)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("activation", [None, "gelu"])
def test_gated_linear_gradients(device, dtype, activation) -> None:
    """dx, dweight and dbias of the gated linear against autograd of the float64 reference."""
    x = randn((2, 19, 40), dtype, device, seed=5)
    weight = randn((64, 40), dtype, device, seed=6) / 6
    bias = randn((64,), dtype, device, seed=7)
    grad = randn((2, 19, 32), dtype, device, seed=8)

    def gradients(op, cast):
        leaves = [cast(t).detach().requires_grad_() for t in (x, weight, bias)]
        op(*leaves[:2], leaves[2], activation, gated=True).backward(cast(grad))
        return [t.grad for t in leaves]

    got = gradients(K.linear, lambda t: t)
    same = gradients(R.linear, lambda t: t)
    wide = gradients(R.linear, torch.Tensor.double)
    from tests.accuracy import assert_within_rule

    for name, g, s, w in zip(("dx", "dweight", "dbias"), got, same, wide):
        assert_within_rule(g, s, w, None, name)


def unfused_gated_linear(x, weight, bias, activation):
    """The gated linear as Hugging Face's ModernBERT writes it: one F.linear chunked into input
    and gate, F.gelu of the input times the gate (differentiated by autograd's own kernels)."""
    value, gate = F.linear(x, weight, bias).chunk(2, dim=-1)
    if activation is not None:
        value = F.gelu(value, approximate="tanh" if activation == "gelu_tanh" else "none")
    return value * gate


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh"])
def test_gated_backward_prologue_forms_both_halves(device, dtype, activation) -> None:
    """The backward GEMMs form dY' of both halves in their prologue (dout * gate * act'(input)
    for the input's columns, dout * act(input) for the gate's): dx, and the input and gate
    halves of dweight and dbias each, against autograd of the unfused gated linear in float64
    by the 2x rule (the same in ``dtype`` the other side). N' = 50 puts the boundary between
    the halves inside a K tile of the dx product and inside a row tile of the dweight product,
    M = 37 is no multiple of a tile either; dout is a transposed view."""
    rows, features, half = 37, 40, 50
    x = randn((rows, features), dtype, device, seed=11)
    weight = randn((2 * half, features), dtype, device, seed=12) / 6
    bias = randn((2 * half,), dtype, device, seed=13)
    grad = randn((half, rows), dtype, device, seed=14).t()

    def gradients(op, cast):
        leaves = [cast(t).detach().requires_grad_() for t in (x, weight, bias)]
        op(*leaves, activation).backward(cast(grad))
        return [t.grad for t in leaves]

    def kernel(x, weight, bias, activation):
        return K.linear(x, weight, bias, activation, gated=True)

    got = gradients(kernel, lambda t: t)
    same = gradients(unfused_gated_linear, lambda t: t)
    wide = gradients(unfused_gated_linear, torch.Tensor.double)
    from tests.accuracy import assert_within_rule

    assert_within_rule(got[0], same[0], wide[0], None, "dx")
    for name, g, s, w in zip(("dweight", "dbias"), got[1:], same[1:], wide[1:]):
        for part, rows_of_half in (("input", slice(0, half)), ("gate", slice(half, None))):
            args = (g[rows_of_half], s[rows_of_half], w[rows_of_half])
            assert_within_rule(*args, None, f"{name} ({part} half)")


def test_bad_gated_linear_is_refused(device) -> None:
    x = randn((3, 8), torch.float32, device, seed=0)
    with pytest.raises(ValueError, match="even number of weight rows"):
        K.linear(x, randn((7, 8), torch.float32, device, seed=1), gated=True)
    with pytest.raises(ValueError, match="residual"):
        K.linear(x, randn((8, 8), torch.float32, device, seed=1), residual=x, gated=True)


# --- the model on the Triton kernels -------------------------------------------------------


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
def test_triton_backend_matches_hf(device, padding_free) -> None:
    """ModernBERT (global and sliding-window layers, GeGLU, pre-norm) with backend="triton"
    against Hugging Face's fp32 eager model, sequences past the window."""
    model = hf_modernbert(seed=7, num_hidden_layers=3).to(device)  # global, local, local
    ids, mask = inputs([45, 7, 20], seed=7, device=device)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
        fastbert.optimize(model, backend="triton", padding_free=padding_free)
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert _max_error(got, expected, mask) <= BOUND


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
def test_triton_gradients_match_hf(device, padding_free) -> None:
    """Every parameter's gradient (Wqkv through the rotary and windowed attention backward,
    the gated Wi, the norms, the tied embeddings) with backend="triton" against Hugging Face's
    fp32 eager model, sequences past the window."""
    model = hf_modernbert("ForMaskedLM", seed=8, num_hidden_layers=3).to(device).train()
    reference_model = copy.deepcopy(model)
    ids, mask = inputs([45, 9, 20], seed=8, device=device)
    batch = {"input_ids": ids, "attention_mask": mask}
    valid = mask.bool().cpu()
    weighted_sum(reference_model(**batch), valid).backward()
    fastbert.optimize(model, backend="triton", padding_free=padding_free)
    weighted_sum(model(**batch), valid).backward()
    assert_grads_match(grads(reference_model), grads(model))
