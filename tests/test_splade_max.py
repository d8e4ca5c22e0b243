"""K.splade_max (the fused SPLADE head) and its torch backend against the float64 reference,
which forms the whole [T, V] logits and activates them before the max, in
sentence-transformers' order: an independent check of the kernels' max-then-activate order.

CPU: the Triton kernel under the interpreter (32 x 32 x 32 tiles, so that sequences of 33 and
129 tokens span several row tiles and short ones share one) in float32 and float16, and the
torch backend with vocabulary chunks smaller than V, eager and under torch.compile. GPU
(``gpu`` mark): bfloat16 too, and BERT's head shape.
"""

from __future__ import annotations

import functools
import inspect
import itertools

import pytest
import torch

from fastbert import kernels as K
from fastbert.kernels import reference as R
from fastbert.kernels import sparse_head_torch as ST
from tests.accuracy import assert_within_rule
from tests.bad_inputs import bad_input_test, float64_case, interpreter_needed_test
from tests.op_cases import ALL_DTYPES, DOT_DTYPES, check_op, dtype_params, randn

# Sequence lengths: empty, one token, inside one row tile, across two and five of them; the
# vocabulary is odd and the features no multiple of the K tile.
LENGTHS = (0, 1, 7, 33, 0, 129, 2)
VOCAB = 333
FEATURES = 40
# The torch backend's vocabulary chunk in these tests: V spans several, the last one partial.
CHUNK = 100


def cu_seqlens_of(lengths, device) -> torch.Tensor:
    bounds = [0, *itertools.accumulate(lengths)]
    return torch.tensor(bounds, dtype=torch.int32, device=device)


def operands(lengths, vocab, k, dtype, device, seed=0):
    """x [T, k], weight [vocab, k], bias [vocab], cu_seqlens: logits of O(1), about half of
    them positive, so relu and the max both matter."""
    tokens = sum(lengths)
    x = randn((tokens, k), dtype, device, seed)
    weight = randn((vocab, k), dtype, device, seed + 1, scale=max(k, 1) ** -0.5)
    bias = randn((vocab,), dtype, device, seed + 2, scale=0.5)
    return x, weight, bias, cu_seqlens_of(lengths, device)


def torch_backend(x, weight, bias=None, cu_seqlens=None, log_steps=1):
    """The torch backend's public op with vocabulary chunks of CHUNK columns."""
    return ST.splade_max(x, weight, bias, cu_seqlens, log_steps, chunk=CHUNK)


IMPLEMENTATIONS = {"triton": K.splade_max, "torch": torch_backend}


def check_splade(op, x, weight, bias, cu_seqlens, log_steps, what="splade_max"):
    """``op``'s output held to the rule against the reference (float64 oracle; the same
    computation in x's dtype for the bound); float32 whatever x's dtype."""
    kwargs = {"bias": bias, "cu_seqlens": cu_seqlens, "log_steps": log_steps}
    out = check_op(op, R.splade_max, (x, weight), kwargs, what=what)
    assert out.dtype == torch.float32 and out.is_contiguous()
    return out


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("has_bias", [False, True], ids=["no_bias", "bias"])
@pytest.mark.parametrize("log_steps", [1, 2])
def test_matches_the_unfused_reference(device, implementation, dtype, has_bias, log_steps):
    x, weight, bias, cu = operands(LENGTHS, VOCAB, FEATURES, dtype, device, seed=log_steps)
    bias = bias if has_bias else None
    out = check_splade(IMPLEMENTATIONS[implementation], x, weight, bias, cu, log_steps)
    assert out.shape == (len(LENGTHS), VOCAB)
    empty = [b for b, n in enumerate(LENGTHS) if n == 0]
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert (out > 0).any(dim=1)[[b for b, n in enumerate(LENGTHS) if n]].all()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_many_sequences_inside_one_row_tile(device, implementation, dtype):
    """Twenty one-token sequences, then lengths 2, 0, 3 and 5: every one of them inside the
    first two row tiles, each reduced on its own."""
    lengths = [1] * 20 + [2, 0, 3, 5]
    x, weight, bias, cu = operands(lengths, 97, 16, dtype, device, seed=5)
    check_splade(IMPLEMENTATIONS[implementation], x, weight, bias, cu, 1)


# Sequence bounds on and beside the edges of row tiles of 16, 32, 64 and 128 rows: one-token
# sequences in a tile's last row and in the next tile's first.
TILE_EDGE_BOUNDS = (0, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 140)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_sequences_at_row_tile_edges(device, implementation, dtype):
    lengths = [b - a for a, b in itertools.pairwise(TILE_EDGE_BOUNDS)]
    x, weight, bias, cu = operands(lengths, 97, FEATURES, dtype, device, seed=31)
    assert cu.tolist() == list(TILE_EDGE_BOUNDS)
    check_splade(IMPLEMENTATIONS[implementation], x, weight, bias, cu, 1)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_cu_seqlens_of_any_stride(device, implementation):
    """cu_seqlens a strided view (a column of a wider buffer): its values, not the memory
    beside them (the kernel reads it as contiguous)."""
    x, weight, bias, cu = operands([5, 9, 3], 97, FEATURES, torch.float32, device, seed=9)
    strided = torch.stack([cu, cu.flip(0)], dim=1)[:, 0]
    assert not strided.is_contiguous()
    check_splade(IMPLEMENTATIONS[implementation], x, weight, bias, strided, 1)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_one_sequence_and_no_cu_seqlens(device, implementation):
    """cu_seqlens None is one sequence of every row: [1, V], as cu_seqlens [0, T]."""
    x, weight, bias, _ = operands([70], VOCAB, FEATURES, torch.float32, device, seed=7)
    op = IMPLEMENTATIONS[implementation]
    out = check_splade(op, x, weight, bias, None, 1)
    assert out.shape == (1, VOCAB)
    assert torch.equal(out, op(x, weight, bias, cu_seqlens_of([70], device)))


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_other_sequences_tokens_have_no_influence(device, implementation):
    """Huge logits in every other sequence leave a sequence's output exactly as it was (a
    boundary off by one would let a neighbour's token in), including where the huge ones share
    its row tiles."""
    lengths = [5, 33, 1, 40, 7]
    x, weight, bias, cu = operands(lengths, 97, FEATURES, torch.float32, device, seed=9)
    op = IMPLEMENTATIONS[implementation]
    out = op(x, weight, bias, cu)
    bounds = cu.tolist()
    for b in range(len(lengths)):
        loud = x.clone()
        outside = torch.ones(x.shape[0], dtype=torch.bool)
        outside[bounds[b] : bounds[b + 1]] = False
        loud[outside.to(device)] *= 1000.0
        moved = op(loud, weight, bias, cu)
        assert torch.equal(moved[b], out[b]), f"sequence {b} moved"


def test_the_rule_catches_a_boundary_off_by_one(device):
    """The test data makes a sequence boundary off by one fail the rule: the output of the
    right computation on boundaries moved by one token is held to it, and must fail."""
    x, weight, bias, cu = operands(LENGTHS, VOCAB, FEATURES, torch.float32, device, seed=1)
    ref = R.splade_max(x.double(), weight.double(), bias.double(), cu)
    out_torch = R.splade_max(x, weight, bias, cu)
    for shift in (-1, 1):
        moved = cu.clone()
        moved[3] += shift  # the boundary between the sequences of 7 and 33 tokens
        wrong = R.splade_max(x, weight, bias, moved)
        with pytest.raises(AssertionError, match="max error"):
            assert_within_rule(wrong, out_torch, ref)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_strided_rows_and_bias(device, implementation, dtype):
    """x and weight rows of a wider tensor (row stride > K), a bias read every third value."""
    x, weight, bias, cu = operands(LENGTHS, VOCAB, FEATURES, dtype, device, seed=11)
    wide_x = randn((x.shape[0], 2 * FEATURES + 3), dtype, device, 12)
    wide_x[:, 5 : 5 + FEATURES] = x
    wide_w = randn((2 * VOCAB, FEATURES), dtype, device, 13)
    wide_w[::2] = weight
    wide_b = randn((3 * VOCAB,), dtype, device, 14)
    wide_b[::3] = bias
    xs, ws, bs = wide_x[:, 5 : 5 + FEATURES], wide_w[::2], wide_b[::3]
    assert not any(t.is_contiguous() for t in (xs, ws, bs))
    out = check_splade(IMPLEMENTATIONS[implementation], xs, ws, bs, cu, 1)
    if implementation == "triton":  # read in place: the contiguous operands' bits
        assert torch.equal(out, K.splade_max(x, weight, bias, cu))


def test_torch_backend_reads_any_strides(device):
    """The torch backend also takes operands without a unit stride along K (the Triton kernel
    refuses them, see BAD_TRITON)."""
    x, weight, bias, cu = operands(LENGTHS, 97, FEATURES, torch.float32, "cpu", seed=15)
    xt, wt = x.t().contiguous().t(), weight.t().contiguous().t()
    check_splade(torch_backend, xt, wt, bias, cu, 2)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize(
    "lengths, vocab, k",
    [([0, 0], VOCAB, FEATURES), ([3, 4], 0, FEATURES), ([], VOCAB, FEATURES), ([5, 0], 9, 0)],
    ids=["no_tokens", "no_vocabulary", "no_sequences", "no_features"],
)
def test_empty_dimensions(device, implementation, lengths, vocab, k):
    """No tokens (two empty sequences): zeros; no vocabulary: [B, 0]; no sequences: [0, V];
    K = 0: the logits are the bias."""
    x, weight, bias, cu = operands(lengths, vocab, k, torch.float32, device, seed=17)
    out = check_splade(IMPLEMENTATIONS[implementation], x, weight, bias, cu, 1)
    assert out.shape == (len(lengths), vocab)


def test_torch_backend_traces_as_one_graph():
    """The torch backend reads no value on the host: torch.compile traces it as one graph
    (its max per sequence a scatter_reduce), with the eager result."""
    x, weight, bias, cu = operands(LENGTHS, VOCAB, FEATURES, torch.float32, "cpu", seed=19)
    graphs = []

    def recording(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    def head(x, weight, bias=None, cu_seqlens=None, log_steps=1):
        return ST.splade_max_unchecked(x, weight, bias, cu_seqlens, log_steps, chunk=CHUNK)

    torch._dynamo.reset()
    compiled = torch.compile(head, fullgraph=True, backend=recording)
    out = check_splade(compiled, x, weight, bias, cu, 2)
    torch.testing.assert_close(out, head(x, weight, bias, cu, 2))
    assert len(graphs) == 1 and "scatter_reduce" in graphs[0].code


def test_chunk_columns_bound_the_logits():
    """A chunk of the torch backend holds at most CHUNK_BYTES of logits (or MIN_CHUNK
    columns), and never more columns than the vocabulary."""
    assert ST.chunk_columns(4096, 4, 30522) == 2048
    assert 4096 * 4 * ST.chunk_columns(4096, 4, 30522) <= ST.CHUNK_BYTES
    assert ST.chunk_columns(65536, 4, 30522) == ST.MIN_CHUNK
    assert ST.chunk_columns(16, 2, 30522) == 30522
    assert ST.chunk_columns(0, 4, 0) == 1


@pytest.mark.parametrize("chunk", [1, 64, VOCAB - 1, 10 * VOCAB])
def test_torch_backend_any_chunk(chunk):
    x, weight, bias, cu = operands(LENGTHS, VOCAB, FEATURES, torch.float32, "cpu", seed=21)
    check_splade(functools.partial(ST.splade_max, chunk=chunk), x, weight, bias, cu, 1)


def test_the_three_share_one_signature():
    parameters = [
        list(inspect.signature(f).parameters)[:5]
        for f in (K.splade_max, ST.splade_max, ST.splade_max_unchecked, R.splade_max)
    ]
    assert all(p == ["x", "weight", "bias", "cu_seqlens", "log_steps"] for p in parameters)


def test_the_op_is_declared_without_backward():
    op = K.OPS["splade_max"]
    assert op.backward is None and op.reference is R.splade_max
    assert op.torch is ST.splade_max_unchecked


def test_custom_op_matches_the_public_function(device):
    x, weight, bias, cu = operands([3, 0, 9], 37, 16, torch.float32, device, seed=23)
    expected = K.splade_max(x, weight, bias, cu, 2)
    op = torch.ops.fastbert.splade_max.default
    assert torch.equal(op(x, weight, bias, cu, 2, False), expected)
    torch.library.opcheck(op, (x, weight, bias, cu, 2, False))


def test_compiles_fullgraph_with_the_custom_op(device):
    x, weight, bias, cu = operands([3, 0, 9], 37, 16, torch.float32, device, seed=25)
    compiled = torch.compile(K.splade_max, fullgraph=True, backend="eager")
    assert torch.equal(compiled(x, weight, bias, cu), K.splade_max(x, weight, bias, cu))


def _valid_args(device) -> dict:
    """Valid float32 arguments (three sequences, T = 12, V = 10, K = 8)."""
    x, weight, bias, cu = operands([4, 0, 8], 10, 8, torch.float32, device, seed=27)
    return {"x": x, "weight": weight, "bias": bias, "cu_seqlens": cu, "log_steps": 2}


def _cu(values):
    return lambda a: torch.tensor(values, dtype=torch.int32, device=a["x"].device)


BAD = {
    "int x": ({"x": lambda a: a["x"].int()}, TypeError, "x must be float16"),
    "mixed dtypes": ({"weight": lambda a: a["weight"].half()}, TypeError, "dtype mismatch"),
    "bias dtype": ({"bias": lambda a: a["bias"].half()}, TypeError, "dtype mismatch"),
    "1-d x": ({"x": lambda a: a["x"][0]}, ValueError, "x must have 2 dimensions"),
    "3-d weight": ({"weight": lambda a: a["weight"][None]}, ValueError, "weight must have 2"),
    "K mismatch": ({"weight": lambda a: a["weight"][:, :5]}, ValueError, "x has 8 input features"),
    "bias shape": ({"bias": lambda a: a["bias"][:9]}, ValueError, r"bias must have shape \(10,\)"),
    "cu_seqlens int64": (
        {"cu_seqlens": lambda a: a["cu_seqlens"].long()},
        TypeError,
        "cu_seqlens must be int32",
    ),
    "cu_seqlens 2-d": (
        {"cu_seqlens": lambda a: a["cu_seqlens"][None]},
        ValueError,
        "cu_seqlens must have 1 dimensions",
    ),
    "cu_seqlens empty": ({"cu_seqlens": _cu([])}, ValueError, "at least one entry"),
    "cu_seqlens not from 0": ({"cu_seqlens": _cu([1, 4, 4, 12])}, ValueError, "from 0"),
    "cu_seqlens short of T": ({"cu_seqlens": _cu([0, 4, 4, 11])}, ValueError, "12 rows"),
    "cu_seqlens past T": ({"cu_seqlens": _cu([0, 4, 13])}, ValueError, "12 rows"),
    "cu_seqlens decreasing": (
        {"cu_seqlens": _cu([0, 6, 4, 12])},
        ValueError,
        r"without decreasing.* 1 decrease",
    ),
    "log_steps 3": ({"log_steps": lambda a: 3}, ValueError, "log_steps must be 1 or 2"),
    "log_steps bool": ({"log_steps": lambda a: True}, ValueError, "log_steps must be 1 or 2"),
    "log_steps float": ({"log_steps": lambda a: 1.0}, ValueError, "log_steps must be 1 or 2"),
    "weight on meta": ({"weight": lambda a: a["weight"].to("meta")}, ValueError, "device"),
    "cu_seqlens on meta": (
        {"cu_seqlens": lambda a: a["cu_seqlens"].to("meta")},
        ValueError,
        "device",
    ),
}
BAD_TRITON = {
    **BAD,
    "float64": float64_case("x", "weight", "bias"),
    "x unit stride": (
        {"x": lambda a: a["x"].t().contiguous().t()},
        ValueError,
        "x must have unit stride along K",
    ),
    "weight unit stride": (
        {"weight": lambda a: a["weight"].t().contiguous().t()},
        ValueError,
        "weight must have unit stride along K",
    ),
    "requires grad": (
        {"x": lambda a: a["x"].clone().requires_grad_()},
        RuntimeError,
        "inference only.*sparse_head_torch.splade_max, on PyTorch ops, has them",
    ),
}

test_bad_inputs_triton = bad_input_test(K.splade_max, _valid_args, BAD_TRITON)
test_bad_inputs_torch = bad_input_test(ST.splade_max, _valid_args, BAD)
test_bad_inputs_reference = bad_input_test(R.splade_max, _valid_args, BAD)


def test_torch_backend_has_gradients():
    """The torch backend's gradients are those of the unfused float64 reference, to float32
    rounding (its output is float32 whatever the input dtype)."""
    x, weight, bias, cu = operands(LENGTHS, 97, FEATURES, torch.float64, "cpu", seed=29)
    x.requires_grad_()
    weight.requires_grad_()
    weights = randn((len(LENGTHS), 97), torch.float64, "cpu", 30)
    fused = torch_backend(x, weight, bias, cu, 2).double()
    unfused = R.splade_max(x, weight, bias, cu, 2)
    got = torch.autograd.grad((fused * weights).sum(), (x, weight))
    expected = torch.autograd.grad((unfused * weights).sum(), (x, weight))
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)


def test_torch_backend_refuses_a_bad_chunk():
    with pytest.raises(ValueError, match="chunk must be a positive int"):
        ST.splade_max(**_valid_args("cpu"), chunk=0)


test_cpu_without_interpreter_says_so = interpreter_needed_test(K.splade_max, _valid_args)


# --- GPU: BERT's vocabulary, every dtype ------------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params((), ALL_DTYPES))
@pytest.mark.parametrize("log_steps", [1, 2])
def test_gpu_bert_head(dtype, log_steps):
    """BERT-base's decoder (K = 768, V = 30,522) on 4,096 tokens of sequences of mixed
    lengths, one of them empty."""
    lengths = [128] * 20 + [1, 0, 511, 7, 33, 129, 260, 1] + [80] * 6
    lengths[-1] += 4096 - sum(lengths)
    x, weight, bias, cu = operands(lengths, 30522, 768, dtype, "cuda", seed=log_steps)
    check_splade(K.splade_max, x, weight, bias, cu, log_steps)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", dtype_params((), ALL_DTYPES))
@pytest.mark.parametrize("tokens", [1, 17, 300])
def test_gpu_short_batches(dtype, tokens):
    """A few tokens: the small row tiles, and one sequence (cu_seqlens None)."""
    x, weight, bias, _ = operands([tokens], 30522, 384, dtype, "cuda", seed=tokens)
    check_splade(K.splade_max, x, weight, bias, None, 1)
