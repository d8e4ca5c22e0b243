"""Every Triton kernel variant and autotune config compiles for sm_80 and sm_90 (no GPU needed).

The compile runs in a child process without TRITON_INTERPRET (the interpreter replaces
@triton.jit and cannot compile). Shared memory must fit the target; register spills are printed
(run pytest with -s or see the captured output) so a regression shows in CI logs.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import compile_cases
from tests.compile_support import SHARED_MEMORY_LIMIT

ROOT = Path(__file__).resolve().parent.parent
OPS = sorted(m.name for m in pkgutil.iter_modules(compile_cases.__path__))


def _compile_reports(op: str) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.compile_support", op],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("op", OPS)
def test_every_variant_compiles_for_sm80_and_sm90(op: str) -> None:
    reports = _compile_reports(op)
    assert reports, f"no compile cases for {op}"
    failures = [r for r in reports if "error" in r]
    assert not failures, "\n".join(f"{r['case']} sm_{r['arch']}: {r['error']}" for r in failures)
    for r in reports:
        assert r["cubin"], f"{r['case']} sm_{r['arch']}: no cubin"
        assert r["shared"] <= SHARED_MEMORY_LIMIT[r["arch"]], (
            f"{r['case']} sm_{r['arch']} needs {r['shared']} B of shared memory, "
            f"limit {SHARED_MEMORY_LIMIT[r['arch']]} B"
        )
    spills = [r for r in reports if r["spill_stores"] or r["spill_loads"]]
    print(f"\n{op}: {len(reports)} compiles, {len(spills)} with register spills")
    for r in spills:
        print(
            f"  spill: {r['case']} sm_{r['arch']}: {r['registers']} regs, "
            f"{r['spill_stores']} B stores, {r['spill_loads']} B loads"
        )
