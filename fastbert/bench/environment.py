"""What a measurement was taken on: GPU, driver, CUDA, library versions, commit and date."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

from fastbert.execution import cpu, cpu_memory
from fastbert.kernels.cpu_library import first_processor

PACKAGES = ("fastbert", "torch", "triton", "transformers", "sentence-transformers")
REPO = Path(__file__).resolve().parents[2]


def _run(command: list[str], cwd: Path | None = None) -> str | None:
    """stdout of ``command`` stripped, or None when it cannot run or fails."""
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str | None:
    """HEAD of the checkout fastbert runs from, with "-dirty" when files differ from it."""
    commit = _run(["git", "rev-parse", "HEAD"], REPO)
    if commit is None:
        return None
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], REPO)
    return commit + ("-dirty" if dirty else "")


def cpu_name(cpuinfo: str | None = None) -> str:
    """The CPU's model name from ``cpuinfo`` (None: /proc/cpuinfo's text), with its family and
    model numbers where it gives them: a virtual machine often names only the vendor's line
    ("AMD EPYC"), and the numbers tell its generations apart, whose rates differ."""
    fields: dict[str, str] = {}
    for line in first_processor(cpuinfo) or []:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    name = fields.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in fields and "model" in fields:
        name += f" (family {fields['cpu family']}, model {fields['model']})"
    return name


def gpu_info() -> dict:
    """Name, compute capability, memory and driver of CUDA device 0; empty without CUDA."""
    if not torch.cuda.is_available():
        return {}
    props = torch.cuda.get_device_properties(0)
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return {
        "gpu": props.name,
        "gpu_count": torch.cuda.device_count(),
        "compute_capability": f"sm_{props.major}{props.minor}",
        "gpu_memory_gib": round(props.total_memory / 2**30, 1),
        "driver": driver.splitlines()[0] if driver else None,
        "cuda": torch.version.cuda,
    }


# Variables that hold oneDNN's, MKL's and PyTorch's own kernels to an older instruction set
# than the CPU's.
ISA_CAPS = (
    "ONEDNN_MAX_CPU_ISA",
    "DNNL_MAX_CPU_ISA",
    "MKL_ENABLE_INSTRUCTIONS",
    "ATEN_CPU_CAPABILITY",
)


def capture() -> dict:
    """The environment as a flat JSON-ready dict."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_flags": " ".join(cpu.relevant_flags()),
        "cpu_threads": torch.get_num_threads(),
        "cpu_freed_memory": cpu_memory.status(),
    }
    env.update({package: _version(package) for package in PACKAGES})
    env.update(gpu_info() or {"gpu": None})
    env["TRITON_INTERPRET"] = os.environ.get("TRITON_INTERPRET")
    # Caps on the instruction sets of the CPU libraries, where a run set them.
    env.update({name: os.environ[name] for name in ISA_CAPS if name in os.environ})
    return env
