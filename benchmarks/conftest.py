"""Set-up of the benchmark suites (``pytest benchmarks``; they need a CUDA GPU).

Options choose the grid (defaults: the benchmark method's):
--bench-models bert-base,bert-large,minilm-l6   --bench-dtypes float16,bfloat16
--bench-shapes 1x128,32x128,8x512,64x512,64x512p   (a trailing p: lengths uniform in [16, seq])
--bench-warmup 10 --bench-reps 100   --bench-compile (also time the torch.compile peers)

Each benchmark is timed twice: with CUDA events by fastbert.bench.timing (median, p20, p80,
TFLOP/s, TB/s, put in the benchmark's extra_info, which --benchmark-json writes and
fastbert.bench.targets reads), and by pytest-benchmark's own wall clock around a call that
ends with torch.cuda.synchronize().
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

from fastbert.bench import counts, timing
from fastbert.bench.runner import describe_error
from fastbert.bench.shapes import GRID, parse_shapes

# Models are built from embedded configs; transformers must never reach for the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
HAS_CUDA = torch.cuda.is_available()
HAS_PYTEST_BENCHMARK = importlib.util.find_spec("pytest_benchmark") is not None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist starts its workers
def pytest_configure(config: pytest.Config) -> None:
    """The benchmarks time one thing at a time, in this process: never in the parallel worker
    processes that pyproject.toml's addopts start for the tests."""
    if config.pluginmanager.hasplugin("xdist"):
        config.option.dist = "no"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("fastbert benchmarks")
    group.addoption("--bench-models", default="bert-base,bert-large,minilm-l6")
    group.addoption("--bench-dtypes", default="float16,bfloat16")
    group.addoption("--bench-shapes", default=",".join(GRID) + ",64x512p")
    group.addoption("--bench-warmup", type=int, default=10)
    group.addoption("--bench-reps", type=int, default=100)
    group.addoption(
        "--bench-compile",
        action="store_true",
        help="also time torch.compile peers (slow: a compilation per shape)",
    )


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize the ``case`` argument: (model, shape, dtype) over the chosen grid."""
    if "case" not in metafunc.fixturenames:
        return
    option = metafunc.config.getoption
    cases = [
        (model, shape, dtype)
        for model in _split(option("--bench-models"))
        for shape in parse_shapes(option("--bench-shapes"))
        for dtype in _split(option("--bench-dtypes"))
    ]
    ids = [f"{m}-{s.label.replace(' ', '-')}-{d}" for m, s, d in cases]
    metafunc.parametrize("case", cases, ids=ids)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None if HAS_CUDA else "the benchmarks need a CUDA GPU"
    if HAS_CUDA and not HAS_PYTEST_BENCHMARK:
        reason = "the benchmarks need pytest-benchmark (pip install pytest-benchmark)"
    for item in items:
        item.add_marker(pytest.mark.gpu)
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def compile_enabled(request: pytest.FixtureRequest) -> bool:
    return request.config.getoption("--bench-compile")


@pytest.fixture
def record(request: pytest.FixtureRequest, benchmark):
    """``record(fn, info, work)``: time ``fn()`` and file the figures under the benchmark.

    info: identifies the measurement (op, impl, model, dtype, batch, seq, padded); work: an
    OpCount (FLOPs and bytes of one call). A first call that raises skips the benchmark with
    the error as the reason (e.g. an SDPA backend that refuses a mask).
    """
    warmup = request.config.getoption("--bench-warmup")
    reps = request.config.getoption("--bench-reps")

    def run(fn, info: dict, work: counts.OpCount) -> None:
        try:
            fn()
            torch.cuda.synchronize()
        except Exception as exc:  # a contender that cannot run this case
            pytest.skip(f"{info.get('impl')} cannot run this case: {describe_error(exc)}")
        result = timing.time_cuda(fn, warmup, reps)
        seconds = result.median_ms * 1e-3
        benchmark.extra_info.update(
            info,
            **result.to_dict(),
            flops=work.flops,
            bytes=work.bytes,
            tflops=work.flops / seconds / 1e12,
            tbps=work.bytes / seconds / 1e12,
        )

        def synchronized() -> None:
            fn()
            torch.cuda.synchronize()

        benchmark.pedantic(synchronized, rounds=max(10, reps // 5), warmup_rounds=2)

    return run
