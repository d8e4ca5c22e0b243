"""tests/interpreter_calls.py: a @triton.jit helper called from a kernel under the interpreter
skips the re-swap of triton.language, with the same results, and a launch still restores
the builtins when it ends."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from tests import interpreter_calls
from tests.conftest import HAS_CUDA

pytestmark = pytest.mark.skipif(HAS_CUDA, reason="the interpreter runs without a GPU only")


@triton.jit
def _cube_plus_one(x):
    return x * x * x + 1.0


@triton.jit
def _helper_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, _cube_plus_one(_cube_plus_one(x)), mask=mask)


def test_the_test_run_skips_the_swap_in_place() -> None:
    assert interpreter._patch_lang.triton_swap
    assert not interpreter_calls.install()  # once only


def test_a_launch_swaps_once_whatever_its_helper_calls(monkeypatch) -> None:
    swaps = []
    triton_swap = interpreter._patch_lang.triton_swap
    monkeypatch.setattr(
        interpreter._patch_lang, "triton_swap", lambda fn: swaps.append(fn) or triton_swap(fn)
    )
    x = torch.ones(37)
    _helper_kernel[(3,)](x, torch.empty_like(x), 37, BLOCK=16)  # 3 programs, 2 calls each
    assert [fn.__name__ for fn in swaps] == ["_helper_kernel"]


def test_helpers_compute_as_without_the_skip_and_the_launch_restores(monkeypatch) -> None:
    x = torch.linspace(-1.5, 1.5, 37)
    expected = (x**3 + 1) ** 3 + 1
    outputs = []
    for swap in (interpreter._patch_lang, interpreter._patch_lang.triton_swap):
        monkeypatch.setattr(interpreter, "_patch_lang", swap)
        out = torch.empty_like(x)
        _helper_kernel[(triton.cdiv(37, 16),)](x, out, 37, BLOCK=16)
        outputs.append(out)
        assert tl.core.is_builtin(tl.load), "the launch left triton.language swapped"
    torch.testing.assert_close(outputs[0], expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(outputs[0], outputs[1])
