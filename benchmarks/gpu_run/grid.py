"""The GPU test grid of benchmarks/run_gpu.sh, as a pytest plugin:
``pytest -p benchmarks.gpu_run.grid --gpu-grid core|rest|all tests/``.

Its tests are those that run on a GPU when there is one: marked ``gpu``, or taking the
``device`` fixture (tests/conftest.py: "cuda" when CUDA is present, the interpreter
otherwise). ``core`` is a covering subset that fits a short run: of each test function, the
cases that together hold every value of each parameter once, and every pair of a dtype with
another parameter's value (so every op meets every dtype on every shape it is tested with,
without every combination of shapes). ``rest`` is what ``core`` leaves out; ``all`` both.
The core runs the test files in turn, a few tests of each at a time, so that a run cut short
has tried every file rather than finished the first ones.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import pytest
import torch

CHOICES = ("core", "rest", "all")
TURN = 4  # consecutive tests of one file in the core's order


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--gpu-grid",
        choices=CHOICES,
        default="all",
        help="the GPU tests to run: a covering core, the rest, or all (default)",
    )


def runs_on_gpu(item: pytest.Item) -> bool:
    """Whether ``item`` runs on the GPU when one is present."""
    return item.get_closest_marker("gpu") is not None or "device" in getattr(
        item, "fixturenames", ()
    )


def _is_dtype(name: str, value: object) -> bool:
    return isinstance(value, torch.dtype) or name == "dtype"


def needs(item: pytest.Item) -> set[tuple]:
    """What ``item`` covers: each (parameter, value) and each pair of a dtype parameter's value
    with another parameter's value."""
    callspec = getattr(item, "callspec", None)
    params = {} if callspec is None else callspec.params
    values = {name: repr(value) for name, value in params.items()}
    covered: set[tuple] = {(name, value) for name, value in values.items()}
    dtypes = [name for name, value in params.items() if _is_dtype(name, value)]
    for dtype, (name, value) in itertools.product(dtypes, values.items()):
        if name != dtype:
            covered.add((dtype, values[dtype], name, value))
    return covered or {("case",)}


def core(items: list[pytest.Item]) -> list[pytest.Item]:
    """A covering subset of ``items`` (their order kept): per test function, greedily the
    cases that add something :func:`needs` lists and the cases kept so far do not hold."""
    covered: dict[tuple, set[tuple]] = {}
    kept = []
    for item in items:
        function = (item.nodeid.split("[")[0],)
        seen = covered.setdefault(function, set())
        new = needs(item) - seen
        if new:
            seen |= new
            kept.append(item)
    return kept


def in_turn(items: list[pytest.Item], turn: int = TURN) -> list[pytest.Item]:
    """``items`` reordered: ``turn`` of the first file's, then of the next file's, and so on
    round the files until none is left (each file's own order kept)."""
    by_file: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        by_file[item.nodeid.split("::")[0]].append(item)
    queues = list(by_file.values())
    ordered: list[pytest.Item] = []
    for start in itertools.count(0, turn):
        batch = [item for queue in queues for item in queue[start : start + turn]]
        if not batch:
            return ordered
        ordered += batch
    return ordered


def select(items: list[pytest.Item], grid: str) -> list[pytest.Item]:
    """The items of ``grid`` ("core", "rest" or "all"): the core in turn (:func:`in_turn`),
    the others in collection order."""
    pool = [item for item in items if runs_on_gpu(item)]
    if grid == "all":
        return pool
    chosen = core(pool)
    if grid == "core":
        return in_turn(chosen)
    kept = {id(item) for item in chosen}
    return [item for item in pool if id(item) not in kept]


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = select(items, config.getoption("--gpu-grid"))
    keep = {id(item) for item in selected}
    deselected = [item for item in items if id(item) not in keep]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
    items[:] = selected
