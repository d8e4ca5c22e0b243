"""ModernBERT: rotary positions, sliding-window layers, the gated (GeGLU) FFN and the
pre-LayerNorm layer, in the ops and in optimized Hugging Face ModernBERT models against
Hugging Face's own (fp32, eager attention), on padded and packed batches.

No ModernBERT checkpoint installs offline, so the models are built from Hugging Face's
ModernBertConfig with answerdotai/ModernBERT-base's structure scaled down (head dim 64,
intermediate 1.5 x hidden, a global layer every third, RoPE bases 160000 / 10000) and random
weights; the sequences are longer than the sliding window.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import fastbert
from fastbert.kernels import reference, torch_ops
from fastbert.model.config import BertConfig
from fastbert.model.families import MODERNBERT
from tests.hf_models import (
    before_and_after_optimize,
    encoder_shape,
    padded_batch,
    random_hf_model,
)
from tests.test_training import assert_grads_match, grads, weighted_sum

BOUND = 1e-4
VOCAB = 97
LOCAL_ATTENTION = 32  # a window of 16 positions each side
# The tiny vocabulary's special tokens: pad 0, [CLS] (beginning) 1, [SEP] (end) 2.
SPECIAL_TOKEN_IDS = dict(
    pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2
)
# Past the window: the sliding layers see only part of the longest rows.
LENGTHS = [90, 7, 41, 1, 64]


def hf_modernbert(head: str = "Model", seed: int = 0, **overrides) -> torch.nn.Module:
    """A Hugging Face ModernBERT model (eager attention) with ModernBERT-base's structure
    scaled down and random weights (LayerNorm weights near one)."""
    import transformers

    values = dict(
        vocab_size=VOCAB,
        **encoder_shape(128, 4, 2, 192),
        max_position_embeddings=256,
        local_attention=LOCAL_ATTENTION,
        global_attn_every_n_layers=3,
        **SPECIAL_TOKEN_IDS,
        num_labels=3,
    )
    values.update(overrides)
    return random_hf_model(
        f"ModernBert{head}",
        transformers.ModernBertConfig(**values),
        seed,
        norm="norm",
        attn_implementation="eager",
    )


def inputs(lengths: list[int], seed: int = 0, device: str = "cpu"):
    """(input_ids, attention_mask): right-padded with the pad id 0."""
    ids, mask, _ = padded_batch(lengths, vocab=VOCAB, seed=seed, device=device)
    return ids, mask


def _max_error(got: torch.Tensor, expected: torch.Tensor, mask: torch.Tensor) -> float:
    return (got - expected)[mask.bool()].abs().max().item()


# --- the ops ------------------------------------------------------------------------------


def test_reference_attention_matches_hf_rotary_and_window() -> None:
    """The reference's RoPE and sliding window against Hugging Face's own functions: its
    rotary embedding, apply_rotary_pos_emb and its bidirectional sliding-window mask."""
    from transformers.models.modernbert import modeling_modernbert as hf

    model = hf_modernbert()
    gen = torch.Generator().manual_seed(0)
    batch, heads, seq, dim = 2, 2, 70, 64
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=gen) for _ in "qkv")
    positions = torch.arange(seq)[None]
    cos, sin = model.rotary_emb(q, positions, "sliding_attention")
    q_rot, k_rot = hf.apply_rotary_pos_emb(q, k, cos, sin)
    window = LOCAL_ATTENTION // 2
    distance = (torch.arange(seq)[None, :] - torch.arange(seq)[:, None]).abs()
    scores = q_rot @ k_rot.transpose(-1, -2) / dim**0.5
    expected = torch.softmax(scores.masked_fill(distance > window, float("-inf")), -1) @ v
    inv_freq = model.rotary_emb.sliding_attention_inv_freq
    got = reference.attention(q, k, v, rotary=inv_freq, window=window)
    assert (got - expected).abs().max() <= 1e-5
    no_window = reference.attention(q, k, v, rotary=inv_freq)
    assert (no_window - expected).abs().max() > 1e-2  # the window matters on these lengths


def test_window_excludes_far_keys() -> None:
    """A key farther than the window from every query of a row has no influence."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 40, 32, generator=gen, dtype=torch.float64) for _ in "qkv")
    base = reference.attention(q[:, :, :5], k, v, window=4)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 10:], v2[:, :, 10:] = 1e3, -1e3
    assert torch.equal(reference.attention(q[:, :, :5], k2, v2, window=4), base)


@pytest.mark.parametrize("packed", [False, True], ids=["dense", "varlen"])
def test_torch_backend_attention_matches_reference(packed: bool) -> None:
    """The torch backend's RoPE + window (SDPA with a window mask) against the float64
    reference, padded rows whose windows hold no real key included."""
    gen = torch.Generator().manual_seed(2)
    lengths, heads, dim, window = [50, 3, 20], 2, 32, 5
    inv_freq = 1.0 / (1e4 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    if packed:
        q, k, v = (torch.randn(sum(lengths), heads, dim, generator=gen) for _ in "qkv")
        cu = torch.tensor([0, 50, 53, 73], dtype=torch.int32)
        args = (q, k, v, cu, max(lengths))
        got = torch_ops.attention_varlen(*args, rotary=inv_freq, window=window)
        wide = (q.double(), k.double(), v.double(), cu, max(lengths))
        expected = reference.attention_varlen(*wide, rotary=inv_freq, window=window)
        valid = torch.ones(sum(lengths), dtype=torch.bool)
    else:
        seq = max(lengths)
        q, k, v = (torch.randn(len(lengths), heads, seq, dim, generator=gen) for _ in "qkv")
        mask = torch.arange(seq)[None] < torch.tensor(lengths)[:, None]
        got = torch_ops.attention(q, k, v, mask, rotary=inv_freq, window=window)
        expected = reference.attention(
            q.double(), k.double(), v.double(), mask, rotary=inv_freq, window=window
        )
        valid = mask[:, None, :].expand(len(lengths), heads, seq)
        assert torch.isfinite(got).all()
    assert (got.double() - expected)[valid].abs().max() <= 1e-5


def test_gated_linear_matches_chunked_geglu() -> None:
    """linear(gated=True): act(first half) * second half, as ModernBertMLP's Wi(x).chunk(2)."""
    gen = torch.Generator().manual_seed(3)
    x, weight = torch.randn(5, 16, generator=gen), torch.randn(24, 16, generator=gen)
    residual = torch.randn(5, 12, generator=gen)
    value, gate = torch.nn.functional.linear(x, weight).chunk(2, dim=-1)
    expected = torch.nn.functional.gelu(value) * gate + residual
    for op in (reference.linear, torch_ops.linear):
        got = op(x, weight, None, "gelu", residual, gated=True)
        assert (got - expected).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="even number of weight rows"):
        reference.linear(x, weight[:23], gated=True)


def test_bad_rotary_and_window_are_refused() -> None:
    q = torch.randn(1, 2, 4, 32)
    with pytest.raises(ValueError, match="window must be None or an integer >= 0"):
        reference.attention(q, q, q, window=-1)
    with pytest.raises(ValueError, match="rotary"):
        reference.attention(q, q, q, rotary=torch.ones(15))
    with pytest.raises(TypeError, match="rotary must be float32"):
        torch_ops.attention(q, q, q, rotary=torch.ones(16, dtype=torch.float64))


# --- the config ---------------------------------------------------------------------------


def test_config_reads_layer_types_rope_bases_and_window() -> None:
    config = BertConfig.from_hf(hf_modernbert().config, MODERNBERT)
    assert config.layer_types == (
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    )
    assert (config.rope_theta, config.local_rope_theta) == (160_000.0, 10_000.0)
    assert (config.window, config.norm_position, config.glu) == (16, "pre", True)
    assert (config.linear_bias, config.norm_bias, config.type_vocab_size) == (False, False, 0)


def test_config_json_of_older_transformers_reads_the_same() -> None:
    """A config.json written before rope_parameters / layer_types (as the released
    checkpoints' are) gives the same config."""
    values = {
        "model_type": "modernbert",
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "intermediate_size": 192,
        "hidden_activation": "gelu",
        "max_position_embeddings": 256,
        "norm_eps": 1e-5,
        "pad_token_id": 0,
        "global_attn_every_n_layers": 3,
        "global_rope_theta": 160000.0,
        "local_rope_theta": 10000.0,
        "local_attention": LOCAL_ATTENTION,
        "num_labels": 3,
    }
    config = BertConfig.from_dict(values, MODERNBERT)
    assert config == BertConfig.from_hf(hf_modernbert().config, MODERNBERT)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"attention_bias": True}, "attention_bias=True is not supported"),
        ({"norm_bias": True}, "norm_bias=True is not supported"),
        ({"mlp_dropout": 0.1}, "mlp_dropout 0.1 is not supported"),
    ],
)
def test_unsupported_configs_are_refused(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fastbert.optimize(hf_modernbert(**overrides), backend="torch")


def test_inputs_longer_than_max_position_embeddings_run_as_hf() -> None:
    """Rotary positions read no table: Hugging Face runs rows longer than
    max_position_embeddings, and so does the optimized model (it refused them), padded and
    packed alike."""
    hf = hf_modernbert(max_position_embeddings=32, local_attention=8)
    ids, mask = inputs([60, 41])
    model = fastbert.optimize(copy.deepcopy(hf), backend="torch")
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
        valid = mask.bool()
        torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-5)
        encoder = fastbert.BertModel.from_pretrained(hf, device="cpu", backend="torch")
        packed = encoder.forward_packed(ids[valid], [0, 60, 101])
    torch.testing.assert_close(packed, want[valid], rtol=1e-4, atol=1e-5)


def test_a_window_set_in_the_config_after_optimize_is_run() -> None:
    """Hugging Face builds the sliding-window mask from the config at each call: a window
    set after optimize is the one run (fastbert kept the bound one: 0.87 off)."""
    hf = hf_modernbert(local_attention=8)
    ids, mask = inputs([40, 12])
    model = fastbert.optimize(copy.deepcopy(hf), backend="torch")
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        for m in (hf, model):
            m.config.local_attention = 32
        want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state
    valid = mask.bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("where", ["embeddings.drop", "mlp.drop", "attention float"])
def test_dropout_set_after_optimize_is_refused_in_training(where: str) -> None:
    """Dropout switched on after optimize (an nn.Dropout's p, or the attention modules' float
    attention_dropout) in a family fastbert runs without it: the encoder applied the
    embeddings' only (variance 0.450 against Hugging Face's 0.558 with the MLP's too) and
    ignored the attention's. Training refuses it; eval mode, where nothing drops, runs."""
    model = fastbert.optimize(hf_modernbert(seed=3), backend="torch")
    ids, mask = inputs(LENGTHS, seed=3)
    for name, module in model.named_modules():
        if where == "attention float" and hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.3
        elif isinstance(module, torch.nn.Dropout) and name.endswith(where):
            module.p = 0.3
    model.train()
    with pytest.raises(ValueError, match=r"now apply \[0.3\]; fastbert runs ModernBERT"):
        model(input_ids=ids, attention_mask=mask)
    model.eval()
    model(input_ids=ids, attention_mask=mask)


def test_int8_is_refused_for_the_gated_ffn() -> None:
    with pytest.raises(ValueError, match="does not run gated"):
        fastbert.optimize(hf_modernbert(), backend="torch", quantize="int8")


# --- optimized Hugging Face models --------------------------------------------------------


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
def test_torch_backend_matches_hf(padding_free: bool) -> None:
    model = hf_modernbert(seed=1)
    ids, mask = inputs(LENGTHS, seed=1)
    expected, got = before_and_after_optimize(
        model,
        {"input_ids": ids, "attention_mask": mask},
        backend="torch",
        padding_free=padding_free,
    )
    assert _max_error(got.last_hidden_state, expected.last_hidden_state, mask) <= BOUND


def test_without_mask_matches_hf() -> None:
    model = hf_modernbert(seed=2)
    ids, _ = inputs([70, 70], seed=2)
    expected, got = before_and_after_optimize(model, {"input_ids": ids}, backend="torch")
    assert (got.last_hidden_state - expected.last_hidden_state).abs().max() <= BOUND


@pytest.mark.parametrize(
    "head, overrides",
    [
        ("ForMaskedLM", {}),
        ("ForSequenceClassification", {"classifier_pooling": "cls"}),
        ("ForSequenceClassification", {"classifier_pooling": "mean"}),
        ("ForTokenClassification", {}),
    ],
    ids=["masked-lm", "seq-cls-cls", "seq-cls-mean", "token-cls"],
)
def test_heads_match_hf(head: str, overrides: dict) -> None:
    """Hugging Face's heads (the MLM head's dense + norm, cls or mean pooling) on the
    optimized encoder: the logits at real tokens (or of each row) as Hugging Face's."""
    model = hf_modernbert(head, seed=3, **overrides)
    ids, mask = inputs(LENGTHS, seed=3)
    expected, got = before_and_after_optimize(
        model, {"input_ids": ids, "attention_mask": mask}, backend="torch"
    )
    error = got.logits - expected.logits
    error = error[mask.bool()] if error.dim() == 3 else error
    assert error.abs().max() <= BOUND


def test_sentence_transformer_matches(tmp_path) -> None:
    """A sentence-transformers model on a ModernBERT encoder (mean pooling; the packaged
    all-MiniLM-L6-v2's tokenizer for real text, and its vocabulary size): optimize(st).encode
    gives the plain model's embeddings."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    from fastbert.integrations import models

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(models.packaged_minilm_path()))
    except ValueError as error:
        pytest.skip(str(error))
    hf = hf_modernbert(seed=4, vocab_size=tokenizer.vocab_size)
    hf.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with models.quiet():
        st = SentenceTransformer(str(tmp_path), device="cpu")
    texts = ["a short one", "rotary positions " * 30, "a sliding window over the keys " * 4]
    expected = st.encode(texts, convert_to_tensor=True)
    assert type(st[0].auto_model).__name__ == "ModernBertModel"
    fastbert.optimize(st, backend="torch")
    got = st.encode(texts, convert_to_tensor=True)
    assert (got - expected).abs().max() <= BOUND


@pytest.mark.parametrize("source", ["instance", "folder"])
def test_bert_model_from_pretrained_loads_the_encoder(source: str, tmp_path) -> None:
    """fastbert.BertModel.from_pretrained on a ModernBERT masked-LM model or its folder
    (encoder tensors under ``model.``) computes Hugging Face's last hidden state."""
    hf = hf_modernbert("ForMaskedLM", seed=5)
    source_arg = hf
    if source == "folder":
        hf.save_pretrained(tmp_path)
        source_arg = tmp_path
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # ModernBERT has no pooler: nothing to warn about
        ours = fastbert.BertModel.from_pretrained(source_arg, device="cpu", backend="torch")
    assert ours.pooler is None
    ids, mask = inputs(LENGTHS, seed=5)
    with torch.no_grad():
        expected = hf.model(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, mask).last_hidden_state
    assert _max_error(got, expected, mask) <= BOUND


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
def test_gradients_match_hf(padding_free: bool) -> None:
    """Every parameter's gradient (Wqkv, the gated Wi, the norms, the tied embeddings) on
    sequences past the window, torch backend."""
    model = hf_modernbert("ForMaskedLM", seed=6).train()
    reference_model = copy.deepcopy(model)
    ids, mask = inputs([80, 9, 33], seed=6)
    batch = {"input_ids": ids, "attention_mask": mask}
    valid = mask.bool()
    weighted_sum(reference_model(**batch), valid).backward()
    fastbert.optimize(model, backend="torch", padding_free=padding_free)
    weighted_sum(model(**batch), valid).backward()
    assert_grads_match(grads(reference_model), grads(model))
