"""Stand-ins for the files a GPU run's stages write, in their formats, with made-up figures:
what the dry run (no GPU) builds its summary and archive from. The figures are invented and
say so (the environment names no real machine); never copy them anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu_run.plan import Stage
from benchmarks.gpu_run.runner import STAGES_JSON, Outcome, write_outcomes

ENVIRONMENT = {
    "gpu": "NVIDIA H100 80GB HBM3 (dry run: made-up figures)",
    "compute_capability": "sm_90",
    "driver": "0.0",
    "cuda": "0.0",
    "torch": "0.0",
    "triton": "0.0",
    "commit": "0000000",
    "date": "1970-01-01T00:00:00+00:00",
}
# shape -> contender -> median ms
FORWARD_MS = {
    "1x128": {"fastbert": 0.31, "fastbert-graphs": 0.18, "hf-eager": 1.9, "hf-sdpa": 1.7},
    "32x128": {
        "fastbert": 1.25,
        "fastbert-graphs": 1.1,
        "hf-eager": 2.9,
        "hf-sdpa": 1.6,
        "hf-compile": 1.3,
        "hf-compile-max": 1.15,
    },
}
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.test_linear" name="test_gpu_epilogues[float16]"/>
<testcase classname="tests.test_attention" name="test_gpu_grid[bfloat16-64-512]"/>
<testcase classname="tests.test_softmax" name="test_gpu_long_rows[float32]">
<failure message="AssertionError">made up</failure></testcase>
<testcase classname="tests.test_fp8_model" name="test_triton_fp8_matches_torch_fp8">
<skipped message="made up"/></testcase>
</testsuite></testsuites>
"""


def _write(path: Path, value: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1) + "\n")


def _bench(results: Path) -> None:
    from fastbert.bench.document import new_document

    records = [
        {"peer": peer, "shape": shape, "status": "ok", "median_ms": ms}
        for shape, peers in FORWARD_MS.items()
        for peer, ms in peers.items()
    ]
    settings = {"model": "bert-base", "dtype": "float16", "device": "cuda"}
    _write(results / "bench" / "results.json", new_document(ENVIRONMENT, settings, records))
    kernels = [
        ("attention", "float16", 64, 512, 0.31, 355.0, 0.5),
        ("attention", "bfloat16", 64, 512, 0.33, 330.0, 0.5),
        ("linear_gelu", "float16", 64, 512, 0.9, 620.0, 0.2),
        ("layer_norm", "float16", 64, 512, 0.04, 0.9, 2.6),
    ]
    benchmarks = [
        {
            "extra_info": {
                "op": op,
                "impl": "fastbert",
                "model": "bert-base",
                "dtype": dtype,
                "batch": batch,
                "seq": seq,
                "padded": False,
                "median_ms": ms,
                "tflops": tflops,
                "tbps": tbps,
            }
        }
        for op, dtype, batch, seq, ms, tflops, tbps in kernels
    ]
    _write(results / "bench" / "kernels-bench.json", {"benchmarks": benchmarks})


def write(results: Path, stages: list[Stage]) -> None:
    """Made-up result files of every stage of ``stages`` into ``results``."""
    outcomes = [
        Outcome(
            s.name, "ok", 0, 1.0, s.cap_s, s.cap_s, list(s.command), f"{s.name}.log", "", s.leftover
        )
        for s in stages
    ]
    results.mkdir(parents=True, exist_ok=True)
    write_outcomes(outcomes, results / STAGES_JSON)
    _write(results / "environment.json", ENVIRONMENT)
    (results / "gpu-tests.xml").write_text(JUNIT)
    _bench(results)
    rows = [
        {"dtype": dtype, "distribution": lengths, "cuda_graphs": graphs, "tokens_per_s": rate}
        for dtype, lengths, graphs, rate in (
            ("float16", "s512", "false", 1.2e6),
            ("float16", "s512", "auto", 2.2e6),
            ("float16", "mixed", "auto", 1.7e6),
            ("bfloat16", "s512", "auto", 2.1e6),
        )
    ]
    _write(results / "corpus" / "corpus.json", {"rows": rows})
    limits = {
        "bfloat16": {"gemm_tflops": 760.0, "copy_tbps": 3.0},
        "float16": {"gemm_tflops": 770.0, "copy_tbps": 3.0},
    }
    _write(results / "limits.json", {"gpu": ENVIRONMENT["gpu"], "limits": limits})
    step = {"fastbert": 30.0, "hf-sdpa": 36.0}
    results_of = {name: {"timing": {"median_ms": ms}} for name, ms in step.items()}
    _write(
        results / "train-step" / "results.json",
        {"rows": [{"shape": "32x128", "results": results_of}]},
    )
    cells = [
        {
            "contender": "fastbert",
            "mix": "batch32",
            "mode": "closed",
            "concurrency": c,
            "requests_per_s": 40.0 * c**0.5,
            "inputs_per_s": 1280.0 * c**0.5,
            "p50_ms": 20.0 * c**0.5,
        }
        for c in (1, 16, 64)
    ]
    _write(results / "serve" / "serve-bench.json", {"cells": cells})
