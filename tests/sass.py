"""Read-out of the machine code (SASS) of a compiled kernel: facts the compiler produced.

:func:`disassemble` runs ``cuobjdump -sass`` (shipped in the Triton wheel) on a cubin;
:func:`parse` turns its listing into :class:`Instruction` records; :func:`main_loop` finds the
kernel's main loop from the control flow alone (the innermost backward branch whose body holds
the tensor-core MMAs, or, with none, the FFMAs of an FMA-loop product); :func:`summary` gathers
what the compile checks and the static report need: the MMA instructions and their shapes, TMA
(UTMALDG) and cp.async (LDGSTS) loads, load widths, local-memory traffic (STL / LDL: register
spills) and the main loop's instruction mix by class. :func:`ctas_per_sm` is the occupancy
arithmetic of the targets' published limits.
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

# Instruction classes of the main-loop mix, by opcode stem (the opcode before its first '.';
# the uniform-datapath twins, e.g. UIADD3, count with their vector forms). Moves, conversions,
# shuffles and constant loads are "other".
CLASSES = {
    # Half-precision and (IGMMA, IMMA) int8 MMAs: warpgroup (sm_90) and warp (sm_80) forms;
    # QGMMA: sm_90's float8 warpgroup MMA.
    "mma": ("HGMMA", "HMMA", "IGMMA", "IMMA", "QGMMA"),
    "fp32 FFMA/FMUL/FADD/FMNMX": ("FFMA", "FMUL", "FADD", "FMNMX", "FCHK"),
    "MUFU": ("MUFU",),
    "int/address": (
        "ISETP",
        "IADD3",
        "IADD",
        "IMAD",
        "LOP3",
        "LEA",
        "SHF",
        "IABS",
        "IMNMX",
        "VIMNMX",
        "SGXT",
        "PLOP3",
        "POPC",
        "FLO",
        "BMSK",
        "IMUL",
        "VIADD",
        "PRMT",
    ),
    "compare/select": ("FSETP", "FSEL", "SEL", "HSETP2"),
    "load/store": (
        "LDG",
        "STG",
        "LDS",
        "STS",
        "LDSM",
        "STSM",
        "LDGSTS",
        "UTMALDG",
        "UTMASTG",
        "LD",
        "ST",
        "LDL",
        "STL",
        "ATOM",
        "ATOMS",
        "RED",
    ),
    "barrier/sync": (
        "BAR",
        "BSYNC",
        "BSSY",
        "DEPBAR",
        "LDGDEPBAR",
        "WARPGROUP",
        "MEMBAR",
        "SYNCS",
        "WARPSYNC",
        "FENCE",
        "ERRBAR",
        "CCTL",
        "ARRIVES",
        "VOTE",
        "VOTEU",
    ),
}
OTHER = "other"
_STEM_CLASS = {stem: name for name, stems in CLASSES.items() for stem in stems}
BRANCHES = ("BRA", "BRX", "JMP", "JMX")

# /*0770*/   @!P1 LDGSTS.E.BYPASS.128 [R39], desc[UR32][R6.64], !P1 ;
_LINE = re.compile(
    r"^\s*/\*(?P<addr>[0-9a-f]+)\*/\s+(?P<pred>@!?U?P[T0-9]+\s+)?"
    r"(?P<op>[A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)\s*(?P<args>[^;]*);"
)
_TARGET = re.compile(r"0x([0-9a-f]+)")


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: byte address, full opcode (with modifiers) and operand text."""

    addr: int
    opcode: str
    operands: str

    @property
    def stem(self) -> str:
        """The opcode without modifiers: "HGMMA" for "HGMMA.64x64x16.F32"."""
        return self.opcode.split(".", 1)[0]

    @property
    def klass(self) -> str:
        """The instruction's class in :data:`CLASSES`, or :data:`OTHER`."""
        stem = self.stem
        if stem not in _STEM_CLASS and stem.startswith("U"):
            stem = stem[1:]
        return _STEM_CLASS.get(stem, OTHER)

    def branch_target(self) -> int | None:
        """The absolute target address of a direct branch, None for anything else."""
        if self.stem not in BRANCHES:
            return None
        match = _TARGET.search(self.operands)
        return int(match.group(1), 16) if match else None


@dataclass(frozen=True)
class Loop:
    """Instructions ``body`` from a backward branch's target up to and including the branch."""

    start: int
    end: int
    body: tuple[Instruction, ...]

    def counts(self) -> dict[str, int]:
        """Instructions per class (NOPs, the scheduler's padding, left out)."""
        counted = collections.Counter(i.klass for i in self.body if i.stem != "NOP")
        return {name: counted.get(name, 0) for name in (*CLASSES, OTHER)}

    @property
    def size(self) -> int:
        """Instructions one iteration issues per thread (NOPs left out)."""
        return sum(1 for i in self.body if i.stem != "NOP")


def _tool(name: str) -> str:
    import triton

    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{name} not found at {path} (it ships in the Triton wheel)")
    return path


def disassemble(cubin: bytes) -> str:
    """The SASS listing of ``cubin`` as ``cuobjdump -sass`` prints it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        proc = subprocess.run(
            [_tool("cuobjdump"), "-sass", path], capture_output=True, text=True, check=True
        )
    return proc.stdout


def parse(sass: str) -> list[Instruction]:
    """The instructions of a one-kernel SASS listing, in address order."""
    found = []
    for line in sass.splitlines():
        match = _LINE.match(line)
        if match:
            found.append(Instruction(int(match["addr"], 16), match["op"], match["args"].strip()))
    return found


def loops(instructions: list[Instruction]) -> list[Loop]:
    """Every backward branch's loop, innermost (shortest) first."""
    found = []
    for branch in instructions:
        target = branch.branch_target()
        if target is not None and target <= branch.addr:
            body = tuple(i for i in instructions if target <= i.addr <= branch.addr)
            found.append(Loop(target, branch.addr, body))
    return sorted(found, key=lambda loop: loop.end - loop.start)


def main_loop(instructions: list[Instruction]) -> Loop | None:
    """The innermost loop holding the kernel's MMAs (HGMMA / HMMA), or, without any, its FFMAs;
    None for a kernel with no such loop (e.g. a one-pass LayerNorm)."""
    candidates = loops(instructions)
    for marker in ("mma", "fp32 FFMA/FMUL/FADD/FMNMX"):
        stems = CLASSES["mma"] if marker == "mma" else ("FFMA",)
        for loop in candidates:
            if any(i.stem in stems for i in loop.body):
                return loop
    return None


def mma_loops(instructions: list[Instruction]) -> list[Loop]:
    """Every innermost loop holding MMAs (none of the others nested in it), in address order:
    e.g. one per key-tile path of the attention kernel (whole tiles, bounded, masked)."""
    holding = [loop for loop in loops(instructions) if any(i.klass == "mma" for i in loop.body)]
    return sorted(
        (
            loop
            for loop in holding
            if not any(
                other is not loop and loop.start <= other.start and other.end <= loop.end
                for other in holding
            )
        ),
        key=lambda loop: loop.start,
    )


def _opcode_counts(instructions: list[Instruction], stems: tuple[str, ...]) -> dict[str, int]:
    return dict(
        sorted(collections.Counter(i.opcode for i in instructions if i.stem in stems).items())
    )


GLOBAL_LOADS = ("LDG", "LDGSTS", "UTMALDG")


def summary(instructions: list[Instruction]) -> dict[str, object]:
    """What the checks and the report read from a kernel's SASS (JSON-serialisable).

    ``mma``: MMA opcodes with their counts (e.g. {"HGMMA.64x64x16.F32": 8}); ``global_loads``:
    global-load opcodes (width in the suffix: LDG.E.128 = 16 bytes per thread) with counts;
    ``tma`` / ``cp_async``: UTMALDG / LDGSTS counts; ``stl`` / ``ldl``: local stores / loads
    (register spills); ``loop``: the main loop's address range, size and class counts, or None;
    ``mma_loop_sizes``: the size of every innermost MMA loop (:func:`mma_loops`), in address
    order.
    """
    stems = collections.Counter(i.stem for i in instructions)
    loop = main_loop(instructions)
    return {
        "mma": _opcode_counts(instructions, CLASSES["mma"]),
        "global_loads": _opcode_counts(instructions, GLOBAL_LOADS),
        "tma": stems["UTMALDG"],
        "cp_async": stems["LDGSTS"],
        "stl": stems["STL"],
        "ldl": stems["LDL"],
        "instructions": len(instructions),
        "mma_loop_sizes": [loop.size for loop in mma_loops(instructions)],
        "loop": None
        if loop is None
        else {
            "start": loop.start,
            "end": loop.end,
            "size": loop.size,
            "classes": loop.counts(),
            "mma": _opcode_counts(list(loop.body), CLASSES["mma"]),
            "global_loads": _opcode_counts(list(loop.body), GLOBAL_LOADS),
        },
    }


# Per-SM limits: registers, shared memory per SM (the largest carve-out), threads, resident CTAs.
SM_LIMITS = {
    80: {"registers": 65536, "shared": 164 * 1024, "threads": 2048, "ctas": 32},
    90: {"registers": 65536, "shared": 228 * 1024, "threads": 2048, "ctas": 32},
}
# Shared memory the driver reserves per resident CTA (sm_80 and later).
RESERVED_SHARED_PER_CTA = 1024
# Registers are allocated per warp in units of 256 (8 per thread).
REGISTER_ALLOCATION_UNIT = 256


def ctas_per_sm(arch: int, registers: int, shared: int, num_warps: int) -> int:
    """Resident CTAs per SM for a kernel of ``registers`` per thread, ``shared`` bytes of shared
    memory per CTA and ``num_warps`` warps: the least of the register, shared-memory, thread
    and CTA limits of ``arch`` (80 or 90)."""
    limits = SM_LIMITS[arch]
    unit = REGISTER_ALLOCATION_UNIT
    per_warp = -(-registers * 32 // unit) * unit
    by_registers = limits["registers"] // (per_warp * num_warps)
    by_shared = limits["shared"] // (shared + RESERVED_SHARED_PER_CTA)
    by_threads = limits["threads"] // (32 * num_warps)
    return min(by_registers, by_shared, by_threads, limits["ctas"])


def tile_normalised(loop_size: int, block_m: int, block_n: int, num_warps: int) -> float:
    """Issue slots of one main-loop iteration per 64x64 tile, for 4 warps: ``loop_size``
    instructions per thread x ``num_warps`` warps, over the (BLOCK_M x BLOCK_N) / (64 x 64)
    tiles one iteration covers, over the 4 warps of a 64x64 program. Equal to ``loop_size``
    for a 64x64 tile on 4 warps."""
    return loop_size * (num_warps / 4) * (64 * 64) / (block_m * block_n)
