"""A process's resident memory over a long run, for benchmarks/serve_soak.py: samples of its
VmRSS (``/proc/<pid>/status``) every few seconds, the peak and the growth over the run's last
half, and where the memory lies at the end (``/proc/<pid>/smaps``: glibc's main heap, the
anonymous mappings that hold its other arenas and its mmap-ed blocks, and mapped files).
Linux only; this module imports only the standard library."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

MB = 1 << 20


@dataclass(frozen=True)
class Sample:
    """One look at the process: seconds since the run began, resident memory (MiB), its
    threads, and the machine's one-minute load average."""

    seconds: float
    rss_mb: float
    threads: int
    load: float


def status(pid: int) -> dict[str, int]:
    """``VmRSS`` (bytes), ``VmHWM`` (bytes, the peak resident memory) and ``Threads`` of
    ``pid``."""
    fields: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) * 1024
        elif name == "Threads":
            fields[name] = int(value)
    return fields


def watch(
    pid: int,
    running: Callable[[], bool],
    interval: float,
    total: float | None = None,
    label: str = "soak",
) -> list[Sample]:
    """Samples of ``pid`` every ``interval`` seconds, from now until ``running()`` turns
    False (and one more then), with a progress line on stderr at each (``total``: the
    seconds the run is meant to last, for the line)."""
    start = time.monotonic()
    samples: list[Sample] = []
    peak = 0.0
    while True:
        alive = running()
        try:
            fields = status(pid)
        except OSError:  # the process has ended
            break
        if "VmRSS" not in fields:  # it has exited, and is not yet reaped
            break
        if fields["VmRSS"] == 0:  # forked, its program not yet running: no sample
            time.sleep(0.05)
            continue
        elapsed = time.monotonic() - start
        sample = Sample(elapsed, fields["VmRSS"] / MB, fields["Threads"], os.getloadavg()[0])
        samples.append(sample)
        peak = max(peak, sample.rss_mb)
        of = f"/{clock(total)}" if total else ""
        print(
            f"[{label}] {clock(elapsed)}{of} rss {sample.rss_mb:,.0f} MB (peak {peak:,.0f}), "
            f"{sample.threads} threads, load {sample.load:.1f}",
            file=sys.stderr,
            flush=True,
        )
        if not alive:
            break
        wake = start + interval * len(samples)
        while running() and time.monotonic() < wake:
            time.sleep(min(0.2, max(0.0, wake - time.monotonic())))
    return samples


def clock(seconds: float) -> str:
    """``m:ss``."""
    whole = int(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def growth(samples: list[Sample]) -> dict:
    """What the samples say: the first, peak and last resident memory (MiB); the growth over
    the last half of the run (the last sample less the one nearest its half-way time), and the
    least-squares slope over that half in MiB a minute."""
    if not samples:
        raise ValueError("no samples")
    end = samples[-1].seconds
    half = [s for s in samples if s.seconds >= end / 2]
    middle = min(samples, key=lambda s: abs(s.seconds - end / 2))
    return {
        "seconds": end,
        "samples": len(samples),
        "start_mb": samples[0].rss_mb,
        "peak_mb": max(s.rss_mb for s in samples),
        "end_mb": samples[-1].rss_mb,
        "middle_mb": middle.rss_mb,
        "growth_last_half_mb": samples[-1].rss_mb - middle.rss_mb,
        "slope_last_half_mb_per_min": 60 * slope([(s.seconds, s.rss_mb) for s in half]),
        "load_mean": sum(s.load for s in samples) / len(samples),
    }


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of y on x (0 for fewer than two distinct x)."""
    n = len(points)
    if n < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    if spread == 0:
        return 0.0
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / spread


def mappings(pid: int) -> dict:
    """Where ``pid``'s resident memory lies (MiB): ``heap`` (glibc's main arena, the
    ``[heap]`` mapping), ``anonymous`` (unnamed mappings: glibc's other arenas, one per
    thread that allocates, up to its arena limit, and blocks it mmap-ed; also the
    threads' stacks and the libraries' own pools), ``files`` (code and mapped data), with the
    count of anonymous mappings over 1 MiB resident. Empty where smaps cannot be read."""
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return {}
    kinds = {"heap": 0, "anonymous": 0, "files": 0, "other": 0}
    large_anonymous = 0
    name = ""
    for line in text.splitlines():
        head = line.split(maxsplit=5)
        if "-" in head[0] and len(head) >= 5 and ":" not in head[0]:  # a mapping's first line
            name = head[5].strip() if len(head) == 6 else ""
        elif head[0] == "Rss:":
            kb = int(head[1])
            kind = (
                "heap"
                if name == "[heap]"
                else "anonymous"
                if not name
                else "files"
                if name.startswith("/")
                else "other"
            )
            kinds[kind] += kb
            large_anonymous += kind == "anonymous" and kb > 1024
    out = {f"{kind}_mb": kb / 1024 for kind, kb in kinds.items()}
    out["anonymous_over_1mb"] = large_anonymous
    return out


def as_dicts(samples: list[Sample]) -> list[dict]:
    return [asdict(s) for s in samples]
