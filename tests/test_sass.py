"""The SASS read-out (tests/sass.py) on hand-written listings: parsing, loops, classes,
occupancy. The compiled kernels' SASS is checked in tests/test_compile.py."""

from __future__ import annotations

import pytest

from tests import sass

# A kernel with a wait loop inside its main loop and an epilogue loop after it, in the format
# of `cuobjdump -sass` (encodings on the second line of each instruction).
LISTING = """
        code for sm_90a
                Function : _kernel
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
                                                                          /* 0x000fe20000000800 */
        /*0010*/                   S2R R38, SR_TID.X ;                    /* 0x0000000000267919 */
        /*0020*/                   LDGSTS.E.BYPASS.128 [R39], desc[UR32][R6.64], !P1 ;
        /*0030*/                   UIADD3 UR4, UR4, 0x1, URZ ;
        /*0040*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [UR4], R2 ;
        /*0050*/              @!P0 BRA 0x40 ;
        /*0060*/                   HGMMA.64x64x16.F32 R24, gdesc[UR8], RZ, !UPT ;
        /*0070*/                   HGMMA.64x64x16.F32 R24, gdesc[UR12], R24, gsb0 ;
        /*0080*/                   FFMA R2, R3, R4, R2 ;
        /*0090*/                   MUFU.EX2 R5, R5 ;
        /*00a0*/                   FSEL R6, R6, -INF , P1 ;
        /*00b0*/                   LDG.E.U8 R7, desc[UR4][R8.64] ;
        /*00c0*/                   NOP ;
        /*00d0*/                   F2FP.F16.F32.PACK_AB R9, R10, R11 ;
        /*00e0*/              @!P2 BRA 0x30 ;
        /*00f0*/                   STL [R1], R2 ;
        /*0100*/                   FFMA R2, R3, R4, R2 ;
        /*0110*/              @P3 BRA 0xf0 ;
        /*0120*/                   EXIT ;
        /*0130*/                   BRA 0x130;
"""


def test_parse_reads_addresses_opcodes_and_operands() -> None:
    instructions = sass.parse(LISTING)
    assert len(instructions) == 20
    first, hgmma = instructions[0], instructions[6]
    assert (first.addr, first.opcode, first.operands) == (0, "LDC", "R1, c[0x0][0x28]")
    assert (hgmma.opcode, hgmma.stem, hgmma.klass) == ("HGMMA.64x64x16.F32", "HGMMA", "mma")
    assert instructions[5].branch_target() == 0x40
    assert hgmma.branch_target() is None


def test_main_loop_is_the_innermost_backward_branch_holding_the_mmas() -> None:
    loop = sass.main_loop(sass.parse(LISTING))
    assert (loop.start, loop.end) == (0x30, 0xE0)
    assert loop.size == 11  # the NOP left out
    assert loop.counts() == {
        "mma": 2,
        "fp32 FFMA/FMUL/FADD/FMNMX": 1,
        "MUFU": 1,
        "int/address": 1,  # UIADD3 counts with IADD3
        "compare/select": 1,
        "load/store": 1,
        "barrier/sync": 1,
        "other": 3,  # F2FP and the two branches
    }


def test_main_loop_falls_back_to_ffma_and_to_none() -> None:
    without_mma = LISTING.replace("HGMMA.64x64x16.F32", "MOV")
    assert (sass.main_loop(sass.parse(without_mma)).start) == 0xF0  # the shortest FFMA loop
    assert sass.main_loop(sass.parse(without_mma.replace("FFMA", "FMUL"))) is None


def test_summary_counts_loads_spills_and_mma_shapes() -> None:
    summary = sass.summary(sass.parse(LISTING))
    assert summary["mma"] == {"HGMMA.64x64x16.F32": 2}
    assert summary["global_loads"] == {"LDG.E.U8": 1, "LDGSTS.E.BYPASS.128": 1}
    assert (summary["tma"], summary["cp_async"], summary["stl"], summary["ldl"]) == (0, 1, 1, 0)
    assert summary["loop"]["size"] == 11
    assert summary["mma_loop_sizes"] == [11]


def test_mma_loops_are_the_innermost_loops_holding_mmas() -> None:
    """A second MMA loop after the main loop counts; a loop around both does not."""
    second = """
        /*0140*/                   HGMMA.64x64x16.F32 R24, gdesc[UR8], RZ, !UPT ;
        /*0150*/                   FSEL R6, R6, -INF , P1 ;
        /*0160*/              @!P2 BRA 0x140 ;
        /*0170*/              @!P4 BRA 0x20 ;
"""
    listing = LISTING.replace("        /*0120*/                   EXIT ;\n", second)
    found = sass.mma_loops(sass.parse(listing))
    assert [(loop.start, loop.end, loop.size) for loop in found] == [
        (0x30, 0xE0, 11),
        (0x140, 0x160, 3),
    ]


@pytest.mark.parametrize(
    ("arch", "registers", "shared", "warps", "expected"),
    [
        (90, 128, 0, 4, 4),  # registers: 65536 / (128 x 128)
        (90, 255, 0, 8, 1),  # 256 x 32 x 8 = 65536
        (90, 32, 0, 4, 16),  # threads: 2048 / 128
        (90, 32, 65536, 4, 3),  # shared: 228 KB / (64 KB + 1 KB)
        (80, 32, 65536, 4, 2),  # shared: 164 KB / 65 KB
        (90, 16, 0, 1, 32),  # the 32-CTA limit
        (90, 90, 0, 4, 5),  # 90 registers allocate as 96
    ],
)
def test_ctas_per_sm(arch: int, registers: int, shared: int, warps: int, expected: int) -> None:
    assert sass.ctas_per_sm(arch, registers, shared, warps) == expected


def test_tile_normalised() -> None:
    assert sass.tile_normalised(500, 64, 64, 4) == 500
    assert sass.tile_normalised(500, 128, 64, 8) == 500
    assert sass.tile_normalised(800, 128, 128, 8) == 400


@pytest.mark.parametrize(
    "opcode, operands, moved",
    [
        ("BRA", "0x2a90", "0x2a80"),
        ("BRA.DIV", "UR4, 0x1c0", "UR4, 0x1b0"),
        ("BSSY", "B0, 0x4c00", "B0, 0x4bf0"),
        ("CALL.REL.NOINC", "0x2c40", "0x2c30"),
        ("RET.REL.NODEC", "R64 0x10", "R64 0x0"),
        ("WARPSYNC.COLLECTIVE", "R105, 0x7700", "R105, 0x76f0"),
        # Not relative code addresses: absolute ones, a lane mask, a constant bank's offsets,
        # an immediate.
        ("JMP", "0x2a90", "0x2a90"),
        ("CALL.ABS.NOINC", "0x2c40", "0x2c40"),
        ("WARPSYNC", "0xffffffff", "0xffffffff"),
        ("LDC", "R1, c[0x0][0x28]", "R1, c[0x0][0x28]"),
        ("UIADD3", "UR4, UR4, 0x1, URZ", "UR4, UR4, 0x1, URZ"),
    ],
)
def test_moving_an_instruction_moves_the_code_address_it_names(
    opcode: str, operands: str, moved: str
) -> None:
    """What disassemble_many does to each kernel read at an offset into one run (here 0x10)."""
    instruction = sass.Instruction(0x1010, opcode, operands).moved(0x10)
    assert instruction == sass.Instruction(0x1000, opcode, moved)
