"""fastbert.kernels.torch_ops (the torch backend) against the float64 reference (the rule of
tests/accuracy.py).

Every op in fp32, fp16 and bf16 on the CPU, on the hard shapes of tests/op_cases.py: sequence
lengths 1 to 512, head dims 32 to 128, a fully padded row, Hugging Face's transposed views,
NaN and Inf at masked keys; and the unchecked ops the encoder runs against the public ones.
"""

from __future__ import annotations

import functools

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import cpu_engine
from fastbert.kernels import reference as R
from fastbert.kernels import torch_ops as T
from tests.accuracy import assert_within_rule
from tests.op_cases import ALL_DTYPES, check_op, dtype_params, lengths_for, padded_mask, randn
from tests.test_attention import POISON_SHAPES, POISONS, packed_qkv, poisoned, qkv

DTYPES = dtype_params(ALL_DTYPES)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "batch, heads, seq",
    [(2, 2, 1), (2, 2, 7), (3, 2, 33), (2, 2, 127), (2, 2, 129), (1, 1, 511), (1, 1, 512)],
)
def test_attention_sequence_lengths(dtype, batch, heads, seq) -> None:
    q, k, v = qkv(batch, heads, seq, seq, 64, dtype, "cpu", seed=seq)
    check_op(T.attention, R.attention, (q, k, v), {"key_padding_mask": None})
    mask = padded_mask(lengths_for(batch, seq), seq)
    check_op(T.attention, R.attention, (q, k, v), {"key_padding_mask": mask})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128])
@pytest.mark.parametrize("layout", ["bhsd", "bshd", "fused"])
def test_attention_head_dims_and_views(dtype, head_dim, layout) -> None:
    """A fully padded row (zeros), a one-key row, HF's transposed and fused-QKV views."""
    q, k, v = qkv(4, 2, 33, 33, head_dim, dtype, "cpu", seed=head_dim, layout=layout)
    mask = padded_mask([33, 17, 1, 0], 33, torch.int64)
    out = check_op(T.attention, R.attention, (q, k, v), {"key_padding_mask": mask, "scale": 0.3})
    assert torch.equal(out[3], torch.zeros_like(out[3]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", POISON_SHAPES)
@pytest.mark.parametrize("poison", POISONS)
def test_nonfinite_masked_keys_have_no_influence(dtype, shape, poison) -> None:
    """NaN / Inf in K and V at masked keys: the output is the one of finite inputs, finite,
    and zeros on a fully padded row."""
    lengths, seq_q, seq_k, head_dim, layout = POISON_SHAPES[shape]
    q, k, v = qkv(len(lengths), 2, seq_q, seq_k, head_dim, dtype, "cpu", seed=12, layout=layout)
    mask = padded_mask(lengths, seq_k)
    k_value, v_value = POISONS[poison]
    out = T.attention(q, poisoned(k, mask, k_value), poisoned(v, mask, v_value), mask)
    assert torch.isfinite(out).all()
    clean = check_op(T.attention, R.attention, (q, k, v), {"key_padding_mask": mask})
    assert torch.equal(out, clean)
    empty = mask.sum(1) == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [32, 64, 80])
@pytest.mark.parametrize("lengths", [[5, 0, 70, 1, 17], [1], [33, 33], [129, 7]], ids=str)
def test_attention_varlen(dtype, head_dim, lengths) -> None:
    """Packed sequences (a zero-length and a one-token one among them), with max_seqlen the
    longest or more."""
    q, k, v, cu = packed_qkv(lengths, 2, head_dim, dtype, "cpu", seed=head_dim)
    for max_seqlen in (max(lengths), max(lengths) + 5):
        out = check_op(T.attention_varlen, R.attention_varlen, (q, k, v, cu, max_seqlen))
        assert out.is_contiguous()


ROTARY_32 = 1.0 / 10_000 ** (torch.arange(0, 32, 2, dtype=torch.float32) / 32)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lengths", [[5, 0, 70, 1, 17], [33, 33, 2, 2, 2]], ids=str)
@pytest.mark.parametrize("variant", ["plain", "rotary-window", "relative-bias"])
def test_attention_varlen_by_path(dtype, lengths, variant) -> None:
    """Both paths of the packed attention: a CPU runs one SDPA call per run of equal lengths
    (eager), CUDA and torch.compile gather the packed tokens into one masked batch (traced by
    Dynamo here); each against the reference, with ModernBERT's and MPNet's variants."""
    q, k, v, cu = packed_qkv(lengths, 2, 32, dtype, "cpu", seed=len(lengths))
    # The rotary frequencies stay float32 for the float64 oracle too (check_op widens kwargs).
    fixed = {"rotary": ROTARY_32, "window": 8} if variant == "rotary-window" else {}
    widened = {}
    if variant == "relative-bias":
        widened = {"relative_bias": randn((2, 32), torch.float32, "cpu", seed=5)}
    op = functools.partial(K.OPS["attention_varlen"].torch, **fixed)
    reference = functools.partial(R.attention_varlen, **fixed)
    torch._dynamo.reset()
    gathered = torch.compile(op, fullgraph=True, backend="eager")
    for path in (op, gathered):
        check_op(path, reference, (q, k, v, cu, max(lengths) + 3), widened)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("poison", ["nan", "inf"])
def test_varlen_other_sequences_never_leak(dtype, poison) -> None:
    """NaN / Inf in every token of one sequence: the others' outputs stay finite and exact."""
    lengths = [5, 33, 0, 1, 17]
    q, k, v, cu = packed_qkv(lengths, 2, 64, dtype, "cpu", seed=13)
    bad = [t.clone() for t in (q, k, v)]
    for t in bad:
        t[5:38] = float(poison)
    out = T.attention_varlen(*bad, cu, max(lengths))
    others = torch.ones(out.shape, dtype=torch.bool)
    others[5:38] = False
    assert torch.isfinite(out[others]).all()
    assert torch.equal(out[others], T.attention_varlen(q, k, v, cu, max(lengths))[others])
    ref = R.attention_varlen(q.double(), k.double(), v.double(), cu, max(lengths))
    assert_within_rule(out, R.attention_varlen(q, k, v, cu, max(lengths)), ref, where=others)


def _torch_dropout_runs(seed: int, dropout_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense and padding-free outputs with q = 0 (uniform probabilities over 40 keys), V = 1."""
    q, v = torch.zeros(1, 2, 40, 32), torch.ones(1, 2, 40, 32)
    packed = (torch.zeros(40, 2, 32), torch.zeros(40, 2, 32), torch.ones(40, 2, 32))
    cu = torch.tensor([0, 40], dtype=torch.int32)
    torch.manual_seed(seed)
    dense = T.attention(q, q, v, dropout_p=dropout_p)
    return dense, T.attention_varlen(*packed, cu, 40, dropout_p=dropout_p)


@pytest.mark.parametrize("which", [0, 1], ids=["dense", "varlen"])
def test_attention_dropout(which) -> None:
    """SDPA's dropout: each output is the row's kept count / ((1 - p) * 40), averaging 1;
    reproducible under torch.manual_seed; p = 0 is the plain op."""
    p = 0.25
    out = _torch_dropout_runs(0, p)[which]
    kept = out * (1 - p) * 40
    torch.testing.assert_close(kept, kept.round())
    assert (out != 1.0).any() and abs(out.mean().item() - 1.0) < 0.1
    assert torch.equal(out, _torch_dropout_runs(0, p)[which])
    assert torch.equal(_torch_dropout_runs(0, 0.0)[which], torch.ones_like(out))
    with pytest.raises(ValueError, match="dropout_p"):
        _torch_dropout_runs(0, 1.0)


def test_varlen_refuses_a_short_max_seqlen() -> None:
    q, k, v, cu = packed_qkv([5, 9], 2, 32, torch.float32, "cpu")
    with pytest.raises(ValueError, match="max_seqlen is 8 but cu_seqlens holds a sequence of 9"):
        T.attention_varlen(q, k, v, cu, 8)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seq", [1, 33, 129])
def test_scaled_masked_softmax(dtype, seq) -> None:
    scores = randn((3, 2, seq, seq), dtype, "cpu", seed=seq, scale=3.0)
    mask = padded_mask([seq, max(1, seq // 2), 0], seq)
    scores[~mask[:, None, None, :].expand_as(scores)] = float("nan")
    out = check_op(T.scaled_masked_softmax, R.scaled_masked_softmax, (scores, mask, 0.7))
    assert torch.isfinite(out).all()
    assert torch.equal(out[2], torch.zeros_like(out[2]))
    check_op(T.scaled_masked_softmax, R.scaled_masked_softmax, (scores[:1], None, 0.7))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "gelu", "gelu_tanh"])
@pytest.mark.parametrize("rows", [1, 7, 129])
def test_linear(dtype, activation, rows) -> None:
    x = randn((rows, 80), dtype, "cpu", seed=rows)
    weight = randn((96, 80), dtype, "cpu", seed=1, scale=0.1)
    bias = randn((96,), dtype, "cpu", seed=2)
    residual = randn((rows, 96), dtype, "cpu", seed=3)
    check_op(T.linear, R.linear, (x, weight, bias, activation, residual))
    check_op(T.linear, R.linear, (x[None], weight, None, activation))
    # A call autograd records takes F.linear (oneDNN's inference op has no derivative).
    recorded = check_op(T.linear, R.linear, (x.requires_grad_(), weight, bias, activation))
    assert recorded.grad_fn is not None


def test_linear_keeps_gradients() -> None:
    """In place only where autograd does not record: the op still differentiates."""
    x = randn((5, 8), torch.float64, "cpu", seed=0).requires_grad_()
    weight = randn((4, 8), torch.float64, "cpu", seed=1)
    residual = randn((5, 4), torch.float64, "cpu", seed=2)
    assert torch.autograd.gradcheck(lambda t: T.linear(t, weight, None, "gelu", residual), (x,))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [32, 384, 1024])
def test_layer_norm(dtype, width) -> None:
    x = randn((3, 7, width), dtype, "cpu", seed=width, scale=4.0)
    residual = randn((3, 7, width), dtype, "cpu", seed=1)
    weight = randn((width,), dtype, "cpu", seed=2)
    bias = randn((width,), dtype, "cpu", seed=3)
    check_op(T.layer_norm, R.layer_norm, (x, weight, bias, 1e-12, residual))
    check_op(T.layer_norm, R.layer_norm, (x, weight, bias, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inputs", ["all", "ids-only", "positions-1d"])
def test_embeddings_layer_norm(dtype, inputs) -> None:
    batch, seq, hidden = 3, 33, 80
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (batch, seq), generator=gen, dtype=torch.int32)
    types = torch.randint(0, 2, (batch, seq), generator=gen).to(torch.int16)
    positions = torch.randint(0, 40, (batch, seq), generator=gen)
    if inputs == "ids-only":
        types, positions = None, None
    elif inputs == "positions-1d":
        positions = torch.arange(seq).flip(0)
    tables = [randn((rows, hidden), dtype, "cpu", seed=rows) for rows in (50, 40, 2)]
    weight = randn((hidden,), dtype, "cpu", seed=5)
    bias = randn((hidden,), dtype, "cpu", seed=6)
    check_op(
        T.embeddings_layer_norm,
        R.embeddings_layer_norm,
        (ids, types, positions, *tables, weight, bias, 1e-12),
    )
    with pytest.raises(ValueError, match="input_ids must lie in"):
        T.embeddings_layer_norm(ids + 50, types, positions, *tables, weight, bias, 1e-12)


def test_unchecked_ops_compute_the_public_ops() -> None:
    """The encoder's unchecked ops give the public ops' outputs bit for bit."""
    q, k, v = qkv(2, 2, 9, 9, 32, torch.float32, "cpu", layout="fused")
    mask = padded_mask([9, 4], 9)
    assert torch.equal(K.OPS["attention"].torch(q, k, v, mask), T.attention(q, k, v, mask))
    pq, pk, pv, cu = packed_qkv([4, 9], 2, 32, torch.float32, "cpu")
    assert torch.equal(
        K.OPS["attention_varlen"].torch(pq, pk, pv, cu, 9), T.attention_varlen(pq, pk, pv, cu, 9)
    )
    x, w = randn((4, 8), torch.float32, "cpu", 0), randn((6, 8), torch.float32, "cpu", 1)
    assert torch.equal(K.OPS["linear"].torch(x, w, None, "gelu"), T.linear(x, w, None, "gelu"))


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda: T.attention(
                torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 7)
            ),
            ValueError,
            "v must have shape",
        ),
        (
            lambda: T.attention_varlen(
                *packed_qkv([3], 1, 8, torch.float32, "cpu")[:3], torch.tensor([0, 3]), 3
            ),
            TypeError,
            "cu_seqlens must be int32",
        ),
        (lambda: T.linear(torch.zeros(2, 3), torch.zeros(4, 5)), ValueError, "input features"),
        (
            lambda: T.layer_norm(torch.zeros(2, 3), torch.zeros(3), torch.zeros(4), 1e-5),
            ValueError,
            "bias must have shape",
        ),
        (
            lambda: T.scaled_masked_softmax(torch.zeros(1, 1, 2, 2), torch.zeros(1, 2), 1.0),
            TypeError,
            "additive float masks",
        ),
    ],
)
def test_public_ops_validate(call, error, match) -> None:
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("engine", [False, True], ids=["plain", "cpu-engine"])
@pytest.mark.parametrize("op", ["attention", "attention_varlen"])
def test_unchecked_attention_traces_as_one_graph(op, engine) -> None:
    """The encoder's attention ops read nothing on the host: Dynamo traces each as one graph
    (fullgraph=True raises on a graph break), with the eager outputs of the plain path. The
    CPU engine's op traces too: under torch.compile it hands every call to the plain op (its
    compiled attention and per-length host reads are not traced)."""
    function = cpu_engine.OPS[op] if engine else K.OPS[op].torch
    if op == "attention":
        q, k, v = qkv(3, 2, 9, 9, 32, torch.float32, "cpu", layout="fused")
        args = (q, k, v, padded_mask([9, 4, 0], 9))
    else:
        args = (*packed_qkv([4, 0, 9], 2, 32, torch.float32, "cpu"), 9)
    torch._dynamo.reset()
    compiled = torch.compile(function, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(*args), K.OPS[op].torch(*args), rtol=0, atol=0)
