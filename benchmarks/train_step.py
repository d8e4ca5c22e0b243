"""One fine-tuning step (forward + backward + AdamW step) of fastbert against Hugging Face.

    python -m benchmarks.train_step --out benchmarks/results/train-cpu-YYYY-MM-DD
    python -m benchmarks.train_step --model bert-base --shapes 32x128,32x128p --out DIR  # GPU

A BertForSequenceClassification (an embedded model shape with random weights, float32
parameters) takes training steps on batches of the given shapes (``p``: lengths uniform in
[16, seq], padded on the right) with labels. Contenders, each from the same weights:

- hf-eager, hf-sdpa: Hugging Face with that attention;
- hf-compile: ``torch.compile`` of the sdpa model (its compilation is not timed);
- fastbert: ``fastbert.optimize`` of the sdpa model, default settings (Triton kernels on CUDA,
  the torch backend on a CPU; padded batches run padding-free).

Dropout is on as the config sets it (0.1), as in real fine-tuning. With ``--amp`` (default
bf16 on CUDA, none on a CPU) every step runs under ``torch.autocast`` with float32 master
weights. On a CPU the contenders are timed round-robin (one step of each in turn) so that a
change of load hits them alike; on CUDA each is timed with CUDA events and its peak memory
recorded (the CPU allocator keeps no peak). Reports medians with p20 / p80 in results.json
(with fastbert.bench.environment) and results.md in --out, and each contender's first step's
seconds (``first_step_s``: compiling, autotuning). ``--profile`` also says where each
contender's step goes (:func:`diagnose`): its host time until the step returns, and on CUDA
the GPU's kernel time in a step and the synchronisations inside one, with PyTorch's profiler
table of two steps in ``profile-<shape>-<contender>.txt``. Interrupted (Ctrl-C, or the GPU
run's time cap), it writes what it measured by then: the shapes done, and the first steps of
the shape it was on.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

import fastbert
from fastbert.bench import environment, memory, timing
from fastbert.bench.models import load_reference
from fastbert.bench.shapes import make_batch, parse_shapes
from fastbert.integrations import models as hf_models

CONTENDERS = ("hf-eager", "hf-sdpa", "hf-compile", "fastbert")
AMP_DTYPES = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
NUM_LABELS = 3


def classifier(reference, attn_implementation: str, device: torch.device):
    """A Hugging Face BertForSequenceClassification with the reference's encoder weights and
    a seeded head, float32, on ``device``, in train mode."""
    transformers = hf_models.import_transformers()
    values = reference.hf_model.config.to_dict()
    for key in ("id2label", "label2id"):
        values.pop(key, None)
    config = transformers.BertConfig(**values, num_labels=NUM_LABELS)
    torch.manual_seed(0)
    model = transformers.AutoModelForSequenceClassification.from_config(
        config, attn_implementation=attn_implementation
    )
    model.bert.load_state_dict(reference.hf_model.state_dict())
    return model.to(device).train()


def build(name: str, reference, device: torch.device) -> torch.nn.Module:
    """The model contender ``name`` trains."""
    if name == "hf-eager":
        return classifier(reference, "eager", device)
    model = classifier(reference, "sdpa", device)
    if name == "hf-sdpa":
        return model
    if name == "hf-compile":
        return torch.compile(model)
    if name == "fastbert":
        return fastbert.optimize(model)
    raise ValueError(f"unknown contender {name!r}; known: {', '.join(CONTENDERS)}")


def step_fn(model, batch, labels, amp: torch.dtype | None, device: torch.device) -> Callable:
    """One training step of ``model`` on ``batch`` (a fresh AdamW for each contender)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    inputs = {
        "input_ids": batch.input_ids,
        "attention_mask": batch.attention_mask,
        "token_type_ids": batch.token_type_ids,
        "labels": labels,
    }

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            loss = model(**inputs).loss
        loss.backward()
        optimizer.step()
        return loss

    return step


def measure(
    names: list[str], steps: dict[str, Callable], device: torch.device, warmup: int, reps: int
) -> dict[str, dict]:
    """name -> {"timing": ms summary, "peak_mib": peak CUDA memory or None}."""
    results = {}
    if device.type == "cuda":
        for name in names:
            memory.release(device)
            memory.reset_peak(device)
            measured = timing.time_cuda(steps[name], warmup, reps)
            results[name] = {"timing": measured.to_dict(), "peak_mib": memory.peak_mib(device)}
        return results
    for name in names:
        for _ in range(warmup):
            steps[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    for _ in range(reps):
        for name in names:
            start = time.perf_counter()
            steps[name]()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return {
        name: {"timing": timing.summarize(samples[name]).to_dict(), "peak_mib": None}
        for name in names
    }


def diagnose(step: Callable, device: torch.device, table: Path) -> dict:
    """Where ``step``'s time goes, after it was timed: ``enqueue_ms``, the median host time of
    three steps until each returns, unsynchronised (near the step's time: the host sets the
    pace); on CUDA ``device_ms``, the GPU's kernel time in one step (the profiler's kernels,
    two steps halved), and ``syncs``, device synchronisations inside one step. ``table`` gets
    the profiler's operators of two steps, by their own device time (CPU time off CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.host_overhead import count_syncs, time_forwards

    found: dict = {"enqueue_ms": time_forwards(step, device, 3)[1]}
    on_cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    with profile(activities=activities) as profiler:
        time_forwards(step, device, 2)
    averages = profiler.key_averages()
    order = "self_device_time_total" if on_cuda else "self_cpu_time_total"
    table.write_text(averages.table(sort_by=order, row_limit=30) + "\n")
    if on_cuda:
        kernels = [e for e in averages if e.device_type == torch.autograd.DeviceType.CUDA]
        found["device_ms"] = sum(e.self_device_time_total for e in kernels) / 2 / 1e3
        found["syncs"] = count_syncs(step, device)
    return found


def render(env: dict, args: argparse.Namespace, rows: list[dict], interrupted: bool = False) -> str:
    device = env.get("gpu") or env["cpu"]
    lines = [
        "# One fine-tuning step: fastbert against Hugging Face",
        "",
        f"{device}; torch {env.get('torch')}, transformers {env.get('transformers')}, "
        f"triton {env.get('triton')}, Python {env['python']}; commit {env.get('commit')}, "
        f"{env['date']}. Model {args.model} (random weights) + a {NUM_LABELS}-label "
        f"classifier, float32 parameters, autocast {args.amp}, dropout 0.1, AdamW. Median ms "
        f"per step (forward + backward + optimizer step) of {args.reps} steps; speed-ups over "
        "Hugging Face sdpa.",
        "",
        "| shape | "
        + " | ".join(args.contenders)
        + " | fastbert / sdpa | peak MiB "
        + " / ".join(args.contenders)
        + " |",
        "|---|" + "---|" * (len(args.contenders) + 2),
    ]
    for row in rows:
        medians = {n: row["results"][n]["timing"]["median_ms"] for n in row["results"]}
        cells = [
            f"{medians[n]:.1f}" if n in medians else row["errors"].get(n, "-")
            for n in args.contenders
        ]
        ratio = "-"
        if "fastbert" in medians and "hf-sdpa" in medians:
            ratio = f"{medians['hf-sdpa'] / medians['fastbert']:.2f}x"
        peaks = [row["results"].get(n, {}).get("peak_mib") for n in args.contenders]
        peak_text = " / ".join("-" if p is None else f"{p:.0f}" for p in peaks)
        lines.append(f"| {row['shape']} | " + " | ".join(cells) + f" | {ratio} | {peak_text} |")
    lines += ["", "First step (compiling, autotuning), seconds:", ""]
    for row in rows:
        firsts = row.get("first_step_s", {})
        text = ", ".join(f"{n} {s:.1f}" for n, s in firsts.items()) or "none finished"
        lines.append(f"- {row['shape']}: {text}")
    where = [
        (row["shape"], name, result["where"])
        for row in rows
        for name, result in row["results"].items()
        if "where" in result
    ]
    if where:
        lines += [
            "",
            "Where a step goes (`--profile`): host ms until the step returns, "
            "unsynchronised; GPU kernel ms in a step; synchronisations in a step:",
            "",
        ]
        for shape, name, found in where:
            gpu = found.get("device_ms")
            syncs = found.get("syncs")
            lines.append(
                f"- {shape} {name}: host {found['enqueue_ms']:.1f} ms"
                + ("" if gpu is None else f", GPU kernels {gpu:.1f} ms")
                + ("" if syncs is None else f", {syncs} syncs")
            )
    if interrupted:
        lines += ["", "The run was interrupted: some measurements are missing."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    on_cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="folder for results.json / .md")
    parser.add_argument("--model", default="bert-base" if on_cuda else "bert-mini")
    parser.add_argument("--shapes", default="32x128,32x128p" if on_cuda else "16x128,16x128p")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--amp", choices=sorted(AMP_DTYPES), default="bf16" if on_cuda else "none")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=20 if on_cuda else 7)
    parser.add_argument(
        "--profile",
        action="store_true",
        help="also where each step goes: host time, GPU kernel time, syncs, profiler tables",
    )
    args = parser.parse_args(argv)
    args.contenders = [c for c in args.contenders.split(",") if c]
    unknown = sorted(set(args.contenders) - set(CONTENDERS))
    if unknown or not args.contenders:
        parser.error(f"--contenders takes some of {', '.join(CONTENDERS)}, got {unknown}")
    try:
        shapes = parse_shapes(args.shapes)
        reference = load_reference(args.model)
    except ValueError as error:
        parser.error(str(error))
    if args.warmup < 0 or args.reps < 1:
        parser.error("--warmup must be >= 0 and --reps >= 1")
    device = torch.device("cuda" if on_cuda else "cpu")
    amp = AMP_DTYPES[args.amp]
    rows: list[dict] = []
    try:
        for shape in shapes:
            row = {"shape": shape.label, "results": {}, "errors": {}, "first_step_s": {}}
            rows.append(row)
            run_shape(row, shape, reference, args, amp, device)
    except KeyboardInterrupt:
        write(args, rows, interrupted=True)
        print("interrupted: wrote what was measured", file=sys.stderr)
        return 130
    write(args, rows)
    return 0


def run_shape(
    row: dict, shape, reference, args: argparse.Namespace, amp, device: torch.device
) -> None:
    """Fill ``row`` with the contenders' first-step seconds and errors, then their timings,
    at ``shape``."""
    batch = make_batch(shape, reference.config.vocab_size, device, seed=shape.batch)
    labels = torch.arange(shape.batch, device=device) % NUM_LABELS
    steps = {}
    for name in args.contenders:
        try:
            step = step_fn(build(name, reference, device), batch, labels, amp, device)
            start = time.perf_counter()
            step()  # the first step compiles (hf-compile) and autotunes (Triton)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            row["first_step_s"][name] = time.perf_counter() - start
            steps[name] = step
        except Exception as error:  # a contender that cannot run here is reported, not fatal
            row["errors"][name] = f"failed: {type(error).__name__}"
            print(f"{shape.label} {name}: {error}", file=sys.stderr)
    row["results"] = measure(list(steps), steps, device, args.warmup, args.reps)
    if args.profile:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        for name, step in steps.items():
            table = Path(args.out) / f"profile-{shape.label.replace(' ', '-')}-{name}.txt"
            row["results"][name]["where"] = diagnose(step, device, table)
    print(
        f"{shape.label}: "
        + ", ".join(f"{n} {r['timing']['median_ms']:.1f} ms" for n, r in row["results"].items()),
        flush=True,
    )


def write(args: argparse.Namespace, rows: list[dict], interrupted: bool = False) -> None:
    """results.json and results.md in ``args.out``."""
    env = environment.capture()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    payload = {"environment": env, "model": args.model, "amp": args.amp, "rows": rows}
    if interrupted:
        payload["interrupted"] = True
    (out / "results.json").write_text(json.dumps(payload, indent=1))
    (out / "results.md").write_text(render(env, args, rows, interrupted))
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}")


if __name__ == "__main__":
    sys.exit(main())
