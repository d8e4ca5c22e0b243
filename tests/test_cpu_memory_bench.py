"""benchmarks/cpu_memory.py: its table from the runs, and its usage errors (the timed runs
themselves are the benchmark's, not a test's)."""

from __future__ import annotations

import pytest

from benchmarks import cpu_memory


def run(keep: str, seconds: float, faults: int) -> dict:
    return {
        "contender": "fastbert-int8",
        "keep": keep,
        "seconds": seconds,
        "minor_faults": faults,
        "system_s": faults / 1e6,
    }


def test_the_table_takes_medians_per_setting() -> None:
    environment = {
        "cpu": "a CPU",
        "cpu_threads": 2,
        "cpu_flags": "avx2",
        "torch": "2.13.0",
        "commit": "abc",
        "date": "today",
    }
    report = {
        "docs": 10,
        "rounds": 3,
        "contenders": ["fastbert-int8"],
        "environment": environment,
        "runs": [run("1", s, 100) for s in (4.0, 5.0, 9.0)]
        + [run("0", s, 1_000_000) for s in (6.0, 5.5, 7.0)],
    }
    table = cpu_memory.markdown(report)
    assert "| fastbert-int8 | inherited | kept | 5.00 | 100 | 0.00 | 1.20x |" in table
    assert "| fastbert-int8 | inherited | returned | 6.00 | 1,000,000 | 1.00 |  |" in table
    # With --caches, each size's pair of rows from its own runs.
    report["caches"] = ["1024", "16"]
    report["runs"] = [{**r, "caches": "1024"} for r in report["runs"]] + [
        {**r, "caches": "16", "seconds": r["seconds"] * 2} for r in report["runs"]
    ]
    table = cpu_memory.markdown(report)
    assert "| fastbert-int8 | 1024 | kept | 5.00 | 100 | 0.00 | 1.20x |" in table
    assert "| fastbert-int8 | 16 | kept | 10.00 | 100 | 0.00 | 1.20x |" in table


@pytest.mark.parametrize(
    "argv",
    [
        ["--docs", "0", "--out", "x"],
        ["--rounds", "1"],
        ["--out", "x", "--contenders", "ort-int8"],  # not a fastbert contender
        ["--out", "x", "--caches", "16,many"],
    ],
)
def test_usage_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        cpu_memory.main(argv)
    assert exit_info.value.code == 2
