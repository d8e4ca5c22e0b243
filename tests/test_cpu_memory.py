"""A CPU forward keeps the memory it frees for the next one once the process's CPU settings
are applied (fastbert.execution.cpu_tuning, at the entry points; fastbert.execution.cpu_memory):
counted in page faults, in a fresh process per setting (malloc's settings are per process);
and the per-shape caches behind the CPU linears stay small where fastbert's command line (or
a program before it imports torch) bounds them: measured in resident memory over many
shapes, in a fresh process per setting (torch reads their sizes as it loads)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastbert.execution import cpu_memory
from tests.sentence_folders import hf_folder

# The entry points' tuning and one tiny forward on the CPU, then 20 rounds of a 40 MiB tensor
# written and freed (as a forward's larger products are: glibc's own threshold moves up to
# 32 MiB blocks onto its heap, but no larger); prints the minor page faults of those rounds.
PROBE = """
import resource, torch
from fastbert import BertConfig, BertModel
from fastbert.execution.cpu_tuning import apply_process_tuning
apply_process_tuning()
config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16)
model = BertModel(config).eval()
with torch.inference_mode():
    model(torch.ones(2, 8, dtype=torch.long))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    t = torch.ones(10 << 20)
    del t
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(keep: str) -> int:
    env = {**os.environ, cpu_memory.VARIABLE: keep}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not cpu_memory.on_glibc(), reason="malloc's settings are glibc's")
def test_a_cpu_forward_keeps_freed_memory_for_reuse() -> None:
    pages = (40 << 20) // 4096
    kept, returned = page_faults("1"), page_faults("0")
    # Returned to the system, every round faults its 10,240 pages in again; kept, only the
    # first round does.
    assert returned > 15 * pages, returned
    assert kept < 3 * pages, kept


# A forward alone, without the entry points' tuning: malloc as it was (prints the faults of
# the same 20 rounds).
UNTUNED = PROBE.replace("apply_process_tuning()\n", "")


@pytest.mark.skipif(not cpu_memory.on_glibc(), reason="malloc's settings are glibc's")
def test_a_forward_alone_leaves_malloc_as_it_is() -> None:
    pages = (40 << 20) // 4096
    out = subprocess.run(
        [sys.executable, "-c", UNTUNED],
        env={**os.environ, cpu_memory.VARIABLE: "1"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert int(out.stdout.split()[-1]) > 15 * pages


def test_loading_a_model_folder_applies_the_tuning_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastbert.embedding import loading
    from fastbert.execution import cpu_tuning

    calls = []
    monkeypatch.setattr(loading, "apply_process_tuning", lambda: calls.append(1))
    loading.load(hf_folder(tmp_path / "model")).embed(["a text"])
    assert calls == [1]
    first = cpu_tuning.apply_process_tuning()
    assert cpu_tuning.apply_process_tuning() is first
    assert first.freed_memory in ("kept", "off", "unavailable")


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_memory.VARIABLE, "0")
    assert not cpu_memory.wanted()
    assert "returned to the system" in cpu_memory.status()
    monkeypatch.setenv(cpu_memory.VARIABLE, "on")
    assert cpu_memory.wanted()
    monkeypatch.setenv(cpu_memory.VARIABLE, "maybe")
    with pytest.raises(ValueError, match="FASTBERT_KEEP_CPU_MEMORY must be 1 or 0"):
        cpu_memory.wanted()


# A one-layer model run on 100 sequence lengths, each a shape of its own for oneDNN; prints the
# growth of resident memory over them (MiB). "bound": the caches bounded before torch loads.
SHAPES = """
import os, sys
if sys.argv[1] == "bound":
    from fastbert.execution import cpu_memory
    assert cpu_memory.bound_shape_caches()
import torch
from fastbert import BertConfig, BertModel

def rss():
    for line in open(f"/proc/{os.getpid()}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024

config = BertConfig(vocab_size=50, hidden_size=64, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=128, max_position_embeddings=512)
model = BertModel(config).eval()
with torch.inference_mode():
    model(torch.ones(1, 8, dtype=torch.long))
    before = rss()
    for n in range(200, 400, 2):
        model(torch.ones(1, n, dtype=torch.long))
print(rss() - before)
"""


def shapes_growth(setting: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in cpu_memory.CACHE_VARIABLES}
    out = subprocess.run(
        [sys.executable, "-c", SHAPES, setting], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.split()[-1])


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")
def test_bounded_caches_hold_a_few_shapes_not_a_thousand() -> None:
    bounded, default = shapes_growth("bound"), shapes_growth("default")
    # Each shape's primitives took about 2 MiB here with the default caches (1,024 entries).
    assert default > 50, default
    assert bounded < default / 4, (bounded, default)


def test_the_command_line_bounds_the_caches_and_keeps_a_given_size() -> None:
    env = {k: v for k, v in os.environ.items() if k not in cpu_memory.CACHE_VARIABLES}
    command = [sys.executable, "-m", "fastbert.cli", "info"]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    assert f"ONEDNN_PRIMITIVE_CACHE_CAPACITY={cpu_memory.CACHE_ENTRIES}" in out
    assert f"LRU_CACHE_CAPACITY={cpu_memory.CACHE_ENTRIES}" in out
    env["LRU_CACHE_CAPACITY"] = "40"
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    assert "LRU_CACHE_CAPACITY=40" in out


def test_bounding_after_torch_loaded_sets_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in cpu_memory.CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert not cpu_memory.bound_shape_caches.__wrapped__()  # torch is loaded in this process
    assert cpu_memory.cache_entries() == dict.fromkeys(cpu_memory.CACHE_VARIABLES, "1024")
    assert "LRU_CACHE_CAPACITY=1024" in cpu_memory.status()


# A parent that loads a model folder (a forward runs) and forks a child that embeds: prints
# the child's exit code and whether its embeddings are the parent's.
FORKED = """
import multiprocessing, sys
import numpy as np
import fastbert

model = fastbert.load(sys.argv[1])
expected = model.embed(["a text", "another text"])

def child(queue):
    queue.put(model.embed(["a text", "another text"]))

if __name__ == "__main__":
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    process = context.Process(target=child, args=(queue,), daemon=True)
    process.start()
    got = queue.get(timeout=60)
    process.join(60)
    print(process.exitcode, bool(np.allclose(got, expected, atol=1e-5)))
"""


@pytest.mark.skipif(not hasattr(os, "register_at_fork"), reason="no fork here")
def test_a_child_forked_after_loading_runs(tmp_path: Path) -> None:
    """GNU OpenMP keeps the parent's thread team in a forked child, where those threads do
    not exist: a child forked after fastbert.load (which runs a forward) hung at its first
    parallel op, for good. The entry points have forked children run torch on one thread."""
    folder = hf_folder(tmp_path / "model")
    out = subprocess.run(
        [sys.executable, "-c", FORKED, str(folder)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert out.stdout.split() == ["0", "True"], out.stderr[-2000:]
