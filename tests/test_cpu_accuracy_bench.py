"""benchmarks/cpu_accuracy.py without its measurement: the Markdown it writes, its arguments,
the files its command leaves, and the switches its variants turn (each restored)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from benchmarks import cpu_accuracy as bench
from tests.test_precision_accuracy import ENVIRONMENT


def cosine_row(variant: str, least: float, mean: float, **more) -> dict:
    return {"variant": variant, "cosine_least": least, "cosine_mean": mean, **more}


def figures() -> dict:
    """A result of the shape :func:`benchmarks.cpu_accuracy.measure` returns, made up."""
    return {
        "model": "all-MiniLM-L6-v2 (packaged)",
        "reference": "sentence-transformers float32 encode() on the CPU",
        "int8": {
            "sentences": 400,
            "rows": [
                cosine_row("int8, per-token activations, no smoothing", 0.991094, 0.997341),
                cosine_row("int8 as shipped (smoothing QKV and FFN1)", 0.995841, 0.998853),
            ],
        },
        "fp8": {"sentences": 200, "rows": [cosine_row("fp8 e4m3", 0.991321, 0.997561)]},
        "bfloat16": {
            "paragraphs": 300,
            "overlap_paragraphs": 500,
            "queries": 100,
            "rows": [
                cosine_row(
                    "fastbert bfloat16",
                    0.99988,
                    0.99996,
                    top10_overlap=0.991,
                    top10_overlap_more=0.992,
                ),
            ],
        },
        "gelu_table": {
            "paragraphs": 300,
            "table_available": False,
            "table_status": "no AVX512BW",
            "rows": [
                {"variant": "post-op", "one_minus_least": 1.246e-4, "one_minus_mean": 4.113e-5}
            ],
        },
        "bfloat16_attention": {
            "paragraphs": 300,
            "math_max_length": {"torch.bfloat16, D=32": 124},
            "math_calls": 504,
            "math_calls_flash_run": 0,
            "math_vs_flash": {"cosine_least": 0.9999621, "cosine_mean": 0.999986},
            "math_vs_float32": {"cosine_least": 0.999853, "cosine_mean": 0.999958},
            "flash_vs_float32": {"cosine_least": 0.999852, "cosine_mean": 0.999957},
        },
        "int8_gemm": {
            "shape": "x @ W^T",
            "rows": [
                {"variant": "fastbert int8", "activations": "outliers", "rel_error": 0.03362},
                {
                    "variant": "torchao",
                    "activations": "outliers",
                    "rel_error": None,
                    "not_measured": "torchao is not installed here",
                },
            ],
        },
    }


def test_benchmark_writes_the_report_as_a_table() -> None:
    """One table per topic with the figures' digits, the environment and the command."""
    command = "python -m benchmarks.cpu_accuracy --out x"
    table = bench.markdown({"figures": figures(), "environment": ENVIRONMENT}, command)
    assert "## int8 on 400 sentences of pydoc_data.topics" in table
    rows = re.findall(r"^\| (int8[^|]*?) \| (\S+) \| (\S+) \|$", table, re.M)
    assert rows == [
        ("int8, per-token activations, no smoothing", "0.99109", "0.99734"),
        ("int8 as shipped (smoothing QKV and FFN1)", "0.99584", "0.99885"),
    ]
    for line in (
        "## fp8 on 200 sentences",
        "| fp8 e4m3 | 0.99132 | 0.99756 |",
        "| fastbert bfloat16 | 0.99988 | 0.99996 | 99.1% | 99.2% |",
        "top-10 overlap (300) | top-10 overlap (500) |",
        "The table's kernel: not available here (no AVX512BW).",
        "| post-op | 1.246e-04 | 4.113e-05 |",
        "| math path against flash kernel | 0.999962 | 0.999986 |",
        "Math-path calls: 504 as shipped, 0 with the flash kernel only.",
        "| fastbert int8 | outliers | 3.36e-02 |",
        "| torchao | outliers | not measured: torchao is not installed here |",
        "CPU: a CPU (flags: avx2; 2 torch threads)",
        "commit abc",
        f"Command: `{command}`",
    ):
        assert line in table, line


def test_arguments_and_their_bounds(tmp_path, capsys) -> None:
    args = bench.parse(["--out", str(tmp_path)])
    assert args.out == tmp_path and args.threads is None
    sizes = (args.sentences, args.fp8_sentences, args.paragraphs, args.overlap_paragraphs)
    assert sizes == (400, 200, 300, 500) and args.attention_paragraphs == 300
    assert bench.parse(["--out", "x", "--threads", "2", "--fp8-sentences", "20"]).threads == 2
    for wrong, message in (
        ([], "the following arguments are required: --out"),
        (["--out", "x", "--threads", "0"], "--threads must be at least 1, got 0"),
        (["--out", "x", "--sentences", "0"], "--sentences must be at least 1"),
        (["--out", "x", "--paragraphs", "110"], "--paragraphs must be more than 110"),
        (["--out", "x", "--overlap-paragraphs", "50"], "--overlap-paragraphs must be more"),
    ):
        with pytest.raises(SystemExit) as exit_:
            bench.parse(wrong)
        assert exit_.value.code == 2
        assert message in capsys.readouterr().err


def test_the_command_writes_json_and_markdown(tmp_path, monkeypatch) -> None:
    from fastbert.bench import environment

    monkeypatch.setattr(environment, "capture", lambda: dict(ENVIRONMENT))
    monkeypatch.setattr(bench, "measure", lambda args, say: figures())
    before = torch.get_num_threads()
    try:
        assert bench.main(["--out", str(tmp_path / "run"), "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    saved = json.loads((tmp_path / "run" / "cpu-accuracy.json").read_text())
    command = f"python -m benchmarks.cpu_accuracy --out {tmp_path / 'run'} --threads 1"
    assert saved == {"figures": figures(), "environment": ENVIRONMENT, "command": command}
    assert (tmp_path / "run" / "cpu-accuracy.md").read_text() == bench.markdown(saved, command)


def test_the_texts_are_the_tests_texts() -> None:
    """The bfloat16 paragraphs are tests/test_cpu_bfloat16.py's (tests/test_embed.py's corpus
    with 120 words)."""
    from tests.test_embed import corpus

    assert bench.paragraphs(300) == corpus(300, offset=0, max_words=120)
    with pytest.raises(ValueError, match="fewer than"):
        bench.paragraphs(10**6)


def test_the_switches_of_the_variants_are_restored() -> None:
    """Quantising inside no_smoothing() smooths nothing; after it, the shipped smoothing; the
    flash-only block empties the math path's thresholds and puts them back; the running
    maxima keep the largest value of every call."""
    import fastbert
    from fastbert.kernels import cpu_engine_attention as engine
    from fastbert.model import quantization
    from tests.hf_models import hf_model

    hf = hf_model("BertModel", seed=3)
    with bench.no_smoothing():
        plain = fastbert.BertModel.from_pretrained(hf, device="cpu", quantize="int8")
    smoothed = fastbert.BertModel.from_pretrained(hf, device="cpu", quantize="int8")
    assert quantization.SMOOTHED_LINEARS == ("qkv_weight", "ffn_in_weight")
    for name in quantization.QUANTIZED_LINEARS:
        assert plain.layers[0].quantized[name][2] is None
        smoothing = name in quantization.SMOOTHED_LINEARS
        assert (smoothed.layers[0].quantized[name][2] is not None) == smoothing

    thresholds = dict(engine.MATH_ATTENTION_MAX_LENGTH)
    with bench.flash_only():
        assert engine.MATH_ATTENTION_MAX_LENGTH == {}
    assert engine.MATH_ATTENTION_MAX_LENGTH == thresholds
    original = engine.math_attention
    with bench.counting_math_attention() as calls:
        assert engine.math_attention is not original and calls == [0]
    assert engine.math_attention is original

    record = bench.RunningMax()
    record["x"] = torch.tensor([1.0, 5.0])
    record["x"] = torch.tensor([3.0, 2.0])
    assert record["x"].tolist() == [3.0, 5.0]
