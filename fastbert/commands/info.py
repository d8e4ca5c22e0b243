"""fastbert info: versions, devices, and which backends can run here."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform

NAME = "info"
HELP = "print versions, devices and which backends can run here"
PACKAGES = ("fastbert", "torch", "triton", "transformers", "sentence-transformers")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def triton_status() -> str:
    """Whether the Triton kernels can run here, and how."""
    import torch

    from fastbert.kernels import launch

    if torch.cuda.is_available():
        return "yes, on the CUDA GPU"
    if launch.interpreting():
        return "yes, on the CPU under the Triton interpreter (TRITON_INTERPRET=1; slow)"
    return "no: needs a CUDA GPU (or TRITON_INTERPRET=1 for the CPU interpreter)"


def report() -> list[tuple[str, str]]:
    import torch

    from fastbert import settings
    from fastbert.execution import cpu, cpu_memory, runtime
    from fastbert.kernels import cpu_engine

    rows = [("python", platform.python_version())]
    rows += [(p, _version(p)) for p in PACKAGES]
    if torch.cuda.is_available():
        rows.append(("cuda", str(torch.version.cuda)))
        for i in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(i)
            rows.append((f"gpu {i}", f"{torch.cuda.get_device_name(i)} (sm_{major}{minor})"))
    else:
        rows.append(("gpu", "none (CUDA not available)"))
    rows.append(
        (
            "backend torch",
            "yes (PyTorch primitives: SDPA, oneDNN / addmm GEMMs, layer_norm; any device)",
        )
    )
    rows.append(("backend triton", triton_status()))
    default = "triton" if torch.cuda.is_available() else "torch"
    rows.append(("backend auto", f"-> {default} here"))
    rows.append(("cpu flags", ", ".join(cpu.relevant_flags()) or "none of note"))
    rows.append(("cpu bfloat16", cpu_bf16_advice()))
    rows.append(("cpu int8", cpu_int8_advice()))
    engine = cpu_engine.status()
    rows.append(("cpu attention kernel", engine.pop("compiled attention")))
    rows.append(("cpu engine", "; ".join(f"{part}: {what}" for part, what in engine.items())))
    rows.append(("cpu row buckets", runtime.cpu_row_buckets_status()))
    rows.append(("cpu freed memory", cpu_memory.status()))
    rows += list(settings.current().items())
    return rows


def cpu_bf16_advice() -> str:
    """Whether bfloat16 is native on this CPU, and what to run."""
    import torch

    from fastbert.execution import cpu
    from fastbert.kernels import packed_weights

    flag = cpu.native_bf16()
    if flag is None and not packed_weights.onednn_serves(torch.bfloat16):
        return (
            "not native here (no avx512_bf16 / amx_bf16, nor the AVX-512 oneDNN's bfloat16 "
            "needs): keep float32, the default (bfloat16's linears run as float32 products "
            "rounded to bfloat16: no faster than float32, with bfloat16's error; docs/cpu.md)"
        )
    if flag is None:
        return (
            "not native here (no avx512_bf16 / amx_bf16): keep float32, the default "
            "(bfloat16 keeps its accuracy but runs emulated)"
        )
    return (
        f"native ({flag}): float32 (the default) is exact; dtype bfloat16 is faster and "
        "lossy (accuracy in docs/cpu.md)"
    )


# int8 on each build of the byte product against float32, end to end, where measured
# (docs/results.md, "int8 on the byte multiply-adds").
BYTE_PRODUCT_SPEED = {
    "avx2": "1.5x float32's speed end to end with oneDNN held to AVX2",
    "avx512": "1.2x float32's speed end to end on an AVX-512 EPYC with its VNNI set aside",
}


def cpu_int8_advice() -> str:
    """What quantize="int8" runs on here, and how it compares with bfloat16 where that is
    native: bfloat16 is the more accurate (docs/precisions.md); with AMX it also ran as fast
    as int8 or faster, without AMX int8 with its quantisation and epilogue compiled ran
    faster, and without those passes no faster; without int8 dot products it runs on AVX2's
    byte product where that is chosen (faster than float32), else as float32 GEMMs, no faster
    (docs/results.md)."""
    from fastbert.execution import cpu
    from fastbert.kernels import cpu_int8, cpu_int8_product
    from fastbert.kernels.cpu_library import INT8_DOT_FLAGS

    flags = cpu.cpu_flags()
    units = [f for f in INT8_DOT_FLAGS if f in flags]
    build = None if units else cpu_int8_product.chosen()
    if build is not None:
        return (
            "quantize int8: no int8 dot-product instructions here: its integer products run "
            f"on {cpu_int8_product.REGISTERS[build]}'s byte multiply-adds, exact, "
            f"{BYTE_PRODUCT_SPEED[build]} (docs/cpu.md); lossy, where float32 (the default) "
            "is exact"
        )
    if not units:
        return (
            "quantize int8: no int8 dot-product instructions here: its integer products run "
            "as exact float32 GEMMs, no faster than float32, and lossy; keep float32 "
            "(docs/cpu.md)"
        )
    where = f"int8 dot products on {units[0]}"
    compiled = cpu_int8.available()
    where += ", quantisation and epilogue compiled" if compiled else ", PyTorch's passes"
    bf16 = cpu.native_bf16()
    if bf16 is None:
        return f"quantize int8: {where}; faster than float32 and lossy (docs/cpu.md)"
    if compiled and bf16 != "amx_bf16":
        return (
            f"quantize int8: {where}; dtype bfloat16 (native here) has a fifth of its mean "
            "error, int8 the speed where measured (docs/precisions.md, docs/results.md)"
        )
    faster = (
        "on AMX it ran as fast as int8 or faster"
        if bf16 == "amx_bf16"
        else "as fast or faster without the compiled passes"
    )
    return (
        f"quantize int8: {where}; prefer dtype bfloat16 (native here): {faster}, with a fifth of "
        "the mean error (docs/precisions.md, docs/results.md)"
    )


def run(args: argparse.Namespace) -> int:
    rows = report()
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0
