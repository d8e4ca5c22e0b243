"""attn_implementation="fastbert" in Hugging Face ModernBERT, against its "sdpa" and "eager"
attention: the global layers and the sliding-window local layers both run fastbert's
attention (the window inside the op), on padded batches with rows longer than the window.

CPU: the Triton kernel under the interpreter (head dim 32) and the torch backend (head dim
24, which the kernel does not run). The models are random ModernBERTs with ModernBERT-base's
structure scaled down (tests/test_modernbert.py); Hugging Face applies RoPE before the
attention function, so the op gets q and k rotated already.
"""

from __future__ import annotations

import copy

import pytest
import torch

from fastbert import kernels
from fastbert.integrations import attention as hf
from fastbert.kernels import cpu_engine, torch_ops
from tests.test_modernbert import hf_modernbert, inputs
from tests.test_training import assert_grads_match, grads, weighted_sum

BOUND = 1e-5  # as for BERT (tests/test_attention_interface.py), fp32
LOCAL_ATTENTION = 8  # Hugging Face's window: keys at most 4 positions away
LENGTHS = [21, 6, 13, 1]  # three rows past the window, one shorter, one single token
# Four layers, a global one every third: full, sliding, sliding, full.
TINY = dict(
    num_hidden_layers=4,
    global_attn_every_n_layers=3,
    local_attention=LOCAL_ATTENTION,
    intermediate_size=96,
    max_position_embeddings=64,
)
SIZES = {
    "kernel": dict(hidden_size=64, num_attention_heads=2),
    "torch": dict(hidden_size=48, num_attention_heads=2),
}


def _models(path: str, seed: int = 3, **overrides) -> dict[str, torch.nn.Module]:
    """The same random ModernBERT with "eager", "sdpa" and "fastbert" attention."""
    eager = hf_modernbert(seed=seed, **{**TINY, **SIZES[path], **overrides})
    models = {"eager": eager}
    for name in ("sdpa", hf.NAME):
        models[name] = copy.deepcopy(eager)
        models[name].set_attn_implementation(name)
    return models


@pytest.fixture
def op_calls(monkeypatch) -> list[tuple]:
    """Records each call of fastbert's attention op, Triton kernel or torch backend: (which,
    the key-padding mask's shape or None, the window)."""
    calls: list[tuple] = []

    def spy(which: str, real):
        def attention(q, k, v, key_padding_mask=None, scale=None, dropout_p=0.0, **kwargs):
            mask_shape = None if key_padding_mask is None else tuple(key_padding_mask.shape)
            calls.append((which, mask_shape, kwargs.get("window")))
            return real(q, k, v, key_padding_mask, scale, dropout_p, **kwargs)

        return attention

    monkeypatch.setattr(kernels, "attention", spy("kernel", kernels.attention))
    # On a CPU the interface's torch path is the CPU engine's attention (which hands what it
    # does not take to the plain op itself): spy on the one the interface calls.
    torch_path = cpu_engine if cpu_engine.serves(torch.device("cpu")) else torch_ops
    monkeypatch.setattr(torch_path, "attention", spy("torch", torch_path.attention))
    return calls


def _expected_calls(model: torch.nn.Module, path: str, mask_shape: tuple | None) -> list[tuple]:
    """One op call per layer: no window in the global layers, Hugging Face's half-width
    ``local_attention // 2`` in the sliding-window ones."""
    half_width = model.config.local_attention // 2
    return [
        (path, mask_shape, None if kind == "full_attention" else half_width)
        for kind in model.config.layer_types
    ]


def _hidden(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_matches_sdpa_and_eager(path: str, op_calls) -> None:
    models = _models(path)
    assert set(models["eager"].config.layer_types) == {"full_attention", "sliding_attention"}
    ids, mask = inputs(LENGTHS, seed=1)
    got = _hidden(models[hf.NAME], ids, mask)
    valid = mask.bool()
    for reference in ("sdpa", "eager"):
        expected = _hidden(models[reference], ids, mask)
        assert (got - expected)[valid].abs().max() <= BOUND, reference
    assert op_calls == _expected_calls(models[hf.NAME], path, tuple(mask.shape))


def test_a_window_edited_after_loading_is_the_one_run() -> None:
    """Hugging Face's eager and sdpa masks read config.local_attention at each call; the
    attention modules were built with the old window, which fastbert's op ran (0.86 off)."""
    models = _models("torch")
    ids, mask = inputs(LENGTHS, seed=1)
    for model in models.values():
        model.config.local_attention = 4
    expected = _hidden(models["eager"], ids, mask)
    got = _hidden(models[hf.NAME], ids, mask)
    assert (got - expected)[mask.bool()].abs().max() <= BOUND


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_without_mask_matches_sdpa(path: str, op_calls) -> None:
    """No padding: the mask function gives None, the local layers still get their window."""
    models = _models(path)
    ids, _ = inputs([18, 18], seed=2)
    expected, got = _hidden(models["sdpa"], ids, None), _hidden(models[hf.NAME], ids, None)
    assert (got - expected).abs().max() <= BOUND
    assert op_calls == _expected_calls(models[hf.NAME], path, None)


@pytest.mark.parametrize("path", ["kernel", "torch"])
def test_gradients_match_sdpa(path: str, op_calls) -> None:
    """Every parameter's gradient, with the attention dropout of training mode off."""
    models = _models(path, seed=4)
    ids, mask = inputs(LENGTHS, seed=4)
    valid = mask.bool()
    for name in ("sdpa", hf.NAME):
        model = models[name].train()
        weighted_sum(model(input_ids=ids, attention_mask=mask), valid).backward()
    assert_grads_match(grads(models["sdpa"]), grads(models[hf.NAME]))
    assert op_calls == _expected_calls(models[hf.NAME], path, tuple(mask.shape))


def test_attention_dropout_runs_in_the_op(op_calls) -> None:
    """In training mode the local layers' attention dropout runs in the op, window kept (the
    dropout after each attention's output projection is switched off, so only the op's
    dropout can make two calls differ)."""
    model = _models("torch", attention_dropout=0.3)[hf.NAME].train()
    for layer in model.layers:
        layer.attn.out_drop = torch.nn.Identity()
    ids, mask = inputs([9, 4], seed=5)
    valid = mask.bool()
    with torch.no_grad():
        first, second = (model(input_ids=ids, attention_mask=mask)[0] for _ in range(2))
    assert not torch.allclose(first[valid], second[valid])
    assert op_calls == 2 * _expected_calls(model, "torch", tuple(mask.shape))


def _qkv(batch=2, heads=2, seq=12, dim=32):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(batch, seq, heads, dim, generator=gen).transpose(1, 2) for _ in range(3)]


@pytest.mark.parametrize("half_width", [0, 1, 3])
def test_window_is_hugging_faces(half_width: int) -> None:
    """Hugging Face passes ``sliding_window = config.sliding_window + 1`` with a mask keeping
    |i - j| <= config.sliding_window: the attention function over the 2-D mask equals sdpa
    over Hugging Face's own 4-D sliding-window mask; one more or one less does not."""
    from transformers import masking_utils

    q, k, v = _qkv()
    padding = torch.tensor([[True] * 12, [True] * 7 + [False] * 5])
    module = torch.nn.Module().eval()
    module.is_causal = False
    band = masking_utils.sdpa_mask(
        batch_size=2,
        q_length=12,
        kv_length=12,
        mask_function=masking_utils.sliding_window_bidirectional_mask_function(half_width),
        attention_mask=padding,
        allow_is_causal_skip=False,
    )
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, band).transpose(1, 2)
    valid = padding[:, :, None, None].expand_as(expected)

    def error(sliding_window: int) -> float:
        got, _ = hf.attention_forward(module, q, k, v, padding, sliding_window=sliding_window)
        return (got - expected)[valid].abs().max().item()

    assert error(half_width + 1) <= BOUND
    assert error(half_width + 2) > 1e-3
    if half_width > 0:
        assert error(half_width) > 1e-3


@pytest.mark.parametrize("sliding_window", [0, -3, 2.0, True])
def test_bad_sliding_window_raises(sliding_window) -> None:
    q, k, v = _qkv()
    module = torch.nn.Module()
    module.is_causal = False
    with pytest.raises(ValueError, match="sliding_window"):
        hf.attention_forward(module, q, k, v, None, sliding_window=sliding_window)


def _mask(mask_function, local_size: int | None) -> torch.Tensor | None:
    padding = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    return hf.padding_mask(
        batch_size=2,
        q_length=6,
        kv_length=6,
        mask_function=mask_function,
        attention_mask=padding,
        local_size=local_size,
        allow_is_causal_skip=False,
    )


def test_mask_function_recognises_only_bidirectional_windows() -> None:
    """The 2-D padding mask for Hugging Face's bidirectional sliding window; the 4-D mask for a
    causal sliding window and for a window combined with another mask function."""
    from transformers import masking_utils as mu

    bidirectional = mu.sliding_window_bidirectional_mask_function(2)
    assert _mask(bidirectional, 2).shape == (2, 6)
    assert _mask(mu.bidirectional_mask_function, None).shape == (2, 6)
    assert _mask(bidirectional, 3).shape == (2, 1, 6, 6)  # a window other than local_size
    assert _mask(mu.sliding_window_causal_mask_function(2), 2).shape == (2, 1, 6, 6)
    combined = mu.and_masks(bidirectional, lambda b, h, q, kv: kv != 1)
    assert _mask(combined, 2).shape == (2, 1, 6, 6)


def test_compiles_fullgraph_with_the_op(device: str) -> None:
    """torch.compile(fullgraph=True) traces ModernBERT with fastbert's attention as one graph
    holding fastbert::attention once per layer, local layers included."""
    model = _models("kernel")[hf.NAME].to(device)
    ids, mask = inputs(LENGTHS, seed=6, device=device)
    calls: list[str] = []

    def recording_backend(graph_module: torch.fx.GraphModule, example_inputs):
        calls.extend(str(n.target) for n in graph_module.graph.nodes)
        return graph_module.forward

    expected = _hidden(model, ids, mask)
    torch._dynamo.reset()
    got = _hidden(torch.compile(model, fullgraph=True, backend=recording_backend), ids, mask)
    assert calls.count("fastbert.attention.default") == model.config.num_hidden_layers
    assert torch.equal(got, expected)
