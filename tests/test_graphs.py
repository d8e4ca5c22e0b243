"""CUDA-graph bookkeeping (fastbert.execution.graphs) on the CPU: when a key is captured, how
many keys are remembered, concurrent callers, and weights that change between calls.

The graphs here are tests/graph_doubles.ReplayingGraphs, whose replay re-runs the captured
call on the CPU and refuses to run against weights other than those it was captured with.
"""

from __future__ import annotations

import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import fastbert
from fastbert.execution import backends, graphs
from fastbert.kernels import reference
from tests.graph_doubles import ReplayingGraphs
from tests.hf_models import hf_model, inference_model, padded_batch


def _double(hidden: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    return hidden * 2


def _call_shapes(held: graphs.EncoderGraphs, shapes) -> None:
    for seq in shapes:
        hidden = torch.full((1, seq, 2), float(seq))
        assert torch.equal(held.run(_double, hidden, None), hidden * 2)


def test_a_cycle_of_more_shapes_than_graphs_settles_instead_of_thrashing() -> None:
    """9 shapes cycled 5 times: "auto" captures 8 graphs once each, then replays them (the
    ninth runs eagerly), rather than evicting and capturing again on every call."""
    held = ReplayingGraphs("auto")
    _call_shapes(held, list(range(1, 10)) * 5)
    assert held.captures == graphs.MAX_GRAPHS
    assert held.replays == 8 * 4 - 8 + 8  # calls 2..5 of shapes 1..8 (the 2nd one captures)


def test_a_new_key_replaces_a_kept_graph_only_when_called_more_often() -> None:
    held = ReplayingGraphs(True)
    _call_shapes(held, range(1, graphs.MAX_GRAPHS + 1))  # True: captured on first sight
    assert held.captures == graphs.MAX_GRAPHS
    _call_shapes(held, [100])  # once: no more than the least-called graph
    assert held.captures == graphs.MAX_GRAPHS
    _call_shapes(held, range(2, graphs.MAX_GRAPHS + 1))  # every graph but shape 1 called again
    _call_shapes(held, [100, 100])  # three calls now, more than shape 1's one
    assert held.captures == graphs.MAX_GRAPHS + 1
    kept = {key[0][0][1] for key in held.graphs}
    assert 100 in kept and 1 not in kept


def test_random_shapes_capture_little_and_remember_a_bounded_number_of_keys() -> None:
    """1,000 calls of random shapes: few captures, and at most SEEN_MAX keys remembered."""
    rng = random.Random(0)
    held = ReplayingGraphs("auto")
    _call_shapes(held, [rng.randint(1, 400) for _ in range(1000)])
    assert len(held.seen) <= graphs.SEEN_MAX
    assert len(held.graphs) <= graphs.MAX_GRAPHS
    assert held.captures <= 2 * graphs.MAX_GRAPHS, held.captures  # 276 with plain LRU


def test_call_counts_age_so_the_kept_set_follows_the_workload() -> None:
    held = ReplayingGraphs("auto")
    old, new = list(range(1, 9)), list(range(101, 109))
    _call_shapes(held, old * 20)
    assert {key[0][0][1] for key in held.graphs} == set(old)
    _call_shapes(held, new * 200)  # the workload moves on
    assert {key[0][0][1] for key in held.graphs} == set(new)


def _graphed(padding_free: bool) -> tuple[fastbert.BertModel, fastbert.BertModel]:
    hf = hf_model("BertModel", seed=21)
    options = dict(dtype=torch.float32, backend="torch", padding_free=False, cuda_graphs=False)
    eager = inference_model(hf, **options)
    graphed = inference_model(hf, **options)
    graphed.runner.graphs = ReplayingGraphs(True)
    if padding_free:
        # Padding-free calls are graphed with the Triton attention kernel only; the torch ops
        # under that name keep the bookkeeping the same at the speed of PyTorch. Like the
        # kernel (and unlike the torch backend's), the reference's attention_varlen runs the
        # bucket's filler sequence, longer than max_seqlen.
        torch_ops = backends.get_ops("torch", "cpu").by_name()
        as_triton = backends.Ops(
            "triton", {**torch_ops, "attention_varlen": reference.attention_varlen}
        )
        for model in (eager, graphed):
            model.ops = lambda: as_triton
            model.padding_free = True
    return eager, graphed


def _wrong_calls_from_four_threads(graphed, batches, is_right, start_together: bool) -> list:
    """Call ``graphed(*batch)`` for every batch, the calls dealt round-robin to four threads
    (``start_together``: held at a barrier until all four run); the indices of the calls
    whose last hidden state ``is_right(i, got)`` rejects, each checked in its own thread."""
    wrong = []
    barrier = threading.Barrier(4)

    def work(thread: int) -> None:
        if start_together:
            barrier.wait()
        for i in range(thread, len(batches), 4):
            if not is_right(i, graphed(*batches[i]).last_hidden_state):
                wrong.append(i)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(4)))  # raises what a thread raised
    return wrong


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
def test_concurrent_calls_each_get_their_own_result(padding_free) -> None:
    """4 threads x 25 calls at one [4, 24] shape, each with its own inputs: every caller gets
    what the eager model computes for its inputs (a replay shares the graph's buffers)."""
    eager, graphed = _graphed(padding_free)
    calls = 100
    batches = [padded_batch([24, 24 - i % 7, 20, 1 + i % 23], seed=i) for i in range(calls)]
    expected = [eager(*batch).last_hidden_state for batch in batches]

    def is_right(i: int, got: torch.Tensor) -> bool:
        return torch.allclose(got, expected[i], atol=1e-5, rtol=0)

    wrong = _wrong_calls_from_four_threads(graphed, batches, is_right, start_together=True)
    assert not wrong, f"{len(wrong)} of {calls} calls got another call's output"
    assert graphed.runner.graphs.replays >= calls - 8


def _check_matches_eager(graphed, eager, batch) -> None:
    torch.testing.assert_close(
        graphed(*batch).last_hidden_state, eager(*batch).last_hidden_state, atol=1e-5, rtol=0
    )


@pytest.mark.parametrize("change", ["half", "assign", "data", "parameter"])
def test_graphs_are_never_replayed_against_other_weights(change) -> None:
    """After a cast, an assigning load_state_dict or a replaced parameter (or its .data), the
    graphs captured before are dropped and the call computes with the new weights."""
    eager, graphed = _graphed(padding_free=False)
    batch = padded_batch([6, 4, 6], seed=3)
    _check_matches_eager(graphed, eager, batch)
    _check_matches_eager(graphed, eager, batch)
    assert graphed.runner.graphs.captures == 1
    other = inference_model(hf_model("BertModel", seed=22), backend="torch")
    weight = other.layers[1].ffn_in_weight.detach().clone()
    for model in (graphed, eager):
        if change == "half":
            model.half()
        elif change == "assign":
            model.load_state_dict(other.state_dict(), assign=True)
        elif change == "data":
            model.layers[1].ffn_in_weight.data = weight.clone()
        else:
            model.layers[1].ffn_in_weight = torch.nn.Parameter(weight.clone(), False)
    _check_matches_eager(graphed, eager, batch)
    assert graphed.runner.graphs.captures == 2, "a new graph for the new weights"


def test_weights_changed_in_place_replay_without_recapture() -> None:
    eager, graphed = _graphed(padding_free=False)
    batch = padded_batch([5, 2], seed=4)
    _check_matches_eager(graphed, eager, batch)
    with torch.no_grad():
        for model in (graphed, eager):
            model.layers[0].attn_out_weight.mul_(1.5)
    _check_matches_eager(graphed, eager, batch)
    assert (graphed.runner.graphs.captures, graphed.runner.graphs.replays) == (1, 2)


def _cuda_models(**options) -> tuple[fastbert.BertModel, fastbert.BertModel]:
    hf = hf_model("BertModel", seed=23)
    common = dict(dtype=torch.float32, device="cuda", padding_free=False)
    eager = inference_model(hf, cuda_graphs=False, **common, **options)
    graphed = inference_model(hf, cuda_graphs=True, **common, **options)
    return eager, graphed


@pytest.mark.gpu
def test_concurrent_calls_replay_real_graphs_each_for_its_caller_gpu() -> None:
    eager, graphed = _cuda_models()
    calls = 64
    batches = [
        padded_batch([24, 24 - i % 7, 20, 1 + i % 23], seed=i, device="cuda") for i in range(calls)
    ]
    expected = [eager(*batch).last_hidden_state for batch in batches]

    def is_right(i: int, got: torch.Tensor) -> bool:
        valid = batches[i][1].bool()
        return torch.equal(got[valid], expected[i][valid])

    wrong = _wrong_calls_from_four_threads(graphed, batches, is_right, start_together=False)
    torch.cuda.synchronize()
    assert not wrong, f"{len(wrong)} of {calls} calls got another call's output"
    assert graphed.runner.graphs.captures == 1 and not graphed.runner.graphs.failed


@pytest.mark.gpu
def test_a_cast_after_capture_drops_the_real_graphs_gpu() -> None:
    eager, graphed = _cuda_models()
    batch = padded_batch([12, 7], seed=5, device="cuda")
    graphed(*batch)
    assert graphed.runner.graphs.captures == 1
    for model in (graphed, eager):
        model.half()
    got = graphed(*batch).last_hidden_state
    valid = batch[1].bool()
    assert got.dtype == torch.float16
    assert torch.equal(got[valid], eager(*batch).last_hidden_state[valid])
    assert graphed.runner.graphs.captures == 2 and not graphed.runner.graphs.failed
