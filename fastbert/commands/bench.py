"""fastbert bench: fastbert side by side with Hugging Face (eager, sdpa), torch.compile of it
and fastbert's own variants, end to end, on the device at hand.

Writes results.json, results.md (the table and, on a GPU, the targets) and results.png into
--out. With no CUDA GPU it runs a small CPU comparison of fastbert (its PyTorch backend, or the
Triton kernels under the interpreter with TRITON_INTERPRET=1) with Hugging Face. The
contenders of a shape are timed in turns until each median's 95% interval is narrow enough
or the time per cell is spent (fastbert/bench/stopping.py); cells that stay too noisy to rank
are named in a caution line with what the machine was measured doing. Exits 1 when no
fastbert contender could be measured.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from fastbert.commands.options import (
    CommandError,
    UsageError,
    add_backend_argument,
    add_device_argument,
    fraction,
    nonnegative_float,
    nonnegative_int,
    positive_int,
    resolve_device,
)

if TYPE_CHECKING:
    import torch

NAME = "bench"
HELP = "compare fastbert with Hugging Face and torch.compile end to end on this device"
# --dtype -> the torch dtype's name (torch is imported when the command runs, not to parse).
DTYPES = {
    "float16": "float16",
    "fp16": "float16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float32": "float32",
    "fp32": "float32",
}
# What fastbert's rows measured on a CPU, by the backend that ran them.
CPU_RUNS = {
    "torch": "fastbert's pure-PyTorch backend",
    "triton (interpreter)": "fastbert's Triton kernels emulated by the Triton interpreter "
    "(TRITON_INTERPRET=1, orders of magnitude slower than compiled)",
}
CPU_NOTE = (
    "No CUDA GPU here: these are CPU figures of {what} against Hugging Face, a check that "
    "everything runs, not a measure of fastbert's speed. The Triton kernels need a CUDA GPU "
    "to run compiled; run fastbert bench there for the real comparison."
)


def cpu_note(backend: str | None) -> str:
    """The note of a CPU run whose fastbert rows ran on ``backend`` (None: on none)."""
    return CPU_NOTE.format(what=CPU_RUNS.get(backend, "fastbert (which cannot run here)"))


@dataclasses.dataclass(frozen=True)
class Defaults:
    model: str
    shapes: str
    warmup: int
    reps: int  # timed repetitions at least
    max_time: float  # timed seconds per cell at most, to settle its median


# (device type, quick) -> what runs when the options leave it open.
DEFAULTS = {
    ("cuda", False): Defaults("bert-base", "1x128,32x128,8x512,64x512,64x512p", 10, 100, 2.0),
    ("cuda", True): Defaults("bert-base", "32x128,32x128p", 5, 20, 0.5),
    ("cpu", False): Defaults("bert-mini", "1x64,8x64,8x64p", 2, 10, 3.0),
    ("cpu", True): Defaults("bert-tiny", "2x32,2x32p", 1, 6, 0.5),
}
CI_WIDTH = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model",
        default=None,
        help="bert-base (default on a GPU; random weights), bert-large, minilm-l6, mpnet-base, "
        "modernbert-base, "
        "bert-mini (default on a CPU), bert-tiny, or real weights: a model name ('minilm' / "
        "'mpnet': the packaged all-MiniLM-L6-v2 / all-mpnet-base-v2; a Hugging Face id in its "
        "cache; fastbert models lists them) or a local checkpoint folder",
    )
    parser.add_argument("--batch", type=positive_int, default=None, help="batch size of one shape")
    parser.add_argument(
        "--seq", type=positive_int, default=None, help="sequence length of one shape"
    )
    parser.add_argument(
        "--shapes",
        default=None,
        help="comma-separated BATCHxSEQ shapes, a trailing p pads one (e.g. 32x128,64x512p; "
        "a padded one's SEQ at least 16); default on a GPU: 1x128,32x128,8x512,64x512,64x512p",
    )
    parser.add_argument(
        "--padded",
        action="store_true",
        help="pad every shape: lengths uniform in [16, seq] (seq at least 16)",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=sorted(DTYPES),
        help="default float16 on a GPU, float32 on a CPU",
    )
    parser.add_argument(
        "--peers",
        default=None,
        help="comma-separated contenders, or 'all': hf-eager, hf-sdpa, hf-compile, "
        "hf-compile-max (slow: minutes per shape), fastbert, fastbert-padfree, "
        "fastbert-graphs, fastbert-padfree-graphs (default: all but hf-compile-max on a "
        "GPU; hf-eager, hf-sdpa, fastbert and fastbert-padfree on a CPU)",
    )
    parser.add_argument(
        "--out",
        default="bench-out",
        help="folder for results.json, results.md, results.png (bench-out)",
    )
    parser.add_argument(
        "--append",
        action="store_true",
        help="add to the results already in --out (same model, dtype, device and fastbert backend)",
    )
    parser.add_argument(
        "--warmup", type=nonnegative_int, default=None, help="untimed calls per shape"
    )
    parser.add_argument(
        "--reps",
        type=positive_int,
        default=None,
        help="timed calls per contender and shape, at least (default 100 on a GPU, 10 on a CPU); "
        "more until the median is settled (--ci-width, --max-time)",
    )
    parser.add_argument(
        "--ci-width",
        type=fraction,
        default=CI_WIDTH,
        metavar="FRACTION",
        help="a cell is settled when its median's 95%% interval is at most this fraction of "
        f"the median wide (default {CI_WIDTH})",
    )
    parser.add_argument(
        "--max-time",
        type=nonnegative_float,
        default=None,
        metavar="SECONDS",
        help="timed seconds per cell at most, after which a cell still unsettled is reported "
        "as too noisy to rank (default 2 on a GPU, 3 on a CPU, 0.5 with --quick; 0: exactly "
        "--reps)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a fast smoke run: few shapes, few reps, no torch.compile (unless "
        "--peers asks for it), a small model on a CPU",
    )
    add_device_argument(parser)
    add_backend_argument(parser)
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and inputs")


def _shapes(args: argparse.Namespace, defaults: Defaults) -> list:
    """The shapes of --batch/--seq or --shapes (left out: the defaults); UsageError naming the
    option for a bad one."""
    from fastbert.bench.shapes import Shape, parse_shapes

    if args.batch is not None or args.seq is not None:
        if args.shapes is not None:
            raise UsageError("give either --batch/--seq or --shapes, not both")
        try:
            return [Shape(args.batch or 32, args.seq or 128, args.padded)]
        except ValueError as exc:  # --padded with a --seq under the shortest padded length
            raise UsageError(f"--seq {args.seq} with --padded: {exc}") from exc
    if args.shapes is None:
        return parse_shapes(defaults.shapes, args.padded)
    try:
        return parse_shapes(args.shapes, args.padded)
    except ValueError as exc:
        raise UsageError(f"--shapes {args.shapes!r}: {exc}") from exc


def _peers(args: argparse.Namespace, device: torch.device) -> list:
    """The contenders of --peers (left out: the device's defaults, less torch.compile with
    --quick); UsageError naming --peers for a bad list."""
    from fastbert.bench import peers

    try:
        chosen = peers.select(args.peers, device)
    except ValueError as exc:
        raise UsageError(f"--peers {args.peers!r}: {exc}") from exc
    if args.peers is None and args.quick:
        return [p for p in chosen if not p.name.startswith("hf-compile")]
    return chosen


def _out_folder(text: str) -> Path:
    """The folder of --out; UsageError when it, or a folder above it, is a file."""
    out = Path(text)
    for path in (out, *out.parents):
        if path.exists():
            if not path.is_dir():
                what = f"--out {text}" if path == out else f"--out {text}: {path}"
                raise UsageError(f"{what} exists and is not a folder")
            break
    return out


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one run measures, with the defaults filled in. ``backend``: what fastbert's rows
    run on ("torch", "triton", "triton (interpreter)"), None when the requested backend cannot
    run on this device (fastbert's rows are then skipped with the reason)."""

    device: torch.device
    backend: str | None
    dtype: torch.dtype
    model: str
    shapes: list
    peers: list
    warmup: int
    reps: int
    max_time: float


def make_plan(args: argparse.Namespace) -> Plan:
    """The options with the defaults of this device; ValueError for a bad option."""
    import torch

    device = resolve_device(args.device)
    defaults = DEFAULTS[("cuda" if device.type == "cuda" else "cpu", args.quick)]
    default_dtype = "float16" if device.type == "cuda" else "float32"
    return Plan(
        device=device,
        backend=_backend_here(args.backend, device),
        dtype=getattr(torch, DTYPES[args.dtype] if args.dtype else default_dtype),
        model=defaults.model if args.model is None else args.model,
        shapes=_shapes(args, defaults),
        peers=_peers(args, device),
        warmup=defaults.warmup if args.warmup is None else args.warmup,
        reps=defaults.reps if args.reps is None else args.reps,
        max_time=defaults.max_time if args.max_time is None else args.max_time,
    )


def _backend_here(requested: str, device: torch.device) -> str | None:
    """What fastbert's rows run on (``backend_label``); None when they cannot."""
    from fastbert.execution.backends import backend_label

    try:
        return backend_label(requested, device)
    except ValueError:
        return None


def _settings(args: argparse.Namespace, plan: Plan):
    """The runner's settings of a plan."""
    from fastbert.bench import runner

    return runner.Settings(
        plan.dtype,
        plan.device,
        args.backend,
        plan.warmup,
        plan.reps,
        args.seed,
        ci_width=args.ci_width,
        max_seconds=plan.max_time,
    )


def _settings_dict(
    args: argparse.Namespace, plan: Plan, reference, peaks, ceilings: dict | None
) -> dict:
    return {
        "model": reference.name,
        "dtype": str(plan.dtype).removeprefix("torch."),
        "device": plan.device.type,
        "backend": plan.backend,
        "backend_requested": args.backend,
        "warmup": plan.warmup,
        "reps": plan.reps,
        "stopping": _settings(args, plan).rule().to_dict(),
        "seed": args.seed,
        "peaks": dataclasses.asdict(peaks) if peaks else None,
        "measured_ceilings": ceilings,
        "note": cpu_note(plan.backend) if plan.device.type != "cuda" else None,
    }


def run(args: argparse.Namespace) -> int:
    try:
        return _bench(args)
    except UsageError:
        raise
    except ValueError as exc:  # a bad option (shape, peer, model, --append mismatch)
        raise UsageError(str(exc)) from exc


def _bench(args: argparse.Namespace) -> int:
    from fastbert.bench import ceilings, document, environment, hardware, machine, report, runner
    from fastbert.bench.models import load_reference
    from fastbert.bench.progress import Progress

    plan = make_plan(args)
    out = _out_folder(args.out)
    if plan.device.type != "cuda":
        print(cpu_note(plan.backend))
    reference = load_reference(plan.model, args.seed)
    positions = reference.config.max_position_embeddings
    too_long = [s.label for s in plan.shapes if s.seq > positions]
    if too_long:
        raise ValueError(f"shapes {', '.join(too_long)} exceed the model's {positions} positions")
    peaks = hardware.peaks_here(plan.device)
    previous = _previous(out) if args.append else None
    env = environment.capture()
    meta = _settings_dict(args, plan, reference, peaks, ceilings.measure(plan.device, plan.dtype))

    def results(records: list[dict], complete: bool) -> dict:
        doc = document.new_document(env, meta, records, complete)
        return report.merge(previous, doc) if previous else doc

    results([], True)  # with --append, a mismatch fails now, not after measuring
    print(
        f"fastbert bench: {reference.name}, {meta['dtype']}, on "
        f"{hardware.device_name(plan.device)}; shapes "
        f"{', '.join(s.label for s in plan.shapes)}; peers "
        f"{', '.join(p.name for p in plan.peers)}; fastbert backend {report.backend_text(meta)}"
    )
    settings = _settings(args, plan)
    print(
        f"timing: {plan.warmup} warm-up calls, then the contenders of each shape in turns, "
        f"{settings.rule().describe()}"
    )
    print(f"machine now: {_machine_text(machine)}")
    records: list[dict] = []
    complete = True
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot create the folder: {exc}") from exc
    try:
        steps = (len(plan.peers) + 1) * len(plan.shapes)
        with Progress(steps, "measuring") as progress:
            for record in runner.run(reference, plan.shapes, plan.peers, settings, peaks, progress):
                records.append(record)
                report.write_json(results(records, False), out / report.RESULTS_JSON)
    except KeyboardInterrupt:
        complete = False
        print("interrupted: reporting what was measured so far")
    doc = results(records, complete)
    _print_summary(doc, report.write_reports(out, doc), out)
    if not complete:
        return 130
    _check_fastbert_measured(records)
    return 0


def _previous(out: Path) -> dict | None:
    """The results --append adds to: out's results.json, None when there is none; UsageError
    naming the file when it cannot be read as results."""
    from fastbert.bench import report

    path = out / report.RESULTS_JSON
    if not path.exists():
        return None
    try:
        return report.read_document(path)
    except ValueError as exc:
        raise UsageError(f"--append: {exc}") from exc


def _machine_text(machine) -> str:
    """The load average and CPU clock right now, as far as the system shows them."""
    now = machine.snapshot()
    parts = [f"{machine.cores()} cores"]
    if now.load_average is not None:
        parts.append(f"load average {now.load_average:.1f}")
    if now.cpu_mhz:
        parts.append(f"CPU clock {min(now.cpu_mhz):.0f}-{max(now.cpu_mhz):.0f} MHz")
    return ", ".join(parts)


def _check_fastbert_measured(records: list[dict]) -> None:
    """CommandError when fastbert contenders ran but none was measured (the comparison has no
    fastbert side); a run of Hugging Face contenders alone is fine."""
    from fastbert.bench import analysis

    ours = [r for r in records if analysis.is_fastbert(r["peer"])]
    if ours and not any(analysis.ok(r) for r in ours):
        # A peer's later shapes say only "not run: failed at ...": its first reason is the one.
        reasons = dict.fromkeys(r["reason"] for r in ours if not r["reason"].startswith("not run"))
        raise CommandError("no fastbert contender was measured: " + "; ".join(reasons))


def _print_summary(doc: dict, messages: list[str], out: Path) -> None:
    from fastbert.bench import report

    print()
    print(report.markdown_table(doc["results"], doc["settings"]["backend"]))
    print()
    print(report.roofline_line(doc))
    caution = report.caution(doc)
    if caution:
        print(caution)
    for message in messages:
        print(message)
    written = [report.RESULTS_JSON, report.RESULTS_MD] + ([] if messages else [report.RESULTS_PNG])
    print(f"wrote {', '.join(str(out / name) for name in written)}")
