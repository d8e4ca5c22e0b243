"""MPNet: the relative position bias (its buckets, the attention ops with it) and optimized
Hugging Face MPNet models against Hugging Face's own, fp32, on padded and packed batches."""

from __future__ import annotations

import copy

import pytest
import torch
import triton
import triton.language as tl

import fastbert
from fastbert import kernels as K
from fastbert.kernels import reference
from fastbert.kernels.attention_tiles import relative_bucket
from tests.accuracy import assert_within_rule
from tests.hf_models import TINY_SHAPE, before_and_after_optimize, padded_batch, random_hf_model
from tests.op_cases import DOT_DTYPES, check_op, padded_mask, randn
from tests.test_training import assert_grads_match, grads, weighted_sum

BOUND = 1e-4
VOCAB = 97
# Lengths past the bias' max distance (128), so the saturated buckets are used too.
LENGTHS = [150, 7, 131, 1, 64]


def hf_mpnet(head: str = "Model", seed: int = 0, **overrides) -> torch.nn.Module:
    import transformers

    values = dict(vocab_size=VOCAB, **TINY_SHAPE, max_position_embeddings=160, num_labels=3)
    values.update(overrides)
    return random_hf_model(f"MPNet{head}", transformers.MPNetConfig(**values), seed)


def mpnet_inputs(lengths: list[int], seed: int = 0, device: str = "cpu"):
    """(input_ids, attention_mask): right-padded with the pad id 1; real ids avoid it."""
    ids, mask, _ = padded_batch(lengths, vocab=VOCAB, seed=seed, device=device)
    ids = torch.where(mask.bool(), ids.clamp(min=2), torch.ones_like(ids))
    return ids, mask


def test_bucket_matches_hf_at_every_distance() -> None:
    """Every key - query distance up to well past the saturation, edges of the log-spaced
    buckets (float rounding at 16, 32, 64) included."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    distance = torch.arange(-700, 701)
    expected = MPNetEncoder.relative_position_bucket(distance)
    assert torch.equal(reference.relative_position_bucket(distance), expected)


@triton.jit
def _buckets(Distance, Out, n, BLOCK: tl.constexpr):
    """Out[i] = relative_bucket(Distance[i]) for i < n."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    distance = tl.load(Distance + offs, mask=inside, other=0)
    tl.store(Out + offs, relative_bucket(distance), mask=inside)


def test_kernel_bucket_matches_reference_at_every_distance(device: str) -> None:
    """The kernels' integer bucketing (attention_tiles.relative_bucket) against the reference's
    float math, for every distance in [-700, 700]."""
    distance = torch.arange(-700, 701, dtype=torch.int32, device=device)
    out = torch.empty_like(distance)
    _buckets[(triton.cdiv(distance.numel(), 256),)](distance, out, distance.numel(), BLOCK=256)
    expected = reference.relative_position_bucket(distance.cpu())
    assert torch.equal(out.cpu().long(), expected)


def _bias_table(heads: int, dtype, device, seed: int = 5) -> torch.Tensor:
    """A [heads, 32] table with spread values, so a wrong bucket shows."""
    return 2.0 * randn((heads, 32), dtype, device, seed)


@pytest.mark.parametrize("dtype", DOT_DTYPES)
@pytest.mark.parametrize("seq, lengths", [(7, [7, 3]), (150, [150, 1, 131])])
def test_kernel_forward_with_bias(device: str, dtype, seq: int, lengths: list[int]) -> None:
    """K.attention with a bias table against the float64 reference (FlashAttention's rule), on
    a padded batch of mixed lengths and unmasked."""
    batch, heads = len(lengths), 2
    q, k, v = (randn((batch, seq, heads, 32), dtype, device, i).transpose(1, 2) for i in range(3))
    table = _bias_table(heads, dtype, device)
    mask = padded_mask(lengths, seq, device=device)
    valid = mask[:, None, :, None].expand(batch, heads, seq, 32)
    kwargs = {"key_padding_mask": mask, "relative_bias": table}
    check_op(K.attention, reference.attention, (q, k, v), kwargs, where=valid)
    check_op(K.attention, reference.attention, (q, k, v), {"relative_bias": table})


@pytest.mark.parametrize("dtype", DOT_DTYPES)
def test_kernel_varlen_with_bias(device: str, dtype) -> None:
    """Packed sequences: each sequence's own positions (a sequence starting late gets the same
    bias as alone)."""
    lengths, heads = [150, 1, 0, 40], 2
    tokens = sum(lengths)
    q, k, v = (randn((tokens, heads, 32), dtype, device, i) for i in range(3))
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    table = _bias_table(heads, dtype, device)
    args = (q, k, v, cu.to(device), max(lengths))
    check_op(K.attention_varlen, reference.attention_varlen, args, {"relative_bias": table})


def _gradients(function, tensors: list, extra: tuple, grad_out: torch.Tensor) -> tuple:
    """The gradients of ``function(q, k, v, *extra, relative_bias=table)`` in
    ``tensors`` = [q, k, v, table] (copies), for the output gradient ``grad_out``."""
    tensors = [t.detach().clone().requires_grad_() for t in tensors]
    q, k, v, table = tensors
    out = function(q, k, v, *extra, relative_bias=table)
    return torch.autograd.grad(out, tensors, grad_out.to(out.dtype))


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "varlen"])
def test_kernel_gradients_with_bias(device: str, packed: bool) -> None:
    """dQ, dK, dV and the table's gradient (the dQ programs' partial sums per bucket) against
    float64 autograd of the reference, fp32 and fp16 by the 2x rule."""
    lengths, heads = [140, 9], 2
    seq = max(lengths)
    for dtype in (torch.float32, torch.float16):
        if packed:
            shape = (sum(lengths), heads, 32)
            cu = torch.tensor([0, lengths[0], sum(lengths)], dtype=torch.int32, device=device)
            extra, where = (cu, seq), None
        else:
            shape = (len(lengths), heads, seq, 32)
            mask = padded_mask(lengths, seq, device=device)
            extra, where = (mask,), mask[:, None, :, None].expand(shape)
        inputs = [randn(shape, dtype, device, i) for i in range(3)]
        inputs.append(_bias_table(heads, dtype, device))
        grad_out = randn(shape, dtype, device, seed=9)
        kernel = K.attention_varlen if packed else K.attention
        op = reference.attention_varlen if packed else reference.attention

        grad_out = grad_out if where is None else grad_out * where
        got = _gradients(kernel, inputs, extra, grad_out)
        same_dtype = _gradients(op, inputs, extra, grad_out)
        exact = _gradients(op, [t.double() for t in inputs], extra, grad_out)
        for name, g, t, e in zip(("dq", "dk", "dv", "dbias"), got, same_dtype, exact):
            assert_within_rule(g, t, e, what=f"{name} {dtype}")


def test_reference_attention_matches_hf_scores() -> None:
    """softmax(q k^T / sqrt(D) + bias) as Hugging Face's MPNetSelfAttention computes it."""
    from transformers.models.mpnet.modeling_mpnet import MPNetEncoder

    gen = torch.Generator().manual_seed(0)
    heads, seq, dim = 3, 140, 16
    q, k, v = (torch.randn(2, heads, seq, dim, generator=gen, dtype=torch.float64) for _ in "qkv")
    table = torch.randn(32, heads, generator=gen, dtype=torch.float64)
    distance = torch.arange(seq)[None, :] - torch.arange(seq)[:, None]
    bias = table[MPNetEncoder.relative_position_bucket(distance)].permute(2, 0, 1)
    probs = torch.softmax(q @ k.transpose(-1, -2) / dim**0.5 + bias, dim=-1)
    got = reference.attention(q, k, v, relative_bias=table.t())
    assert (got - probs @ v).abs().max() <= 1e-12


def _assert_optimized_matches_hf(
    seed: int, lengths: list[int], device: str = "cpu", **options
) -> tuple[object, object]:
    """A random MPNet model's outputs on a padded batch of ``lengths``, before and after
    ``fastbert.optimize(model, **options)``, once their last hidden states are checked to be
    within BOUND at the real tokens."""
    model = hf_mpnet(seed=seed).to(device)
    ids, mask = mpnet_inputs(lengths, seed=seed, device=device)
    expected, got = before_and_after_optimize(
        model, {"input_ids": ids, "attention_mask": mask}, **options
    )
    err = (got.last_hidden_state - expected.last_hidden_state)[mask.bool()].abs().max()
    assert err <= BOUND, f"last_hidden_state differs by {err}"
    return expected, got


@pytest.mark.parametrize("padding_free", [False, True])
def test_torch_backend_matches_hf(padding_free: bool) -> None:
    expected, got = _assert_optimized_matches_hf(
        1, LENGTHS, backend="torch", padding_free=padding_free
    )
    assert (got.pooler_output - expected.pooler_output).abs().max() <= BOUND


def test_without_mask_matches_hf() -> None:
    model = hf_mpnet(seed=2)
    ids, _ = mpnet_inputs([20, 20], seed=2)
    expected, got = before_and_after_optimize(model, {"input_ids": ids}, backend="torch")
    assert (got.last_hidden_state - expected.last_hidden_state).abs().max() <= BOUND


def test_too_few_buckets_are_refused() -> None:
    with pytest.raises(ValueError, match="relative_attention_num_buckets must be 0 or >= 32"):
        fastbert.optimize(hf_mpnet(relative_attention_num_buckets=16), backend="torch")


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
def test_triton_backend_matches_hf(device: str, padding_free: bool) -> None:
    """The Triton kernels (the interpreter on a CPU) on sequences past the bias' max distance."""
    _assert_optimized_matches_hf(
        3, [150, 7, 131], device, backend="triton", padding_free=padding_free
    )


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gradients_match_hf_past_the_max_distance(device: str, backend: str) -> None:
    """Every parameter's gradient, the relative bias table's included, on long sequences."""
    model = hf_mpnet("ForMaskedLM", seed=4).to(device).train()
    reference_model = copy.deepcopy(model)
    ids, mask = mpnet_inputs([140, 9], seed=4, device=device)
    inputs = {"input_ids": ids, "attention_mask": mask}
    valid = mask.bool().cpu()
    weighted_sum(reference_model(**inputs), valid).backward()
    fastbert.optimize(model, backend=backend)
    weighted_sum(model(**inputs), valid).backward()
    expected, got = grads(reference_model), grads(model)
    assert got["mpnet.encoder.relative_attention_bias.weight"].abs().max() > 0
    assert_grads_match(expected, got)


def test_unsupported_architecture_names_the_families() -> None:
    import transformers

    config = transformers.DebertaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=128,
    )
    with pytest.raises(TypeError, match="got DebertaModel.*MPNet: MPNetModel, MPNetForMaskedLM"):
        fastbert.optimize(transformers.DebertaModel(config))


# --- the real all-mpnet-base-v2 weights ---------------------------------------------------


def _paragraphs(count: int, offset: int) -> list[str]:
    """Paragraphs of Python's own documentation: real English of mixed length."""
    from pydoc_data.topics import topics

    paragraphs = [
        " ".join(p.split()) for name in sorted(topics) for p in topics[name].split("\n\n")
    ]
    return [p for p in paragraphs if p][offset : offset + count]


@pytest.fixture(scope="module")
def mpnet_path():
    from fastbert.integrations import models

    try:
        return models.packaged_mpnet_path()
    except ValueError as error:
        pytest.skip(str(error))


@pytest.mark.slow
def test_real_weights_encode_matches_sentence_transformers(mpnet_path) -> None:
    """optimize(st).encode and fastbert.embed equal sentence-transformers' own encode on real
    text: short and long paragraphs (one past the 384-token limit) in padded batches."""
    import torch.nn.functional as F
    from sentence_transformers import SentenceTransformer

    texts = _paragraphs(40, offset=300) + [" ".join(_paragraphs(30, offset=500))]
    model = SentenceTransformer(str(mpnet_path), device="cpu")
    expected = model.encode(texts, batch_size=16, convert_to_tensor=True)
    assert type(model[0].auto_model).__name__ == "MPNetModel"
    fastbert.optimize(model)
    got = model.encode(texts, batch_size=16, convert_to_tensor=True)
    cosine = F.cosine_similarity(got, expected, dim=-1)
    assert cosine.min() >= 0.99999, f"lowest cosine {cosine.min():.7f}"
    embedded = torch.as_tensor(fastbert.embed(texts[:16], model=str(mpnet_path)))
    cosine = F.cosine_similarity(embedded, expected[:16], dim=-1)
    assert cosine.min() >= 0.99999, f"fastbert.embed: lowest cosine {cosine.min():.7f}"


@pytest.mark.parametrize("source", ["instance", "folder"])
def test_bert_model_from_pretrained_loads_the_encoder(source: str, tmp_path) -> None:
    """fastbert.BertModel.from_pretrained on an MPNet model, or on the folder of a masked-LM
    checkpoint (encoder tensors under ``mpnet.``), computes Hugging Face's last hidden state."""
    hf = hf_mpnet("ForMaskedLM", seed=6)
    if source == "folder":
        hf.save_pretrained(tmp_path)
        source_arg = tmp_path
    else:
        source_arg = hf
    with pytest.warns(UserWarning, match="no pooler"):
        ours = fastbert.BertModel.from_pretrained(source_arg, device="cpu", backend="torch")
    ids, mask = mpnet_inputs([140, 9], seed=6)
    with torch.no_grad():
        expected = hf.mpnet(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, mask).last_hidden_state
    valid = mask.bool()
    assert (got - expected)[valid].abs().max() <= BOUND


def test_heads_refuse_other_families() -> None:
    with pytest.raises(ValueError, match="loads BERT checkpoints; run MPNet heads through"):
        fastbert.BertForMaskedLM.from_pretrained(hf_mpnet("ForMaskedLM"), device="cpu")


def test_bench_shape_mpnet_base_is_an_mpnet_config() -> None:
    """The benchmarks' embedded mpnet-base shape reads as MPNet (relative bias, positions after
    the padding index, no token types), at all-mpnet-base-v2's size."""
    from fastbert.bench import shapes

    config = shapes.model_config("mpnet-base")
    assert config.relative_attention_num_buckets == 32
    assert (config.position_scheme, config.pad_token_id, config.type_vocab_size) == (
        "padding_offset",
        1,
        0,
    )
    assert (config.hidden_size, config.num_hidden_layers, config.max_sequence_length) == (
        768,
        12,
        512,
    )
