"""The process-wide CPU settings fastbert applies once, at its entry points.

Three settings belong to the whole process rather than to a model or a forward
(fastbert.execution.cpu_memory says what the first two are worth):

- the sizes of oneDNN's and ideep's per-shape caches (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``,
  ``LRU_CACHE_CAPACITY``), which torch reads as it loads: set where unset, and only while
  torch is not imported yet;
- glibc malloc's thresholds, so that the memory a CPU forward frees is kept for the next one
  (``$FASTBERT_KEEP_CPU_MEMORY=0`` leaves malloc as it is).

:func:`apply_process_tuning` applies them, once per process. The entry points call it before
any model runs: ``fastbert``'s command line (before anything imports torch, so the caches are
bounded too), ``fastbert.load`` / ``fastbert.embed`` and every job that loads a model folder
(fastbert.embedding.loading.load_options), and the server's start. No forward calls it: a
program that builds its models itself (``BertModel.from_pretrained``, ``fastbert.optimize``)
calls it once, first, to get the same settings.

- a process forked from this one (``multiprocessing``'s default on Linux, a prefork server)
  runs torch on one thread: GNU OpenMP, which PyTorch's CPU builds use, keeps the parent's
  thread team in the child, where those threads no longer exist, so a child's first
  parallel op hung for good once the parent had run one (``fastbert.load`` runs a forward);
  one thread runs no parallel region, as PyTorch's DataLoader workers do. Start children
  with "spawn" or "forkserver" to have them use every core.

The server's OpenMP spin-waiting (``fastbert serve --omp-spin``) is no process setting: it is
which thread runs the server's torch ops, decided by the server's start
(fastbert.serve.server) from its options.

Importing this module imports no torch.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys

from fastbert.execution import cpu_memory


@dataclasses.dataclass(frozen=True)
class ProcessTuning:
    """What :func:`apply_process_tuning` did in this process.

    ``shape_caches_bounded``: whether it set the per-shape caches' sizes (False once torch was
    imported first, or where the environment set them already is kept either way);
    ``freed_memory``: "kept", "off" (``$FASTBERT_KEEP_CPU_MEMORY=0``) or "unavailable" (not
    glibc, or mallopt refused).
    """

    shape_caches_bounded: bool
    freed_memory: str


@functools.cache
def apply_process_tuning() -> ProcessTuning:
    """Apply this process's CPU settings (see the module docstring), once; later calls return
    what the first did. Call it at an entry point, before torch is imported where possible."""
    bounded = cpu_memory.bound_shape_caches()
    os.register_at_fork(after_in_child=_one_thread_after_fork)
    return ProcessTuning(bounded, cpu_memory.keep_freed_memory())


def _one_thread_after_fork() -> None:
    """In a forked child: torch on one thread, where the parent had imported it (see the
    module docstring)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)
