"""The end-to-end comparison: every peer on every shape, timed in turns.

Every peer is built first (the memory its weights take is noted as it is built). Then, shape
by shape: each peer's first call and warm-up calls, one peer after another (its peak memory is
taken here), then the timed repetitions of all of them in turns (turns.py: rep 1 of every
peer, then rep 2, ...) until the stopping rule (stopping.py) has every median settled or the
time allowed is spent; then one record per peer of that shape. A peer that cannot be built or
fails on a shape is recorded as skipped with the reason, and the run goes on; after a failure
its remaining shapes are skipped too (a failing torch.compile would otherwise fail again,
slowly, on each).

A record (JSON-ready dict) holds: peer, description, shape label, batch, seq, padded,
real_tokens, status ("ok" or "skipped"), reason, median_ms, p20_ms, p80_ms, reps, ci_low_ms
and ci_high_ms (the median's 95% interval), noisy (the interval stayed wider than the rule
allows), stopped (why the timing of its shape stopped), machine (what else the machine did
while the shape was timed: machine.py), first_call_s (build excluded; compilation,
autotuning and graph capture included), peak_mib (CUDA memory: the peer's weights plus the
most its calls on the shape allocated above what was allocated before them: activations,
workspaces, a CUDA graph's pool), flops and bytes (of the work it does: every position for
dense peers, real tokens for padding-free ones) and roofline_ms (None when the GPU's peaks
are unknown).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Iterator, Sequence

import torch

from fastbert.bench import counts, machine, memory, timing, turns
from fastbert.bench.hardware import Peaks
from fastbert.bench.models import Reference
from fastbert.bench.peers import Forward, Peer, unavailable_reason
from fastbert.bench.progress import Progress
from fastbert.bench.shapes import Batch, Shape, make_batch
from fastbert.bench.stopping import StoppingRule


@dataclasses.dataclass(frozen=True)
class Settings:
    """How to run: dtype, device, fastbert backend, warm-up calls, seed, and the stopping rule
    of the timed repetitions: at least ``reps``, more until the median's 95% interval is
    within ``ci_width`` of it or ``max_seconds`` per peer and shape are spent (0: ``reps``
    exactly)."""

    dtype: torch.dtype
    device: torch.device
    backend: str = "auto"
    warmup: int = 10
    reps: int = 100
    seed: int = 0
    ci_width: float = 0.05
    max_seconds: float = 0.0

    def rule(self) -> StoppingRule:
        return StoppingRule(
            min_reps=self.reps,
            width=self.ci_width,
            max_seconds=self.max_seconds,
            max_reps=max(self.reps, StoppingRule.max_reps),
        )


def describe_error(exc: BaseException) -> str:
    """One line: the exception's type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:200]}" if lines else type(exc).__name__


def base_record(peer: Peer, shape: Shape, batch: Batch) -> dict:
    return {
        "peer": peer.name,
        "description": peer.description,
        "shape": shape.label,
        "batch": shape.batch,
        "seq": shape.seq,
        "padded": shape.padded,
        "real_tokens": batch.real_tokens,
    }


def skipped(peer: Peer, shape: Shape, batch: Batch, reason: str) -> dict:
    return {**base_record(peer, shape, batch), "status": "skipped", "reason": reason}


def work(
    reference: Reference,
    peer: Peer,
    shape: Shape,
    batch: Batch,
    dtype: torch.dtype,
    peaks: Peaks | None,
) -> dict:
    """FLOPs, bytes and roofline time of one forward of ``peer`` on ``batch``."""
    lengths = batch.lengths if peer.packs else None
    elem = torch.empty((), dtype=dtype).element_size()
    pooler = getattr(reference.hf_model, "pooler", None) is not None
    ops = counts.bert_forward(
        reference.config, shape.batch, shape.seq, elem, lengths, pooler=pooler
    )
    roofline = counts.roofline_ms(ops, peaks.tflops, peaks.tbps) if peaks else None
    return {
        "flops": counts.total_flops(ops),
        "bytes": counts.total_bytes(ops),
        "roofline_ms": roofline,
    }


def warm_up(forward: Forward, batch: Batch, settings: Settings) -> tuple[float, float | None]:
    """The first call of ``forward(batch)`` and ``settings.warmup - 1`` more, untimed but for
    the first: (first call's seconds, the most CUDA memory allocated meanwhile above what was
    allocated before it, MiB; None off CUDA)."""
    before = memory.allocated_mib(settings.device)
    memory.reset_peak(settings.device)
    start = time.perf_counter()
    forward(batch)
    timing.synchronize(settings.device)
    first_call_s = time.perf_counter() - start
    for _ in range(settings.warmup - 1):
        forward(batch)
    peak = memory.peak_mib(settings.device)
    return first_call_s, None if peak is None else peak - before


def measure(forward: Forward, batch: Batch, settings: Settings, base_mib: float | None) -> dict:
    """Time ``forward(batch)`` alone: first call, then warm-up and ``settings.reps`` timed
    repetitions; peak memory above ``base_mib`` (allocated before the peer was built)."""
    with torch.inference_mode():
        before = memory.allocated_mib(settings.device)
        first_call_s, peak = warm_up(forward, batch, settings)
        result = timing.time_fn(lambda: forward(batch), settings.device, 0, settings.reps)
    return {
        "status": "ok",
        **result.to_dict(),
        "first_call_s": first_call_s,
        "peak_mib": None if peak is None or base_mib is None else peak + before - base_mib,
    }


def _release_compiled(device: torch.device) -> None:
    """After the peers' last references are dropped: collect them, reset torch.compile's
    caches."""
    gc.collect()
    torch._dynamo.reset()
    memory.release(device)


@dataclasses.dataclass
class _Contender:
    """A peer in the run: its forward once built (else why not), the memory its weights took."""

    peer: Peer
    forward: Forward | None = None
    reason: str | None = None
    resident_mib: float | None = None


def _build(peers: Sequence[Peer], reference: Reference, settings: Settings) -> list[_Contender]:
    contenders = []
    for peer in peers:
        contender = _Contender(peer, reason=unavailable_reason(peer, settings.device))
        if contender.reason is None:
            before = memory.allocated_mib(settings.device)
            try:
                contender.forward = peer.build(
                    reference, settings.dtype, settings.device, settings.backend
                )
            except Exception as exc:  # a peer that cannot be built is skipped, never fatal
                contender.reason = f"could not be built: {describe_error(exc)}"
            after = memory.allocated_mib(settings.device)
            contender.resident_mib = None if before is None else after - before
        contenders.append(contender)
    return contenders


def _shape_records(
    contenders: Sequence[_Contender],
    reference: Reference,
    shape: Shape,
    batch: Batch,
    settings: Settings,
    peaks: Peaks | None,
    progress: Progress | None,
) -> list[dict]:
    """One record per contender of ``shape``: warm-ups one by one, then the timing in turns.
    A contender that fails here gets its reason set for the shapes after."""
    warm: dict[str, dict] = {}
    failures: dict[str, str] = {}
    for contender in contenders:
        name = contender.peer.name
        if progress is not None:
            progress.step(f"{name} {shape.label}: first call and warm-up")
        if contender.reason is None:
            try:
                first_call_s, peak = warm_up(contender.forward, batch, settings)
            except Exception as exc:  # one failing peer never aborts the run
                failures[name] = describe_error(exc)
                memory.release(settings.device)
            else:
                resident = contender.resident_mib
                peak_mib = None if peak is None or resident is None else resident + peak
                warm[name] = {"first_call_s": first_call_s, "peak_mib": peak_mib}
        if progress is not None:
            progress.advance()
    if progress is not None:
        progress.step(f"{shape.label}: {len(warm)} contenders timed in turns")
    by_name = {c.peer.name: c for c in contenders}
    before = machine.snapshot()
    timed = turns.time_in_turns(
        {name: _call(by_name[name].forward, batch) for name in warm},
        settings.rule(),
        timing.timer_for(settings.device),
    )
    conditions = machine.during(before, machine.snapshot())
    if progress is not None:
        progress.advance()
    failures.update({name: describe_error(exc) for name, exc in timed.failures.items()})
    records = []
    for contender in contenders:
        name = contender.peer.name
        if contender.reason is not None:
            records.append(skipped(contender.peer, shape, batch, contender.reason))
        elif name in failures:
            records.append(skipped(contender.peer, shape, batch, failures[name]))
            contender.reason = f"not run: failed at {shape.label}"
        else:
            records.append(
                {
                    **base_record(contender.peer, shape, batch),
                    "status": "ok",
                    **timed.timings[name].to_dict(),
                    **warm[name],
                    "machine": conditions,
                    **work(reference, contender.peer, shape, batch, settings.dtype, peaks),
                }
            )
    return records


def _call(forward: Forward, batch: Batch):
    return lambda: forward(batch)


def run(
    reference: Reference,
    shapes: Sequence[Shape],
    peers: Sequence[Peer],
    settings: Settings,
    peaks: Peaks | None,
    progress: Progress | None = None,
) -> Iterator[dict]:
    """Yield one record per (peer, shape), shape by shape (in the order of ``peers`` within
    one); ``progress`` has ``len(shapes) * (len(peers) + 1)`` steps."""
    contenders = _build(peers, reference, settings)
    try:
        for shape in shapes:
            batch = make_batch(
                shape,
                reference.config.vocab_size,
                settings.device,
                settings.seed,
                reference.config.pad_token_id,
            )
            with torch.inference_mode():
                records = _shape_records(
                    contenders, reference, shape, batch, settings, peaks, progress
                )
            yield from records
    finally:
        contenders = None
        _release_compiled(settings.device)
