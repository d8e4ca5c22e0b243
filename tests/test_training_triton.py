"""Training on the Triton backend end to end (the interpreter on a CPU, CUDA on a GPU): every
parameter's gradient against Hugging Face's, for one model of each family (a mix of heads,
tests/test_optimize.TRITON_CASES), dense and padding-free; the kernels' dropout in training
mode; autocast with float32 master weights.

Every head of every family gets the same check on the torch backend
(tests/test_training.py::test_optimized_gradients_match_hf). A head is Hugging Face's own
module on either backend, and the output its head reads is chosen by code that does not
depend on the backend; what the Triton backend changes is the encoder's kernels, which each
family's model runs in full (the mix includes the pooler, tied masked-LM weights, token-level
and pooled heads).

The ops' own backward tests (tests/test_attention_backward.py, tests/test_ops_backward.py)
compare each kernel with float64 autograd; these check that the model wires them right.
"""

from __future__ import annotations

import copy

import pytest
import torch

import fastbert
from tests.hf_models import dropout_logits, hf_model, padded_batch
from tests.test_optimize import TRITON_CASES, make_inputs, make_model
from tests.test_training import (
    NO_HEAD_DROPOUT,
    assert_grads_match,
    grads,
    left_padded,
    weighted_sum,
)

# fp32 Triton products are exact IEEE (no tf32) and the statistics fp32, as in Hugging Face:
# the same bound as the torch backend.
LENGTHS = [9, 4, 6]
GRAD_LENGTHS = [9, 4, 6, 1]  # an even count: multiple choice pairs the rows


GRADIENT_CASES = [(f, h, padding_free) for f, h in TRITON_CASES for padding_free in (False, True)]


@pytest.mark.parametrize(
    "family, head, padding_free",
    GRADIENT_CASES,
    ids=[f"{f}-{h}-{'padding-free' if p else 'dense'}" for f, h, p in GRADIENT_CASES],
)
def test_triton_gradients_match_hf(device: str, family: str, head: str, padding_free: bool) -> None:
    model = make_model(family, head, seed=31, **NO_HEAD_DROPOUT).to(device).train()
    reference = copy.deepcopy(model)
    inputs, valid = make_inputs(model, head, GRAD_LENGTHS, seed=31, device=device)
    weighted_sum(reference(**inputs), valid.cpu()).backward()
    fastbert.optimize(model, backend="triton", padding_free=padding_free)
    weighted_sum(model(**inputs), valid.cpu()).backward()
    assert_grads_match(grads(reference), grads(model))


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
def test_triton_left_padded_gradients_match_hf(device: str, padding_free: bool) -> None:
    model = make_model("roberta", "ForMaskedLM", seed=35).to(device).train()
    reference = copy.deepcopy(model)
    inputs, valid = left_padded(
        *make_inputs(model, "ForMaskedLM", GRAD_LENGTHS, seed=35, device=device)
    )
    weighted_sum(reference(**inputs), valid.cpu(), tokens_only=True).backward()
    fastbert.optimize(model, backend="triton", padding_free=padding_free)
    weighted_sum(model(**inputs), valid.cpu(), tokens_only=True).backward()
    assert_grads_match(grads(reference), grads(model))


def test_compiled_training_step_matches_eager(device: str) -> None:
    """torch.compile(fullgraph=True) of a fastbert model's loss (aot_eager on the CPU, whose
    custom ops then run the interpreter) traces the custom ops and their backward: the same
    loss and gradients as eager."""
    hf = hf_model("BertForSequenceClassification", seed=36)
    model = fastbert.BertForSequenceClassification.from_pretrained(
        hf,
        device=device,
        dtype=torch.float32,
        backend="triton",
        padding_free=False,
        cuda_graphs=False,
    ).train()
    ids, mask, types = (t.to(device) for t in padded_batch(LENGTHS, seed=36))
    labels = torch.tensor([0, 1, 2], device=device)

    def loss_of(m):
        return m(ids, mask, types, labels=labels).loss

    eager_loss = loss_of(model)
    eager_loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    backend = "inductor" if device == "cuda" else "aot_eager"
    compiled = torch.compile(loss_of, fullgraph=True, backend=backend)
    loss = compiled(model)
    loss.backward()
    torch.testing.assert_close(loss, eager_loss)
    assert_grads_match(expected, grads(model))


def test_own_model_trains_on_triton(device: str) -> None:
    """fastbert.BertForPreTraining with labels: loss and gradients as on the torch backend."""
    hf = hf_model("BertForPreTraining", seed=32)
    ids, mask, types = (t.to(device) for t in padded_batch(LENGTHS, seed=32))
    labels = ids.masked_fill(mask == 0, -100)
    nsp = torch.tensor([0, 1, 0], device=device)
    results = {}
    for backend in ("torch", "triton"):
        model = fastbert.BertForPreTraining.from_pretrained(
            hf, device=device, dtype=torch.float32, backend=backend
        ).train()
        loss = model(ids, mask, types, labels=labels, next_sentence_label=nsp).loss
        loss.backward()
        results[backend] = (loss.item(), grads(model))
    assert abs(results["torch"][0] - results["triton"][0]) <= 1e-5
    assert_grads_match(results["torch"][1], results["triton"][1])


def test_triton_dropout_in_training(device: str) -> None:
    hf = hf_model(
        "BertForSequenceClassification",
        seed=33,
        hidden_dropout_prob=0.2,
        attention_probs_dropout_prob=0.2,
    )
    model = fastbert.BertForSequenceClassification.from_pretrained(
        hf, device=device, dtype=torch.float32, backend="triton"
    )
    ids, mask, types = (t.to(device) for t in padded_batch(LENGTHS, seed=33))
    evaluated, first, second, again = dropout_logits(model, (ids, mask, types), seed=1)
    assert torch.equal(first, again) and not torch.allclose(first, second)
    assert not torch.allclose(first, evaluated)
    model(ids, mask, types, labels=torch.tensor([0, 1, 2], device=device)).loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_triton_autocast_with_float32_master_weights(device: str) -> None:
    """Under torch.autocast every Triton op computes in autocast's dtype (fp16 on the CPU:
    the interpreter's tl.dot cannot multiply bf16; bf16 on a GPU), the float32 weights get
    float32 gradients, and the loss stays within the dtype's rounding of the float32 loss."""
    half = torch.float16 if device == "cpu" else torch.bfloat16
    hf = hf_model("BertForSequenceClassification", seed=34)
    ids, mask, types = (t.to(device) for t in padded_batch(LENGTHS, seed=34))
    labels = torch.tensor([0, 2, 1], device=device)
    model = fastbert.BertForSequenceClassification.from_pretrained(
        hf, device=device, dtype=torch.float32, backend="triton"
    ).train()
    exact = model(ids, mask, types, labels=labels).loss.item()
    with torch.autocast(torch.device(device).type, dtype=half):
        out = model(ids, mask, types, labels=labels)
    assert out.logits.dtype == half  # the ops computed in autocast's dtype
    out.loss.backward()
    assert abs(out.loss.item() - exact) <= 0.02 * abs(exact)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in model.parameters())
