"""The launchers' host-side integer helpers agree with Triton's own."""

from __future__ import annotations

import triton

from fastbert.kernels import launch


def test_next_power_of_2_matches_triton() -> None:
    for n in range(1, 5000):
        assert launch.next_power_of_2(n) == triton.next_power_of_2(n), n
    assert launch.next_power_of_2(2**40 + 1) == 2**41


def test_cdiv_matches_triton() -> None:
    for a in range(0, 600):
        for b in (1, 2, 3, 16, 64, 128, 257):
            assert launch.cdiv(a, b) == triton.cdiv(a, b), (a, b)
