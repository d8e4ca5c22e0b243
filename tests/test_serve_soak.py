"""benchmarks/serve_soak.py end to end in seconds (a real server under a few seconds of load,
a ``fastbert embed`` job of a few dozen rows), its request mix, its growth figures from given
samples, and its usage errors. The figures of a real soak are the benchmark's, not a test's."""

from __future__ import annotations

import json

import pytest

from benchmarks import serve_soak, soak_memory
from fastbert.execution import cpu_memory
from tests.cli_usage import usage_error_test


def test_a_short_serve_soak_samples_the_server_under_load(tmp_path) -> None:
    argv = ["--out", str(tmp_path), "--minutes", "0.1", "--interval", "1", "--clients", "2"]
    assert serve_soak.main([*argv, "--bad", "0.3", "--env", "MALLOC_ARENA_MAX=2"]) == 0
    report = json.loads((tmp_path / "serve-soak.json").read_text())
    samples = report["samples"]
    assert len(samples) >= 4
    assert all(s["rss_mb"] > 10 and s["threads"] > 1 for s in samples)
    assert report["memory"]["peak_mb"] == max(s["rss_mb"] for s in samples)
    assert report["variables"]["MALLOC_ARENA_MAX"] == "2"
    # As the command line set it:
    assert f"LRU_CACHE_CAPACITY={cpu_memory.CACHE_ENTRIES}" in report["freed_memory"]
    load = report["load"]
    assert load["ok"] > 0
    # Bad requests get their 400 / 422 answers, and nothing else fails.
    assert load["errors"] and set(load["errors"]) <= {"400", "422"}, load["errors"]
    assert report["mappings_at_end"]["heap_mb"] > 0
    table = (tmp_path / "serve-soak.md").read_text()
    assert "| time (m:ss) | RSS MiB | threads | load average |" in table
    assert "errors by status: 4" in table


def test_a_short_embed_soak_samples_the_job_to_its_end(tmp_path) -> None:
    argv = ["--out", str(tmp_path), "--mode", "embed", "--rows", "60", "--interval", "0.2"]
    assert serve_soak.main([*argv, "--dtype", "bfloat16"]) == 0
    report = json.loads((tmp_path / "embed-soak.json").read_text())
    assert report["rows"] == 60
    assert report["dtype"] == "bfloat16" and "bfloat16" in report["command"]
    assert len(report["samples"]) >= 2
    assert report["vm_hwm_mb"] >= report["memory"]["peak_mb"] * 0.9


def test_the_requests_mix_sizes_and_bad_bodies() -> None:
    texts = [f"text {i}" for i in range(100)]
    calls = serve_soak.requests(texts, 400, 5, 0.25)
    bad = [c for c in calls if c.body in serve_soak.BAD_BODIES]
    good = [c for c in calls if c not in bad]
    assert len(bad) == 100
    # Spread evenly (every fourth request), not by chance: a short window always meets some.
    assert [i for i, c in enumerate(calls) if c in bad][:3] == [3, 7, 11]
    assert {c.inputs for c in good} == {1, 2, 3, 4, 5}
    assert all(len(json.loads(c.body)["inputs"]) == c.inputs for c in good)
    assert calls == serve_soak.requests(texts, 400, 5, 0.25)  # seeded


def test_passes_over_the_corpus_differ_in_length() -> None:
    rows = serve_soak.embed_rows(["one two three", "four"], 6)
    assert rows == ["one two three", "four", "two three", "four", "three", "four"]


def test_growth_is_the_last_half_of_the_samples() -> None:
    samples = [soak_memory.Sample(60.0 * i, 100.0 + 10 * i, 8, 1.0) for i in range(11)]
    samples[0] = soak_memory.Sample(0.0, 300.0, 8, 1.0)  # the start does not count
    growth = soak_memory.growth(samples)
    assert growth["peak_mb"] == 300.0
    assert growth["middle_mb"] == 150.0
    assert growth["growth_last_half_mb"] == pytest.approx(50.0)
    assert growth["slope_last_half_mb_per_min"] == pytest.approx(10.0)


test_usage_errors_exit_2 = usage_error_test(
    serve_soak.main,
    [
        [],
        ["--minutes", "0"],
        ["--docs", "3000"],
        ["--max-texts", "33"],
        ["--bad", "1"],
        ["--env", "NO_VALUE"],
        ["--mode", "train"],
        ["--dtype", "float16"],
    ],
)
