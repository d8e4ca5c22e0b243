"""The GPU grid at the sizes of the real models (skipped without CUDA).

The other test files check each op and model path on small shapes everywhere (the Triton
interpreter on a CPU) and forward kernels at BERT sizes on a GPU. These add what a GPU alone
can run in reasonable time:

- the backward of every op at BERT-base's sizes (attention dense and packed at 128 and 512
  tokens, the four projections, LayerNorm, the embeddings' 30,522-row table, the softmax of
  BERT-base's scores), in float32, float16 and bfloat16, against float64 autograd;
- the int8 and float8 linears at BERT-base's projections;
- BERT-base, MPNet-base and ModernBERT-base with random weights of their real sizes, dense and
  padding-free, in float16 and bfloat16, against Hugging Face in float32 (the rule: at most
  twice Hugging Face's own error in that dtype), and BERT-base replayed from CUDA graphs;
- BERT-base quantised to int8 and float8, on the Triton kernels and on the torch backend.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastbert
from fastbert import kernels as K
from fastbert.bench.models import random_reference
from fastbert.bench.shapes import padded_batch
from fastbert.integrations import models as hf_models
from fastbert.kernels import reference as R
from tests import test_ops_backward as ops_backward
from tests.op_cases import ALL_DTYPES, dtype_params, padded_mask
from tests.test_attention import packed_qkv, qkv
from tests.test_attention_backward import check_gradients as check_attention_gradients
from tests.test_linear_quantized import check, operands

pytestmark = pytest.mark.gpu

DTYPES = dtype_params((), ALL_DTYPES)
HALF = dtype_params((), (torch.float16, torch.bfloat16))
HIDDEN, HEADS, INTERMEDIATE, VOCAB = 768, 12, 3072, 30522
# Real lengths of a padded batch of 512 positions, the shortest one token.
LENGTHS_512 = [512, 300, 1, 77, 511, 256, 33, 129]
# (K, N, activation, residual): the query/key/value, attention output, FFN up and down.
PROJECTIONS = [
    (HIDDEN, 3 * HIDDEN, None, False),
    (HIDDEN, HIDDEN, None, True),
    (HIDDEN, INTERMEDIATE, "gelu", False),
    (INTERMEDIATE, HIDDEN, None, True),
]
PROJECTION_IDS = ["qkv", "attention-out", "ffn-up", "ffn-down"]
ROWS = 1000  # tokens: off every tile grid (32 x 128 = 4096 in the forward tests)


# --- backward of every op at BERT-base's sizes ---------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch, seq, lengths", [(32, 128, None), (8, 512, LENGTHS_512)])
def test_attention_gradients(dtype, batch, seq, lengths, device="cuda") -> None:
    """A model's padded rows get no gradient (nothing reads them), so neither do they here.
    With random gradients on them, dK of a sequence of one real key sums 511 padded rows'
    dS = P (dP - D) = dO.v - dO.o, a float32 residual of two equal products that FlashAttention's
    D = rowsum(dO * O) leaves and PyTorch's sum(P * dP) cancels exactly: 1.6e-5 against 3.1e-6
    (H200, float32), while the small cases of tests/test_attention_backward.py keep random
    gradients on every row."""
    q, k, v = qkv(batch, HEADS, seq, seq, HIDDEN // HEADS, dtype, device, seed=seq, layout="fused")
    mask = None if lengths is None else padded_mask(lengths, seq, device=device)
    grad_out = torch.randn(q.shape, generator=torch.Generator().manual_seed(99)).to(device)
    if mask is not None:
        grad_out = grad_out * mask[:, None, :, None]
    check_attention_gradients(K.attention, R.attention, (q, k, v), (mask,), grad_out=grad_out)


@pytest.mark.parametrize("dtype", DTYPES)
def test_attention_varlen_gradients(dtype, device="cuda") -> None:
    q, k, v, cu_seqlens = packed_qkv(LENGTHS_512, HEADS, HIDDEN // HEADS, dtype, device, seed=3)
    check_attention_gradients(
        K.attention_varlen, R.attention_varlen, (q, k, v), (cu_seqlens, max(LENGTHS_512))
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k, n, activation, residual", PROJECTIONS, ids=PROJECTION_IDS)
def test_linear_gradients(dtype, k, n, activation, residual, device="cuda") -> None:
    x = ops_backward._randn(ROWS, k, dtype=dtype, device=device)
    weight = k**-0.5 * ops_backward._randn(n, k, dtype=dtype, device=device, seed=1)
    bias = ops_backward._randn(n, dtype=dtype, device=device, seed=2)
    res = ops_backward._randn(ROWS, n, dtype=dtype, device=device, seed=3) if residual else None
    dout = ops_backward._randn(ROWS, n, device=device, seed=4)
    ops_backward.check_gradients(K.linear, R.linear, (x, weight, bias, activation, res), dout)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_gradients(dtype, device="cuda") -> None:
    x = ops_backward._randn(ROWS, HIDDEN, dtype=dtype, device=device)
    weight = 1 + 0.2 * ops_backward._randn(HIDDEN, dtype=dtype, device=device, seed=1)
    bias = ops_backward._randn(HIDDEN, dtype=dtype, device=device, seed=2)
    res = ops_backward._randn(ROWS, HIDDEN, dtype=dtype, device=device, seed=3)
    dout = ops_backward._randn(ROWS, HIDDEN, device=device, seed=4)
    args = (x, weight, bias, 1e-12, res)
    ops_backward.check_gradients(K.layer_norm, R.layer_norm, args, dout)


@pytest.mark.parametrize("dtype", DTYPES)
def test_embeddings_gradients(dtype, device="cuda") -> None:
    """BERT-base's tables; 32 x 128 ids, so that many rows of the word table repeat."""
    generator = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (32, 128), generator=generator).to(device)
    types = torch.randint(0, 2, (32, 128), generator=generator).to(device)
    tables = [
        ops_backward._randn(rows, HIDDEN, dtype=dtype, device=device, seed=rows)
        for rows in (VOCAB, 512, 2)
    ]
    weight = 1 + 0.2 * ops_backward._randn(HIDDEN, dtype=dtype, device=device, seed=1)
    bias = ops_backward._randn(HIDDEN, dtype=dtype, device=device, seed=2)
    args = (ids, types, None, *tables, weight, bias, 1e-12)
    dout = ops_backward._randn(32, 128, HIDDEN, device=device, seed=4)
    ops_backward.check_gradients(K.embeddings_layer_norm, R.embeddings_layer_norm, args, dout)


@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_gradients(dtype, device="cuda") -> None:
    """BERT-base's scores at 32 x 128, half the rows padded to various lengths."""
    scores = ops_backward._randn(32, HEADS, 128, 128, dtype=dtype, device=device)
    lengths = [128 if i % 2 else max(1, 4 * i) for i in range(32)]
    mask = padded_mask(lengths, 128, device=device)
    dout = ops_backward._randn(32, HEADS, 128, 128, device=device, seed=4)
    args = (scores, mask, (HIDDEN // HEADS) ** -0.5)
    ops_backward.check_gradients(K.scaled_masked_softmax, R.scaled_masked_softmax, args, dout)


# --- int8 and float8 linears at BERT-base's projections ------------------------------------

# Least cosine of a real token's hidden state against Hugging Face's float32 one, BERT-base with
# random weights: measured 0.99963 (int8) and 0.99649 (fp8) on the torch backend in float32.
LEAST_COSINE = {"int8": 0.999, "fp8": 0.99}
QUANTISED = {"int8": K.linear_int8, "fp8": K.linear_fp8}


def _skip_without_fp8(quantize: str, device: str) -> None:
    on_cuda = torch.device(device).type == "cuda"
    if quantize == "fp8" and on_cuda and torch.cuda.get_device_capability(device) < (8, 9):
        pytest.skip("float8 products need sm_89 or newer")


@pytest.mark.parametrize("quantize", sorted(QUANTISED))
@pytest.mark.parametrize("dtype", dtype_params((), (torch.float32, torch.float16)))
@pytest.mark.parametrize("k, n, activation, residual", PROJECTIONS, ids=PROJECTION_IDS)
def test_quantised_projections(quantize, dtype, k, n, activation, residual, device="cuda"):
    _skip_without_fp8(quantize, device)
    op = QUANTISED[quantize]
    x, weight_q, weight_scale, bias, res = operands(quantize, 32 * 128, n, k, dtype, device, k)
    check(op, x, weight_q, weight_scale, bias, activation, res if residual else None)


# --- the models at their real sizes ----------------------------------------------------------


def _batch(reference, device: str):
    """A padded batch of 8 x 512 (LENGTHS_512) for the reference's vocabulary and padding."""
    config = reference.config
    pad = config.pad_token_id or 0
    return padded_batch(LENGTHS_512, 512, config.vocab_size, device, seed=7, pad_token_id=pad)


def _hidden(model, batch, takes_token_types: bool) -> torch.Tensor:
    arguments = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
    if takes_token_types:
        arguments["token_type_ids"] = batch.token_type_ids
    with torch.no_grad():
        return model(**arguments).last_hidden_state


def _fastbert(reference, device: str, **options):
    model = fastbert.BertModel.from_pretrained(reference.hf_model, device=device, **options)
    takes_token_types = reference.config.type_vocab_size > 0
    return lambda batch: _hidden(model, batch, takes_token_types)


def _hugging_face(reference, dtype: torch.dtype, device: str):
    sdpa = getattr(reference.hf_model, "_supports_sdpa", False)
    model = hf_models.model_like(reference.hf_model, "sdpa" if sdpa else "eager", dtype, device)
    return lambda batch: _hidden(model, batch, hf_models.takes_token_types(model))


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("shape", ["bert-base", "mpnet-base", "modernbert-base"])
def test_model_within_twice_hf_error(shape, dtype, padding_free, device="cuda") -> None:
    """Random weights of the real size, a padded batch of 512 positions: fastbert's error
    against Hugging Face in float32 at most twice Hugging Face's own in ``dtype`` (plus 1e-3,
    as tests/test_optimize.py)."""
    reference = random_reference(shape, seed=3)
    batch = _batch(reference, device)
    valid = batch.attention_mask.bool()
    expected = _hugging_face(reference, torch.float32, device)(batch)
    hf_error = (_hugging_face(reference, dtype, device)(batch).float() - expected)[valid]
    ours = _fastbert(reference, device, dtype=dtype, padding_free=padding_free)(batch)
    error = (ours.float() - expected)[valid].abs().max().item()
    bound = 2 * hf_error.abs().max().item() + 1e-3
    assert error <= bound, f"{shape}: fastbert error {error:.3g} > {bound:.3g}"


@pytest.mark.parametrize("padding_free", [False, True], ids=["dense", "padding-free"])
def test_bert_base_replayed_from_cuda_graphs(padding_free, device="cuda") -> None:
    """Dense, replays give the eager result bit for bit; padding-free, graphed per size bucket
    (other row counts, so maybe other tiles), as close to float32 as eager (as
    tests/test_runtime.py holds small models)."""
    reference = random_reference("bert-base", seed=4)
    batch = _batch(reference, device)
    valid = batch.attention_mask.bool()
    options = dict(padding_free=padding_free, cuda_graphs=False)
    exact = _fastbert(reference, device, dtype=torch.float32, **options)(batch)[valid]
    eager = _fastbert(reference, device, dtype=torch.float16, **options)(batch)[valid]
    options["cuda_graphs"] = True
    graphed = _fastbert(reference, device, dtype=torch.float16, **options)
    for _ in range(3):  # the capture, then replays
        got = graphed(batch)[valid]
        if padding_free:
            error = (got.float() - exact).abs().max().item()
            bound = 2 * (eager.float() - exact).abs().max().item() + 1e-3
            assert error <= bound, f"graphed {error:.3g} > {bound:.3g}"
        else:
            assert torch.equal(got, eager)


@pytest.mark.parametrize("quantize", ["int8", "fp8"])
def test_bert_base_quantised(quantize, device="cuda") -> None:
    """BERT-base quantised, float16 activations: each real token's hidden state close to
    Hugging Face's float32 one, on the Triton kernels and on the torch backend alike."""
    _skip_without_fp8(quantize, device)
    reference = random_reference("bert-base", seed=5)
    batch = _batch(reference, device)
    valid = batch.attention_mask.bool()
    expected = _hugging_face(reference, torch.float32, device)(batch)[valid]
    outs = []
    for backend in ("triton", "torch"):
        options = dict(dtype=torch.float16, backend=backend, quantize=quantize)
        out = _fastbert(reference, device, **options)(batch)[valid].float()
        cosine = F.cosine_similarity(out, expected, dim=-1)
        assert cosine.min() >= LEAST_COSINE[quantize], f"{backend}: {cosine.min():.5f}"
        outs.append(out)
    cosine = F.cosine_similarity(outs[0], outs[1], dim=-1)
    assert cosine.min() >= LEAST_COSINE[quantize], f"triton vs torch: {cosine.min():.5f}"
