"""Test set-up. Runs before any test module is imported.

Without a CUDA GPU the Triton kernels run under the interpreter, which must be switched on
before any module with @triton.jit is imported: hence the environment is set here, first
(and the interpreter's helper calls made cheaper: tests/interpreter_calls.py).
With one, autotuning is pinned to one config per launch (FASTBERT_AUTOTUNE=0).
"""

from __future__ import annotations

import os

import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
else:
    # The GPU tests check results, not speed: each launch runs the first config its kernel
    # keeps, untimed (autotuning every shape would take most of the run). The other configs
    # are checked one by one in tests/test_configs_gpu.py.
    os.environ.setdefault("FASTBERT_AUTOTUNE", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402

if os.environ.get("TRITON_INTERPRET") == "1":
    from tests import interpreter_calls

    interpreter_calls.install()

# Under pytest-xdist (pyproject.toml's addopts: --dist loadfile) a test file runs in one worker
# process, so its module-scoped fixtures (a served model, a compiled op's reports) are made
# once. The longest file, tests/test_compile.py, compiles each op's cases on every core
# (tests/compile_support.py), so the other workers' files need not wait for it.


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device() -> str:
    """Where the kernels under test run: the GPU when there is one, else the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture
def interpreter_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton interpreter switched off, for the tests that a CPU launch without it says how
    to switch it on. Skips where a GPU is present (the kernels then run there)."""
    if HAS_CUDA:
        pytest.skip("a GPU is present")
    monkeypatch.setenv("TRITON_INTERPRET", "0")
