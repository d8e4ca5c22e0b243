"""The torch.ops.fastbert custom ops that fastbert/kernels/op.py registers from each op's
declaration: torch.library.opcheck (schema, fake tensors, AOT dispatch, autograd registration), the
triton backend running the declarations, and torch.compile(fullgraph=True) over a model that uses
them (CPU: the Triton interpreter under the eager / aot_eager compilers; GPU: Inductor, and
CUDA-graph capture via mode="reduce-overhead")."""

from __future__ import annotations

import inspect

import pytest
import torch

import fastbert
from fastbert import kernels as K
from fastbert.execution.backends import get_ops
from tests.hf_models import hf_model, padded_batch

OPS = torch.ops.fastbert


def _randn(*shape: int, dtype=torch.float32, device="cpu", seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen).to(device, dtype)


def _mask(lengths: list[int], seq: int, device: str) -> torch.Tensor:
    return (torch.arange(seq)[None, :] < torch.tensor(lengths)[:, None]).to(device)


def _attention_args(
    device: str, with_mask: bool, scale: float, bias: bool = False, positions: bool = False
):
    # Hugging Face's layout: [B, S, H, D] tensors viewed as [B, H, S, D].
    q, k, v = (_randn(2, 9, 2, 32, device=device, seed=i).transpose(1, 2) for i in range(3))
    mask = _mask([9, 4], 9, device) if with_mask else None
    table = _relative_bias(device, bias)
    rotary, window = _rotary(device, positions)
    qkv = _requiring_grad((q, k, v), bias)
    return (*qkv, mask, scale, 0.0, table, rotary, window, None, bias)


def _rotary(device: str, positions: bool) -> tuple[torch.Tensor | None, int | None]:
    """(RoPE inverse frequencies for D = 32, a sliding window of 3), or Nones."""
    if not positions:
        return None, None
    return 1.0 / 1e4 ** (torch.arange(0, 32, 2, device=device).float() / 32), 3


def _relative_bias(device: str, bias: bool) -> torch.Tensor | None:
    """A [2, 32] relative position bias table requiring grad, or None."""
    return _randn(2, 32, device=device, seed=7).requires_grad_() if bias else None


def _varlen_args(device: str, bias: bool = False, positions: bool = False):
    q, k, v = (_randn(12, 2, 32, device=device, seed=i) for i in range(3))
    cu_seqlens = torch.tensor([0, 5, 5, 12], dtype=torch.int32, device=device)
    table = _relative_bias(device, bias)
    rotary, window = _rotary(device, positions)
    q, k, v = _requiring_grad((q, k, v), bias)
    return q, k, v, cu_seqlens, 7, 32**-0.5, 0.0, table, rotary, window, None, bias


def _softmax_args(device: str, with_mask: bool, grad: bool = False):
    scores = _requiring_grad((_randn(2, 2, 3, 9, device=device),), grad)[0]
    return scores, _mask([9, 2], 9, device) if with_mask else None, 0.5, grad


def _linear_args(device: str, full: bool, grad: bool = False, gated: bool = False):
    x, w = _randn(3, 5, 16, device=device), _randn(24, 16, device=device, seed=1)
    if not full:
        return _requiring_grad((x, w, None, None, None), grad) + (gated, grad)
    width = 12 if gated else 24
    bias, residual = _randn(24, device=device, seed=2), _randn(3, 5, width, device=device, seed=3)
    return _requiring_grad((x, w, bias, "gelu", residual), grad) + (gated, grad)


def _requiring_grad(args: tuple, grad: bool) -> tuple:
    """``args`` with their floating tensors requiring grad when ``grad``."""
    if not grad:
        return args
    return tuple(
        a.requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
        for a in args
    )


def _seed_tensor(dropout_p: float) -> torch.Tensor | None:
    return torch.tensor(1234, dtype=torch.int64) if dropout_p else None


def _layer_norm_args(device: str, residual: bool, dropout_p: float = 0.0, grad: bool = False):
    x = _randn(3, 5, 48, device=device)
    weight, bias = _randn(48, device=device, seed=1), _randn(48, device=device, seed=2)
    res = _randn(3, 5, 48, device=device, seed=3) if residual else None
    args = _requiring_grad((x, weight, bias, 1e-12, res), grad)
    return (*args, dropout_p, _seed_tensor(dropout_p), grad)


def _embeddings_args(device: str, optional_ids: bool, dropout_p: float = 0.0, grad: bool = False):
    ids = torch.tensor([[1, 5, 7, 2], [3, 3, 0, 9]], device=device)
    types = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]], device=device) if optional_ids else None
    positions = torch.tensor([3, 2, 1, 0], device=device) if optional_ids else None
    tables = [_randn(rows, 32, device=device, seed=rows) for rows in (11, 8, 2)]
    weight, bias = _randn(32, device=device, seed=1), _randn(32, device=device, seed=2)
    floats = _requiring_grad((*tables, weight, bias), grad)
    padding_rows = (1, 0) if optional_ids else (None, None)
    return (
        ids,
        types,
        positions,
        *floats,
        1e-12,
        True,
        dropout_p,
        _seed_tensor(dropout_p),
        *padding_rows,
        grad,
    )


CASES = {
    "attention-mask": (OPS.attention, lambda d: _attention_args(d, True, 32**-0.5)),
    "attention-nomask-scale": (OPS.attention, lambda d: _attention_args(d, False, 0.3)),
    "attention_varlen": (OPS.attention_varlen, _varlen_args),
    "attention-bias-grad": (OPS.attention, lambda d: _attention_args(d, True, 0.3, bias=True)),
    "attention_varlen-bias-grad": (OPS.attention_varlen, lambda d: _varlen_args(d, bias=True)),
    "attention-rotary-window": (
        OPS.attention,
        lambda d: _attention_args(d, True, 0.3, positions=True),
    ),
    "attention_varlen-rotary-window": (
        OPS.attention_varlen,
        lambda d: _varlen_args(d, positions=True),
    ),
    "attention-bias-rotary-window-grad": (
        OPS.attention,
        lambda d: _attention_args(d, True, 0.3, bias=True, positions=True),
    ),
    "attention_varlen-bias-rotary-window-grad": (
        OPS.attention_varlen,
        lambda d: _varlen_args(d, bias=True, positions=True),
    ),
    "softmax-mask": (OPS.scaled_masked_softmax, lambda d: _softmax_args(d, True)),
    "softmax-nomask": (OPS.scaled_masked_softmax, lambda d: _softmax_args(d, False)),
    "linear-full": (OPS.linear, lambda d: _linear_args(d, True)),
    "linear-bare": (OPS.linear, lambda d: _linear_args(d, False)),
    "linear-gated": (OPS.linear, lambda d: _linear_args(d, True, gated=True)),
    "layer_norm-residual": (OPS.layer_norm, lambda d: _layer_norm_args(d, True)),
    "layer_norm": (OPS.layer_norm, lambda d: _layer_norm_args(d, False)),
    "embeddings-all-ids": (OPS.embeddings_layer_norm, lambda d: _embeddings_args(d, True)),
    "embeddings-ids-only": (OPS.embeddings_layer_norm, lambda d: _embeddings_args(d, False)),
    "softmax-grad": (OPS.scaled_masked_softmax, lambda d: _softmax_args(d, True, grad=True)),
    "linear-full-grad": (OPS.linear, lambda d: _linear_args(d, True, grad=True)),
    "linear-bare-grad": (OPS.linear, lambda d: _linear_args(d, False, grad=True)),
    "linear-gated-grad": (OPS.linear, lambda d: _linear_args(d, True, grad=True, gated=True)),
    "layer_norm-residual-dropout-grad": (
        OPS.layer_norm,
        lambda d: _layer_norm_args(d, True, dropout_p=0.25, grad=True),
    ),
    "layer_norm-grad": (OPS.layer_norm, lambda d: _layer_norm_args(d, False, grad=True)),
    "embeddings-all-ids-dropout-grad": (
        OPS.embeddings_layer_norm,
        lambda d: _embeddings_args(d, True, dropout_p=0.25, grad=True),
    ),
    "embeddings-ids-only-grad": (
        OPS.embeddings_layer_norm,
        lambda d: _embeddings_args(d, False, grad=True),
    ),
}


def _public_arity(name: str) -> int:
    """How many leading arguments of the custom op the public function takes: the reference's
    positional parameters (the op's public signature)."""
    parameters = inspect.signature(K.OPS[name].reference).parameters.values()
    return sum(p.kind is not p.KEYWORD_ONLY for p in parameters)


def _public_keywords(name: str, op, args: tuple) -> dict[str, object]:
    """The public function's keyword-only arguments that the custom op takes positionally
    (attention's rotary and window, linear's gated), read from ``args`` by schema name."""
    parameters = inspect.signature(K.OPS[name].reference).parameters.values()
    names = [argument.name for argument in op.default._schema.arguments]
    return {
        p.name: args[names.index(p.name)]
        for p in parameters
        if p.kind is p.KEYWORD_ONLY and p.name in names
    }


def _seed_at(op) -> int | None:
    """Where the custom op takes its dropout seed, if it has one."""
    names = [argument.name for argument in op.default._schema.arguments]
    return names.index("seed") if "seed" in names else None


@pytest.mark.parametrize("case", list(CASES))
def test_opcheck(case: str, device: str) -> None:
    op, make_args = CASES[case]
    torch.library.opcheck(op.default, make_args(device))


@pytest.mark.parametrize("case", list(CASES))
def test_custom_op_equals_public_function(case: str, device: str) -> None:
    """The op returns exactly what the public function (the launcher, in eager mode) returns:
    attention its transpose; ops with a backward return (out, saved...), placeholders unless
    asked for. The "-grad" cases (inputs that require grad: the op saves for the backward)
    are held to the public function with gradients on, the same saving variant: compiled
    apart, the variants may round differently (on an H200 the gated linear's saving forward
    differed from its inference one in the last bit of 27 of 180 elements)."""
    op, make_args = CASES[case]
    args = make_args(device)
    name = op.__name__.split(".")[-1]
    seed_at = _seed_at(op)
    if seed_at is not None and args[seed_at] is not None:
        pytest.skip("dropout: the public function draws its own seed (tests/test_dropout.py)")
    training = any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
    keywords = _public_keywords(name, op, args)
    with torch.set_grad_enabled(training):
        expected = getattr(K, name)(*args[: _public_arity(name)], **keywords).detach()
    with torch.no_grad():
        got = op(*args)
    if isinstance(got, tuple):
        got = got[0]
    if op is OPS.attention:
        expected = expected.transpose(1, 2)
    assert got.is_contiguous() and torch.equal(got, expected)


def test_public_attention_is_the_transposed_view(device: str) -> None:
    q, k, v, mask = _attention_args(device, True, 0.25)[:4]
    out = K.attention(q, k, v, mask)
    assert out.shape == q.shape and out.transpose(1, 2).is_contiguous()


def test_triton_backend_runs_the_declarations(device: str) -> None:
    ops = get_ops("triton", device)
    assert set(ops.names) == set(K.OPS)
    assert {"attention", "attention_varlen", "linear", "layer_norm"} <= set(K.OPS)
    for name, op in K.OPS.items():
        assert getattr(ops, name) is op
        assert getattr(OPS, name).default.name() == f"fastbert::{name}"
        if op.backward is not None:  # linear_int8 runs inference only
            backward = getattr(OPS, f"{name}_backward").default.name()
            assert backward == f"fastbert::{name}_backward"


def test_fake_tensor_checks_reject_bad_shapes() -> None:
    x, w = torch.empty(3, 16, device="meta"), torch.empty(24, 15, device="meta")
    with pytest.raises(ValueError, match="input features"):
        OPS.linear(x, w, None, None, None, False, False)


def _compiled_model_matches_eager(device: str, compiler, **compile_kwargs) -> None:
    hf = hf_model("BertModel", seed=3)
    model = fastbert.BertModel.from_pretrained(
        hf,
        dtype=torch.float32,
        device=device,
        backend="triton",
        padding_free=False,
        cuda_graphs=False,
    )
    ids, mask, types = padded_batch([7, 3, 5], seed=3, device=device)
    expected = model(ids, mask, types)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend=compiler, **compile_kwargs)
    for _ in range(3):  # reduce-overhead records its CUDA graph on a later call
        got = compiled(ids, mask, types)
    torch.testing.assert_close(got.last_hidden_state, expected.last_hidden_state)
    torch.testing.assert_close(got.pooler_output, expected.pooler_output)


def test_model_compiles_fullgraph_with_the_ops(device: str) -> None:
    """Dynamo traces the whole triton-backend model as one graph (fullgraph=True raises on a
    graph break), and the graph holds the fastbert custom ops."""
    targets: set[str] = set()

    def recording_backend(graph_module: torch.fx.GraphModule, example_inputs):
        targets.update(str(node.target) for node in graph_module.graph.nodes)
        return graph_module.forward

    _compiled_model_matches_eager(device, recording_backend)
    for op in ("embeddings_layer_norm", "linear", "attention", "layer_norm"):
        assert f"fastbert.{op}.default" in targets, sorted(targets)


def test_model_compiles_fullgraph_aot_eager(device: str) -> None:
    """AOT autograd traces the ops through their fake implementations."""
    _compiled_model_matches_eager(device, "aot_eager")


def test_torch_backend_compiles_fullgraph_on_a_cpu_and_still_checks_ids() -> None:
    """The torch backend's id check reads the ids' range on the host, which a full graph
    cannot hold (Dynamo raised a data-dependent-guard error): on a CPU the graph asserts it."""
    model = fastbert.BertModel.from_pretrained(
        hf_model("BertModel", seed=4), backend="torch", padding_free=False
    )
    ids, mask, types = padded_batch([7, 3, 5], seed=4)
    expected = model(ids, mask, types).last_hidden_state
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(ids, mask, types).last_hidden_state, expected)
    bad = ids.clone()
    bad[1, 0] = model.config.vocab_size
    with pytest.raises(RuntimeError, match=r"input_ids must lie in \[0, 96\]"):
        compiled(bad, mask, types)


@pytest.mark.gpu
def test_model_compiles_fullgraph_inductor_gpu() -> None:
    _compiled_model_matches_eager("cuda", "inductor")


@pytest.mark.gpu
def test_layers_capture_in_cuda_graph_under_compile_gpu() -> None:
    """mode="reduce-overhead" captures the compiled model in CUDA graphs (the embeddings op's
    id check synchronises; Inductor's CUDA-graph trees run such a graph partially eagerly).
    Inductor falls back to eager silently when it cannot graph, counting a skip: there must
    be none, or the values alone would not show whether anything was captured."""
    from torch._dynamo.utils import counters

    counters["inductor"].clear()
    _compiled_model_matches_eager("cuda", "inductor", mode="reduce-overhead")
    assert counters["inductor"]["cudagraph_skips"] == 0, "Inductor skipped CUDA graphs"


@pytest.mark.gpu
def test_layer_ops_capture_in_cuda_graph_gpu() -> None:
    """Attention, linear and layer-norm ops record into a torch.cuda.CUDAGraph and replay."""
    q, k, v, mask = _attention_args("cuda", True, 0.25)[:4]
    x = _randn(2, 9, 64, device="cuda")
    w, b = _randn(64, 64, device="cuda", seed=1), _randn(64, device="cuda", seed=2)

    def step():
        ctx = K.attention(q, k, v, mask).transpose(1, 2).reshape(2, 9, 64)
        y = K.linear(ctx, w, b, "gelu", x)
        return K.layer_norm(y, b, b, 1e-12, x)

    expected = step()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm up (autotuning) outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_out, expected)


def _training_step(x, w, b, gamma, beta, residual, scores, word, pos, types, ids):
    """A small graph of every differentiable op, dropout included, reduced to one loss."""
    h = K.linear(x, w, b, "gelu_tanh", residual)
    h = K.layer_norm(h, gamma, beta, 1e-5, residual, dropout_p=0.2)
    e = K.embeddings_layer_norm(
        ids, None, None, word, pos, types, gamma, beta, 1e-12, dropout_p=0.1
    )
    probs = K.scaled_masked_softmax(scores, None, 0.5)
    return (h * h).sum() + (e * e).sum() + (probs * scores).sum()


def test_compiled_training_step_matches_eager(device: str) -> None:
    """torch.compile(fullgraph=True) traces the forward and backward custom ops (with their
    dropout seeds drawn in the graph) and gives the eager gradients."""
    leaves = [
        _randn(2, 3, 16, device=device),
        _randn(24, 16, device=device, seed=1),
        _randn(24, device=device, seed=2),
        _randn(24, device=device, seed=3),
        _randn(24, device=device, seed=4),
        _randn(2, 3, 24, device=device, seed=5),
        _randn(1, 2, 3, 5, device=device, seed=6),
        _randn(9, 24, device=device, seed=7),
        _randn(4, 24, device=device, seed=8),
        _randn(1, 24, device=device, seed=9),
    ]
    ids = torch.tensor([[1, 8, 1], [0, 1, 2]], device=device)

    def grads(step) -> list[torch.Tensor]:
        inputs = [t.detach().clone().requires_grad_() for t in leaves]
        torch.manual_seed(0)
        return list(torch.autograd.grad(step(*inputs, ids), inputs))

    torch._dynamo.reset()
    compiled = torch.compile(_training_step, fullgraph=True, backend="aot_eager")
    for got, expected in zip(grads(compiled), grads(_training_step)):
        torch.testing.assert_close(got, expected)


def test_a_declaration_whose_launcher_does_not_fit_its_schema_is_refused() -> None:
    """Op checks each launcher and fake against its schema before registering anything."""

    def launcher(x, save):
        return x, None

    def fake(x, y, save):
        return x.new_empty(x.shape), x.new_empty(0)

    kernel = K.Kernel(launcher, "(Tensor x, Tensor y, bool save) -> (Tensor, Tensor)", fake)
    with pytest.raises(TypeError, match="launcher takes 2 positional arguments, its schema 3"):
        K.Op("not_registered", reference=fake, torch=fake, prepare=fake, forward=kernel)
    assert not hasattr(OPS, "not_registered")
