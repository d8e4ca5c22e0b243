"""Padding-free execution and the run-mode settings (fastbert.execution.runtime)."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

import fastbert
from fastbert.execution import graphs, runtime, validation
from fastbert.kernels import cpu_attention
from tests.graph_doubles import ReplayingGraphs
from tests.hf_models import hf_model, inference_model, padded_batch

BOUND = 1e-4


def _hf_hidden(hf, ids, mask, types):
    with torch.no_grad():
        return hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_padding_free_matches_hf(device, backend) -> None:
    hf = hf_model("BertModel", seed=11)
    model = inference_model(
        hf, dtype=torch.float32, device=device, backend=backend, padding_free=True
    )
    # Rows of different lengths, one fully padded, and one with a hole.
    ids, mask, types = padded_batch([9, 1, 6, 9], seed=11, device=device)
    mask[2] = torch.tensor([1, 0, 1, 1, 1, 0, 1, 1, 0], device=device)
    mask[1] = 0
    expected = _hf_hidden(hf.to(device), ids, mask, types)
    got = model(ids, mask, types).last_hidden_state
    valid = mask.bool()
    assert (got - expected)[valid].abs().max() <= BOUND
    assert torch.equal(got[~valid], torch.zeros_like(got[~valid])), "padding is not zero"


@pytest.mark.parametrize("padding_free", [True, "auto"])
def test_a_left_padded_batch_computes_every_position(device, padding_free) -> None:
    """A row whose first position is padding runs dense whatever padding_free says: the
    pooler reads that position, which Hugging Face computes (packing would give zeros)."""
    hf = hf_model("BertModel", seed=11)
    model = inference_model(hf, dtype=torch.float32, device=device, padding_free=padding_free)
    ids, mask, types = padded_batch([9, 4, 6], seed=11, device=device)
    mask[1] = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1, 1], device=device)
    with torch.no_grad():
        expected = hf.to(device)(input_ids=ids, attention_mask=mask, token_type_ids=types)
    got = model(ids, mask, types)
    assert (got.last_hidden_state - expected.last_hidden_state).abs().max() <= BOUND
    assert (got.pooler_output - expected.pooler_output).abs().max() <= BOUND


def test_padding_free_equals_dense(device) -> None:
    """Packing changes which rows run, not what a real token computes."""
    hf = hf_model("BertModel", seed=12)
    model = inference_model(hf, dtype=torch.float32, device=device)
    ids, mask, types = padded_batch([12, 5, 3], seed=12, device=device)
    model.padding_free = False
    dense = model(ids, mask, types)
    model.padding_free = True
    packed = model(ids, mask, types)
    valid = mask.bool()
    assert (packed.last_hidden_state - dense.last_hidden_state)[valid].abs().max() <= BOUND
    assert (packed.pooler_output - dense.pooler_output).abs().max() <= BOUND


def _pack(mask: torch.Tensor, min_padding: float = 0.0) -> runtime.PackedBatch | None:
    rows = validation.read_batch(torch.zeros_like(mask, dtype=torch.long), None, mask, 1, 1)
    return runtime.pack(mask, rows, min_padding)


def test_pack_indices_and_boundaries() -> None:
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
    packed = _pack(mask)
    assert packed.indices.tolist() == [0, 1, 8, 10, 11]
    assert packed.cu_seqlens.tolist() == [0, 2, 2, 5]
    assert packed.cu_seqlens.dtype == torch.int32
    assert packed.max_seqlen == 3
    assert packed.positions().tolist() == [0, 1, 0, 2, 3]
    values = torch.arange(12.0).view(3, 4, 1)
    assert packed.gather(values).view(-1).tolist() == [0.0, 1.0, 8.0, 10.0, 11.0]
    back = packed.scatter(packed.gather(values))
    assert torch.equal(back, values * mask[..., None])


def test_pack_indices_match_nonzero_on_random_masks() -> None:
    gen = torch.Generator().manual_seed(5)
    for _ in range(20):
        mask = torch.rand(6, 37, generator=gen) < torch.rand(1, generator=gen)
        packed = _pack(mask)
        expected = mask.reshape(-1).nonzero().squeeze(1)
        if expected.numel() in (0, mask.numel()):
            assert packed is None or expected.numel() == 0
            continue
        assert torch.equal(packed.indices, expected)
        assert packed.max_seqlen == int(mask.sum(1).max())


def test_pack_skips_batches_with_little_padding() -> None:
    full = torch.ones(2, 8, dtype=torch.bool)
    assert _pack(full) is None
    one_pad = full.clone()
    one_pad[0, -1] = False  # 1 of 16 tokens is padding: 6% < 10%
    assert _pack(one_pad, runtime.PACK_MIN_PADDING) is None
    assert _pack(one_pad, runtime.PACK_MIN_PADDING_CPU) is not None
    assert _pack(one_pad) is not None


def test_packing_thresholds() -> None:
    mask = torch.tensor([[1, 0, 0, 0]], dtype=torch.bool)
    assert runtime.packing_threshold("auto", mask) == runtime.PACK_MIN_PADDING_CPU
    assert runtime.packing_threshold("auto", mask.to("meta")) == runtime.PACK_MIN_PADDING
    assert runtime.packing_threshold(True, mask) == 0.0
    assert runtime.packing_threshold(False, mask) is None
    assert runtime.packing_threshold(True, None) is None


def _attention_calls(monkeypatch) -> list[tuple[str, torch.Tensor | None]]:
    """Record the torch backend's attention calls: ("dense", its mask) or ("packed", None)."""
    from fastbert.execution import backends

    calls = []
    torch_ops = backends.get_ops("torch", "cpu").by_name()
    dense, packed = torch_ops["attention"], torch_ops["attention_varlen"]

    def attention(q, k, v, key_padding_mask=None, scale=None, dropout_p=0.0):
        calls.append(("dense", key_padding_mask))
        return dense(q, k, v, key_padding_mask, scale, dropout_p)

    def attention_varlen(*args, **kwargs):
        calls.append(("packed", None))
        return packed(*args, **kwargs)

    spied = {**torch_ops, "attention": attention, "attention_varlen": attention_varlen}
    spying = backends.Ops("torch", spied)
    monkeypatch.setattr(backends, "_ops_for", lambda *choice: spying)
    return calls


def test_auto_packs_padded_batches_on_the_torch_backend(monkeypatch) -> None:
    """padding_free="auto" packs a batch with padding on the CPU too (it measured faster)."""
    calls = _attention_calls(monkeypatch)
    model = inference_model(hf_model(), backend="torch")
    ids, mask, types = padded_batch([9, 4, 7])  # 30% padding
    model(ids, mask, types)
    assert calls and all(kind == "packed" for kind, _ in calls)


def test_a_batch_without_padding_runs_unmasked(monkeypatch) -> None:
    """An all-ones attention_mask is dropped: no mask copies, SDPA's unmasked kernel."""
    calls = _attention_calls(monkeypatch)
    model = inference_model(hf_model(), backend="torch")
    ids, mask, types = padded_batch([6, 6])
    expected = model(ids, None, types).last_hidden_state
    assert torch.equal(model(ids, mask, types).last_hidden_state, expected)
    assert calls and all(call == ("dense", None) for call in calls)


class HostReads(TorchFunctionMode):
    """Records every call that reads a device value on the host (a synchronisation on CUDA)."""

    READS = {
        "item",
        "tolist",
        "nonzero",
        "masked_select",
        "unique",
        "__bool__",
        "__int__",
        "__float__",
        "__index__",
    }

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        indexed_by_mask = name in ("__getitem__", "__setitem__") and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in args[1:2]
        )
        if name in self.READS or indexed_by_mask:
            self.reads.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("backend", "padding_free"),
    [("triton", True), ("triton", False), ("torch", False), ("torch", True), ("torch", "auto")],
)
def test_a_forward_reads_the_device_once(device, backend, padding_free) -> None:
    """One host read per call checks the ids and sizes the packing (each read stalls the
    host until the GPU has caught up, so the launches stop overlapping the GPU's work). On a
    CPU, where a read costs nothing, the torch backend's packed attention also reads
    cu_seqlens in each layer, unless the compiled CPU attention runs it (it takes cu_seqlens
    as it is; only a relative bias, rotary positions or a window, which BERT has none of,
    make it read the longest length to size their tables)."""
    model = inference_model(hf_model(), device=device, backend=backend, padding_free=padding_free)
    ids, mask, types = padded_batch([9, 4, 7], device=device)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    compiled = cpu_attention.available() and head_dim in cpu_attention.HEAD_DIMS
    on_cpu = backend == "torch" and torch.device(device).type == "cpu"
    reads_per_layer = int(on_cpu and not compiled)
    for args in ((ids, mask, types), (ids, mask), (ids,)):
        packs = padding_free is not False and len(args) > 1
        layers = len(model.layers) * reads_per_layer if packs else 0
        with HostReads() as mode:
            model(*args)
        assert mode.reads == ["tolist"] * (1 + layers), (args, mode.reads)


def test_out_of_range_ids_raise_on_every_path(device) -> None:
    for padding_free in (True, False):
        model = inference_model(hf_model(), device=device, padding_free=padding_free)
        ids, mask, types = padded_batch([5, 3], device=device)
        bad_ids = ids.clone()
        bad_ids[1, 0] = 97
        with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 96\]"):
            model(bad_ids, mask, types)
        with pytest.raises(ValueError, match=r"token_type_ids must lie in \[0, 1\]"):
            model(ids, mask, types - 1)


@pytest.mark.parametrize("name", ["padding_free", "cuda_graphs"])
@pytest.mark.parametrize("value", ["yes", 1, 0, None])
def test_bad_settings_are_refused(name, value) -> None:
    with pytest.raises(ValueError, match=name):
        inference_model(hf_model(), device="cpu", **{name: value})


@pytest.mark.parametrize("padding_free", ["auto", True])
def test_cuda_graphs_true_needs_cuda(padding_free) -> None:
    """The setting is refused on a CPU at every call: with gradients on (which never replay
    a graph), padded or not, packed by the model or given packed."""
    model = inference_model(
        hf_model(), device="cpu", backend="torch", cuda_graphs=True, padding_free=padding_free
    )
    ids = torch.tensor([[1, 2, 3], [4, 5, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    calls = {
        "no grad": lambda: model(ids[:1]),
        "grad": lambda: model(ids[:1]),
        "padded": lambda: model(ids, attention_mask=mask),
        "packed": lambda: model.forward_packed(torch.tensor([1, 2, 3, 4, 5]), [0, 3, 5]),
    }
    for name, call in calls.items():
        with torch.set_grad_enabled(name != "no grad"):
            with pytest.raises(ValueError, match="cuda_graphs=True needs the model on a CUDA"):
                call()


def _graphed_model(cuda_graphs) -> tuple[fastbert.BertModel, fastbert.BertModel]:
    hf = hf_model("BertModel", seed=14)
    eager = inference_model(hf, cuda_graphs=False, padding_free=False)
    graphed = inference_model(hf, cuda_graphs=False, padding_free=False)
    graphed.runner.graphs = ReplayingGraphs(cuda_graphs)
    return eager, graphed


def test_graph_replays_read_each_call_s_inputs_and_return_copies() -> None:
    """The graph holds the embeddings too: ids, token types and mask are its inputs."""
    eager, graphed = _graphed_model(True)
    outputs = []
    for seed in range(3):  # one shape, three different batches and masks
        ids, mask, types = padded_batch([8, 3, 6], seed=seed)
        mask[1, 0] = 0  # masks differ between calls, not only ids
        mask[seed, 2] = 0
        got = graphed(ids, mask, types).last_hidden_state
        torch.testing.assert_close(got, eager(ids, mask, types).last_hidden_state)
        outputs.append((got, got.clone()))
    assert (graphed.runner.graphs.captures, graphed.runner.graphs.replays) == (1, 3)
    for returned, at_return in outputs:  # a later replay must not overwrite a returned output
        assert torch.equal(returned, at_return)
    ids, mask, _ = padded_batch([8, 8, 5], seed=9)
    torch.testing.assert_close(graphed(ids).last_hidden_state, eager(ids).last_hidden_state)
    torch.testing.assert_close(
        graphed(ids, mask).last_hidden_state, eager(ids, mask).last_hidden_state
    )
    assert graphed.runner.graphs.captures == 3, "each set of optional inputs needs its own graph"


def test_auto_graphs_a_shape_on_its_second_sight_and_not_large_batches() -> None:
    _, graphed = _graphed_model("auto")
    held = graphed.runner.graphs
    ids, mask, types = padded_batch([5, 4])
    graphed(ids, mask, types)
    assert (held.captures, held.replays) == (0, 0)
    graphed(ids, mask, types)
    graphed(ids, mask, types)
    assert (held.captures, held.replays) == (1, 2)
    cpu = torch.device("cpu")
    assert not held.wants(cpu, graphs.GRAPH_AUTO_MAX_TOKENS + 1)
    assert held.wants(cpu, graphs.GRAPH_AUTO_MAX_TOKENS)


def test_token_buckets_are_few_and_tight() -> None:
    buckets = [runtime.token_bucket(t) for t in range(1, 20000)]
    for tokens, bucket in enumerate(buckets, start=1):
        assert tokens <= bucket < tokens + max(64, tokens / 8), (tokens, bucket)
    assert buckets == sorted(buckets)
    assert len(set(buckets[:8192])) <= 8 + 8 * 7, "one bucket per eighth of each power of two"
    assert runtime.token_bucket(0) == 0


def test_sequence_buckets_are_powers_of_two() -> None:
    assert [runtime.sequence_bucket(n) for n in (1, 8, 9, 16, 17, 100)] == [8, 8, 16, 16, 32, 128]


def test_bucketed_inputs_pad_with_a_filler_sequence() -> None:
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 1]], dtype=torch.bool)
    packed = _pack(mask)
    ids = torch.tensor([5, 6, 7, 8, 9])
    (padded_ids, no_types), cu_seqlens, max_seqlen = runtime.bucketed_inputs(
        packed.cu_seqlens, packed.max_seqlen, ids, None
    )
    assert no_types is None
    assert padded_ids.tolist() == [5, 6, 7, 8, 9] + [0] * (runtime.token_bucket(5) - 5)
    # Sequence 3 is the filler rows, 4..7 are empty: 8 sequences, the smallest count bucket.
    assert cu_seqlens.tolist() == [0, 2, 2, 5] + [runtime.token_bucket(5)] * 5
    assert cu_seqlens.dtype == torch.int32 and max_seqlen == 4  # longest row 3 -> 4


def _padded_batches(lengths_per_call: list[list[int]], seq: int):
    """Right-padded batches of ``seq`` columns, one per list of row lengths."""
    for seed, lengths in enumerate(lengths_per_call):
        ids, mask, types = padded_batch(lengths, seed=seed)
        pad = seq - ids.shape[1]
        yield tuple(torch.nn.functional.pad(t, (0, pad)) for t in (ids, mask, types))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_padding_free_graphs_replay_per_size_bucket(device, backend) -> None:
    """Batches whose real tokens fall in one bucket replay one graph, and each computes what
    the eager padding-free model (and Hugging Face) computes for it. The filler sequence is
    longer than max_seqlen: the kernel's grid-stride loop covers it. The torch backend is not
    graphed padding-free: its attention_varlen reads cu_seqlens on the host, which a capture
    cannot hold."""
    hf = hf_model("BertModel", seed=15)
    options = dict(
        dtype=torch.float32, device=device, backend=backend, padding_free=True, cuda_graphs=False
    )
    eager = inference_model(hf, **options)
    graphed = inference_model(hf, **options)
    graphed.runner.graphs = ReplayingGraphs(True, torch.device(device).type)
    hf = hf.to(device)
    # 20, 17, 10 and 20 real tokens in 3 or 4 rows, longest 9 (bucket 64, max_seqlen 16, 8
    # sequences), one call with a fully padded row; then 70 tokens, longest 30 (bucket 128,
    # max_seqlen 32).
    calls = [[9, 5, 6], [3, 9, 5], [1, 0, 9], [5, 4, 9, 2], [30, 30, 10]]
    for ids, mask, types in _padded_batches(calls, seq=30):
        ids, mask, types = ids.to(device), mask.to(device), types.to(device)
        got = graphed(ids, mask, types).last_hidden_state
        valid = mask.bool()
        expected = eager(ids, mask, types).last_hidden_state
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        assert (got - _hf_hidden(hf, ids, mask, types))[valid].abs().max() <= BOUND
        assert torch.equal(got[~valid], torch.zeros_like(got[~valid])), "padding is not zero"
    if backend == "torch":
        assert (graphed.runner.graphs.captures, graphed.runner.graphs.replays) == (0, 0)
        return
    assert (graphed.runner.graphs.captures, graphed.runner.graphs.replays) == (2, 5)
    host_keys = [key[-1] for key in graphed.runner.graphs.graphs]
    assert host_keys == [16, 32], "max_seqlen, a power of two, is part of the key"


@pytest.mark.gpu
@pytest.mark.parametrize("cuda_graphs", [True, "auto"])
def test_cuda_graphs_match_eager_on_gpu(cuda_graphs) -> None:
    hf = hf_model("BertModel", seed=13)
    eager = inference_model(
        hf, dtype=torch.float16, device="cuda", cuda_graphs=False, padding_free=False
    )
    graphed = inference_model(
        hf, dtype=torch.float16, device="cuda", cuda_graphs=cuda_graphs, padding_free=False
    )
    valid = None
    for seed in range(3):  # "auto" captures on the second sight of a shape, replays after
        ids, mask, types = padded_batch([16, 9, 16], seed=seed, device="cuda")
        expected = eager(ids, mask, types).last_hidden_state
        got = graphed(ids, mask, types).last_hidden_state
        valid = mask.bool()
        assert torch.equal(got[valid], expected[valid])
    assert len(graphed.runner.graphs.graphs) == 1 and not graphed.runner.graphs.failed
    without_mask = graphed(ids).last_hidden_state
    assert torch.equal(without_mask, eager(ids).last_hidden_state)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_padding_free_cuda_graphs_on_gpu(dtype) -> None:
    """Captured for real: padding-free batches replayed from graphs of their size bucket, each
    as accurate against the fp32 model as the eager padding-free model in ``dtype``."""
    hf = hf_model("BertModel", seed=16)
    reference = inference_model(
        hf, dtype=torch.float32, device="cuda", padding_free=True, cuda_graphs=False
    )
    eager = inference_model(hf, dtype=dtype, device="cuda", padding_free=True, cuda_graphs=False)
    graphed = inference_model(hf, dtype=dtype, device="cuda", padding_free=True, cuda_graphs=True)
    calls = [[40, 17, 3], [12, 40, 8], [1, 0, 39], [140, 100, 90]]  # buckets 64, 64, 64, 384
    for ids, mask, types in _padded_batches(calls, seq=140):
        ids, mask, types = ids.cuda(), mask.cuda(), types.cuda()
        valid = mask.bool()
        ref = reference(ids, mask, types).last_hidden_state
        err = (graphed(ids, mask, types).last_hidden_state.float() - ref)[valid].abs().max()
        eager_err = (eager(ids, mask, types).last_hidden_state.float() - ref)[valid].abs().max()
        assert err <= 2 * eager_err + 1e-3, f"graphed {err:.3g} vs eager {eager_err:.3g}"
    assert len(graphed.runner.graphs.graphs) == 2 and not graphed.runner.graphs.failed
