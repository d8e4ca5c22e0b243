"""BertModel.forward_packed: sequences given end to end give, at every token, what Hugging
Face gives the same sequences padded (fp32, identical weights), for every position scheme;
bad packed inputs are refused with errors naming the argument."""

from __future__ import annotations

import pytest
import torch

import fastbert
from tests.hf_models import hf_model, padded_batch
from tests.test_modernbert import hf_modernbert
from tests.test_mpnet import hf_mpnet

BOUND = 1e-4
LENGTHS = [9, 1, 30, 17]


def _hf(kind: str) -> torch.nn.Module:
    """A tiny random Hugging Face encoder of each position scheme: sequential (BERT),
    padding-offset (RoBERTa), relative bias (MPNet), rotary with a sliding window
    (ModernBERT)."""
    if kind == "bert":
        return hf_model("BertModel", seed=1)
    if kind == "roberta":
        import transformers

        from tests.hf_models import TINY_SHAPE, random_hf_model

        config = transformers.RobertaConfig(
            vocab_size=97, **TINY_SHAPE, max_position_embeddings=160, pad_token_id=1
        )
        return random_hf_model("RobertaModel", config, seed=2)
    if kind == "mpnet":
        return hf_mpnet(seed=3)
    return hf_modernbert(seed=4)


def _packed(ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    lengths = mask.sum(dim=1).tolist()
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return ids[mask.bool()], offsets


@pytest.mark.parametrize("kind", ["bert", "roberta", "mpnet", "modernbert"])
@pytest.mark.parametrize("padding_free", ["auto", False])
def test_forward_packed_matches_hf_padded(kind: str, padding_free: object) -> None:
    hf = _hf(kind)
    ids, mask, _ = padded_batch(LENGTHS, seed=5)
    # Real ids avoid the pad id (1 for RoBERTa and MPNet, 0 otherwise): the packed rows are
    # the real tokens.
    ids = torch.where(mask.bool(), ids.clamp(min=2), torch.zeros_like(ids))
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    ours = fastbert.BertModel.from_pretrained(hf, backend="torch", padding_free=padding_free)
    packed_ids, cu_seqlens = _packed(ids, mask)
    with torch.no_grad():
        got = ours.forward_packed(packed_ids, cu_seqlens)
        as_tensor = ours.forward_packed(packed_ids, torch.tensor(cu_seqlens, dtype=torch.int32))
    assert got.shape == expected.shape
    error = (got - expected).abs().max().item()
    assert error <= BOUND, f"{kind}: forward_packed differs from Hugging Face by {error}"
    assert torch.equal(got, as_tensor)


def test_roberta_positions_count_pad_ids_inside_a_sequence() -> None:
    """A pad id inside a sequence's real tokens takes no position, as Hugging Face counts
    RoBERTa's positions (the padded batch's padding_offset rule)."""
    hf = _hf("roberta")
    ids, mask, _ = padded_batch([12, 8], seed=6)
    ids = torch.where(mask.bool(), ids.clamp(min=2), torch.ones_like(ids))
    ids[0, 5] = 1  # the pad id, counted as a real token by the mask
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    ours = fastbert.BertModel.from_pretrained(hf, backend="torch")
    with torch.no_grad():
        got = ours.forward_packed(*_packed(ids, mask))
    assert (got - expected).abs().max().item() <= BOUND


def test_token_types_and_an_empty_input() -> None:
    hf = _hf("bert")
    ids, mask, types = padded_batch([6, 11], seed=7)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    ours = fastbert.BertModel.from_pretrained(hf, backend="torch")
    packed_ids, cu_seqlens = _packed(ids, mask)
    with torch.no_grad():
        got = ours.forward_packed(packed_ids, cu_seqlens, types[mask.bool()])
        empty = ours.forward_packed(torch.zeros(0, dtype=torch.long), [0])
    assert (got - expected.last_hidden_state[mask.bool()]).abs().max().item() <= BOUND
    assert empty.shape == (0, 64)


@pytest.mark.parametrize(
    "ids, cu_seqlens, error, match",
    [
        (torch.ones(2, 3, dtype=torch.long), [0, 6], ValueError, r"shape \[tokens\]"),
        (torch.ones(5), [0, 5], TypeError, "input_ids"),
        (torch.ones(5, dtype=torch.long), [0, 4], ValueError, "from 0 to the 5 tokens"),
        (torch.ones(5, dtype=torch.long), [1, 5], ValueError, "from 0 to the 5 tokens"),
        (torch.ones(5, dtype=torch.long), [0, 4, 2, 5], ValueError, "never decrease"),
        (torch.ones(5, dtype=torch.long), torch.tensor([0.0, 5.0]), TypeError, "integers"),
        (torch.ones(200, dtype=torch.long), [0, 10, 200], ValueError, "sequence 1 has 190"),
        (torch.full((5,), 97), [0, 5], ValueError, "input_ids"),
    ],
)
def test_bad_packed_inputs_are_refused(ids, cu_seqlens, error, match) -> None:
    ours = fastbert.BertModel.from_pretrained(_hf("bert"), backend="torch")
    with pytest.raises(error, match=match):
        ours.forward_packed(ids, cu_seqlens)


def test_triton_backend_forward_packed_matches_hf(device: str) -> None:
    """The Triton kernels (the interpreter on a CPU) on packed input."""
    hf = _hf("bert").to(device)
    ids, mask, _ = padded_batch([5, 13, 2], seed=8, device=device)
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
    ours = fastbert.BertModel.from_pretrained(
        hf,
        device=device,
        dtype=torch.float32,
        backend="triton",  # CUDA's default is float16
    )
    with torch.no_grad():
        got = ours.forward_packed(*_packed(ids, mask))
    assert (got - expected).abs().max().item() <= BOUND


def _packed_calls(device: str):
    """Packed inputs of four calls of three sequences (a graph's key holds the number of
    sequences too): three in the size bucket of 64 tokens (max_seqlen 16), one in that of 128
    (max_seqlen 32)."""
    for seed, lengths in enumerate([[9, 5, 6], [3, 9, 5], [1, 2, 9], [30, 30, 10]]):
        ids, mask, _ = padded_batch(lengths, seed=seed, device=device)
        yield _packed(ids, mask)


def test_packed_input_replays_a_graph_per_size_bucket(device: str) -> None:
    """forward_packed keys its CUDA graphs on the packed size bucket (the CPU stand-in for
    graphs checks the bookkeeping; the Triton kernels under the interpreter run it), and a
    replayed call gives the eager call's values."""
    from tests.graph_doubles import ReplayingGraphs
    from tests.hf_models import inference_model

    hf = _hf("bert")
    options = dict(device=device, backend="triton", cuda_graphs=False)
    eager = inference_model(hf, **options)
    graphed = inference_model(hf, **options)
    graphed.runner.graphs = ReplayingGraphs(True, torch.device(device).type)
    for ids, cu_seqlens in _packed_calls(device):
        got = graphed.forward_packed(ids, cu_seqlens)
        torch.testing.assert_close(got, eager.forward_packed(ids, cu_seqlens), atol=1e-5, rtol=0)
        assert got.shape == (ids.numel(), 64)
    assert (graphed.runner.graphs.captures, graphed.runner.graphs.replays) == (2, 4)
    assert [key[-1] for key in graphed.runner.graphs.graphs] == [16, 32]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_forward_packed_cuda_graphs_on_gpu(dtype) -> None:
    """On a GPU, packed calls replayed from real CUDA graphs give the eager packed call's
    values, and both stay as close to the float32 model as the padded entry does."""
    from tests.hf_models import inference_model

    hf = _hf("bert")
    reference = inference_model(hf, device="cuda", cuda_graphs=False)
    eager = inference_model(hf, dtype=dtype, device="cuda", cuda_graphs=False)
    graphed = inference_model(hf, dtype=dtype, device="cuda", cuda_graphs=True)
    for ids, cu_seqlens in _packed_calls("cuda"):
        want = reference.forward_packed(ids, cu_seqlens)
        got = graphed.forward_packed(ids, cu_seqlens)
        assert torch.equal(got, eager.forward_packed(ids, cu_seqlens))
        # The padded entry's error in this dtype on the same sequences is the measure.
        bounds = torch.as_tensor(cu_seqlens).tolist()
        rows = [ids[a:b] for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        padded = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
        mask = torch.nn.utils.rnn.pad_sequence([torch.ones_like(r) for r in rows], True).bool()
        dense = eager(padded, mask.long()).last_hidden_state[mask]
        dense_error = dense.float() - reference(padded, mask.long()).last_hidden_state[mask]
        bound = 2 * dense_error.abs().max().item() + torch.finfo(dtype).eps
        assert (got.float() - want).abs().max().item() <= bound
    assert len(graphed.runner.graphs.graphs) == 2 and not graphed.runner.graphs.failed
