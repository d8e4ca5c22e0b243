"""Read-out of the machine code (SASS) of a compiled kernel: facts the compiler produced.

:func:`disassemble` runs ``cuobjdump -sass`` (shipped in the Triton wheel) on a cubin;
:func:`parse` turns its listing into :class:`Instruction` records; :func:`disassemble_many` reads
many cubins' instructions in one ``nvdisasm`` run, as :func:`parse` reads each one's listing;
:func:`main_loop` finds the kernel's main loop from the control flow alone (the innermost
backward branch whose body holds the tensor-core MMAs, or, with none, the FFMAs of an FMA-loop
product); :func:`summary` gathers what the compile checks and the static report need: the MMA
instructions and their shapes, TMA (UTMALDG) and cp.async (LDGSTS) loads, load widths,
local-memory traffic (STL / LDL: register spills) and the main loop's instruction mix by class.
:func:`ctas_per_sm` is the occupancy arithmetic of the targets' published limits.
"""

from __future__ import annotations

import bisect
import collections
import os
import re
import struct
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
# Opcodes whose last hexadecimal operand is an address relative to the instruction, which the
# disassembler prints as an address in the kernel's code: a branch's or relative call's target,
# a convergence barrier's or a collective warp sync's resume point, a relative return's base
# (the kernel's start). A plain WARPSYNC's operand is a lane mask; an absolute address (JMP,
# CALL.ABS) needs a relocation in a cubin, which machine_code refuses.
_CODE_ADDRESS = re.compile(r"(BRA|BSSY|CALL\.REL|RET\.REL|WARPSYNC\.COLLECTIVE)(\.|$)")


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

    def moved(self, offset: int) -> Instruction:
        """This instruction ``offset`` bytes earlier, with the code address it names, if any."""
        operands = self.operands
        if _CODE_ADDRESS.match(self.opcode):
            *_, last = _TARGET.finditer(operands)
            rebased = f"0x{int(last.group(1), 16) - offset:x}"
            operands = operands[: last.start()] + rebased + operands[last.end() :]
        return Instruction(self.addr - offset, self.opcode, operands)


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


def _listing(tool: str, options: list[str], data: bytes) -> str:
    """What the Triton wheel's ``tool`` prints when given ``options`` and a file of ``data``."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "input")
        with open(path, "wb") as f:
            f.write(data)
        proc = subprocess.run(
            [_tool(tool), *options, path], capture_output=True, text=True, check=True
        )
    return proc.stdout


def disassemble(cubin: bytes) -> str:
    """The SASS listing of ``cubin`` as ``cuobjdump -sass`` prints it."""
    return _listing("cuobjdump", ["-sass"], cubin)


# nvdisasm's name for the instruction set of each target Triton compiles for (sm_90a on Hopper:
# the warpgroup MMAs are not in plain sm_90).
RAW_INSTRUCTION_SETS = {80: "SM80", 90: "SM90a"}
# ELF64 section headers: sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size.
_SECTION_HEADER = struct.Struct("<IIQQQQ")
_RELOCATIONS = (4, 9)  # SHT_RELA, SHT_REL


def machine_code(cubin: bytes) -> bytes | None:
    """The instructions of a one-kernel ``cubin`` (an ELF64 file): its only ``.text.`` section,
    or None when it has several, or relocations into its code (an address a linked listing
    would name, which raw instructions cannot)."""
    shoff = struct.unpack_from("<Q", cubin, 0x28)[0]
    entry_size, count, names_index = struct.unpack_from("<HHH", cubin, 0x3A)
    sections = [_SECTION_HEADER.unpack_from(cubin, shoff + i * entry_size) for i in range(count)]
    names_offset = sections[names_index][4]

    def name(section: tuple) -> str:
        start = names_offset + section[0]
        return cubin[start : cubin.index(b"\0", start)].decode()

    texts = [s for s in sections if name(s).startswith(".text.")]
    relocated = [s for s in sections if s[1] in _RELOCATIONS and ".text." in name(s) and s[5]]
    if len(texts) != 1 or relocated:
        return None
    offset, size = texts[0][4], texts[0][5]
    return cubin[offset : offset + size]


def disassemble_many(cubins: list[bytes], arch: int) -> list[list[Instruction]]:
    """Each cubin's instructions as :func:`parse` reads its ``cuobjdump -sass`` listing (one
    kernel per cubin, compiled for ``arch``: 80 or 90), from one ``nvdisasm`` run over their
    code laid end to end, each kernel's addresses (and the code addresses its instructions
    name) then counted from its own start. The tool takes ~0.3 s of CPU to start and ~0.02 s
    a kernel: one run per cubin cost the compile checks ~0.4 s a kernel. A cubin whose code
    cannot be read raw (:func:`machine_code`) is disassembled on its own."""
    codes = [machine_code(cubin) for cubin in cubins]
    readable = [i for i, code in enumerate(codes) if code]
    starts = [sum(len(codes[j]) for j in readable[:k]) for k in range(len(readable))]
    found: list[list[Instruction]] = [[] for _ in cubins]
    if readable:
        code = b"".join(codes[i] for i in readable)
        listing = _listing("nvdisasm", ["--binary", RAW_INSTRUCTION_SETS[arch]], code)
        for instruction in parse(listing):
            k = bisect.bisect_right(starts, instruction.addr) - 1
            found[readable[k]].append(instruction.moved(starts[k]))
    for i, code in enumerate(codes):
        if code is None:
            found[i] = parse(disassemble(cubins[i]))
        elif len(found[i]) != len(code) // 16:
            raise RuntimeError(
                f"nvdisasm read {len(found[i])} instructions of kernel {i}, "
                f"its code holds {len(code) // 16}"
            )
    return found


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
