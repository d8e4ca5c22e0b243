"""What this machine's CPU can run natively: the instruction-set flags Linux reports in
/proc/cpuinfo that decide whether a lossy precision is fast here (bfloat16 needs AVX512_BF16
or AMX; int8 GEMMs use VNNI where present)."""

from __future__ import annotations

from fastbert.kernels.cpu_library import cpu_flags

# The flags that matter for fastbert's precisions, in the order they are reported.
RELEVANT = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16", "amx_int8")
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def relevant_flags() -> list[str]:
    """Which of :data:`RELEVANT` this CPU has."""
    flags = cpu_flags()
    return [flag for flag in RELEVANT if flag in flags]


def native_bf16() -> str | None:
    """The flag that makes bfloat16 native here (AMX first), or None: then bfloat16 runs, with
    the same accuracy, on emulated instructions (often slower than float32)."""
    flags = cpu_flags()
    return next((flag for flag in BF16_FLAGS if flag in flags), None)
