"""Every Triton kernel variant and autotune config compiles for sm_80 and sm_90 (no GPU needed).

The compile runs in a child process without TRITON_INTERPRET (the interpreter replaces
@triton.jit and cannot compile), once per op: the reports are cached and every check below reads
them. Shared memory must fit the target; register spills are printed (run pytest with -s or see
the captured output) so a regression shows in CI logs. The matrix kernels must use the tensor-core
instructions of each target: warpgroup MMA (wgmma) on sm_90 wherever the tile allows it,
mma.sync on sm_80. Their SASS (read out in the same child process, see tests/sass.py) must hold
HGMMA on sm_90 wherever the tile allows it, no register spills (STL) in 16-bit, and an attention
main loop within its instruction budget.
"""

from __future__ import annotations

import ast
import collections
import functools
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import compile_cases
from tests.compile_support import (
    SHARED_MEMORY_LIMIT,
    approximate_divisions,
    chained_dots,
    contracted_roundings,
    fusable_operations,
    mma_instruction,
)
from tests.sass import tile_normalised

ROOT = Path(__file__).resolve().parent.parent
OPS = sorted(m.name for m in pkgutil.iter_modules(compile_cases.__path__))


def _matrix(op: str) -> bool:
    """The case module's MATRIX: whether its kernels multiply tiles with tl.dot. Read from the
    source: the case modules build their cases for a GPU, so this process (the interpreter's)
    does not import them."""
    tree = ast.parse((ROOT / "tests" / "compile_cases" / f"{op}.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and [t.id for t in node.targets] == ["MATRIX"]:
            return ast.literal_eval(node.value)
    raise AssertionError(f"tests/compile_cases/{op}.py sets no MATRIX = True / False")


# Ops whose kernels multiply tiles with tl.dot (their cases declare dtype and block_m), and the
# row-wise ones (one row per program, no tl.dot).
MMA_OPS = tuple(op for op in OPS if _matrix(op))
ROW_OPS = tuple(op for op in OPS if op not in MMA_OPS)
SIXTEEN_BIT = ("fp16", "bf16")
# Operand types that run on tensor cores: the 16-bit floats, int8 (linear_int8) and float8 e4m3
# (linear_fp8).
TENSOR_CORE_DTYPES = (*SIXTEEN_BIT, "int8", "fp8")
# Ops compiled for sm_90 only: float8 e4m3 has no tensor cores on sm_80.
SM90_ONLY_OPS = ("linear_fp8",)
# wgmma runs on a warpgroup (4 warps) with an M of 64 per warpgroup.
WGMMA_MIN_BLOCK_M = 64
WARPGROUP = 4
# Issue slots per 64x64 key tile (4 warps) of the attention kernel's loops, D=64 fp16 on sm_90,
# 64x64 tile, in each variant: today's counts plus ~5%, so that only a regression fails (see
# benchmarks/results/static-sm90.md for the counts and the instruction mix). The main loop
# (whole tiles of real keys: no mask, no bounds) is 304 masked, 304 unmasked, 311 padding-free;
# the longest other loop (a partial tile, or, with a mask that is not a prefix of real keys,
# the step that reads the mask) is 535 masked, 421 unmasked, 416 padding-free.
ATTENTION_BUDGET_CASES = tuple(
    f"attention[fp16 D=64 64x64 s3 w4 mask={mask} varlen={varlen}]"
    for mask, varlen in ((1, 0), (0, 0), (0, 1))
)
ATTENTION_LOOP_BUDGET = 320
ATTENTION_OTHER_LOOP_BUDGET = 562


def _compiling_python(*args: str) -> subprocess.CompletedProcess:
    """``python *args`` run from the repository root without TRITON_INTERPRET (the interpreter
    replaces @triton.jit and cannot compile), its output captured."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )


@functools.cache
def _compile_run(op: str) -> tuple[int, str, str]:
    """Compile ``op``'s cases once per test session: (returncode, stdout, stderr)."""
    proc = _compiling_python("-m", "tests.compile_support", op)
    return proc.returncode, proc.stdout, proc.stderr


def _compile_reports(op: str) -> list[dict]:
    returncode, stdout, stderr = _compile_run(op)
    assert returncode == 0, stderr[-4000:]
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


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


def expected_mma(report: dict) -> tuple[str, ...] | None:
    """The instruction families a 16-bit or int8 case may use on its target; None: not
    checked.

    sm_80: mma.sync. sm_90: wgmma when BLOCK_M >= 64 and num_warps is a multiple of 4 (a
    warpgroup per 64 rows); smaller tiles may only take mma.sync (or wgmma), never no MMA.
    float32 (IEEE products as an FMA loop, or tf32 mma) is recorded, not checked.
    """
    if report["dtype"] not in TENSOR_CORE_DTYPES:
        return None
    if report["arch"] == 80:
        return ("mma.sync",)
    if report["block_m"] >= WGMMA_MIN_BLOCK_M and report["num_warps"] % WARPGROUP == 0:
        return ("wgmma",)
    return ("wgmma", "mma.sync")


@pytest.mark.parametrize("op", MMA_OPS)
def test_matrix_kernels_use_each_targets_tensor_cores(op: str) -> None:
    reports = _compile_reports(op)
    undeclared = [r["case"] for r in reports if r.get("dtype") is None or not r.get("block_m")]
    assert not undeclared, f"cases without dtype / block_m: {undeclared}"
    counts = collections.Counter((r["arch"], r["dtype"], r.get("mma")) for r in reports)
    print(f"\n{op}: MMA instruction per (arch, dtype): compiles")
    for (arch, dtype, mma), n in sorted(counts.items(), key=str):
        print(f"  sm_{arch} {dtype} {mma}: {n}")
    checked = [(r, expected_mma(r)) for r in reports if expected_mma(r) is not None]
    assert any(allowed == ("wgmma",) for _, allowed in checked), f"{op}: no wgmma-sized case"
    if op in SM90_ONLY_OPS:
        assert all(r["arch"] == 90 for r in reports), f"{op}: compiled for a target before sm_90"
    else:
        assert any(r["arch"] == 80 for r, _ in checked), f"{op}: no tensor-core sm_80 case"
    wrong = [
        f"{r['case']} sm_{r['arch']}: {r.get('mma', r.get('error'))}, expected {' or '.join(ok)}"
        for r, ok in checked
        if r.get("mma") not in ok
    ]
    assert not wrong, "\n".join(wrong)


def test_mma_instruction_reads_ptx() -> None:
    wgmma = (
        "wgmma.fence.sync.aligned;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {%f1}, %rd1, %rd2, p, 1, 1, 0, 1;\n"
        "wgmma.commit_group.sync.aligned;\n"
    )
    mma = "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1}, {%r1}, {%r2}, {%f1};\n"
    assert mma_instruction(wgmma) == "wgmma"
    assert mma_instruction(mma) == "mma.sync"
    assert mma_instruction(wgmma + mma) == "wgmma+mma.sync"
    assert mma_instruction("fma.rn.f32 %f1, %f2, %f3, %f1;\nwgmma.fence.sync.aligned;\n") == "none"


# Variants that may divide approximately, where the IEEE division spilled registers: dropout's
# scale 1 / (1 - p) (a random mask's), the GELU-tanh's sigmoid (beside its approximate exp),
# and the means of the LayerNorm backward (its own and the embeddings'), in the cases named
# with these flags.
APPROXIMATE_DIVISION_FLAGS = (
    "dropout=1",
    "drop=1",
    " act=2",
    "dact=2",
    "layer_norm_bwd[",
    "embeddings_bwd[",
)


@pytest.mark.parametrize("op", OPS)
def test_divisions_and_roundings_are_the_references(op: str) -> None:
    """Every float32 division is IEEE (``div.rn``: a plain ``/`` compiles to the approximate
    ``div.full``, 2 units in the last place, which put a LayerNorm of rows at 1000 +- 1 off by
    1.2e-4) but in the variants APPROXIMATE_DIVISION_FLAGS name, and no rounding by
    1.5 * 2**23 is fused with the product it rounds (the row quantisation then rounded the
    exact product, one int8 code off the reference's)."""
    wrong = [
        f"{r['case']} sm_{r['arch']}: {r['approximate_divisions']} approximate divisions, "
        f"{r['contracted_roundings']} contracted roundings"
        for r in _compile_reports(op)
        if r["contracted_roundings"]
        or (
            r["approximate_divisions"]
            and not any(flag in r["case"] for flag in APPROXIMATE_DIVISION_FLAGS)
        )
    ]
    assert not wrong, "\n".join(wrong)


def test_float32_linear_sums_each_k_tile_apart() -> None:
    """The float32 linear's products (forward, gated, input gradients) go into a zero
    accumulator each K tile, that tile's sum then added: summed in one chain over K, a
    single-row BERT-base projection on an H200 was 5.9e-6 off where PyTorch's was 6.4e-7.
    Triton folds ``acc + tl.dot(a, b)`` back into one chain, so this reads the compiled IR."""
    reports = [r for r in _compile_reports("linear") if r["dtype"] == "fp32"]
    assert reports
    chained = [f"{r['case']} sm_{r['arch']}" for r in reports if r["chained_dots"]]
    assert not chained, "float32 dots into a running sum:\n" + "\n".join(chained)


@pytest.mark.parametrize("op", ROW_OPS)
def test_row_kernels_round_every_operation(op: str) -> None:
    """The row kernels' forwards compile without fused multiply-adds (fastbert/kernels/launch.py's
    UNFUSED): each product and sum rounds as written, as in the reference and the
    interpreter, and in every variant alike (fused where the compiler chose, a LayerNorm that
    also saved its statistics gave other bits than one that did not). The backwards
    (``_bwd`` cases) keep the compiler's fusions."""
    fused = [
        f"{r['case']} sm_{r['arch']}: {r['fusable_operations']}"
        for r in _compile_reports(op)
        if r["fusable_operations"] and "_bwd[" not in r["case"]
    ]
    assert not fused, "float32 operations a compiler may fuse:\n" + "\n".join(fused)


def _launched_kernel(call: ast.Call) -> str | None:
    """The name of the kernel a call launches, ``<name>_kernel[grid](...)`` or
    ``launch_tuned(<name>_kernel, grid, ...)``; None for any other call."""
    func = call.func
    if isinstance(func, ast.Subscript) and isinstance(func.value, ast.Name):
        name = func.value.id
    elif isinstance(func, ast.Name) and func.id == "launch_tuned" and call.args:
        name = getattr(call.args[0], "id", "")
    else:
        return None
    return name if name.endswith("_kernel") else None


def test_every_launch_names_its_fusion_choice() -> None:
    """Each Triton launch in fastbert/kernels/ passes ``**FUSED`` or ``**UNFUSED`` (its launch.py):
    left unsaid, Triton takes TRITON_DEFAULT_FP_FUSION's choice, which Triton 3.9 warns about
    and 3.10 turns off, so a kernel's numerics would follow the caller's environment."""
    launches = [
        (path.name, node, kernel)
        for path in sorted((ROOT / "fastbert" / "kernels").glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call) and (kernel := _launched_kernel(node))
    ]
    unsaid = [
        f"{name}:{node.lineno} {kernel}"
        for name, node, kernel in launches
        if not {
            k.value.id for k in node.keywords if k.arg is None and isinstance(k.value, ast.Name)
        }
        & {"FUSED", "UNFUSED"}
    ]
    assert not unsaid, "launches without **FUSED or **UNFUSED:\n" + "\n".join(unsaid)
    assert len(launches) >= 13, f"found {len(launches)} launches: has the launch syntax changed?"


def test_chained_dots_reads_triton_ir() -> None:
    ir = (
        "%cst_2 = arith.constant dense<0.000000e+00> : tensor<16x64xf32>\n"
        "%c0 = arith.constant dense<0> : tensor<16x64xi32>\n"
        "%acc_63 = tt.dot %a_59, %b_62, %cst_2 : tensor<16x32xf32> * tensor<32x64xf32>\n"
        "%acc_64 = tt.dot %a_59, %b_62, %c0 : tensor<16x32xi8> * tensor<32x64xi8>\n"
    )
    assert chained_dots(ir) == 0
    assert chained_dots(ir + "%acc_65 = tt.dot %a_59, %b_62, %acc_63 : tensor<16x32xf32>\n") == 1
    assert (
        chained_dots(
            "%cst = arith.constant dense<1.000000e+00> : tensor<2xf32>\n"
            "%d = tt.dot %a, %b, %cst : tensor<2xf32>\n"
        )
        == 1
    )


def test_arithmetic_readers_read_ptx() -> None:
    assert approximate_divisions("div.full.f32 %r3, %r1, %r2;\ndiv.rn.f32 %r4, %r1, %r2;") == 1
    assert approximate_divisions("div.approx.ftz.f32 %r3, %r1, %r2;") == 1
    assert approximate_divisions("div.rn.f32 %r3, %r1, %r2;\ndiv.s32 %r5, %r6, %r7;") == 0
    fused = "fma.rn.f32 %r36, %r3, %r35, 0f4B400000;\nadd.f32 %r37, %r36, 0fCB400000;"
    assert contracted_roundings(fused) == 1
    plain = "mul.f32 %r36, %r3, %r35;\nadd.f32 %r37, %r36, 0f4B400000;"
    assert contracted_roundings(plain) == 0
    assert contracted_roundings("fma.rn.f32 %r1, %r2, 0f4B400000, %r3;") == 0
    assert fusable_operations(fused) == 2  # the FMA, and the add.f32 after it
    assert fusable_operations("mul.rn.f32 %r1, %r2, %r3;\nadd.rn.f32 %r4, %r1, %r5;") == 0
    assert fusable_operations("mul.ftz.f32 %r1, %r2, %r3;\nsub.f32 %r4, %r1, %r5;") == 2
    assert fusable_operations("atom.global.gpu.acq_rel.add.f32 %r1, [%rd1], %r2;") == 0


def _sixteen_bit_mma_reports(op: str) -> list[dict]:
    """The tensor-core cases (16-bit, or int8) of ``op``, each with its SASS read out."""
    reports = [r for r in _compile_reports(op) if r.get("dtype") in TENSOR_CORE_DTYPES]
    assert reports and all("sass" in r for r in reports), f"{op}: no SASS read out"
    return reports


# The MMA opcodes each operand type's cases must show: (sm_90 warpgroup, sm_80 warp); float8
# e4m3 is compiled for sm_90 only.
SASS_MMA = {
    "fp16": ("HGMMA", "HMMA"),
    "bf16": ("HGMMA", "HMMA"),
    "int8": ("IGMMA", "IMMA"),
    "fp8": ("QGMMA", None),
}


@pytest.mark.parametrize("op", MMA_OPS)
def test_sixteen_bit_wgmma_sized_tiles_run_hgmma_on_sm90(op: str) -> None:
    """fp16 / bf16: HGMMA on sm_90 (wgmma-sized tiles), HMMA on sm_80; int8: IGMMA and IMMA
    (the integer tensor cores: ``IGMMA.64x128x32.S8.S8``, ``IMMA.16832.S8.S8.SAT``); float8
    e4m3: QGMMA on sm_90 (``QGMMA.64x128x32.F32.E4M3.E4M3``)."""
    reports = [r for r in _sixteen_bit_mma_reports(op) if expected_mma(r) == ("wgmma",)]
    sm90 = [r for r in reports if r["arch"] == 90]
    assert sm90, f"{op}: no 16-bit sm_90 case with BLOCK_M >= {WGMMA_MIN_BLOCK_M}"
    lost = [
        r["case"]
        for r in sm90
        if not any(k.startswith(SASS_MMA[r["dtype"]][0] + ".") for k in r["sass"]["mma"])
    ]
    assert not lost, f"no warpgroup MMA (HGMMA / IGMMA / QGMMA) in the SASS of: {lost}"
    ampere = [
        r["case"]
        for r in reports
        if r["arch"] == 80
        and not any(k.startswith(SASS_MMA[r["dtype"]][1] + ".") for k in r["sass"]["mma"])
    ]
    assert not ampere, f"no HMMA / IMMA in the sm_80 SASS of: {ampere}"


# 16-bit cases that spill today, on sm_80 only: (case, arch) -> ptxas spill-store bytes. They
# may not spill more; every other 16-bit case (all of sm_90) may not spill at all. The padding-
# free variant's grid-stride loop and the D=32 128x128 tile run out of sm_80's registers by a
# word or two (ptxas: 255 and 128 registers). The bf16 32x64 dx product with the GELU
# derivative holds one word on the stack on sm_90: one STL, which ptxas reports as 4 bytes
# under Triton 3.9's flags (--regAllocOptLevel=2) and as none under Triton 3.6's. The bytes are
# ptxas's report of Triton's own build of the cubin (tests/compile_support.py).
KNOWN_SPILLS = {
    ("linear[bf16 32x64x32 s4 w4 dx dact=1]", 90): 4,
    **{
        (f"attention[{dtype} D={d} {tile} varlen={varlen}]", 80): spilled
        for dtype in SIXTEEN_BIT
        for d, tile, varlen, spilled in (
            (32, "128x128 s2 w8 mask=0", 0, 8),
            (80, "64x32 s4 w4 mask=0", 1, 4),
            (96, "64x32 s4 w4 mask=0", 1, 4),
            (128, "64x32 s4 w4 mask=0", 1, 4),
        )
    },
}


def _spills_too_much(report: dict) -> bool:
    known = KNOWN_SPILLS.get((report["case"], report["arch"]))
    if known is None:
        return bool(report["sass"]["stl"] or report["spill_stores"])
    return report["spill_stores"] > known


def _spill_line(report: dict) -> str:
    """A case's spills as ptxas reports them, with its local stores and loads where its SASS
    was read out."""
    sass = report.get("sass")
    local = f"{sass['stl']} STL, {sass['ldl']} LDL, " if sass else ""
    return (
        f"{report['case']} sm_{report['arch']}: {local}{report['spill_stores']} B spill "
        f"stores, {report['spill_loads']} B spill loads"
    )


@pytest.mark.parametrize("op", MMA_OPS)
def test_sixteen_bit_cases_do_not_spill(op: str) -> None:
    spilled = [_spill_line(r) for r in _sixteen_bit_mma_reports(op) if _spills_too_much(r)]
    assert not spilled, "\n".join(spilled)


# The row-wise ops' 16-bit cases are named "<kernel>[fp16 ..." or "<kernel>[bf16 ...".


@pytest.mark.parametrize("op", ROW_OPS)
def test_sixteen_bit_row_kernels_do_not_spill(op: str) -> None:
    sixteen_bit = [
        r for r in _compile_reports(op) if any(f"[{t} " in r["case"] for t in SIXTEEN_BIT)
    ]
    spilled = [_spill_line(r) for r in sixteen_bit if r["spill_stores"] or r["spill_loads"]]
    assert not spilled, "\n".join(spilled)


@pytest.mark.parametrize("case", ATTENTION_BUDGET_CASES)
def test_attention_loops_within_their_instruction_budgets(case: str) -> None:
    (report,) = [r for r in _compile_reports("attention") if r["case"] == case and r["arch"] == 90]
    loop = report["sass"]["loop"]
    assert loop is not None, f"{case}: no main loop found in the SASS"
    tile = (report["block_m"], report["block_n"], report["num_warps"])
    per_tile = tile_normalised(loop["size"], *tile)
    others = [tile_normalised(size, *tile) for size in report["sass"]["mma_loop_sizes"]]
    print(f"\n{case} sm_90: {per_tile:.0f} instructions per 64x64 tile (main loop)")
    print(f"  by class: {loop['classes']}; every MMA loop: {[round(n) for n in others]}")
    assert per_tile <= ATTENTION_LOOP_BUDGET, (
        f"attention main loop: {per_tile:.0f} instructions per 64x64 tile, budget "
        f"{ATTENTION_LOOP_BUDGET}; mix: {loop['classes']}"
    )
    assert max(others) <= ATTENTION_OTHER_LOOP_BUDGET, (
        f"attention MMA loops: {[round(n) for n in others]} instructions per 64x64 tile, "
        f"budget {ATTENTION_OTHER_LOOP_BUDGET} for the longest"
    )


def test_persistent_linear_configs_load_by_tma_on_sm90() -> None:
    """The persistent configs read their operands through TMA descriptors: UTMALDG in the
    main loop of every persistent case, no cp.async (LDGSTS) left for the operands."""
    persistent = [r for r in _compile_reports("linear") if "persistent=" in r["case"]]
    assert persistent, "no persistent linear case"
    assert {r["arch"] for r in persistent} == {90}
    wrong = [
        f"{r['case']}: {r['sass']['loop']['global_loads']}, {r['sass']['cp_async']} LDGSTS"
        for r in persistent
        if not any(op.startswith("UTMALDG") for op in r["sass"]["loop"]["global_loads"])
        or r["sass"]["cp_async"]
    ]
    assert not wrong, "\n".join(wrong)


# Compiles matrix kernels for each target and reads their SASS both ways: each cubin on its own
# with cuobjdump, and all of a target's in one nvdisasm run (what the compile checks use), in
# both orders, so that each kernel is read at an offset into the run. Between them they name
# code addresses in branches, calls, returns and convergence barriers (and, with Triton 3.9,
# a collective warp sync: attention_backward's case 40 on sm_90; tests/test_sass.py moves each
# form by hand).
_DISASSEMBLY_CHECK = """
import json
from tests import sass
from tests.compile_cases import attention, attention_backward, linear
from tests.compile_support import compile_kernel
cases = [attention.CASES[0], linear.CASES[0], attention_backward.CASES[40]]
out = []
for arch in (80, 90):
    cubins = [compile_kernel(case, arch)[0].asm["cubin"] for case in cases]
    alone = [sass.parse(sass.disassemble(cubin)) for cubin in cubins]
    for together, expected in (
        (sass.disassemble_many(cubins, arch), alone),
        (sass.disassemble_many(cubins[::-1], arch), alone[::-1]),
    ):
        instructions = [i for listing in expected for i in listing]
        out.append({
            "arch": arch,
            "sizes": [len(listing) for listing in expected],
            "opcodes": sorted({i.stem for i in instructions} | {i.opcode for i in instructions}),
            "same": together == expected,
        })
print(json.dumps(out))
"""


def test_one_disassembler_run_reads_each_kernel_as_cuobjdump_does() -> None:
    proc = _compiling_python("-c", _DISASSEMBLY_CHECK)
    assert proc.returncode == 0, proc.stderr[-4000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [run["arch"] for run in runs] == [80, 80, 90, 90]
    for run in runs:
        assert len(set(run["sizes"])) == 3, run["sizes"]
        assert {"BRA", "BSSY", "CALL", "RET"} <= set(run["opcodes"]), run["opcodes"]
        assert run["same"], f"sm_{run['arch']}: the batched read differs from cuobjdump's"
