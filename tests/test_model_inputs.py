"""Bad input to the encoder raises a clear error; edge cases give well-formed outputs."""

from __future__ import annotations

import pytest
import torch

import fastbert
from tests.hf_models import hf_model, padded_batch


@pytest.fixture(scope="module")
def model() -> fastbert.BertModel:
    return fastbert.BertModel.from_pretrained(hf_model(), device="cpu", backend="torch")


@pytest.mark.parametrize(
    "make_ids, error, message",
    [
        (lambda: torch.tensor([[5, 97]]), ValueError, r"input_ids must lie in \[0, 96\]"),
        (lambda: torch.tensor([[5, -1]]), ValueError, r"input_ids must lie in \[0, 96\]"),
        (lambda: torch.ones(1, 161, dtype=torch.long), ValueError, "max_position_embeddings"),
        (lambda: torch.ones(1, 4), TypeError, "input_ids must hold integer ids"),
        (lambda: torch.ones(4, dtype=torch.long), ValueError, r"\[batch, seq\]"),
        (lambda: torch.ones(1, 2, 3, dtype=torch.long), ValueError, r"\[batch, seq\]"),
        (lambda: [[1, 2]], TypeError, "must be a torch.Tensor"),
        (lambda: torch.ones(2, 0, dtype=torch.long), ValueError, "sequence length 0"),
    ],
)
def test_bad_input_ids(model, make_ids, error, message) -> None:
    with pytest.raises(error, match=message):
        model(make_ids())


def test_mask_shape_must_match(model) -> None:
    ids, mask, _ = padded_batch([5, 5])
    with pytest.raises(ValueError, match="attention_mask must have the shape of input_ids"):
        model(ids, attention_mask=mask[:, :4])


def test_token_type_shape_must_match(model) -> None:
    ids, _, types = padded_batch([5, 5])
    with pytest.raises(ValueError, match="token_type_ids must have the shape of input_ids"):
        model(ids, token_type_ids=types[:1])


def test_token_type_out_of_range(model) -> None:
    ids, _, types = padded_batch([5, 5])
    with pytest.raises(ValueError, match=r"token_type_ids must lie in \[0, 1\]"):
        model(ids, token_type_ids=types + 2)


def test_float_token_types_rejected(model) -> None:
    ids, _, types = padded_batch([5, 5])
    with pytest.raises(TypeError, match="token_type_ids must hold integer ids"):
        model(ids, token_type_ids=types.float())


def test_inputs_on_another_device_rejected(model) -> None:
    ids = torch.ones(1, 3, dtype=torch.long, device="meta")
    with pytest.raises(ValueError, match="input_ids is on meta but the model is on cpu"):
        model(ids)


def test_empty_batch_gives_empty_outputs(model) -> None:
    out = model(torch.empty(0, 7, dtype=torch.long))
    assert out.last_hidden_state.shape == (0, 7, 64)
    assert out.pooler_output.shape == (0, 64)


def test_empty_batch_heads() -> None:
    mlm = fastbert.BertForMaskedLM.from_pretrained(hf_model("BertForMaskedLM"), device="cpu")
    assert mlm(torch.empty(0, 3, dtype=torch.long)).logits.shape == (0, 3, 97)
    cls = fastbert.BertForSequenceClassification.from_pretrained(
        hf_model("BertForSequenceClassification"), device="cpu"
    )
    assert cls(torch.empty(0, 3, dtype=torch.long)).logits.shape == (0, 3)


def test_all_padding_row_is_finite(model) -> None:
    ids, mask, types = padded_batch([6, 6])
    mask[1] = 0
    out = model(ids, mask, types)
    assert torch.isfinite(out.last_hidden_state).all()
    assert torch.isfinite(out.pooler_output).all()


def test_single_token(model) -> None:
    out = model(torch.tensor([[7]]))
    assert out.last_hidden_state.shape == (1, 1, 64)
    assert torch.isfinite(out.last_hidden_state).all()


def test_bool_and_float_masks_equal_int_mask(model) -> None:
    ids, mask, types = padded_batch([6, 3])
    ref = model(ids, mask, types).last_hidden_state
    for other in (mask.bool(), mask.float()):
        assert torch.equal(model(ids, other, types).last_hidden_state, ref)


def test_outputs_index_like_hf(model) -> None:
    ids, mask, _ = padded_batch([4, 4])
    out = model(ids, mask)
    hidden, pooled = out
    assert out[0] is hidden and out["pooler_output"] is pooled


def test_unknown_backend_rejected() -> None:
    with pytest.raises(ValueError, match="backend must be one of"):
        fastbert.BertModel.from_pretrained(hf_model(), device="cpu", backend="cuda")
