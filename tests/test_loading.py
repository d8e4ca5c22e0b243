"""from_pretrained: every source loads the same weights; bad checkpoints fail by name."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import fastbert
from fastbert.model.families import FAMILIES
from tests.hf_models import as_pytorch_bin, hf_model, padded_batch


def _same_outputs(a, b) -> None:
    ids, mask, types = padded_batch([8, 5], seed=11)
    assert torch.equal(a(ids, mask, types)[0], b(ids, mask, types)[0])


@pytest.mark.parametrize("safe", [True, False], ids=["safetensors", "pytorch_model.bin"])
def test_folder_loads_like_instance(tmp_path, safe: bool) -> None:
    hf = hf_model("BertForMaskedLM", seed=1)
    hf.save_pretrained(tmp_path)
    if not safe:
        as_pytorch_bin(tmp_path)
    from_folder = fastbert.BertForMaskedLM.from_pretrained(tmp_path, device="cpu")
    from_instance = fastbert.BertForMaskedLM.from_pretrained(hf, device="cpu")
    _same_outputs(from_folder, from_instance)


def test_base_model_from_head_checkpoint(tmp_path) -> None:
    hf = hf_model("BertForSequenceClassification", seed=2)
    hf.save_pretrained(tmp_path)
    model = fastbert.BertModel.from_pretrained(tmp_path, device="cpu")
    ids, mask, types = padded_batch([6, 6], seed=2)
    with torch.no_grad():
        expected = hf.bert(input_ids=ids, attention_mask=mask, token_type_ids=types)
    assert (model(ids, mask, types).pooler_output - expected.pooler_output).abs().max() < 1e-4


def test_checkpoint_without_pooler_warns_and_omits_it(tmp_path) -> None:
    hf = hf_model("BertForMaskedLM", seed=3)
    hf.save_pretrained(tmp_path)
    with pytest.warns(UserWarning, match="no pooler"):
        model = fastbert.BertModel.from_pretrained(tmp_path, device="cpu")
    assert model(torch.tensor([[3, 4]])).pooler_output is None


def _rewrite_weights(folder, edit) -> None:
    state = load_file(folder / "model.safetensors")
    edit(state)
    save_file(state, folder / "model.safetensors")


def test_missing_tensor_is_named(tmp_path) -> None:
    hf_model("BertModel").save_pretrained(tmp_path)
    _rewrite_weights(tmp_path, lambda s: s.pop("encoder.layer.1.attention.self.key.weight"))
    with pytest.raises(ValueError, match="lacks 'encoder.layer.1.attention.self.key.weight'"):
        fastbert.BertModel.from_pretrained(tmp_path, device="cpu")


def test_misshaped_tensor_is_named(tmp_path) -> None:
    hf_model("BertModel").save_pretrained(tmp_path)
    name = "encoder.layer.0.intermediate.dense.weight"
    _rewrite_weights(tmp_path, lambda s: s.update({name: s[name][:, :10].contiguous()}))
    with pytest.raises(ValueError, match=f"{name} has shape \\(128, 10\\)"):
        fastbert.BertModel.from_pretrained(tmp_path, device="cpu")


def test_head_missing_from_base_checkpoint_is_named(tmp_path) -> None:
    hf_model("BertModel").save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="lacks 'classifier.weight'"):
        fastbert.BertForSequenceClassification.from_pretrained(tmp_path, device="cpu")


def test_legacy_gamma_beta_names(tmp_path) -> None:
    hf = hf_model("BertModel", seed=4)
    hf.save_pretrained(tmp_path)

    def rename(state):
        for key in [k for k in state if "LayerNorm" in k]:
            new = key.replace("LayerNorm.weight", "LayerNorm.gamma")
            new = new.replace("LayerNorm.bias", "LayerNorm.beta")
            state[new] = state.pop(key)

    _rewrite_weights(tmp_path, rename)
    _same_outputs(
        fastbert.BertModel.from_pretrained(tmp_path, device="cpu"),
        fastbert.BertModel.from_pretrained(hf, device="cpu"),
    )


def test_untied_decoder_rejected() -> None:
    hf = hf_model("BertForMaskedLM")
    state = hf.state_dict()
    state["cls.predictions.decoder.weight"] = state["cls.predictions.decoder.weight"] + 1
    model = fastbert.BertForMaskedLM(fastbert.BertConfig.from_hf(hf.config))
    from fastbert.model.loading import load_weights

    with pytest.raises(ValueError, match="decoder.weight differs"):
        load_weights(model, state)


def test_masked_lm_reads_the_decoders_own_bias() -> None:
    """Hugging Face's decoder adds its own bias (the head's plain one only where they are
    tied): fastbert's BertForMaskedLM read the plain one."""
    hf = hf_model("BertForMaskedLM", seed=3).eval()
    predictions = hf.cls.predictions
    predictions.decoder.bias = torch.nn.Parameter(predictions.bias.detach() + 0.5)
    ids, mask, types = padded_batch([6, 3], seed=3)
    valid = mask.bool()
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        got = fastbert.BertForMaskedLM.from_pretrained(hf, device="cpu")(ids, mask, types)[0]
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-5)


def test_non_bert_config_rejected(tmp_path) -> None:
    hf_model("BertModel").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = "gpt2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        fastbert.BertModel.from_pretrained(tmp_path, device="cpu")


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("position_embedding_type", "relative_key", "position_embedding_type"),
        ("hidden_act", "swish", "hidden_act 'swish' is not supported"),
    ],
)
def test_unsupported_config_rejected(field, value, message) -> None:
    with pytest.raises(ValueError, match=message):
        fastbert.BertConfig.from_dict({field: value})


def test_hub_id_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="not a local folder"):
        fastbert.BertModel.from_pretrained("bert-base-uncased", device="cpu")


def test_unknown_source_type() -> None:
    with pytest.raises(TypeError, match="from_pretrained takes"):
        fastbert.BertModel.from_pretrained(42, device="cpu")


def test_dtype_and_default_device() -> None:
    model = fastbert.BertModel.from_pretrained(hf_model(), dtype=torch.float16, device="cpu")
    assert model.dtype == torch.float16 and model.device.type == "cpu"
    out = model(torch.tensor([[3, 4, 5]]))
    assert out.last_hidden_state.dtype == torch.float16


@pytest.mark.parametrize("family", ["bert", "roberta", "xlm-roberta", "electra", "distilbert"])
def test_each_family_folder_loads_hugging_faces_outputs(tmp_path, family: str) -> None:
    """Every family's saved folder gives Hugging Face's last hidden state: ELECTRA's
    embedding projection (embedding_size 32 != hidden_size 64, ELECTRA-small's shape) was
    never read, so every text got the same output (3.1 from Hugging Face's)."""
    from tests.test_optimize import make_inputs, make_model

    hf = make_model(family, "Model").eval()
    hf.save_pretrained(tmp_path)
    inputs, valid = make_inputs(hf, "Model", [7, 3])
    if family == "distilbert":
        inputs.pop("token_type_ids", None)
    with torch.no_grad():
        want = hf(**inputs).last_hidden_state
        got = fastbert.BertModel.from_pretrained(tmp_path, device="cpu", backend="torch")(
            inputs["input_ids"], inputs["attention_mask"], inputs.get("token_type_ids")
        )[0]
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-5)


def _edited_config(folder, drop: tuple[str, ...] = (), **add) -> None:
    path = folder / "config.json"
    values = json.loads(path.read_text())
    for key in drop:
        values.pop(key, None)
    path.write_text(json.dumps({**values, **add}))


@pytest.mark.parametrize(
    "family, drop, add",
    [
        ("roberta", ("pad_token_id",), {}),
        ("xlm-roberta", ("pad_token_id",), {}),
        ("modernbert", ("norm_eps",), {}),
        ("modernbert", (), {"sliding_window": 2}),
        ("modernbert", (), {"pad_token_id": None}),
        ("mpnet", ("relative_attention_num_buckets",), {}),
        ("distilbert", ("dim", "n_layers", "n_heads"), "bert-names"),
    ],
    ids=[
        "roberta-no-pad-id",
        "xlm-r-no-pad-id",
        "modernbert-no-norm-eps",
        "modernbert-sliding-window-alias",
        "modernbert-null-pad-id",
        "mpnet-no-buckets",
        "distilbert-bert-names",
    ],
)
def test_a_config_json_reads_as_transformers_reads_it(tmp_path, family, drop, add) -> None:
    """What a config.json leaves out takes the family's default, and older or alias keys
    count, as in Hugging Face: fastbert took its own defaults (RoBERTa's pad id 0 where
    Hugging Face's is 1: 0.91 off; ModernBERT's eps 1e-12 for 1e-5), ignored ModernBERT's
    sliding_window (0.26) and failed on a null pad id or MPNet's default buckets."""
    import transformers

    from tests.test_modernbert import hf_modernbert
    from tests.test_optimize import make_inputs, make_model

    hf = hf_modernbert() if family == "modernbert" else make_model(family, "Model")
    hf.save_pretrained(tmp_path)
    if add == "bert-names":  # transformers' attribute_map reads them as DistilBERT's own
        config = hf.config
        add = dict(
            hidden_size=config.dim,
            num_hidden_layers=config.n_layers,
            num_attention_heads=config.n_heads,
        )
    _edited_config(tmp_path, drop, **add)
    reference = transformers.AutoModel.from_pretrained(tmp_path, attn_implementation="eager")
    inputs, valid = make_inputs(hf, "Model", [9, 4])
    inputs.pop("token_type_ids", None)
    with torch.no_grad():
        want = reference.eval()(**inputs).last_hidden_state
        model = fastbert.BertModel.from_pretrained(tmp_path, device="cpu", backend="torch")
        got = model(inputs["input_ids"], inputs["attention_mask"])[0]
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("family", [f.model_type for f in FAMILIES])
def test_each_familys_defaults_are_transformers(family: str) -> None:
    """A config.json that names only its model_type reads as the family's transformers
    config class fills it in (fastbert took BERT's defaults: RoBERTa's pad id 0)."""
    import dataclasses

    import transformers

    from fastbert.model.families import family_of_model_type

    spec = family_of_model_type(family)
    ours = fastbert.BertConfig.from_dict({"model_type": family}, spec)
    theirs = fastbert.BertConfig.from_hf(getattr(transformers, f"{spec.prefix}Config")(), spec)
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)


def test_a_scaled_rope_under_the_older_key_is_refused(tmp_path) -> None:
    """ModernBERT's rope_scaling (before rope_parameters) scales both layer types' RoPE in
    transformers: refused as rope_parameters' is (it ran unscaled: 0.05 off)."""
    from tests.test_modernbert import hf_modernbert

    hf_modernbert().save_pretrained(tmp_path)
    _edited_config(
        tmp_path, ("rope_parameters",), rope_scaling={"rope_type": "linear", "factor": 4.0}
    )
    with pytest.raises(ValueError, match="rope_type 'linear' .* is not supported"):
        fastbert.BertModel.from_pretrained(tmp_path, device="cpu")
