"""fastbert.integrations.packed_classifier: a fastbert-optimized sequence classifier of every
family scores packed sequences as Hugging Face scores the same inputs padded, and a head that
reads other rows than the packed path gives it is found by the load-time check."""

from __future__ import annotations

import copy
import threading

import pytest
import torch

import fastbert
from fastbert.integrations import packed_classifier
from tests.test_modernbert import hf_modernbert
from tests.test_modernbert import inputs as modernbert_inputs
from tests.test_optimize import BOUND, FAMILIES, make_inputs, make_model

LENGTHS = [7, 3, 12, 1, 9]


def _classifiers() -> dict[str, torch.nn.Module]:
    """A random ``*ForSequenceClassification`` model of each family; ModernBERT with each
    of its two poolings."""
    models = {family: make_model(family, "ForSequenceClassification") for family in FAMILIES}
    for pooling in ("cls", "mean"):
        models[f"modernbert-{pooling}"] = hf_modernbert(
            "ForSequenceClassification", seed=5, classifier_pooling=pooling
        )
    return models


CLASSIFIERS = _classifiers()


def _padded_inputs(name: str, model: torch.nn.Module) -> dict[str, torch.Tensor]:
    if name.startswith("modernbert"):
        ids, mask = modernbert_inputs(LENGTHS, seed=2)
        return {"input_ids": ids, "attention_mask": mask}
    return make_inputs(model, "ForSequenceClassification", LENGTHS, seed=2)[0]


def _packed(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[int], torch.Tensor | None]:
    """The padded batch's real tokens end to end: (ids [T], cu_seqlens, types [T] or None)."""
    real = inputs["attention_mask"].bool()
    cu_seqlens = [0]
    for length in real.sum(1).tolist():
        cu_seqlens.append(cu_seqlens[-1] + length)
    types = inputs.get("token_type_ids")
    return inputs["input_ids"][real], cu_seqlens, None if types is None else types[real]


@pytest.mark.parametrize("name", CLASSIFIERS)
def test_packed_logits_equal_hugging_faces(name: str) -> None:
    reference = CLASSIFIERS[name]
    model = fastbert.optimize(copy.deepcopy(reference), padding_free="auto")
    inputs = _padded_inputs(name, reference)
    with torch.no_grad():
        want = reference(**inputs).logits
    ids, cu_seqlens, types = _packed(inputs)
    assert packed_classifier.reads_head_rows_only(model, **inputs)
    with torch.inference_mode():
        got = packed_classifier.packed_logits(model, ids, cu_seqlens, types)
    assert got.shape == want.shape
    assert (got - want).abs().max().item() <= BOUND


def _last_token_classifier() -> torch.nn.Module:
    reference = CLASSIFIERS["bert"]
    base_class = type(reference)

    class LastTokenClassifier(base_class):
        def forward(self, input_ids=None, attention_mask=None, **kwargs):
            hidden = self.bert(input_ids, attention_mask=attention_mask).last_hidden_state
            last = hidden[torch.arange(len(hidden)), attention_mask.sum(1) - 1]
            logits = self.classifier(last)
            return type("Output", (), {"logits": logits})()

    model = LastTokenClassifier(reference.config).eval()
    model.load_state_dict(reference.state_dict())
    return model


def test_a_head_that_reads_other_rows_is_found() -> None:
    reference = _last_token_classifier()
    model = fastbert.optimize(copy.deepcopy(reference))
    inputs = _padded_inputs("bert", reference)
    assert not packed_classifier.reads_head_rows_only(model, **inputs)


def test_the_packed_path_needs_an_optimized_model() -> None:
    with pytest.raises(TypeError, match="is not fastbert-optimized"):
        packed_classifier.packed_logits(CLASSIFIERS["bert"], torch.tensor([1, 2]), [0, 2])


def test_returning_is_per_thread() -> None:
    """While one thread's head runs on given rows, another thread's call runs the encoder."""
    model = fastbert.optimize(copy.deepcopy(CLASSIFIERS["bert"]))
    forward = packed_classifier.optimized_forward(model)
    inputs = _padded_inputs("bert", model)
    with torch.inference_mode():
        want = model(**inputs).logits
        seen = []
        with forward.returning(torch.zeros(len(LENGTHS), 1, 64)):

            def call() -> None:
                with torch.inference_mode():
                    seen.append(model(**inputs).logits)

            thread = threading.Thread(target=call)
            thread.start()
            thread.join()
        assert torch.equal(seen[0], want)
