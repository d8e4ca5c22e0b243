"""Training through fastbert: gradients against Hugging Face's, losses, dropout, and a
fine-tuning run that follows Hugging Face's loss curve.

Gradients are compared in float32 with dropout off, on the torch backend (the Triton
kernels' gradients are compared op by op in their own tests, and end to end in
test_training_triton.py): every parameter's gradient within 1e-4 of Hugging Face's relative
to its norm.
"""

from __future__ import annotations

import copy

import pytest
import torch

import fastbert
from fastbert.model.encoder import CHECKPOINT
from fastbert.model.loading import hf_weight_names
from tests.hf_models import encoder_shape, hf_model, padded_batch
from tests.test_optimize import CASES, FAMILIES, make_inputs, make_model, training_step

GRAD_BOUND = 1e-4
LENGTHS = [7, 3, 5, 1, 6, 7]
# Key biases have a zero gradient in exact arithmetic (a softmax ignores a constant added to
# all scores of its row): both sides hold rounding noise (~1e-7 here), compared to the norm of
# the key weight's gradient instead of their own.
KEY_BIASES = ("attention.self.key.bias", "attention.k_lin.bias", "attention.attn.k.bias")
# The heads' own dropouts off too (DistilBERT's classifier and QA heads, ELECTRA's sequence
# summary), so that train mode is deterministic on both sides.
NO_HEAD_DROPOUT = dict(seq_classif_dropout=0.0, qa_dropout=0.0, summary_last_dropout=0.0)

# Hugging Face's names of the two dropout probabilities (DistilBERT's differ).
HIDDEN_AND_ATTENTION = ("hidden_dropout_prob", "attention_probs_dropout_prob")


def weighted_sum(
    outputs, valid: torch.Tensor, seed: int = 0, tokens_only: bool = False
) -> torch.Tensor:
    """A scalar that depends on every output value at real tokens (fixed random weights), so
    its gradient reaches every parameter an output depends on. ``tokens_only``: leave out
    sentence-level outputs (a pooler reads position 0, a pad under left padding)."""
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    for key, value in outputs.items():
        if not isinstance(value, torch.Tensor) or key == "loss":
            continue
        if tuple(value.shape[: valid.dim()]) == tuple(valid.shape):
            value = value[valid]
        elif tokens_only:
            continue
        weights = torch.randn(value.shape, generator=gen).to(value.device)
        total = total + (value * weights).sum()
    return total


def assert_grads_match(expected: dict, got: dict, bound: float = GRAD_BOUND) -> None:
    """``got[name]`` within ``bound`` of ``expected[name]`` relative to its norm, per name; a
    gradient Hugging Face does not give (None) must be absent or zero."""
    assert expected.keys() == got.keys()
    for name, want in expected.items():
        have = got[name]
        if name.endswith(KEY_BIASES):
            scale = expected[name.replace(".bias", ".weight")].norm()
            assert max(have.norm(), want.norm()) <= bound * scale, f"{name}: not ~0"
            continue
        if want is None or not want.abs().max():
            assert have is None or not have.abs().max(), f"{name}: unexpected gradient"
            continue
        assert have is not None, f"{name}: no gradient"
        error = ((have - want).norm() / want.norm()).item()
        assert error <= bound, f"{name}: gradient differs by {error:.2e} of its norm"


def grads(model: torch.nn.Module) -> dict:
    return {name: p.grad for name, p in model.named_parameters()}


def left_padded(inputs: dict, valid: torch.Tensor) -> tuple[dict, torch.Tensor]:
    """The same rows with their padding moved to the front."""
    order = torch.argsort(valid.long(), dim=-1, stable=True)
    return {k: torch.gather(v, -1, order) for k, v in inputs.items()}, valid.gather(-1, order)


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
@pytest.mark.parametrize("family, head", CASES, ids=[f"{f}-{h}" for f, h in CASES])
def test_optimized_gradients_match_hf(family: str, head: str, padding_free: bool) -> None:
    model = make_model(family, head, seed=len(head), **NO_HEAD_DROPOUT).train()
    reference = copy.deepcopy(model)
    inputs, valid = make_inputs(model, head, LENGTHS, seed=len(family))
    weighted_sum(reference(**inputs), valid).backward()
    fastbert.optimize(model, backend="torch", padding_free=padding_free)
    weighted_sum(model(**inputs), valid).backward()
    assert_grads_match(grads(reference), grads(model))


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_left_padded_gradients_match_hf(family: str, padding_free: bool) -> None:
    model = make_model(family, "ForMaskedLM", seed=21).train()
    reference = copy.deepcopy(model)
    inputs, valid = left_padded(*make_inputs(model, "ForMaskedLM", LENGTHS, seed=21))
    weighted_sum(reference(**inputs), valid, tokens_only=True).backward()
    fastbert.optimize(model, backend="torch", padding_free=padding_free)
    weighted_sum(model(**inputs), valid, tokens_only=True).backward()
    assert_grads_match(grads(reference), grads(model))


def _zero_head_biases(model: torch.nn.Module) -> torch.nn.Module:
    """The head's linears without bias, as Hugging Face initialises a fresh head: a padded
    position's zeros then reach the head's LayerNorm as a constant row."""
    encoder = set(model.base_model.modules())
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module not in encoder:
            torch.nn.init.zeros_(module.bias)
    return model


@pytest.mark.parametrize("family", [f for f, head in CASES if head == "ForMaskedLM"])
def test_float16_masked_lm_gradients_on_a_cpu_are_as_close_as_hugging_faces(family: str) -> None:
    # PyTorch's float16 LayerNorm backward on a CPU is NaN for a constant row: a padding-free
    # call's zero rows gave a fresh head's LayerNorm NaN gradients, where Hugging Face's are
    # finite. In float16 both sides round: each is compared to the float32 gradients, and
    # fastbert's distance must be at most twice Hugging Face's own (1e-3 of the norm at least).
    exact = _zero_head_biases(make_model(family, "ForMaskedLM", seed=31))
    reference, model = copy.deepcopy(exact).half(), copy.deepcopy(exact).half()
    inputs, valid = make_inputs(exact, "ForMaskedLM", LENGTHS, seed=31)
    labels = _mlm_labels(inputs["input_ids"], valid)
    for each in (exact, reference, fastbert.optimize(model, backend="torch", padding_free=True)):
        each(**inputs, labels=labels).loss.backward()
    for name, want in grads(exact).items():
        if want is None or not want.abs().max() or name.endswith(KEY_BIASES):
            continue
        theirs = (grads(reference)[name].float() - want).norm() / want.norm()
        ours = (grads(model)[name].float() - want).norm() / want.norm()
        assert ours <= 2 * max(theirs, 1e-3), f"{name}: {ours:.2e} from float32, HF {theirs:.2e}"


# fastbert's own heads: (class, labels maker) -> the Hugging Face class with the same head.
def _mlm_labels(ids: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    labels = ids.clone()
    labels[~valid] = -100
    labels[:, ::3] = -100  # unpredicted positions
    return labels


_OWN_HEADS = {
    "BertForMaskedLM": lambda ids, valid: {"labels": _mlm_labels(ids, valid)},
    "BertForPreTraining": lambda ids, valid: {
        "labels": _mlm_labels(ids, valid),
        "next_sentence_label": torch.arange(ids.shape[0]) % 2,
    },
    "BertForNextSentencePrediction": lambda ids, valid: {"labels": torch.arange(ids.shape[0]) % 2},
    "BertForSequenceClassification": lambda ids, valid: {"labels": torch.arange(ids.shape[0]) % 3},
}


def _fused_hf_grads(hf: torch.nn.Module, ours: torch.nn.Module) -> dict:
    """Hugging Face's gradients under fastbert's parameter names (query, key and value
    concatenated as fastbert fuses them)."""
    hf_grads = {name: p.grad for name, p in hf.named_parameters()}
    with_pooler = any(n.endswith("pooler.weight") for n, _ in ours.named_parameters())
    names = hf_weight_names(type(ours).__name__, ours.config, with_pooler)
    return {
        ours_name: torch.cat([hf_grads[t] for t in theirs]) for ours_name, theirs in names.items()
    }


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
@pytest.mark.parametrize("cls_name", sorted(_OWN_HEADS))
def test_own_heads_loss_and_gradients_match_hf(cls_name: str, padding_free: bool) -> None:
    hf = hf_model(cls_name, seed=11).train()
    ours = (
        getattr(fastbert, cls_name)
        .from_pretrained(hf, device="cpu", backend="torch", padding_free=padding_free)
        .train()
    )
    ids, mask, types = padded_batch(LENGTHS, seed=11)
    labels = _OWN_HEADS[cls_name](ids, mask.bool())
    want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, **labels)
    have = ours(ids, mask, types, **labels)
    assert abs(have.loss.item() - want.loss.item()) <= 1e-5 * max(1.0, abs(want.loss.item()))
    want.loss.backward()
    have.loss.backward()
    assert_grads_match(_fused_hf_grads(hf, ours), grads(ours))


@pytest.mark.parametrize("cls_name", ["BertForMaskedLM", "BertForPreTraining"])
def test_own_heads_read_targets_at_padding_as_hf(cls_name: str) -> None:
    # A collator that copies input_ids into labels leaves targets at padding: the loss reads
    # those positions, so the padding-free call runs dense as Hugging Face computes them.
    hf = hf_model(cls_name, seed=13).train()
    ours = getattr(fastbert, cls_name).from_pretrained(hf, backend="torch", padding_free=True)
    ids, mask, types = padded_batch(LENGTHS, seed=13)
    labels = {"labels": ids.clone(), "next_sentence_label": torch.arange(ids.shape[0]) % 2}
    if cls_name == "BertForMaskedLM":
        del labels["next_sentence_label"]
    want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, **labels)
    have = ours.train()(ids, mask, types, **labels)
    assert abs(have.loss.item() - want.loss.item()) <= 1e-5 * max(1.0, abs(want.loss.item()))
    want.loss.backward()
    have.loss.backward()
    assert_grads_match(_fused_hf_grads(hf, ours), grads(ours))


def test_own_float16_masked_lm_gradients_on_a_cpu_are_as_close_as_hugging_faces() -> None:
    # fastbert's own head reads the padding-free call's zero rows too: its LayerNorm runs in
    # float32 where PyTorch's float16 one on a CPU would give NaN gradients (see above).
    exact = _zero_head_biases(hf_model("BertForMaskedLM", seed=32))
    reference = copy.deepcopy(exact).half()
    ours = fastbert.BertForMaskedLM.from_pretrained(
        reference, dtype=torch.float16, backend="torch", padding_free=True
    )
    ids, mask, types = padded_batch(LENGTHS, seed=32)
    labels = _mlm_labels(ids, mask.bool())
    for hf in (exact, reference):
        hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels).loss.backward()
    ours(ids, mask, types, labels=labels).loss.backward()
    want, theirs = _fused_hf_grads(exact, ours), _fused_hf_grads(reference, ours)
    for name, have in grads(ours).items():
        if name.endswith("key_bias") or not want[name].abs().max():
            continue
        hf_error = (theirs[name].float() - want[name]).norm() / want[name].norm()
        error = (have.float() - want[name]).norm() / want[name].norm()
        assert error <= 2 * max(hf_error, 1e-3), f"{name}: {error:.2e}, HF {hf_error:.2e}"


@pytest.mark.parametrize(
    "num_labels, labels, problem",
    [
        (1, torch.tensor([0.5, -1.0]), "regression"),
        (3, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.0]]), "multi_label_classification"),
        (3, torch.tensor([2, 0]), "single_label_classification"),
    ],
)
def test_sequence_classification_losses_match_hf(num_labels, labels, problem) -> None:
    hf = hf_model("BertForSequenceClassification", seed=12, num_labels=num_labels)
    ours = fastbert.BertForSequenceClassification.from_pretrained(hf, backend="torch")
    ids, mask, types = padded_batch([5, 3], seed=12)
    want = hf(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)
    have = ours(ids, mask, types, labels=labels)
    assert hf.config.problem_type == problem  # Hugging Face inferred it, as fastbert does
    torch.testing.assert_close(have.loss, want.loss, atol=1e-5, rtol=1e-5)


def test_loss_comes_first_like_hf() -> None:
    ours = fastbert.BertForSequenceClassification.from_pretrained(
        hf_model("BertForSequenceClassification"), backend="torch"
    )
    ids, mask, types = padded_batch([4, 2])
    loss, logits = ours(ids, mask, types, labels=torch.tensor([0, 1]))
    assert loss.dim() == 0 and logits.shape == (2, 3)
    (logits_only,) = ours(ids, mask, types)
    assert logits_only.shape == (2, 3)


@pytest.mark.parametrize(
    "cls_name, labels, message",
    [
        (
            "BertForMaskedLM",
            torch.zeros(2, 3, dtype=torch.long),
            r"masked-LM labels must have shape \[2, 4\]",
        ),
        (
            "BertForSequenceClassification",
            torch.zeros(3, dtype=torch.long),
            r"single-label classification labels must have shape \[2\]",
        ),
    ],
)
def test_labels_of_the_wrong_shape_raise(cls_name, labels, message) -> None:
    ours = getattr(fastbert, cls_name).from_pretrained(hf_model(cls_name), backend="torch")
    ids, mask, types = padded_batch([4, 2])
    with pytest.raises(ValueError, match=message):
        ours(ids, mask, types, labels=labels)


def test_every_parameter_gets_a_gradient_and_requires_grad_by_default() -> None:
    model = fastbert.BertForPreTraining.from_pretrained(
        hf_model("BertForPreTraining"), backend="torch"
    )
    assert all(p.requires_grad for p in model.parameters())
    assert not model.training  # from_pretrained returns eval mode, as Hugging Face does
    ids, mask, types = padded_batch([6, 4], seed=3)
    labels = _OWN_HEADS["BertForPreTraining"](ids, mask.bool())
    model(ids, mask, types, **labels).loss.backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().max()]
    assert missing == []


def test_own_models_checkpoint_the_layers_asked_through_the_function_given() -> None:
    """fastbert's own models: ``gradient_checkpointing`` with ``checkpointed_layers`` runs the
    chosen layers alone through ``checkpoint_function``, saving less, with the same loss and
    gradients (dropout included)."""
    model = fastbert.BertForSequenceClassification.from_pretrained(
        hf_model("BertForSequenceClassification"), backend="torch"
    ).train()
    encoder = next(m for m in model.modules() if isinstance(m, fastbert.BertModel))
    assert len(encoder.layers) >= 2
    ids, mask, types = padded_batch([9, 6, 9, 4], seed=4)
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    labels = torch.tensor([0, 1, 1, 0])
    full, loss, expected = training_step(model, inputs, labels)

    calls = [0]

    def counted(*args, **kwargs):
        calls[0] += 1
        return CHECKPOINT(*args, **kwargs)

    # Set on the head model, as on Hugging Face's: the encoder's (setting them on the head
    # added attributes nothing read).
    model.gradient_checkpointing = True
    model.checkpointed_layers = (True,) + (False,) * (len(encoder.layers) - 1)
    model.checkpoint_function = counted
    assert encoder.gradient_checkpointing and encoder.checkpoint_function is counted
    kept, checkpointed_loss, got = training_step(model, inputs, labels)
    assert calls[0] == 1 and kept < full
    assert torch.equal(loss, checkpointed_loss)
    for name, grad in expected.items():
        assert torch.allclose(grad, got[name], atol=1e-6), name


@pytest.mark.parametrize("value", [(True,), (True, False, True, False, True), (1, 0, 1, 0)])
def test_checkpointed_layers_take_one_bool_per_layer(value: tuple) -> None:
    """``checkpointed_layers`` of another length than the model's layers (or not bools)
    raises at once, naming the count, instead of failing or being cut at the first call."""
    model = fastbert.BertModel(fastbert.BertConfig(vocab_size=10, **encoder_shape(8, 4, 2, 8)))
    with pytest.raises(ValueError, match="a bool for each of the model's 4 layers"):
        model.checkpointed_layers = value
    model.checkpointed_layers = [True, False, True, False]
    assert model.checkpointed_layers == (True, False, True, False)
    model.checkpointed_layers = None
    assert model.checkpointed_layers is None


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "modernbert"])
def test_hidden_dropout_where_hugging_face_applies_it(family: str) -> None:
    """A layer applies the hidden dropout at as many places as Hugging Face's layer holds a
    hidden dropout module: after the attention output and the FFN, and for DistilBERT after
    the FFN only (its attention output is added to its input undropped)."""
    from fastbert.integrations.packed_classifier import optimized_forward
    from fastbert.model import families

    names = ("dropout", "attention_dropout") if family == "distilbert" else HIDDEN_AND_ATTENTION
    hf = make_model(family, "Model", **dict(zip(names, (0.3, 0.2))))
    (spec,) = [f for f in families.FAMILIES if f.model_type == family]
    hf_layer = hf.get_submodule(f"{spec.layer_prefix}.0")
    theirs = [m.p for m in hf_layer.modules() if isinstance(m, torch.nn.Dropout)]
    encoder = optimized_forward(fastbert.optimize(hf, backend="torch")).encoder.train()
    ops, calls = encoder.ops(), []

    class Recording:
        def __getattr__(self, name: str):
            return getattr(ops, name)

        def layer_norm(self, *args, dropout_p: float = 0.0, **kwargs):
            calls.append(dropout_p)
            return ops.layer_norm(*args, dropout_p=dropout_p, **kwargs)

    hidden = torch.randn(2, 5, hf.config.hidden_size if family != "distilbert" else hf.config.dim)
    width = hidden.shape[-1]
    encoder.layers[0](Recording(), hidden, lambda qkv: qkv[..., :width], dropout_p=0.3)
    assert sorted(p for p in calls if p) == sorted(p for p in theirs if p == 0.3)


@pytest.mark.parametrize("family", [f for f in FAMILIES if f != "modernbert"])
def test_dropout_follows_the_models_modules(family: str) -> None:
    """Dropout set on the model's nn.Dropout modules after optimize is what trains: all at 0
    (TRL's trainers do so) gives eval mode's output in train mode; one kind at 0 leaves the
    other; modules of one kind set apart raise a ValueError naming it."""
    from fastbert.integrations.packed_classifier import optimized_forward

    names = ("dropout", "attention_dropout") if family == "distilbert" else HIDDEN_AND_ATTENTION
    hf = make_model(family, "Model", **dict(zip(names, (0.3, 0.2))))
    inputs, _ = make_inputs(hf, "Model", [5, 3])
    model = fastbert.optimize(hf, backend="torch")
    forward = optimized_forward(model)
    model.eval()
    evaluated = model(**inputs).last_hidden_state
    model.train()
    assert forward.dropout_now() == (0.3, 0.2)
    assert not torch.allclose(model(**inputs).last_hidden_state, evaluated)
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    for module in dropouts:
        module.p = 0.0
    torch.testing.assert_close(model(**inputs).last_hidden_state, evaluated, rtol=0, atol=0)
    dropouts[0].p = 0.5  # the embeddings' (hidden) dropout alone
    with pytest.raises(ValueError, match="hidden dropout modules apply different"):
        model(**inputs)
    for module in dropouts:  # a module in eval mode applies none
        module.p = 0.3
        module.eval()
    torch.testing.assert_close(model(**inputs).last_hidden_state, evaluated, rtol=0, atol=0)
    dropouts[0].train()
    with pytest.raises(ValueError, match="hidden dropout modules apply different"):
        model(**inputs)


def test_dropout_modules_put_in_training_mode_drop_in_an_eval_model() -> None:
    """Monte Carlo dropout: model.eval(), then every nn.Dropout back in training mode, drops
    as in Hugging Face (fastbert followed the model's mode alone: each call gave the eval
    output); the layers' modules alone (the embeddings' left in eval mode) are refused."""
    hf = make_model("bert", "ForSequenceClassification", hidden_dropout_prob=0.3)
    inputs, _ = make_inputs(hf, "ForSequenceClassification", [5, 3])
    model = fastbert.optimize(hf, backend="torch").eval()
    with torch.no_grad():
        evaluated = model.bert(**inputs).last_hidden_state
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.train()
        draws = [model.bert(**inputs).last_hidden_state for _ in range(3)]
        assert not any(torch.allclose(draw, evaluated) for draw in draws)
        assert not torch.allclose(draws[0], draws[1])
        model.bert.embeddings.eval()
        with pytest.raises(ValueError, match="hidden dropout modules apply different"):
            model.bert(**inputs)
        model.eval()
        torch.testing.assert_close(
            model.bert(**inputs).last_hidden_state, evaluated, rtol=0, atol=0
        )


def test_submodules_in_eval_mode_train_without_their_dropout() -> None:
    """model.train() with the base model's embeddings and encoder put back in eval mode (a
    head trained on a frozen-mode body): no dropout in the encoder, as in Hugging Face."""
    hf = make_model("bert", "ForSequenceClassification", hidden_dropout_prob=0.3)
    inputs, _ = make_inputs(hf, "ForSequenceClassification", [5, 3])
    reference = copy.deepcopy(hf)
    model = fastbert.optimize(hf, backend="torch")
    for m in (model, reference):
        m.train()
        m.bert.embeddings.eval()
        m.bert.encoder.eval()
        m.dropout.p = 0.0  # the head's own dropout (Hugging Face's module) off too
    with torch.no_grad():
        torch.testing.assert_close(
            model(**inputs).logits, reference(**inputs).logits, rtol=1e-4, atol=1e-5
        )


def test_reentrant_checkpointing_trains_layers_over_frozen_embeddings() -> None:
    """Frozen embeddings and reentrant activation checkpointing (Hugging Face marks the
    embeddings' output as needing a gradient, from a hook fastbert's embeddings never ran):
    the layers' parameters get Hugging Face's gradients (they got none)."""
    hf = make_model("bert", "ForSequenceClassification", seed=7)
    inputs, _ = make_inputs(hf, "ForSequenceClassification", [5, 3], seed=7)
    labels = torch.tensor([0, 2])
    reference = copy.deepcopy(hf)
    model = fastbert.optimize(hf, backend="torch")
    grads = []
    for m in (model, reference):
        m.train()
        m.bert.embeddings.requires_grad_(False)
        m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        m(**inputs, labels=labels).loss.backward()
        grads.append({n: p.grad for n, p in m.named_parameters() if p.requires_grad})
    ours, theirs = grads
    assert ours.keys() == theirs.keys()
    missing = [n for n in theirs if theirs[n] is not None and ours[n] is None]
    assert not missing, missing
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], rtol=1e-4, atol=1e-5)
