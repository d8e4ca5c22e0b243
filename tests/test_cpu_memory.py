"""A CPU forward keeps the memory it frees for the next one (fastbert.execution.cpu_memory):
counted in page faults, in a fresh process per setting (malloc's settings are per process)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastbert.execution import cpu_memory

# One tiny forward on the CPU, then 20 rounds of a 40 MiB tensor written and freed (as a
# forward's larger products are: glibc's own threshold moves up to 32 MiB blocks onto its heap,
# but no larger); prints the minor page faults of those rounds.
PROBE = """
import resource, torch
from fastbert import BertConfig, BertModel
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


def test_the_setting_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_memory.VARIABLE, "0")
    assert not cpu_memory.wanted()
    assert "returned to the system" in cpu_memory.status()
    monkeypatch.setenv(cpu_memory.VARIABLE, "on")
    assert cpu_memory.wanted()
    monkeypatch.setenv(cpu_memory.VARIABLE, "maybe")
    with pytest.raises(ValueError, match="FASTBERT_KEEP_CPU_MEMORY must be 1 or 0"):
        cpu_memory.wanted()
