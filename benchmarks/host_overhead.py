"""Where an eager forward's host time goes: fastbert's launchers, Triton's launch, waiting.

    python -m benchmarks.host_overhead --out DIR [--model bert-base] [--shapes 1x128,32x128]

Without CUDA graphs a forward launches each of its Triton kernels from Python, and at small
shapes the host's launching, not the GPU, sets its time. For each shape, fastbert's model
(random weights of ``--model``'s size, ``--dtype``, the Triton backend, dense, no CUDA
graphs) is warmed up (compiles, autotunes), then timed over ``--reps`` forwards:

- ``forward_ms``: wall-clock time of a forward, synchronised at its end (what ``fastbert
  bench`` reports for "fastbert" on a GPU);
- ``enqueue_ms``: the time until the forward returns, unsynchronised: the host's part;
- ``wrappers_ms``: the same forwards with every kernel launch a no-op at Triton's launcher
  (``JITFunction.run``; the autotuner still picks its config, the outputs are allocated):
  fastbert's own Python and PyTorch's allocations; ``enqueue_ms - wrappers_ms`` is Triton's
  launcher;
- ``launches``: Triton kernel launches a forward, and ``syncs``: CUDA synchronisations inside
  one forward (PyTorch's sync debug mode; the ids' range check reads one value on the host);
- ``profile.txt``: Python's profiler over the timed real forwards, the functions by own time.

On a CPU the kernels run under the Triton interpreter (set ``TRITON_INTERPRET=1`` before
starting); there only the no-op launches are timed (the interpreter's launcher is the one
replaced), which measures fastbert's own host time on that CPU. Writes host-overhead.json and
host-overhead.md into --out.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from benchmarks.corpus_tokens import DTYPES

HOST_JSON = "host-overhead.json"
HOST_MD = "host-overhead.md"
PROFILE_TXT = "profile.txt"


def _launcher_classes() -> list[type]:
    """The classes whose ``run`` launches a Triton kernel: the JIT function, and the
    interpreter's stand-in for it."""
    from triton.runtime import interpreter, jit

    return [jit.JITFunction, interpreter.InterpretedFunction]


@contextlib.contextmanager
def counted_launches(stub: bool) -> Iterator[list[int]]:
    """Count the Triton kernel launches inside the block (a one-item list); with ``stub``,
    each launch does nothing instead."""
    count = [0]
    originals = {cls: cls.run for cls in _launcher_classes()}

    def wrap(original: Callable) -> Callable:
        def run(self, *args, **kwargs):
            count[0] += 1
            return None if stub else original(self, *args, **kwargs)

        return run

    for cls, original in originals.items():
        cls.run = wrap(original)
    try:
        yield count
    finally:
        for cls, original in originals.items():
            cls.run = original


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_forwards(
    forward: Callable[[], object], device: torch.device, reps: int
) -> tuple[float, float]:
    """(median synchronised ms, median enqueue ms) of ``reps`` calls of ``forward``."""
    synced, enqueued = [], []
    for _ in range(reps):
        _sync(device)
        start = time.perf_counter()
        forward()
        returned = time.perf_counter()
        _sync(device)
        synced.append((time.perf_counter() - start) * 1e3)
        enqueued.append((returned - start) * 1e3)
    return statistics.median(synced), statistics.median(enqueued)


def count_syncs(forward: Callable[[], object], device: torch.device) -> int | None:
    """CUDA synchronisations inside one call of ``forward`` (None off CUDA)."""
    if device.type != "cuda":
        return None
    _sync(device)
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            forward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def profile_text(forward: Callable[[], object], reps: int, lines: int = 40) -> str:
    """Python's profiler over ``reps`` calls of ``forward``: the top functions by own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(reps):
        forward()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(lines)
    return out.getvalue()


def build_model(model: str, dtype: torch.dtype, device: torch.device):
    """fastbert's eager dense model of ``model``'s size with random weights, on Triton."""
    import fastbert
    from fastbert.bench.models import random_reference

    reference = random_reference(model)
    built = fastbert.BertModel.from_pretrained(
        reference.hf_model,
        dtype=dtype,
        device=device,
        backend="triton",
        padding_free=False,
        cuda_graphs=False,
    )
    return built.eval(), reference.config.vocab_size


def measure_shape(
    model, vocab: int, batch: int, seq: int, device: torch.device, reps: int, warmup: int
) -> tuple[dict, str]:
    """One shape's row (see the module docstring) and its profile text."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (batch, seq), generator=generator).to(device)
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)

    def forward() -> object:
        with torch.inference_mode():
            return model(ids, attention_mask=mask)

    real = device.type == "cuda"
    row: dict = {"shape": f"{batch}x{seq}"}
    if real:
        for _ in range(warmup):
            forward()
        row["forward_ms"], row["enqueue_ms"] = time_forwards(forward, device, reps)
        row["syncs"] = count_syncs(forward, device)
    with counted_launches(stub=True) as launches:
        forward()  # the first no-op forward: lazy set-up off the clock
        launches[0] = 0
        _, row["wrappers_ms"] = time_forwards(forward, device, reps)
    row["launches"] = round(launches[0] / reps)
    if real:
        row["triton_ms"] = row["enqueue_ms"] - row["wrappers_ms"]
    # The real forwards' profile; under the interpreter, the stubbed ones' (fastbert's side).
    with contextlib.nullcontext() if real else counted_launches(stub=True):
        return row, profile_text(forward, reps)


def markdown(report: dict) -> str:
    settings, env = report["settings"], report["environment"]
    where = env.get("gpu") or f"CPU ({env.get('cpu')}), Triton interpreter, launches stubbed"
    lines = [
        f"# Host time of an eager forward: {settings['model']}, {settings['dtype']}, {where}",
        "",
        f"Dense, no CUDA graphs, random weights; medians of {settings['reps']} forwards. "
        "fastbert's launchers: the forward with every Triton launch a no-op; Triton's "
        "launcher: the unsynchronised forward minus that.",
        "",
        "| shape | forward ms | host ms | fastbert's launchers ms | Triton's launcher ms | "
        "launches | us a launch (fastbert / Triton) | syncs |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]

    def ms(row: dict, key: str) -> str:
        return f"{row[key]:.3f}" if row.get(key) is not None else "-"

    for row in report["rows"]:
        launches = max(row["launches"], 1)
        ours = row["wrappers_ms"] * 1e3 / launches
        triton = row.get("triton_ms")
        per_launch = f"{ours:.1f} / " + (f"{triton * 1e3 / launches:.1f}" if triton else "-")
        syncs = row.get("syncs")
        lines.append(
            f"| {row['shape']} | {ms(row, 'forward_ms')} | {ms(row, 'enqueue_ms')} | "
            f"{ms(row, 'wrappers_ms')} | {ms(row, 'triton_ms')} | {row['launches']} | "
            f"{per_launch} | {'-' if syncs is None else syncs} |"
        )
    return "\n".join(lines) + "\n"


def write(report: dict, profiles: dict[str, str], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / HOST_JSON).write_text(json.dumps(report, indent=1) + "\n")
    (out / HOST_MD).write_text(markdown(report))
    text = "".join(f"## {shape}\n{profile}\n" for shape, profile in profiles.items())
    (out / PROFILE_TXT).write_text(text)


def _shape(text: str) -> tuple[int, int]:
    try:
        batch, seq = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is BATCHxSEQ, got {text!r}") from None
    if batch < 1 or seq < 1:
        raise argparse.ArgumentTypeError(f"a shape's sizes must be positive, got {text!r}")
    return batch, seq


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.host_overhead", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", type=Path, required=True, help="folder for the results")
    parser.add_argument("--model", default="bert-base", help="an embedded model shape")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float16")
    parser.add_argument(
        "--shapes",
        type=lambda text: [_shape(part) for part in text.split(",")],
        default=[(1, 128), (32, 128)],
        help="BATCHxSEQ shapes, comma-separated",
    )
    parser.add_argument("--reps", type=int, default=20, help="timed forwards a measure")
    parser.add_argument("--warmup", type=int, default=3, help="untimed forwards first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:
        parser.error("--reps must be >= 1 and --warmup >= 0")
    from fastbert.bench import environment
    from fastbert.bench.shapes import MODEL_SHAPES
    from fastbert.kernels.launch import interpreting

    if args.model not in MODEL_SHAPES:
        parser.error(f"--model: one of {', '.join(MODEL_SHAPES)}")
    device = torch.device(args.device)
    if device.type == "cpu" and not interpreting():
        parser.error("on a CPU the Triton kernels need TRITON_INTERPRET=1 set before starting")
    model, vocab = build_model(args.model, DTYPES[args.dtype], device)
    report = {
        "environment": environment.capture(),
        "settings": {"model": args.model, "dtype": args.dtype, "reps": args.reps},
        "rows": [],
    }
    profiles: dict[str, str] = {}
    for batch, seq in args.shapes:
        row, profiles[f"{batch}x{seq}"] = measure_shape(
            model, vocab, batch, seq, device, args.reps, args.warmup
        )
        report["rows"].append(row)
        write(report, profiles, args.out)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
