"""quantize="fp8" on the models: accuracy on real weights and text (on the CPU, the emulation:
the same e4m3 operands multiplied in float32), the Triton kernels against the torch backend,
the refusals (GPUs before sm_89, non-float32 on the CPU) and the command line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastbert
from fastbert.execution import validation
from tests.hf_models import hf_model, padded_batch
from tests.test_int8_model import assert_backends_agree, embed_with, minilm_on_real_text

# fp8 against float32 sentence-transformers on real text (all-MiniLM-L6-v2, 200 sentences of
# Python's documentation): measured least 0.9913 and mean 0.9976 (int8: 0.9958 and 0.9988;
# e4m3 keeps 3 fraction bits where int8 spends 127 levels on each row's range).
LEAST_COSINE = 0.99
MEAN_COSINE = 0.997


@pytest.fixture(scope="module")
def minilm():
    return minilm_on_real_text()


def test_from_pretrained_fp8_on_real_text(minilm) -> None:
    path, st, texts, expected = minilm
    model = fastbert.BertModel.from_pretrained(path, device="cpu", quantize="fp8")
    assert model.quantize == "fp8"
    assert model.layers[0].quantized.weights["qkv_weight"].weight.dtype == torch.float8_e4m3fn
    cosine = F.cosine_similarity(embed_with(model, st.tokenizer, texts), expected, dim=-1)
    assert cosine.min() >= LEAST_COSINE, cosine.min()
    assert cosine.mean() >= MEAN_COSINE, cosine.mean()
    assert cosine.min() < 0.99999  # not the float path


def test_triton_fp8_matches_torch_fp8(device) -> None:
    """The Triton kernels and the torch backend's emulation: each token's hidden state close to
    Hugging Face's float32 one, and to each other's (not bit for bit: the backends' attention
    and LayerNorm differ in the last bits, which moves an activation across an e4m3 rounding
    boundary now and then)."""
    assert_backends_agree("fp8", 0.995, device)


def test_switching_between_int8_and_fp8_requantises() -> None:
    hf = hf_model("BertModel", seed=6)
    ids, mask, types = padded_batch([6, 4], seed=6)
    model = fastbert.BertModel.from_pretrained(hf, device="cpu", quantize="int8")
    with torch.no_grad():
        int8 = model(ids, mask, types).last_hidden_state
        model.quantize = "fp8"
        fp8 = model(ids, mask, types).last_hidden_state
        fresh = fastbert.BertModel.from_pretrained(hf, device="cpu", quantize="fp8")
        assert torch.equal(fp8, fresh(ids, mask, types).last_hidden_state)
    assert model.layers[0].quantized.format == "fp8"
    assert not torch.equal(int8, fp8)


def test_fp8_on_the_cpu_needs_float32() -> None:
    hf = hf_model("BertModel", seed=1)
    with pytest.raises(TypeError, match="quantize='fp8' on the CPU runs with float32"):
        fastbert.BertModel.from_pretrained(hf, device="cpu", dtype=torch.float16, quantize="fp8")


@pytest.mark.parametrize(
    "capability, message",
    [
        ((8, 6), r"'fp8' needs the FP8 tensor cores of sm_89 .* sm_86, which runs quantize='int8'"),
        ((7, 5), r"'fp8' needs the FP8 tensor cores of sm_89 .* sm_75, which runs quantize=None"),
    ],
)
def test_gpus_before_sm89_are_refused(monkeypatch, capability, message) -> None:
    """An Ampere or Turing GPU gets an error naming what fp8 needs and what runs there; Ada and
    Hopper pass."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some GPU")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    cuda = torch.device("cuda", 0)
    with pytest.raises(ValueError, match=message):
        validation.check_quantize("fp8", torch.float16, cuda)
    for newer in ((8, 9), (9, 0)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=newer: c)
        validation.check_quantize("fp8", torch.float16, cuda)


def test_the_commands_take_quantize_fp8() -> None:
    from fastbert.cli import build_parser

    parser = build_parser()
    embed = ["embed", "in.txt", "--model", "m", "--output", "out"]
    assert parser.parse_args([*embed, "--quantize", "fp8"]).quantize == "fp8"
    assert parser.parse_args(["serve", "--model", "m", "--quantize", "fp8"]).quantize == "fp8"
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args([*embed, "--quantize", "fp4"])
    assert exit_info.value.code == 2
