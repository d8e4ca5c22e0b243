"""Compile cases for the float8 e4m3 variant (QUANT = 2) of fastbert/kernels/fused_linear.py's GEMM:
e4m3 x and weight, float32 accumulation, the dequantise / bias / GELU / residual epilogue, on
the configs and epilogues of the int8 cases (tests/compile_cases/linear_int8.py: ``keep``
treats both one-byte formats alike), with float16 outputs and on one config float32 outputs.

The FP8 tensor cores start with sm_89 (Ada); the cases compile for sm_90 (Hopper) only, where
tests/test_compile.py checks the FP8 warpgroup MMA in the SASS
(``QGMMA.64x128x32.F32.E4M3.E4M3``); sm_80 has no e4m3 MMA and the launcher refuses it.
"""

from __future__ import annotations

from tests.compile_cases import linear_int8

MATRIX = True

FP8_ARCHS = linear_int8.FORMATS["fp8"][2]

CASES = linear_int8.cases("fp8")
