"""fastbert accuracy: fastbert against Hugging Face fp32, per layer and at the end, for every
dtype the device runs (fastbert/accuracy/stages.py); with --precisions, each precision against
sentence-transformers fp32 on a retrieval sample of real text
(fastbert/accuracy/precision_report.py), showing its expected run time once the reference has
run a tenth of its work and each stage's time left as it goes. An emulated precision (fp8 on
a CPU) runs only with --emulated."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from fastbert.commands.options import (
    UsageError,
    add_device_argument,
    positive_int,
    resolve_device,
)
from fastbert.model.families import FAMILIES

NAME = "accuracy"
HELP = (
    "compare fastbert with Hugging Face fp32, layer by layer, in every supported dtype; "
    "--precisions: each precision's error, cosine and top-10 overlap on real text"
)
# On a CPU the Triton kernels run under the interpreter (MiniLM: about 20 s per dtype for 32
# tokens, the interpreter's tile height): a small input by default.
CPU_TEXTS, CPU_MAX_LENGTH = 2, 16
# --precisions' sample, as fastbert.accuracy.evaluate_precisions takes it by default (kept here
# so that parsing the command line does not import the accuracy package).
DEFAULT_QUERIES, DEFAULT_CORPUS = 100, 1000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default="minilm",
        help="'minilm' (the packaged all-MiniLM-L6-v2, default), 'random' (a random config of "
        "--family), another model name (a packaged model, a Hugging Face id in its cache: "
        "fastbert models lists them) or a local checkpoint folder",
    )
    parser.add_argument(
        "--family",
        default=None,
        choices=[f.model_type for f in FAMILIES],
        help="with --model random: the family of the random config (default bert; the others "
        "run through fastbert.optimize); a checkpoint's config names its own",
    )
    add_device_argument(parser)
    parser.add_argument(
        "--backend",
        default=None,
        choices=("triton", "torch"),
        help="fastbert backend (default triton, on a CPU under the Triton interpreter; with "
        "--precisions: triton on CUDA, torch on a CPU)",
    )
    parser.add_argument(
        "--dtypes",
        default=None,
        help="comma-separated subset of fp32,fp16,bf16 (default: all the device supports), "
        "or int8 / fp8 (quantize='int8' / 'fp8': float32 on a CPU, float16 on CUDA; only when "
        "named; fp8 on a CPU is an emulation of its e4m3 math: with --emulated)",
    )
    parser.add_argument("--texts", type=positive_int, default=None, help="how many built-in texts")
    parser.add_argument(
        "--max-length", type=positive_int, default=None, help="tokens per text, at most"
    )
    parser.add_argument(
        "--precisions",
        nargs="?",
        const="",
        default=None,
        metavar="LIST",
        help="the precision report instead of the stage comparison: for each precision "
        "(comma-separated subset of fp32,fp16,bf16,int8,fp8; alone: every one the device runs "
        "natively), the hidden states' error and the sentence embeddings' cosine and top-10 "
        "neighbour overlap against sentence-transformers fp32 on real text (a few minutes on a "
        "2-core CPU: the expected time is shown as it starts)",
    )
    parser.add_argument(
        "--emulated",
        action="store_true",
        help="also run the precisions the device can only emulate (fp8 on a CPU: e4m3 values "
        "multiplied in float32, for its accuracy, not its speed)",
    )
    parser.add_argument(
        "--queries",
        type=positive_int,
        default=None,
        help=f"--precisions: query sentences in the sample (default {DEFAULT_QUERIES})",
    )
    parser.add_argument(
        "--corpus",
        type=positive_int,
        default=None,
        help=f"--precisions: corpus paragraphs in the sample (default {DEFAULT_CORPUS})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def _forwarded_argv(args: argparse.Namespace) -> list[str]:
    """The command line that re-runs this command with ``args``."""
    argv = [NAME, "--model", args.model, "--device", args.device]
    for flag, value in (
        ("--family", args.family),
        ("--backend", args.backend),
        ("--dtypes", args.dtypes),
        ("--texts", args.texts),
        ("--max-length", args.max_length),
    ):
        if value is not None:
            argv += [flag, str(value)]
    return argv + (["--emulated"] if args.emulated else []) + (["--json"] if args.json else [])


def _rerun_under_interpreter(args: argparse.Namespace) -> int:
    """The interpreter must be on before the kernels are imported: run again in a new process."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "fastbert.cli", *_forwarded_argv(args)]
    return subprocess.run(command, env=env).returncode


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _print_report(report) -> None:
    where = f"{report.device}, backend {report.backend}"
    if report.interpreter:
        where += " under the Triton interpreter (TRITON_INTERPRET=1; a small input, slow)"
    print(f"fastbert accuracy: {report.model} ({report.family}) on {where}")
    print(
        f"reference: Hugging Face fp32; {report.texts} texts, {report.tokens} real tokens, "
        f"padded to {report.max_length}; fastbert dense; errors at real tokens only"
    )
    print(f"head: {report.head}")
    for note in report.notes:
        print(f"note: {note}")
    header = (
        f"  {'stage':<20}{'max|err|':>10}{'mean|err|':>11}{'cos min':>10}{'cos mean':>10}"
        f"{'HF max|err|':>13}{'argmax':>8}{'top-5':>7}"
    )
    import torch

    from fastbert.accuracy import stages

    for result in report.results:
        # A quantised precision's yardstick is Hugging Face in the dtype it computes in.
        yardstick = str(stages.compute_dtype(result.dtype, torch.device(report.device)))
        print(
            f"\n{result.dtype}  (HF max|err|: Hugging Face itself in "
            f"{yardstick.removeprefix('torch.')})"
        )
        print(header)
        for entry in [*result.layers, *result.outputs]:
            print(
                f"  {entry.name:<20}{entry.max_abs_err:>10.2e}{entry.mean_abs_err:>11.2e}"
                f"{entry.cosine_min:>10.6f}{entry.cosine_mean:>10.6f}"
                f"{_fmt(entry.hf_max_abs_err, '.2e'):>13}"
                f"{_fmt(entry.argmax_agreement, '.4f'):>8}{_fmt(entry.top5_agreement, '.3f'):>7}"
            )


def _print_precision_report(report) -> None:
    print(
        f"fastbert accuracy --precisions: {report.model} on {report.device}, "
        f"backend {report.backend}"
    )
    print(f"reference: {report.reference}")
    print(
        f"sample: {report.queries} queries and {report.corpus} corpus texts, {report.source}; "
        f"{report.tokens} real tokens; mean |hidden| of the reference {report.hidden_mean_abs:.3f}"
    )
    print(
        "hidden: the last layer's output at real tokens; cos: the sentence embeddings, per "
        f"text; top-{report.top_k}: each query's {report.top_k} nearest corpus texts, the "
        "fraction also among the reference's"
    )
    for note in report.notes:
        print(f"note: {note}")
    top = f"top-{report.top_k}"
    print(
        f"\n  {'precision':<11}{'runs in':<26}{'hidden max|err|':>16}{'mean|err|':>11}"
        f"{'cos least':>11}{'cos mean':>10}{top + ' least':>14}{top + ' mean':>13}"
    )
    for r in report.results:
        print(
            f"  {r.precision:<11}{r.runs_in():<26}{r.hidden_max_abs_err:>16.2e}"
            f"{r.hidden_mean_abs_err:>11.2e}{_fmt(r.cosine_least, '.6f'):>11}"
            f"{_fmt(r.cosine_mean, '.6f'):>10}{_fmt(r.top10_overlap_least, '.2f'):>14}"
            f"{_fmt(r.top10_overlap_mean, '.3f'):>13}"
        )


def _checked_precisions(
    flag: str, value: str | None, device, backend: str, emulated: bool
) -> list[str] | None:
    """The precisions a comma-separated ``value`` of ``flag`` names (None when it names none);
    UsageError for an unknown one, one the device does not run, or an emulated one without
    --emulated."""
    if not value:
        return None
    from fastbert import accuracy

    try:
        return accuracy.check_precisions(value.split(","), device, backend, emulated)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from exc


def _run_precisions(args: argparse.Namespace, device) -> int:
    """The precision report (--precisions)."""
    stage_options = [
        flag
        for flag, value in (
            ("--dtypes", args.dtypes),
            ("--texts", args.texts),
            ("--max-length", args.max_length),
        )
        if value is not None
    ]
    if args.family is not None:
        raise UsageError(
            "--family picks the family of the stage comparison's --model random; --precisions "
            "runs a real embedding model and its tokenizer (--model minilm or a local folder), "
            "whose config names its family"
        )
    if args.model == "random":
        raise UsageError(
            "--model random is the stage comparison's random config; --precisions runs a model "
            "and its tokenizer on real text (--model minilm, a folder or a Hugging Face id in "
            "the cache)"
        )
    if stage_options:
        raise UsageError(
            f"{', '.join(stage_options)}: the stage comparison's options; --precisions takes "
            "--queries and --corpus"
        )
    backend = args.backend or ("triton" if device.type == "cuda" else "torch")
    if device.type == "cpu" and backend == "triton":
        raise UsageError(
            "--precisions on a CPU runs the torch backend (the Triton interpreter is far too "
            "slow for a corpus): leave out --backend or use --backend torch"
        )
    from fastbert import accuracy

    names = _checked_precisions("--precisions", args.precisions, device, backend, args.emulated)
    return _print_evaluation(
        accuracy.evaluate_precisions,
        _print_precision_report,
        args.json,
        model=args.model,
        device=args.device,
        backend=backend,
        precisions=names,
        queries=args.queries or DEFAULT_QUERIES,
        corpus=args.corpus or DEFAULT_CORPUS,
        emulated=args.emulated,
    )


def run(args: argparse.Namespace) -> int:
    device = resolve_device(args.device)
    args.device = str(device)
    if args.precisions is not None:
        return _run_precisions(args, device)
    if args.queries is not None or args.corpus is not None:
        raise UsageError("--queries and --corpus belong to --precisions")
    if args.family is not None and args.model != "random":
        raise UsageError(
            f"--family picks the family of --model random; --model {args.model!r} names its "
            "own in its config"
        )
    args.backend = args.backend or "triton"
    # Checked here, before a re-run under the interpreter, so a usage error comes from this
    # process.
    dtypes = _checked_precisions("--dtypes", args.dtypes, device, args.backend, args.emulated)
    from fastbert.kernels import launch

    on_cpu = device.type == "cpu"
    if on_cpu and args.backend == "triton" and not launch.interpreting():
        print(
            "no GPU: running the Triton kernels under the interpreter (TRITON_INTERPRET=1)",
            file=sys.stderr,
        )
        return _rerun_under_interpreter(args)
    from fastbert import accuracy

    small = on_cpu and args.backend == "triton"
    texts = args.texts or (CPU_TEXTS if small else len(accuracy.TEXTS))
    max_length = args.max_length or (CPU_MAX_LENGTH if small else 128)
    return _print_evaluation(
        accuracy.evaluate,
        _print_report,
        args.json,
        model=args.model,
        family=args.family or "bert",
        device=args.device,
        backend=args.backend,
        dtypes=dtypes,
        texts=texts,
        max_length=max_length,
    )


def _print_evaluation(
    evaluate: Callable[..., Any],
    print_text: Callable[[Any], None],
    as_json: bool,
    **options: Any,
) -> int:
    """Run ``evaluate(**options)`` (its progress on stderr) and print the report it returns: as
    JSON with ``as_json``, else as ``print_text`` writes it; 0. Its ValueError is a usage
    error."""
    try:
        report = evaluate(progress=sys.stderr, **options)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    if as_json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print_text(report)
    return 0
