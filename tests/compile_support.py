"""Ahead-of-time compile checks for every Triton kernel variant and autotune config.

``python -m tests.compile_support [op ...]`` compiles each case listed in
``tests/compile_cases/<op>.py`` (a module-level ``CASES`` list of :class:`CompileCase`) for sm_80
and sm_90 with ``triton.compile`` and a ``GPUTarget`` — no GPU needed, the Triton wheel ships ptxas
— in one process per core, and prints one JSON line per (case, arch), in the cases' order: shared
memory, registers, spills, the tensor-core instruction family in the PTX (``mma``, see
:func:`mma_instruction`), or the compile error, and the resident CTAs per SM those registers and
that shared memory allow (``ctas_per_sm``). Cases that declare ``dtype`` and ``block_m`` (the matrix
kernels) carry them (and ``num_warps`` and ``block_n``) into the report, so that a test can tell
which cases should run on warpgroup MMA, and get their SASS read out (``sass``, see
:func:`tests.sass.summary`: MMA opcodes and shapes, TMA / cp.async loads, spills, the main loop's
instruction mix), a batch of cases' by one disassembler run per target
(:func:`tests.sass.disassemble_many`). It must run in a process WITHOUT ``TRITON_INTERPRET`` set;
``tests/test_compile.py`` starts it that way.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import multiprocessing
import os
import pkgutil
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from fastbert.bench.machine import cores
from fastbert.kernels.launch import FUSED
from tests import sass

ARCHS = (80, 90)
# Largest dynamic shared memory per block (bytes): A100 (sm_80) and H100 (sm_90).
SHARED_MEMORY_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
# The element types the cases compile, with their sizes in bytes (what ``keep`` predicates take).
ELEMENT_SIZES = {"fp16": 2, "bf16": 2, "fp32": 4}
DTYPES = tuple(ELEMENT_SIZES)
# At most this many compiling processes (each holds Triton's compiler, a few hundred MB).
MAX_PROCESSES = 8


@dataclass
class CompileCase:
    """One kernel specialisation: the jit function, its argument types and constexpr values."""

    name: str
    fn: object
    signature: dict[str, str]
    constexprs: dict[str, object]
    num_warps: int = 4
    num_stages: int = 2
    archs: tuple[int, ...] = field(default=ARCHS)
    # Integer arguments that are multiples of 16 in the launches that matter (BERT's N and K).
    aligned_ints: tuple[str, ...] = ()
    # For the tensor-core check of matrix kernels: the element type of the tl.dot operands
    # ("fp16", "bf16", "fp32") and the row tile (the M of the MMA).
    dtype: str | None = None
    block_m: int | None = None
    # The column tile of the main loop's iteration (attention: BLOCK_N keys), for the report.
    block_n: int | None = None
    # The register cap a config states (triton.Config's maxnreg), None for ptxas's own choice.
    maxnreg: int | None = None
    # The compile options the launcher passes: every launcher names its fusion choice
    # (fastbert/kernels/launch.py's FUSED, or UNFUSED for the row kernels' forwards).
    options: dict[str, object] = field(default_factory=lambda: dict(FUSED))

    @classmethod
    def tuned(
        cls,
        config: object,
        name: str,
        fn: object,
        signature: dict[str, str],
        constexprs: dict[str, object],
        dtype: str,
        **fields: object,
    ) -> CompileCase:
        """A case of an autotuned matrix kernel in ``config`` (a triton.Config): launched with
        its warps, stages and register cap, its BLOCK_M and BLOCK_N the case's row and column
        tiles unless ``fields`` set them otherwise."""
        tiles = {"block_m": config.kwargs["BLOCK_M"], "block_n": config.kwargs["BLOCK_N"]}
        launch = {
            "num_warps": config.num_warps,
            "num_stages": config.num_stages,
            "maxnreg": config.maxnreg,
        }
        return cls(name, fn, signature, constexprs, dtype=dtype, **launch, **{**tiles, **fields})


def row_tiles(block_size: Callable[[int], int], largest: int) -> list[int]:
    """Every row tile a row-wise launcher can choose: ``block_size`` of each power of two up to
    ``largest`` (the launcher's MAX_HIDDEN or MAX_KEYS), ascending."""
    return sorted({block_size(2**i) for i in range(largest.bit_length())})


# wgmma.mma_async only (not wgmma.fence / commit_group / wait_group); mma.sync as a whole word.
_MMA_PATTERNS = (
    ("wgmma", re.compile(r"\bwgmma\.mma_async\b")),
    ("mma.sync", re.compile(r"(?<![\w.])mma\.sync\b")),
)


def mma_instruction(ptx: str) -> str:
    """The matrix instruction family in ``ptx``: "wgmma", "mma.sync", "wgmma+mma.sync" or "none".

    ``wgmma`` (warpgroup MMA) is Hopper's tensor-core path; ``mma.sync`` is Ampere's, which
    sm_90 still runs, more slowly. "none": no tensor-core instruction (an FMA loop, e.g.
    float32 with IEEE products). "wgmma+mma.sync": some dots took each path.
    """
    found = [name for name, pattern in _MMA_PATTERNS if pattern.search(ptx)]
    return "+".join(found) or "none"


# A float32 division a plain ``/`` compiles to: ``div.full`` (2 units in the last place) or
# ``div.approx``; ``tl.math.div_rn`` compiles to the IEEE ``div.rn``.
_APPROXIMATE_DIVISION = re.compile(r"\bdiv\.(full|approx)(\.ftz)?\.f32\b")
# A fused multiply-add whose addend is +-1.5 * 2**23 (0f4B400000 / 0fCB400000): a rounding to an
# integer by adding and removing that constant, fused with the product before it.
_CONTRACTED_ROUNDING = re.compile(r"\bfma\.rn(\.ftz)?\.f32\s[^;]*,\s*0f[4C]B400000\s*;")


# Float32 arithmetic the compiler fused, or may still fuse: an FMA, or a product or sum without
# a rounding modifier (ptxas contracts mul.f32 and add.f32 into FFMA; mul.rn.f32 it leaves).
_FUSABLE = re.compile(r"(?<![\w.])(fma\.rn(\.ftz)?\.f32|(mul|add|sub)(\.ftz)?\.f32)\b")


def fusable_operations(ptx: str) -> int:
    """How many float32 operations in ``ptx`` are, or may become, fused multiply-adds."""
    return len(_FUSABLE.findall(ptx))


def approximate_divisions(ptx: str) -> int:
    """How many approximate float32 divisions ``ptx`` holds (none may: the kernels divide as
    PyTorch does, correctly rounded)."""
    return len(_APPROXIMATE_DIVISION.findall(ptx))


def contracted_roundings(ptx: str) -> int:
    """How many roundings by 1.5 * 2**23 in ``ptx`` were fused with the product they round
    (which then rounds the exact product, not its float32 value as the reference does)."""
    return len(_CONTRACTED_ROUNDING.findall(ptx))


# A tt.dot in Triton's IR and its accumulator (the third operand); a constant that is zero.
_DOT = re.compile(r"= tt\.dot %[\w.#]+, %[\w.#]+, (%[\w.#]+)")
_ZERO = re.compile(r"(%[\w.#]+) = arith\.constant dense<0(?:\.0+e\+00)?>")


def chained_dots(ttir: str) -> int:
    """How many tl.dot in ``ttir`` (Triton's IR) add their products into a running sum: an
    accumulator that is not a constant zero. A dot into zero makes a K tile's partial sum,
    added apart."""
    zeros = set(_ZERO.findall(ttir))
    return sum(acc not in zeros for acc in _DOT.findall(ttir))


def _usage_from_log(text: str) -> dict[str, int] | None:
    """Registers and spill bytes from a ptxas ``-v`` log; None when it holds none."""
    regs = re.search(r"Used (\d+) registers", text)
    if regs is None:
        return None
    stores = re.search(r"(\d+) bytes spill stores", text)
    loads = re.search(r"(\d+) bytes spill loads", text)
    return {
        "registers": int(regs.group(1)),
        "spill_stores": int(stores.group(1)) if stores else 0,
        "spill_loads": int(loads.group(1)) if loads else 0,
    }


def alignment_hints(case: CompileCase) -> dict[tuple[int, ...], list]:
    """The 16-divisibility the JIT infers at launch: pointers, strides and ``aligned_ints``.

    At a real launch Triton marks every 16-byte-aligned pointer and every integer divisible by
    16 (BERT's hidden sizes, hence its strides, are). Without these hints the compiler can
    neither vectorise the loads nor pipeline them through shared memory (a K-masked load is
    pipelined only when K is known to be a multiple of 16), so the registers, spills and
    shared memory it reports would not be those of the kernel that runs.
    """
    names = list(case.fn.arg_names)
    aligned = [
        name
        for name, kind in case.signature.items()
        if kind.startswith("*")
        or (kind in ("i32", "i64") and (name.startswith("stride_") or name in case.aligned_ints))
    ]
    return {(names.index(name),): [["tt.divisibility", 16]] for name in aligned}


def compile_kernel(case: CompileCase, arch: int) -> tuple[object, str]:
    """``case`` compiled for ``arch`` by ``triton.compile`` (its ``asm`` holds "ptx" and
    "cubin"), and what ptxas printed with ``-v`` while Triton built the cubin; raises what the
    compiler raises."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    src = ASTSource(
        fn=case.fn,
        signature=case.signature,
        constexprs=case.constexprs,
        attrs=alignment_hints(case),
    )
    options = {"num_warps": case.num_warps, "num_stages": case.num_stages}
    if case.maxnreg is not None:
        options["maxnreg"] = case.maxnreg
    options.update(case.options)
    log = io.StringIO()
    # Triton runs ptxas with -v and prints its log when asked: reading it there saves a
    # second ptxas run per case (a fifth of the compile checks' time). Always compiled, never
    # taken from Triton's cache: the report must come from Triton's own ptxas run, with its
    # flags (3.9 passes --regAllocOptLevel=2, which spills where a plain ptxas run does not).
    with knobs.nvidia.scope(), knobs.compilation.scope(), contextlib.redirect_stdout(log):
        knobs.nvidia.dump_ptxas_log = True
        knobs.compilation.always_compile = True
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)
    return kernel, log.getvalue()


def _compiled_report(case: CompileCase, arch: int, keep_ptx: bool) -> tuple[dict, bytes]:
    """``case`` compiled for ``arch``: its report without the SASS, and its cubin (empty when
    the compile failed: the report's ``error`` says why)."""
    report: dict[str, object] = {"case": case.name, "arch": arch}
    if case.dtype is not None:
        report.update(
            dtype=case.dtype, block_m=case.block_m, block_n=case.block_n, num_warps=case.num_warps
        )
    try:
        kernel, ptxas_log = compile_kernel(case, arch)
        report["shared"] = int(kernel.metadata.shared)
        report["cubin"] = len(kernel.asm["cubin"]) > 0
        report["mma"] = mma_instruction(kernel.asm["ptx"])
        report["approximate_divisions"] = approximate_divisions(kernel.asm["ptx"])
        report["contracted_roundings"] = contracted_roundings(kernel.asm["ptx"])
        report["fusable_operations"] = fusable_operations(kernel.asm["ptx"])
        report["chained_dots"] = chained_dots(kernel.asm["ttir"])
        usage = _usage_from_log(ptxas_log)
        if usage is None:
            raise RuntimeError("ptxas printed no register report (-v) while Triton compiled")
        report.update(usage)
        report["ctas_per_sm"] = sass.ctas_per_sm(
            arch, report["registers"], report["shared"], case.num_warps
        )
        if keep_ptx:
            report["ptx"] = kernel.asm["ptx"]
        return report, kernel.asm["cubin"]
    except Exception as exc:  # report every failure, keep compiling the rest
        report["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        return report, b""


def compile_cases(
    pairs: list[tuple[CompileCase, int]], keep_ptx: bool = False
) -> list[dict[str, object]]:
    """A report for each (case, arch) of ``pairs``, in order (``error`` set where it failed);
    the PTX under "ptx" when ``keep_ptx``. The cases that declare a ``dtype`` get their SASS
    read out, by one disassembler run per target for all of them."""
    compiled = [_compiled_report(case, arch, keep_ptx) for case, arch in pairs]
    for arch in ARCHS:
        chosen = [
            (report, cubin)
            for (case, case_arch), (report, cubin) in zip(pairs, compiled)
            if case_arch == arch and case.dtype is not None and "error" not in report
        ]
        if not chosen:
            continue
        reports, cubins = zip(*chosen)
        try:
            for report, instructions in zip(reports, sass.disassemble_many(list(cubins), arch)):
                report["sass"] = sass.summary(instructions)
        except Exception as exc:
            for report in reports:
                report["error"] = f"reading the SASS: {type(exc).__name__}: {exc}"[:2000]
    return [report for report, _ in compiled]


def compile_case(case: CompileCase, arch: int, keep_ptx: bool = False) -> dict[str, object]:
    """Compile ``case`` for ``arch``; return a report (``error`` set when it failed), with
    the PTX under "ptx" when ``keep_ptx``."""
    return compile_cases([(case, arch)], keep_ptx)[0]


def load_cases(ops: list[str]) -> list[CompileCase]:
    from tests import compile_cases

    names = ops or [m.name for m in pkgutil.iter_modules(compile_cases.__path__)]
    cases: list[CompileCase] = []
    for name in names:
        cases.extend(importlib.import_module(f"tests.compile_cases.{name}").CASES)
    return cases


# The (case, arch) pairs of this run, for the compiling processes forked from it (a case holds
# its jit function, which is not sent between processes: each forked process has the list).
_PAIRS: list[tuple[CompileCase, int]] = []


# Pairs compiled by one process at a time: their SASS is read by one disassembler run per target
# (~0.3 s each to start), and the last batch keeps one core busy while the others finish.
BATCH = 12


def _report_lines(batch: range) -> list[str]:
    return [json.dumps(report) for report in compile_cases([_PAIRS[i] for i in batch])]


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("compile checks must run without TRITON_INTERPRET=1", file=sys.stderr)
        return 2
    _PAIRS[:] = [(case, arch) for case in load_cases(argv) for arch in case.archs]
    # One compiling process per core: an op's cases compiled one after another held one core
    # for minutes while the others sat idle at the end of a test run. The reports come out in
    # the cases' order.
    processes = max(1, min(cores(), MAX_PROCESSES, len(_PAIRS)))
    # Every compile's cache key starts from a hash of Triton's own sources, computed once per
    # process (~1.6 s): computed here, the forked processes inherit it.
    from triton.runtime.cache import triton_key

    triton_key()
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        batches = [range(i, min(i + BATCH, len(_PAIRS))) for i in range(0, len(_PAIRS), BATCH)]
        for lines in pool.imap(_report_lines, batches):
            print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
