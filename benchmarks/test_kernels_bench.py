"""Kernel level: each fastbert kernel against what PyTorch offers for the same op, on the
shapes fastbert's encoder feeds it.

- attention (key-padding mask, HF-style strided q/k/v views): fastbert vs
  F.scaled_dot_product_attention under each SDPA backend (one that refuses a mask is skipped
  with its error) and eager (matmul, masked softmax in fp32, matmul).
- linear + GELU (the FFN's first GEMM): fastbert vs nn.Linear then F.gelu, and torch.compile
  of that (--bench-compile).
- layer_norm of x + residual: fastbert vs F.layer_norm(x + r), and torch.compile of that.
- scaled_masked_softmax of attention scores: fastbert vs eager.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from benchmarks.cases import config_and_dtype, info, key_padding_mask, randn
from fastbert import kernels as K
from fastbert.bench import counts
from fastbert.kernels import reference

SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")


def _sdpa(backend_name: str):
    """F.scaled_dot_product_attention restricted to one backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "math": SDPBackend.MATH,
    }[backend_name]

    def attend(q, k, v, mask):
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :])

    return attend


def _compiled(fn, enabled: bool):
    if not enabled:
        pytest.skip("torch.compile peers run with --bench-compile")
    torch._dynamo.reset()  # one compilation per case, never the recompile limit's fallback
    return torch.compile(fn, dynamic=False)


@pytest.mark.parametrize("impl", ["fastbert", "eager"] + [f"sdpa-{b}" for b in SDPA_BACKENDS])
def test_attention(case, impl, record) -> None:
    config, dtype = config_and_dtype(case)
    shape = case[1]
    heads, d = config.num_attention_heads, config.head_dim
    qkv = randn(shape.batch, shape.seq, 3, heads, d, dtype=dtype)
    q, k, v = qkv.permute(2, 0, 3, 1, 4)  # [B, heads, S, D] views, as the encoder passes them
    mask = key_padding_mask(shape)
    if impl == "fastbert":
        fn = lambda: K.attention(q, k, v, mask)
    elif impl == "eager":
        fn = lambda: reference.attention(q, k, v, mask)
    else:
        attend = _sdpa(impl.removeprefix("sdpa-"))
        fn = lambda: attend(q, k, v, mask)
    work = counts.attention(shape.batch, heads, shape.seq, shape.seq, d, dtype.itemsize)
    record(fn, info(case, "attention", impl), work)


@pytest.mark.parametrize("impl", ["fastbert", "eager", "compile"])
def test_linear_gelu(case, impl, record, compile_enabled) -> None:
    config, dtype = config_and_dtype(case)
    tokens, h, i = case[1].batch * case[1].seq, config.hidden_size, config.intermediate_size
    x = randn(tokens, h, dtype=dtype)
    weight, bias = randn(i, h, dtype=dtype, scale=h**-0.5), randn(i, dtype=dtype, scale=0.1)
    eager = lambda x, w, b: F.gelu(F.linear(x, w, b))
    if impl == "fastbert":
        fn = lambda: K.linear(x, weight, bias, activation="gelu")
    else:
        op = eager if impl == "eager" else _compiled(eager, compile_enabled)
        fn = lambda: op(x, weight, bias)
    work = counts.linear(tokens, i, h, dtype.itemsize)
    record(fn, info(case, "linear_gelu", impl), work)


@pytest.mark.parametrize("impl", ["fastbert", "eager", "compile"])
def test_layer_norm(case, impl, record, compile_enabled) -> None:
    config, dtype = config_and_dtype(case)
    tokens, h, eps = case[1].batch * case[1].seq, config.hidden_size, config.layer_norm_eps
    x, residual = randn(tokens, h, dtype=dtype), randn(tokens, h, dtype=dtype)
    weight, bias = randn(h, dtype=dtype), randn(h, dtype=dtype)
    eager = lambda x, r, w, b: F.layer_norm(x + r, (h,), w, b, eps)
    if impl == "fastbert":
        fn = lambda: K.layer_norm(x, weight, bias, eps, residual)
    else:
        op = eager if impl == "eager" else _compiled(eager, compile_enabled)
        fn = lambda: op(x, residual, weight, bias)
    work = counts.layer_norm(tokens, h, dtype.itemsize)
    record(fn, info(case, "layer_norm", impl), work)


@pytest.mark.parametrize("impl", ["fastbert", "eager"])
def test_scaled_masked_softmax(case, impl, record) -> None:
    config, dtype = config_and_dtype(case)
    shape = case[1]
    heads = config.num_attention_heads
    scores = randn(shape.batch, heads, shape.seq, shape.seq, dtype=dtype)
    mask = key_padding_mask(shape)
    scale = config.head_dim**-0.5
    op = K.scaled_masked_softmax if impl == "fastbert" else reference.scaled_masked_softmax
    fn = lambda: op(scores, mask, scale)
    work = counts.softmax(shape.batch, heads, shape.seq, shape.seq, dtype.itemsize)
    record(fn, info(case, "softmax", impl), work)
