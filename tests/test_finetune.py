"""Fine-tuning runs: fastbert follows Hugging Face's loss curve step by step, Hugging Face's
Trainer trains an optimized model and saves what it learned, dropout behaves as in training,
and CUDA graphs never replay a call that records gradients or applies dropout."""

from __future__ import annotations

import copy

import pytest
import torch

import fastbert
from tests.hf_models import dropout_logits, hf_model, padded_batch

STEPS = 100
LOSS_BOUND = 1e-3


def _batches(steps: int, batch: int = 8, seed: int = 0):
    """``steps`` (input_ids, attention_mask, token_type_ids, labels) batches of a learnable
    task: the label is the first token's id modulo 3."""
    gen = torch.Generator().manual_seed(seed)
    for step in range(steps):
        lengths = torch.randint(2, 13, (batch,), generator=gen).tolist()
        ids, mask, types = padded_batch(lengths, seed=seed * 1000 + step)
        yield ids, mask, types, ids[:, 0] % 3


def _train(model, steps: int, step_inputs) -> list[float]:
    """Losses of ``steps`` AdamW steps of ``model`` (train mode) on :func:`_batches`."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3)
    losses = []
    for ids, mask, types, labels in _batches(steps):
        loss = step_inputs(model, ids, mask, types, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def _hf_loss(model, ids, mask, types, labels):
    return model(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels).loss


def _own_loss(model, ids, mask, types, labels):
    return model(ids, mask, types, labels=labels).loss


@pytest.mark.parametrize("how", ["optimize", "own-model", "own-model-padding-free"])
def test_fine_tuning_follows_hf_loss_curve(how: str) -> None:
    hf = hf_model("BertForSequenceClassification", seed=1)
    expected = _train(copy.deepcopy(hf), STEPS, _hf_loss)
    if how == "optimize":
        got = _train(fastbert.optimize(hf, backend="torch"), STEPS, _hf_loss)
    else:
        padding_free = how.endswith("padding-free")
        ours = fastbert.BertForSequenceClassification.from_pretrained(
            hf, backend="torch", padding_free=padding_free
        )
        got = _train(ours, STEPS, _own_loss)
    assert expected[-1] < 0.5 * expected[0]  # the run learns: a curve worth following
    worst = max(abs(a - b) for a, b in zip(expected, got))
    assert worst <= LOSS_BOUND, f"losses differ by up to {worst:.2e}"


def test_hf_trainer_trains_an_optimized_model_and_saves_it(tmp_path) -> None:
    pytest.importorskip("accelerate")
    from transformers import BertForSequenceClassification, Trainer, TrainingArguments

    model = fastbert.optimize(hf_model("BertForSequenceClassification", seed=2), backend="torch")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def row(t: torch.Tensor) -> torch.Tensor:  # every row padded to 12 tokens
        return torch.nn.functional.pad(t, (0, 12 - t.shape[-1]))

    rows = [
        {
            "input_ids": row(ids[i]),
            "attention_mask": row(mask[i]),
            "token_type_ids": row(types[i]),
            "labels": labels[i],
        }
        for ids, mask, types, labels in _batches(12, seed=2)
        for i in range(len(labels))
    ]
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=8,
        num_train_epochs=3,
        learning_rate=2e-3,
        logging_steps=6,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    result = trainer.train()
    logged = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert result.global_step == 36 and logged[-1] < logged[0]
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert len(changed) == len(before)  # query, key and value included
    model.save_pretrained(tmp_path / "saved")
    reloaded = BertForSequenceClassification.from_pretrained(tmp_path / "saved").eval()
    model.eval()
    ids, mask, types, _ = next(_batches(1, seed=9))
    with torch.no_grad():
        want = reloaded(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
        have = model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits
    torch.testing.assert_close(have, want, atol=1e-4, rtol=0)


def test_hooks_the_encoder_would_skip_are_refused(tmp_path) -> None:
    """The Trainer's NEFTune (neftune_noise_alpha: a forward hook adding noise to the input
    embeddings' output) trained exactly as without it (loss 0.27 from Hugging Face's with it,
    4.8e-7 from Hugging Face's without): fastbert's encoder reads the embeddings' weight
    without calling the module. Such a hook is refused, naming it, as is any hook on a module
    the encoder does not call; Hugging Face's own checkpointing hook is let through."""
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    model = fastbert.optimize(hf_model("BertForSequenceClassification", seed=2), backend="torch")
    ids, mask, types, labels = next(_batches(8, seed=2))
    rows = [
        {"input_ids": ids[i], "attention_mask": mask[i], "token_type_ids": types[i]}
        | {"labels": labels[i]}
        for i in range(len(labels))
    ]
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=4,
        max_steps=2,
        neftune_noise_alpha=5.0,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
    )
    with pytest.raises(ValueError, match=r"word_embeddings has a forward hook \(NEFTune"):
        Trainer(model=model, args=args, train_dataset=rows).train()

    model = fastbert.optimize(hf_model("BertForSequenceClassification", seed=2), backend="torch")
    model.gradient_checkpointing_enable()  # registers make_inputs_require_grads on embeddings
    model.train()
    model(input_ids=ids, attention_mask=mask, labels=labels).loss.backward()
    handle = model.bert.encoder.layer[1].output.register_forward_hook(lambda m, i, out: 2 * out)
    with pytest.raises(ValueError, match=r"BertModel.encoder.layer.1.output has a forward hook"):
        model(input_ids=ids, attention_mask=mask)
    handle.remove()
    model(input_ids=ids, attention_mask=mask)


def _dropout_model(**kwargs) -> fastbert.BertForSequenceClassification:
    hf = hf_model(
        "BertForSequenceClassification",
        seed=3,
        hidden_dropout_prob=0.3,
        attention_probs_dropout_prob=0.3,
    )
    return fastbert.BertForSequenceClassification.from_pretrained(hf, backend="torch", **kwargs)


@pytest.mark.parametrize("padding_free", [False, True])
def test_dropout_in_train_mode_only(padding_free: bool) -> None:
    model = _dropout_model(padding_free=padding_free)
    inputs = padded_batch([7, 4, 6], seed=3)
    with torch.no_grad():
        eval_b = model(*inputs).logits
    eval_a, train_a, train_b, train_again = dropout_logits(model, inputs, seed=0)
    assert torch.equal(eval_a, eval_b)
    assert not torch.allclose(train_a, train_b)  # fresh masks each call
    assert torch.equal(train_a, train_again)  # ... reproducible from the seed
    assert not torch.allclose(train_a, eval_a)


def test_optimized_model_dropout_follows_train_and_eval() -> None:
    hf = hf_model("BertModel", seed=4, hidden_dropout_prob=0.3)
    fastbert.optimize(hf, backend="torch")
    ids, mask, types = padded_batch([6, 3], seed=4)
    with torch.no_grad():
        hf.eval()
        a, b = (hf(input_ids=ids, attention_mask=mask).last_hidden_state for _ in range(2))
        hf.train()
        c = hf(input_ids=ids, attention_mask=mask).last_hidden_state
    assert torch.equal(a, b) and not torch.allclose(a, c)


def test_graphs_replay_only_calls_without_gradients_or_dropout() -> None:
    model = fastbert.BertModel.from_pretrained(
        hf_model("BertModel"), backend="torch", cuda_graphs=True
    )
    device = torch.device("cuda")  # wants() is asked only, nothing runs on it
    model.runner.graphs.wants = lambda device, tokens: True

    def graphable() -> bool:
        return model.runner.graphable(model.call(), device, 64)

    assert not graphable()  # eval mode, but grad mode on: params need grad
    with torch.no_grad():
        assert graphable()
        model.train()
        assert not graphable()
    model.eval()
    assert not graphable()


def test_autocast_mixed_precision_keeps_float32_master_gradients() -> None:
    """Under torch.autocast (bf16) with float32 weights, the loss follows Hugging Face's under
    the same autocast, and every gradient is float32."""
    hf = hf_model("BertForSequenceClassification", seed=5)
    ours = fastbert.BertForSequenceClassification.from_pretrained(hf, backend="torch").train()
    ids, mask, types = padded_batch([9, 4, 7], seed=5)
    labels = torch.tensor([0, 2, 1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = hf.train()(
            input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels
        ).loss
        have = ours(ids, mask, types, labels=labels).loss
    have.backward()
    assert abs(have.item() - want.item()) <= 0.02 * abs(want.item())  # bf16 rounding
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in ours.parameters())
