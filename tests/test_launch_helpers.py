"""The launchers' host-side helpers: the integer ones agree with Triton's own, and an
autotuned kernel's launch from its autotuner's cache behaves as the autotuner's."""

from __future__ import annotations

import pytest
import torch
import triton
from triton.runtime.autotuner import Autotuner

from fastbert import kernels as K
from fastbert.kernels import fused_linear, launch
from fastbert.kernels import reference as R
from tests.test_linear import operands


def test_next_power_of_2_matches_triton() -> None:
    for n in range(1, 5000):
        assert launch.next_power_of_2(n) == triton.next_power_of_2(n), n
    assert launch.next_power_of_2(2**40 + 1) == 2**41


def test_cdiv_matches_triton() -> None:
    for a in range(0, 600):
        for b in (1, 2, 3, 16, 64, 128, 257):
            assert launch.cdiv(a, b) == triton.cdiv(a, b), (a, b)


# --- launch_tuned: an autotuned kernel launched from its autotuner's cache ---------------------


@pytest.fixture
def autotuner_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Each Autotuner.run call of the test, as (autotuner, args, kwargs), after the cache it
    found: the kernels still run."""
    runs: list[tuple] = []
    original = Autotuner.run

    def run(self, *args, **kwargs):
        runs.append((self, args, dict(kwargs)))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Autotuner, "run", run)
    return runs


def _linear_inputs(device: str) -> tuple:
    x, weight, bias, residual = operands(37, 150, 140, torch.float32, device, seed=21)
    return x, weight, bias, residual


def test_a_tuned_key_launches_from_the_autotuners_cache(device, autotuner_runs) -> None:
    """The second launch of a key skips Autotuner.run and computes the same; after
    ``cache.clear()`` the autotuner runs again (as the config checks and gemm_configs use it)."""
    kernel = fused_linear._linear_fwd_kernel
    x, weight, bias, residual = _linear_inputs(device)
    first = K.linear(x, weight, bias, "gelu", residual)
    tuned = kernel.best_config
    launched_by_autotuner = len(autotuner_runs)
    second = K.linear(x, weight, bias, "gelu", residual)
    assert len(autotuner_runs) == launched_by_autotuner, "a tuned key went through the autotuner"
    assert kernel.best_config is tuned
    assert torch.equal(second, first)
    reference = R.linear(*(t.double() for t in (x, weight, bias)), "gelu", residual.double())
    torch.testing.assert_close(second.double(), reference, rtol=1e-5, atol=1e-5)
    kernel.cache.clear()
    K.linear(x, weight, bias, "gelu", residual)
    assert [tuner for tuner, _, _ in autotuner_runs[launched_by_autotuner:]] == [kernel]


def test_the_key_read_is_the_one_the_autotuner_caches(device, autotuner_runs) -> None:
    """launch_tuned's key for a launch is the key Triton's autotuner stored for it (both read
    the key arguments and every argument's dtype; a Triton that changes its key fails here)."""
    kernel = fused_linear._linear_fwd_kernel
    kernel.cache.clear()
    x, weight, bias, residual = _linear_inputs(device)
    K.linear(x.half() if device == "cuda" else x, weight, bias, None, residual)
    ((tuner, args, kwargs),) = autotuner_runs
    assert tuner is kernel
    assert list(kernel.cache) == [launch._KeyReader(kernel).key(args, kwargs)]


def test_other_kernels_launch_as_given() -> None:
    """A stand-in a test puts in a kernel's place is launched by indexing it with the grid."""
    launched = []

    class StandIn:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launched.append((grid, args, kwargs))

    launch.launch_tuned(StandIn(), (3,), 1, 2, FLAG=True)
    assert launched == [((3,), (1, 2), {"FLAG": True})]


def test_a_pre_hook_reads_the_arguments_the_autotuner_would_give_it() -> None:
    """The pre-hook's arguments: positional by name, then keywords, then the config's values,
    each later one winning, as the dict Autotuner.run builds."""
    names = ["x", "y", "BLOCK", "FLAG"]
    position = {name: i for i, name in enumerate(names)}
    args, kwargs, chosen = (1, None), {"FLAG": True, "BLOCK": 8}, {"BLOCK": 64, "num_warps": 4}
    arguments = launch._LaunchArguments(position, args, kwargs, chosen)
    expected = {**dict(zip(names, args)), **kwargs, **chosen}
    assert dict(arguments) == expected and len(arguments) == len(expected)
    assert [arguments[name] for name in expected] == list(expected.values())
    with pytest.raises(KeyError):
        arguments["missing"]
