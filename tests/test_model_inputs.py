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


@pytest.mark.parametrize("layout", ["every other token", "rows of one token"])
def test_strided_ids_give_hugging_faces_result(layout) -> None:
    """Ids that are views with other strides (ids[:, ::2]; a batch of one-token rows, whose
    positions spread over the rows with stride 0) give Hugging Face's hidden states with
    gradients off, where the CPU engine runs its compiled embeddings."""
    hf = hf_model()
    model = fastbert.BertModel.from_pretrained(hf, device="cpu", backend="torch")
    wide = torch.randint(1, 97, (3, 16), generator=torch.Generator().manual_seed(0))
    ids = wide[:, ::2] if layout == "every other token" else wide[:, :1]
    with torch.inference_mode():
        expected = hf(ids.contiguous()).last_hidden_state
        got = model(ids).last_hidden_state
    torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)


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


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.uint8, torch.int32])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_small_integer_ids_behave_like_int64(device, backend, dtype) -> None:
    """int8 / int16 / uint8 / int32 ids and token types give what int64 ones give (uint8 ids
    are ids, not a boolean mask), on both backends."""
    model = fastbert.BertModel.from_pretrained(hf_model(), device=device, backend=backend)
    ids, mask, types = padded_batch([6, 3], device=device)
    expected = model(ids, mask, types).last_hidden_state
    got = model(ids.to(dtype), mask, types.to(dtype)).last_hidden_state
    assert torch.equal(got, expected)
    if dtype.is_signed:
        with pytest.raises(ValueError, match=r"input_ids must lie in \[0, 96\]"):
            model(torch.full((1, 2), -3, dtype=dtype, device=device))


def test_small_integer_ids_in_the_reference_op() -> None:
    from fastbert.kernels import reference

    word, pos, types = torch.randn(97, 8), torch.randn(16, 8), torch.randn(2, 8)
    ln = (torch.ones(8), torch.zeros(8), 1e-12)
    ids = torch.tensor([[3, 90, 0]])
    expected = reference.embeddings_layer_norm(ids, None, None, word, pos, types, *ln)
    for dtype in (torch.int8, torch.int16, torch.uint8):
        got = reference.embeddings_layer_norm(ids.to(dtype), None, None, word, pos, types, *ln)
        assert torch.equal(got, expected)


@pytest.mark.parametrize(
    "inputs, error, message",
    [
        (lambda ids: (ids, torch.ones(1, 7)), ValueError, "attention_mask must have the shape"),
        (
            lambda ids: (ids, None, torch.ones(0, 5, dtype=torch.long)),
            ValueError,
            "token_type_ids must have the shape",
        ),
        (lambda ids: (ids, None, torch.ones(0, 7)), TypeError, "token_type_ids must hold integer"),
        (lambda ids: (ids.to("meta"),), ValueError, "meta"),
        (
            lambda ids: (ids, torch.ones(0, 7, device="meta")),
            ValueError,
            "attention_mask is on meta",
        ),
    ],
)
def test_an_empty_batch_still_validates_its_other_inputs(model, inputs, error, message) -> None:
    with pytest.raises(error, match=message):
        model(*inputs(torch.empty(0, 7, dtype=torch.long)))


def test_meta_tensors_are_rejected() -> None:
    meta_model = fastbert.BertModel(
        fastbert.BertConfig(
            vocab_size=10,
            hidden_size=8,
            num_attention_heads=2,
            intermediate_size=8,
            num_hidden_layers=1,
        ),
        device="meta",
    )
    with pytest.raises(ValueError, match="meta device"):
        meta_model(torch.ones(1, 3, dtype=torch.long, device="meta"))


HEAD_CLASSES = [
    "BertModel",
    "BertForMaskedLM",
    "BertForSequenceClassification",
    "BertForNextSentencePrediction",
]


@pytest.mark.parametrize("cls_name", HEAD_CLASSES)
def test_run_settings_are_readable_settable_and_validated_on_every_model(cls_name) -> None:
    hf_name = "BertModel" if cls_name == "BertModel" else cls_name
    model = getattr(fastbert, cls_name).from_pretrained(
        hf_model(hf_name), device="cpu", padding_free=False, cuda_graphs=False
    )
    encoder = model if cls_name == "BertModel" else model.bert
    for name, value in (("padding_free", True), ("cuda_graphs", "auto"), ("backend", "torch")):
        setattr(model, name, value)
        assert getattr(model, name) == value
        assert getattr(encoder, name) == value, f"{name} did not reach the encoder"
    for name, bad in (("padding_free", "yes"), ("cuda_graphs", 1), ("backend", "cuda")):
        with pytest.raises(ValueError, match=name):
            setattr(model, name, bad)
        assert getattr(model, name) != bad
    model.padding_free = True  # takes effect: the torch backend then packs padded batches
    ids, mask, types = padded_batch([6, 2])
    hidden_zeroed = model.bert(ids, mask, types) if cls_name != "BertModel" else model(ids, mask)
    assert torch.equal(
        hidden_zeroed.last_hidden_state[1, 2:],
        torch.zeros_like(hidden_zeroed.last_hidden_state[1, 2:]),
    )


def _odd_head_model(**options) -> fastbert.BertModel:
    """A model with head dim 16 (hidden 32, 2 heads), which the Triton kernel does not run."""
    return fastbert.BertModel.from_pretrained(
        hf_model(hidden_size=32, num_attention_heads=2, intermediate_size=64),
        device="cpu",
        **options,
    )


def test_an_unsupported_head_dim_with_backend_triton_fails_when_built() -> None:
    with pytest.raises(ValueError, match="head dim .* is 16"):
        _odd_head_model(backend="triton")
    model = _odd_head_model(backend="torch")
    with pytest.raises(ValueError, match="head dim .* is 16"):
        model.backend = "triton"
    assert model.backend == "torch"


def test_an_unsupported_head_dim_runs_its_attention_on_the_reference(device) -> None:
    """backend='auto' on a Triton device: the attention alone falls back (one warning), the
    other ops run the kernels, and the model matches Hugging Face."""
    from fastbert.execution import backends as ops_module

    hf = hf_model(hidden_size=32, num_attention_heads=2, intermediate_size=64)
    model = fastbert.BertModel.from_pretrained(
        hf,
        device=device,
        dtype=torch.float32,
        backend="torch",  # CUDA's default is float16
    )
    model.runner._backend = "triton"  # what "auto" resolves to on CUDA (here: the interpreter)
    with pytest.warns(UserWarning, match="head dim 16"):
        ops = model.ops()
    assert ops.attention is ops_module.get_ops("torch", device).attention
    assert ops.linear is ops_module.get_ops("triton", device).linear
    ids, mask, types = padded_batch([6, 3], device=device)
    with torch.no_grad():
        expected = hf.to(device)(input_ids=ids, attention_mask=mask, token_type_ids=types)
    got = model(ids, mask, types).last_hidden_state
    valid = mask.bool()
    assert (got - expected.last_hidden_state)[valid].abs().max() <= 1e-4
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.ops()  # one warning per model
