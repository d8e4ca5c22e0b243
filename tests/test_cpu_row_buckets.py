"""Row buckets on a CPU (fastbert.execution.runtime): a bfloat16 padding-free call runs its
linears on its size bucket's rows, so that oneDNN makes each primitive once per bucket, and
the real rows' results are the unbucketed call's, bit for bit; other dtypes, calls that record
gradients and other backends run their rows as they are."""

from __future__ import annotations

import pytest
import torch

import fastbert
from fastbert.execution import backends, runtime
from tests.hf_models import padded_batch
from tests.test_forward_packed import LENGTHS, _hf, _packed


def _linear_rows(monkeypatch) -> list[int]:
    """Record the rows of every linear the CPU's torch-backend ops run."""
    rows = []
    ops = backends.get_ops("torch", "cpu").by_name()

    def linear(x, *args, **kwargs):
        rows.append(x.shape[0])
        return ops["linear"](x, *args, **kwargs)

    spying = backends.Ops("torch", {**ops, "linear": linear})
    monkeypatch.setattr(backends, "_ops_for", lambda *choice: spying)
    return rows


def _packed_inputs(kind: str) -> tuple[torch.nn.Module, torch.Tensor, list[int]]:
    hf = _hf(kind)
    ids, mask, _ = padded_batch(LENGTHS, seed=5)
    ids = torch.where(mask.bool(), ids.clamp(min=2), torch.zeros_like(ids))
    packed_ids, cu_seqlens = _packed(ids, mask)
    return hf, packed_ids, cu_seqlens


@pytest.mark.parametrize("kind", ["bert", "roberta", "mpnet", "modernbert"])
def test_bfloat16_linears_run_the_bucket_and_real_rows_keep_their_bits(
    kind: str, monkeypatch
) -> None:
    """Every position scheme (the filler's sequences get positions, distances and windows of
    their own): the bucketed call equals the unbucketed one at every real row; a filler row
    attending to a real sequence, or a real row to the filler, would change them."""
    hf, packed_ids, cu_seqlens = _packed_inputs(kind)
    tokens = packed_ids.numel()
    rows = _linear_rows(monkeypatch)
    model = fastbert.BertModel.from_pretrained(hf, backend="torch", dtype=torch.bfloat16)
    with torch.no_grad():
        bucketed = model.forward_packed(packed_ids, cu_seqlens)
        assert bucketed.shape[0] == tokens
        bucket = runtime.token_bucket(tokens, runtime.CPU_BUCKET_MIN_STEP)
        assert bucket > tokens and set(rows) == {bucket}, (tokens, sorted(set(rows)))
        rows.clear()
        monkeypatch.setattr(runtime, "CPU_BUCKETED_DTYPES", ())
        plain = model.forward_packed(packed_ids, cu_seqlens)
        assert set(rows) == {tokens}
    assert torch.equal(bucketed, plain)


def test_a_padded_batch_is_bucketed_once_packed(monkeypatch) -> None:
    """The padded entry packs its batch and runs the bucket too; padding stays zero."""
    rows = _linear_rows(monkeypatch)
    model = fastbert.BertModel.from_pretrained(_hf("bert"), backend="torch", dtype=torch.bfloat16)
    ids, mask, types = padded_batch(LENGTHS, seed=6)
    with torch.no_grad():
        bucketed = model(ids, mask, types).last_hidden_state
        monkeypatch.setattr(runtime, "CPU_BUCKETED_DTYPES", ())
        plain = model(ids, mask, types).last_hidden_state
    tokens = int(mask.sum())
    assert rows[0] == runtime.token_bucket(tokens, runtime.CPU_BUCKET_MIN_STEP) != tokens
    assert torch.equal(bucketed, plain)
    assert not bucketed[~mask.bool()].any()


def test_float32_and_calls_recording_gradients_run_their_rows(monkeypatch) -> None:
    hf, packed_ids, cu_seqlens = _packed_inputs("bert")
    rows = _linear_rows(monkeypatch)
    float32 = fastbert.BertModel.from_pretrained(hf, backend="torch")
    with torch.no_grad():
        float32.forward_packed(packed_ids, cu_seqlens)
    bfloat16 = fastbert.BertModel.from_pretrained(hf, backend="torch", dtype=torch.bfloat16)
    bfloat16.forward_packed(packed_ids, cu_seqlens).sum().backward()  # records gradients
    assert set(rows) == {packed_ids.numel()}


def test_filler_sequences_are_short_and_after_the_real_ones() -> None:
    hidden = torch.ones(5, 4, dtype=torch.bfloat16)
    cu_seqlens = torch.tensor([0, 2, 5], dtype=torch.int32)
    padded, bounds, longest = runtime.with_filler(hidden, cu_seqlens, 3, 35)
    assert padded.shape == (40, 4) and torch.equal(padded[:5], hidden) and not padded[5:].any()
    assert bounds.tolist() == [0, 2, 5, 21, 37, 40] and bounds.dtype == torch.int32
    assert longest == runtime.FILLER_SEQUENCE
    assert runtime.with_filler(hidden, cu_seqlens, 3, 2)[2] == 3


def test_cpu_buckets_are_tight_for_short_calls() -> None:
    step = runtime.CPU_BUCKET_MIN_STEP
    buckets = [runtime.token_bucket(t, step) for t in range(1, 4097)]
    for tokens, bucket in enumerate(buckets, start=1):
        assert tokens <= bucket < tokens + max(step, tokens / 8), (tokens, bucket)
    # 16 buckets up to 256 rows, then eight per doubling: 48 up to 4,096.
    assert len(set(buckets)) == 48
