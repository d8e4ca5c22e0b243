"""The end-to-end comparison: every peer on every shape, one result record at a time.

Each peer is built once, run on every shape, then freed before the next is built, so its
peak memory is measured with no other contender resident. A peer that cannot be built or
fails on a shape is recorded as skipped with the reason, and the run goes on; after a failure
its remaining shapes are skipped too (a failing torch.compile would otherwise fail again,
slowly, on each).

A record (JSON-ready dict) holds: peer, description, shape label, batch, seq, padded,
real_tokens, status ("ok" or "skipped"), reason, median_ms, p20_ms, p80_ms, reps,
first_call_s (build excluded; compilation, autotuning and graph capture included), peak_mib
(CUDA memory allocated while it ran the shape, above what was allocated before the peer was
built: weights, activations, workspaces and any CUDA-graph pools), flops and bytes (of the
work it does: every position for dense peers, real tokens for padding-free ones) and
roofline_ms (None when the GPU's peaks are unknown).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Iterator, Sequence

import torch

from fastbert.bench import counts, memory, timing
from fastbert.bench.hardware import Peaks
from fastbert.bench.models import Reference
from fastbert.bench.peers import Forward, Peer, unavailable_reason
from fastbert.bench.progress import Progress
from fastbert.bench.shapes import Batch, Shape, make_batch


@dataclasses.dataclass(frozen=True)
class Settings:
    """How to run: dtype, device, fastbert backend, warm-up and timed repetitions, seed."""

    dtype: torch.dtype
    device: torch.device
    backend: str = "auto"
    warmup: int = 10
    reps: int = 100
    seed: int = 0


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


def measure(forward: Forward, batch: Batch, settings: Settings, base_mib: float | None) -> dict:
    """Time ``forward(batch)``: first call, then warm-up and timed repetitions; peak memory."""
    memory.reset_peak(settings.device)
    with torch.inference_mode():
        start = time.perf_counter()
        forward(batch)
        timing.synchronize(settings.device)
        first_call_s = time.perf_counter() - start
        result = timing.time_fn(
            lambda: forward(batch), settings.device, max(settings.warmup - 1, 0), settings.reps
        )
    peak = memory.peak_mib(settings.device)
    return {
        "status": "ok",
        **result.to_dict(),
        "first_call_s": first_call_s,
        "peak_mib": None if peak is None or base_mib is None else peak - base_mib,
    }


def _release_compiled(device: torch.device) -> None:
    """After a peer's last reference is dropped: collect it, reset torch.compile's caches."""
    gc.collect()
    torch._dynamo.reset()
    memory.release(device)


def run(
    reference: Reference,
    shapes: Sequence[Shape],
    peers: Sequence[Peer],
    settings: Settings,
    peaks: Peaks | None,
    progress: Progress | None = None,
) -> Iterator[dict]:
    """Yield one record per (peer, shape), peer by peer."""
    batches = {
        shape: make_batch(
            shape,
            reference.config.vocab_size,
            settings.device,
            settings.seed,
            reference.config.pad_token_id,
        )
        for shape in shapes
    }
    for peer in peers:
        reason = unavailable_reason(peer, settings.device)
        forward = None
        base_mib = memory.allocated_mib(settings.device)
        if reason is None:
            try:
                forward = peer.build(reference, settings.dtype, settings.device, settings.backend)
            except Exception as exc:  # a peer that cannot be built is skipped, never fatal
                reason = f"could not be built: {describe_error(exc)}"
        for shape in shapes:
            batch = batches[shape]
            if progress is not None:
                progress.step(f"{peer.name} {shape.label}")
            if reason is not None:
                record = skipped(peer, shape, batch, reason)
            else:
                try:
                    record = {
                        **base_record(peer, shape, batch),
                        **measure(forward, batch, settings, base_mib),
                        **work(reference, peer, shape, batch, settings.dtype, peaks),
                    }
                except Exception as exc:  # one failing peer never aborts the run
                    record = skipped(peer, shape, batch, describe_error(exc))
                    reason = f"not run: failed at {shape.label}"
                    memory.release(settings.device)
            if progress is not None:
                progress.advance()
            yield record
        forward = None
        _release_compiled(settings.device)
