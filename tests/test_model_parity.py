"""The torch backend computes what Hugging Face computes (fp32, identical weights)."""

from __future__ import annotations

import pytest
import torch

import fastbert
from tests.hf_models import hf_model, padded_batch

BOUND = 1e-4
LENGTHS = {
    1: [1, 1],
    7: [7, 3, 5],
    33: [33, 20, 1],
    128: [128, 64, 100],
}


def _hf_outputs(model, ids, mask, types):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask, token_type_ids=types)


@pytest.mark.parametrize("seq", sorted(LENGTHS))
@pytest.mark.parametrize("hidden_act", ["gelu", "gelu_new"])
def test_bert_model_matches_hf(seq: int, hidden_act: str) -> None:
    hf = hf_model("BertModel", hidden_act=hidden_act)
    ours = fastbert.BertModel.from_pretrained(hf, device="cpu", backend="torch")
    ids, mask, types = padded_batch(LENGTHS[seq], seed=seq)
    expected = _hf_outputs(hf, ids, mask, types)
    got = ours(ids, attention_mask=mask, token_type_ids=types)
    valid = mask.bool()
    hidden_err = (got.last_hidden_state - expected.last_hidden_state)[valid].abs().max()
    pooled_err = (got.pooler_output - expected.pooler_output).abs().max()
    assert hidden_err <= BOUND, f"last_hidden_state differs by {hidden_err}"
    assert pooled_err <= BOUND, f"pooler_output differs by {pooled_err}"


def test_without_mask_or_token_types_matches_hf() -> None:
    hf = hf_model("BertModel", seed=3)
    ours = fastbert.BertModel.from_pretrained(hf, device="cpu", backend="torch")
    ids, _, _ = padded_batch([12, 12], seed=3)
    with torch.no_grad():
        expected = hf(input_ids=ids)
    got = ours(ids)
    assert (got.last_hidden_state - expected.last_hidden_state).abs().max() <= BOUND
    assert (got.pooler_output - expected.pooler_output).abs().max() <= BOUND


@pytest.mark.parametrize("seq", [7, 33])
def test_masked_lm_matches_hf(seq: int) -> None:
    hf = hf_model("BertForMaskedLM", seed=seq)
    ours = fastbert.BertForMaskedLM.from_pretrained(hf, device="cpu", backend="torch")
    ids, mask, types = padded_batch(LENGTHS[seq], seed=seq)
    expected = _hf_outputs(hf, ids, mask, types).logits
    got = ours(ids, mask, types).logits
    valid = mask.bool()
    assert got.shape == expected.shape
    assert (got - expected)[valid].abs().max() <= BOUND
    assert torch.equal(got.argmax(-1)[valid], expected.argmax(-1)[valid])


@pytest.mark.parametrize("name", ["BertForSequenceClassification", "BertForNextSentencePrediction"])
def test_sentence_heads_match_hf(name: str) -> None:
    hf = hf_model(name, seed=5)
    ours = getattr(fastbert, name).from_pretrained(hf, device="cpu", backend="torch")
    ids, mask, types = padded_batch([7, 33, 12], seed=5)
    expected = _hf_outputs(hf, ids, mask, types).logits
    got = ours(ids, mask, types).logits
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= BOUND


def test_padding_values_have_no_influence() -> None:
    hf = hf_model("BertModel", seed=7)
    ours = fastbert.BertModel.from_pretrained(hf, device="cpu", backend="torch")
    ids, mask, types = padded_batch([9, 4], seed=7)
    before = ours(ids, mask, types).last_hidden_state
    noisy = torch.where(mask.bool(), ids, torch.full_like(ids, 55))
    after = ours(noisy, mask, types).last_hidden_state
    valid = mask.bool()
    assert torch.equal(before[valid], after[valid])
