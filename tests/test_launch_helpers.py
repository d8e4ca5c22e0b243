"""The launchers' host-side integer helpers agree with Triton's own."""

from __future__ import annotations

import triton
from fastbert.kernels import _runtime


def test_next_power_of_2_matches_triton() -> None:
    for n in range(1, 5000):
        assert _runtime.next_power_of_2(n) == triton.next_power_of_2(n), n
    assert _runtime.next_power_of_2(2**40 + 1) == 2**41


def test_cdiv_matches_triton() -> None:
    for a in range(0, 600):
        for b in (1, 2, 3, 16, 64, 128, 257):
            assert _runtime.cdiv(a, b) == triton.cdiv(a, b), (a, b)
