"""How long ``fastbert accuracy --precisions`` will take, from the reference's first batches.

A batch's work is its padded size in tokens (texts x the longest one's tokens, as the model
truncates them): the batches are sorted longest first, so the rate the reference reaches on
its first batches, in tokens a second, carries over to the rest. A precision's stage is then
its entry's ``cpu_cost`` times the reference's (measured: fastbert/accuracy/precisions.py; on
CUDA every stage counts as the reference's). Within each stage the progress tells the time
left at that stage's own rate.
"""

from __future__ import annotations

from typing import Any

import torch

from fastbert.accuracy.precisions import precision
from fastbert.bench.progress import format_seconds

# The reference's share of its work done before its rate is trusted: its first batches run
# the slowest (first calls, the longest texts).
CALIBRATION = 0.1


def token_lengths(model: Any, texts: list[str]) -> list[int]:
    """Each text's tokens as the SentenceTransformer ``model`` encodes it (truncated at its
    ``max_seq_length``)."""
    ids = model.tokenizer(texts, truncation=True, max_length=model.max_seq_length)["input_ids"]
    return [len(row) for row in ids]


def batch_units(lengths: list[int], batches: list[list[int]]) -> list[int]:
    """The work of each batch: its texts times the longest one's tokens (``lengths``)."""
    return [len(batch) * max(lengths[i] for i in batch) for batch in batches]


def stage_costs(names: list[str], device: torch.device) -> dict[str, float]:
    """Each precision's stage time over the reference's on ``device``."""
    if device.type == "cuda":
        return dict.fromkeys(names, 1.0)
    return {name: precision(name).cpu_cost for name in names}


def expected_seconds(
    names: list[str], device: torch.device, units: int, rate: float
) -> dict[str, float]:
    """Seconds each precision's stage is expected to take on ``units`` of work at the
    reference's ``rate`` (units a second)."""
    return {name: cost * units / rate for name, cost in stage_costs(names, device).items()}


def summary(reference_left_s: float, stages: dict[str, float]) -> str:
    """One line: the time expected for the rest of the run, stage by stage."""
    total = reference_left_s + sum(stages.values())
    parts = ", ".join(f"{name} {format_seconds(s)}" for name, s in stages.items())
    return (
        f"expected: about {format_seconds(total)} more on this machine (reference "
        f"{format_seconds(reference_left_s)} more; {parts}), from the reference's first batches"
    )
