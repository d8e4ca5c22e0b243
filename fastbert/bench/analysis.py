"""Figures derived from a results document (see report.py): throughput, TFLOP/s, roofline
fraction, speed-ups and whether two medians are apart beyond their intervals, shared by the
report, the targets and the README generator."""

from __future__ import annotations

from collections.abc import Iterable

FASTBERT = "fastbert"


def ok(record: dict) -> bool:
    return record.get("status") == "ok"


def shapes_in_order(records: Iterable[dict]) -> list[str]:
    """Shape labels in order of first appearance."""
    return list(dict.fromkeys(r["shape"] for r in records))


def is_fastbert(peer: str) -> bool:
    return peer == FASTBERT or peer.startswith(FASTBERT + "-")


def peers_in_order(records: Iterable[dict]) -> list[str]:
    """Peer names, the others first and fastbert's variants last, each in order of appearance."""
    return sorted(dict.fromkeys(r["peer"] for r in records), key=is_fastbert)


def by_shape(records: Iterable[dict]) -> dict[str, dict[str, dict]]:
    """shape label -> peer name -> record; shapes in order of appearance, peers as
    :func:`peers_in_order`."""
    records = list(records)
    table: dict[str, dict[str, dict]] = {shape: {} for shape in shapes_in_order(records)}
    order = {peer: i for i, peer in enumerate(peers_in_order(records))}
    for r in sorted(records, key=lambda r: order[r["peer"]]):
        table[r["shape"]][r["peer"]] = r
    return table


def tokens_per_s(record: dict) -> float:
    """Real (non-padding) tokens per second."""
    return record["real_tokens"] / (record["median_ms"] * 1e-3)


def tflops(record: dict) -> float:
    """Achieved TFLOP/s on the work the contender does."""
    return record["flops"] / (record["median_ms"] * 1e-3) / 1e12


def roofline_fraction(record: dict) -> float | None:
    """roofline time / measured time (1.0 = at the roofline); None without known peaks."""
    if record.get("roofline_ms") is None:
        return None
    return record["roofline_ms"] / record["median_ms"]


def best_fastbert(rows: dict[str, dict]) -> dict | None:
    """The fastest fastbert variant among one shape's records (None if none ran)."""
    candidates = [r for p, r in rows.items() if is_fastbert(p) and ok(r)]
    return min(candidates, key=lambda r: r["median_ms"], default=None)


def speedup(record: dict, over: dict) -> float:
    """How many times faster ``record`` is than ``over`` (ratio of median times)."""
    return over["median_ms"] / record["median_ms"]


def interval(record: dict) -> tuple[float, float] | None:
    """The median's 95% interval (ms); None when the record has none (too few repetitions,
    or results from before intervals were recorded)."""
    low, high = record.get("ci_low_ms"), record.get("ci_high_ms")
    return None if low is None or high is None else (low, high)


def interval_width(record: dict) -> float | None:
    """The interval's width over the median (0.05: known to within 5%)."""
    bounds = interval(record)
    return None if bounds is None else (bounds[1] - bounds[0]) / record["median_ms"]


def overlap(record: dict, other: dict) -> bool:
    """Whether the two medians' intervals overlap, so that neither is faster beyond the noise;
    False when either has no interval."""
    a, b = interval(record), interval(other)
    return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]
