"""The caution a run prints when some of its cells are too noisy to rank: which ones, how wide
their intervals stayed, and the likely cause from what the machine was measured doing while
they were timed (machine.py: other processes' CPU time, steal, load average, CPU clock)."""

from __future__ import annotations

from collections.abc import Iterable

from fastbert.bench import analysis

# What counts as a likely cause: other processes busy for this many cores' worth, a hypervisor
# taking this share of the CPUs, a clock that moved by this fraction.
OTHER_CORES = 0.25
STEAL = 0.05
CLOCK_SPREAD = 0.05


def noisy_records(records: Iterable[dict]) -> list[dict]:
    """The measured records flagged noisy (their median's interval stayed too wide)."""
    return [r for r in records if analysis.ok(r) and r.get("noisy")]


def _spread(record: dict) -> str:
    width = analysis.interval_width(record)
    return f"{100 * width:.0f}%" if width is not None else f"none from {record['reps']} reps"


def _merged(readings: list[dict]) -> dict:
    """The worst of several shapes' machine readings (machine.during's dicts)."""

    def values(key: str) -> list[float]:
        return [r[key] for r in readings if r.get(key) is not None]

    loads = [x for r in readings for x in (r.get("load_average") or ()) if x is not None]
    clocks = [x for r in readings for x in (r.get("cpu_mhz") or ())]
    return {
        "other_cores": max(values("other_cores"), default=None),
        "steal_fraction": max(values("steal_fraction"), default=None),
        "load": (loads[0], loads[-1]) if loads else None,
        "cpu_mhz": (min(clocks), max(clocks)) if clocks else None,
        "cores": max(values("cores"), default=None),
    }


def likely_causes(readings: list[dict]) -> str:
    """What the machine readings of the noisy cells' shapes point at, in a sentence."""
    m = _merged(readings)
    causes, calm = [], []
    if m["other_cores"] is not None:
        text = f"other processes used {m['other_cores']:.1f} of the {m['cores']} cores"
        if m["load"] is not None:
            text += f" (load average {m['load'][0]:.1f}, then {m['load'][1]:.1f})"
        (causes if m["other_cores"] >= OTHER_CORES else calm).append(text)
    if m["steal_fraction"] is not None and m["steal_fraction"] >= STEAL:
        causes.append(f"the hypervisor took {100 * m['steal_fraction']:.0f}% of the CPU time")
    if m["cpu_mhz"] is not None:
        low, high = m["cpu_mhz"]
        if high > 0 and (high - low) / high >= CLOCK_SPREAD:
            causes.append(f"the CPU clock moved between {low:.0f} and {high:.0f} MHz")
        else:
            calm.append(f"the CPU clock read {high:.0f} MHz throughout")
    if causes:
        return "likely cause: " + "; ".join(causes) + "."
    measured = f" ({'; '.join(calm)})" if calm else ""
    return (
        f"nothing measured explains it{measured}: the contenders' own variation, or work this "
        "machine does not show (a virtual machine's neighbours, GPU clocks)."
    )


def caution(records: list[dict], width: float | None) -> str | None:
    """One line naming the noisy cells, their spread and the likely cause; None when none is
    noisy. ``width``: the interval width the stopping rule allowed (None: not recorded)."""
    noisy = noisy_records(records)
    if not noisy:
        return None
    measured = [r for r in records if analysis.ok(r)]
    allowed = f"wider than {100 * width:.0f}% of the median" if width else "too wide"
    cells = ", ".join(f"{r['peer']} {r['shape']} ({_spread(r)})" for r in noisy)
    shapes = {r["shape"]: r["machine"] for r in noisy if r.get("machine")}
    cause = likely_causes(list(shapes.values())) if shapes else "the machine was not measured."
    return (
        f"Caution: {len(noisy)} of {len(measured)} cells are too noisy to rank, their median's "
        f"95% interval {allowed} (its width in brackets): {cells}. {cause[0].upper()}"
        f"{cause[1:]} Rerun on an idle machine, or allow more time per cell (--max-time)."
    )
