"""What else the machine was doing while contenders were timed: the likely causes of noisy
timings, measured where the system shows them (Linux's /proc and /sys; elsewhere the
readings are None).

A :class:`Snapshot` is taken before and after a stretch of timing; :func:`during` turns two of
them into what happened in between: the CPU time other processes used (all CPU time busy
minus this process's own, in cores' worth), the share a hypervisor took (steal), the load
average, and the CPU clock range.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import time
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Snapshot:
    wall_s: float  # time.monotonic
    own_cpu_s: float  # this process's user + system time, all its threads
    busy_s: float | None  # every CPU's non-idle time, steal excluded (/proc/stat)
    steal_s: float | None  # time the hypervisor ran something else on this machine's CPUs
    load_average: float | None  # the 1-minute load average
    cpu_mhz: tuple[float, ...] | None  # each CPU's current clock


def _proc_stat() -> tuple[float, float] | tuple[None, None]:
    """(busy, steal) seconds over all CPUs since boot, from /proc/stat's "cpu" line."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None, None
    if fields[0] != "cpu" or len(fields) < 9:
        return None, None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    hz = os.sysconf("SC_CLK_TCK")
    return (user + nice + system + irq + softirq) / hz, steal / hz


def cpu_mhz() -> tuple[float, ...] | None:
    """Each CPU's current clock in MHz: cpufreq's scaling_cur_freq where the kernel has it, else
    /proc/cpuinfo's "cpu MHz" (a virtual machine often reports a fixed figure there)."""
    files = sorted(glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"))
    try:
        if files:
            return tuple(int(Path(f).read_text()) / 1e3 for f in files)
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except (OSError, ValueError):
        return None
    mhz = [float(line.split(":", 1)[1]) for line in lines if line.startswith("cpu MHz")]
    return tuple(mhz) or None


def snapshot() -> Snapshot:
    times = os.times()
    busy, steal = _proc_stat()
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return Snapshot(time.monotonic(), times.user + times.system, busy, steal, load, cpu_mhz())


def cores() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def during(before: Snapshot, after: Snapshot) -> dict:
    """What happened between two snapshots, JSON-ready: ``other_cores`` (CPU time other
    processes used, in cores' worth: 1.0 = one core busy throughout), ``steal_fraction`` (of
    the CPUs' time), ``load_average`` (before, after), ``cpu_mhz`` (lowest and highest
    reading of either), ``cores``. A reading the system does not give is None."""
    wall = max(after.wall_s - before.wall_s, 1e-9)
    n = cores()
    other = steal = None
    if before.busy_s is not None and after.busy_s is not None:
        others_s = (after.busy_s - before.busy_s) - (after.own_cpu_s - before.own_cpu_s)
        other = round(max(others_s, 0.0) / wall, 2)
        steal = round(max(after.steal_s - before.steal_s, 0.0) / (wall * n), 3)
    readings = [*(before.cpu_mhz or ()), *(after.cpu_mhz or ())]
    return {
        "other_cores": other,
        "steal_fraction": steal,
        "load_average": [before.load_average, after.load_average],
        "cpu_mhz": [min(readings), max(readings)] if readings else None,
        "cores": n,
    }
