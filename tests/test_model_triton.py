"""The encoder's triton backend against Hugging Face (CPU: under the Triton interpreter)."""

from __future__ import annotations

import pytest
import torch

import fastbert
from tests.hf_models import hf_model, padded_batch

BOUND = 1e-4


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding_free"])
@pytest.mark.parametrize("lengths", [[7, 3, 5], [33, 1]], ids=["seq7", "seq33"])
def test_triton_backend_matches_hf_fp32(device, lengths, padding_free) -> None:
    hf = hf_model("BertModel", seed=len(lengths))
    model = fastbert.BertModel.from_pretrained(
        hf, dtype=torch.float32, device=device, backend="triton", padding_free=padding_free
    )
    ids, mask, types = padded_batch(lengths, seed=len(lengths), device=device)
    with torch.no_grad():
        expected = hf.to(device)(input_ids=ids, attention_mask=mask, token_type_ids=types)
    got = model(ids, mask, types)
    valid = mask.bool()
    assert (got.last_hidden_state - expected.last_hidden_state)[valid].abs().max() <= BOUND
    assert (got.pooler_output - expected.pooler_output).abs().max() <= BOUND


def test_triton_masked_lm_matches_hf_fp32(device) -> None:
    hf = hf_model("BertForMaskedLM", seed=9, hidden_act="gelu_new")
    model = fastbert.BertForMaskedLM.from_pretrained(
        hf, dtype=torch.float32, device=device, backend="triton"
    )
    ids, mask, types = padded_batch([9, 4], seed=9, device=device)
    with torch.no_grad():
        expected = hf.to(device)(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    got = model(ids, mask, types).logits
    valid = mask.bool()
    assert (got - expected)[valid].abs().max() <= BOUND
    assert torch.equal(got.argmax(-1)[valid], expected.argmax(-1)[valid])


def test_triton_backend_without_interpreter_or_gpu_says_so(interpreter_off) -> None:
    model = fastbert.BertModel.from_pretrained(hf_model(), device="cpu", backend="triton")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        model(torch.tensor([[1, 2, 3]]))


def _bert_base_hf():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    return BertModel(BertConfig()).eval()


@pytest.mark.gpu
@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding_free"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_bert_base_low_precision_within_twice_hf_error(dtype, padding_free) -> None:
    """fastbert in fp16/bf16 vs HF fp32: no more than twice HF's own error in that dtype."""
    hf32 = _bert_base_hf().cuda()
    hf_low = _bert_base_hf().to("cuda", dtype)
    model = fastbert.BertModel.from_pretrained(
        hf32, dtype=dtype, device="cuda", padding_free=padding_free
    )
    lengths = [128, 77, 128, 5, 100, 128, 64, 1]
    ids, mask, types = padded_batch(lengths, vocab=30522, seed=1, device="cuda")
    with torch.no_grad():
        ref = hf32(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
        hf_out = hf_low(input_ids=ids, attention_mask=mask, token_type_ids=types)
    got = model(ids, mask, types).last_hidden_state
    valid = mask.bool()
    err = (got.float() - ref)[valid].abs().max().item()
    hf_err = (hf_out.last_hidden_state.float() - ref)[valid].abs().max().item()
    assert err <= 2 * hf_err, f"fastbert error {err:.3g} > 2 x HF {dtype} error {hf_err:.3g}"


@pytest.mark.gpu
def test_bert_base_fp32_matches_hf() -> None:
    hf = _bert_base_hf().cuda()
    model = fastbert.BertModel.from_pretrained(hf, dtype=torch.float32, device="cuda")
    ids, mask, types = padded_batch([128, 60, 1], vocab=30522, seed=2, device="cuda")
    with torch.no_grad():
        ref = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    got = model(ids, mask, types).last_hidden_state
    assert (got - ref)[mask.bool()].abs().max() <= BOUND
