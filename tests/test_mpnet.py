"""MPNet: the relative position bias (its buckets, the attention ops with it) and optimized
Hugging Face MPNet models against Hugging Face's own, fp32, on padded and packed batches."""

from __future__ import annotations

import pytest
import torch

import fastbert
from fastbert.kernels import reference
from tests.hf_models import padded_batch, randomize

BOUND = 1e-4
VOCAB = 97
# Lengths past the bias' max distance (128), so the saturated buckets are used too.
LENGTHS = [150, 7, 131, 1, 64]


def hf_mpnet(head: str = "Model", seed: int = 0, **overrides) -> torch.nn.Module:
    import transformers

    values = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=128,
        max_position_embeddings=160,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=3,
    )
    values.update(overrides)
    torch.manual_seed(seed)
    model = getattr(transformers, f"MPNet{head}")(transformers.MPNetConfig(**values))
    return randomize(model, seed)


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


@pytest.mark.parametrize("padding_free", [False, True])
def test_torch_backend_matches_hf(padding_free: bool) -> None:
    model = hf_mpnet(seed=1)
    ids, mask = mpnet_inputs(LENGTHS, seed=1)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask)
        fastbert.optimize(model, backend="torch", padding_free=padding_free)
        got = model(input_ids=ids, attention_mask=mask)
    valid = mask.bool()
    err = (got.last_hidden_state - expected.last_hidden_state)[valid].abs().max()
    assert err <= BOUND, f"last_hidden_state differs by {err}"
    assert (got.pooler_output - expected.pooler_output).abs().max() <= BOUND


def test_without_mask_matches_hf() -> None:
    model = hf_mpnet(seed=2)
    ids, _ = mpnet_inputs([20, 20], seed=2)
    with torch.no_grad():
        expected = model(input_ids=ids).last_hidden_state
        fastbert.optimize(model, backend="torch")
        got = model(input_ids=ids).last_hidden_state
    assert (got - expected).abs().max() <= BOUND


def test_token_type_ids_are_refused() -> None:
    model = fastbert.optimize(hf_mpnet(), backend="torch")
    ids, mask = mpnet_inputs([4, 2])
    with pytest.raises(ValueError, match="token_type_ids.*no token types"):
        model(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))


def test_too_few_buckets_are_refused() -> None:
    with pytest.raises(ValueError, match="relative_attention_num_buckets must be 0 or >= 32"):
        fastbert.optimize(hf_mpnet(relative_attention_num_buckets=16), backend="torch")
