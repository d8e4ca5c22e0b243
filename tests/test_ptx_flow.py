"""tests/ptx_flow.py on made-up PTX: which registers depend on an argument, the loops' back
edges, and whether an MMA loop's exit test reads the argument."""

from __future__ import annotations

import pytest

from tests import ptx_flow

# A kernel of three arguments: param_0 (a bound), param_1 (a row stride), param_2 (unused).
# The MMA loop runs from lo = param_0 - 1 while its counter is below hi = param_0 + 64; the
# stride only moves a pointer, stored through st (no register written); an inner loop without
# an MMA counts to a constant.
PTX = """
.visible .entry kernel(
	.param .u32 kernel_param_0,
	.param .u32 kernel_param_1,
	.param .u32 kernel_param_2
)
{
	ld.param.b32 	%r1, [kernel_param_0];
	ld.param.b32 	%r2, [kernel_param_1];
	sub.s32 	%r3, %r1, 1;       // lo
	add.s32 	%r4, %r1, 64;      // hi
	mov.b32 	%r5, %r3;
	mov.b64 	%rd1, 0;
$L__BB0_1:
	wgmma.fence.sync.aligned;
	wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%r10,%r11}, {%r12,%r13}, %rd2, 0, 1, 1, 0;
	mul.wide.s32 	%rd3, %r2, 4;
	add.s64 	%rd1, %rd1, %rd3;
	st.global.b32 	[%rd1], %r5;
	mov.b32 	%r20, 0;
$L__BB0_2:
	add.s32 	%r20, %r20, 1;
	setp.lt.s32 	%p2, %r20, 8;
	@%p2 bra 	$L__BB0_2;
	add.s32 	%r5, %r5, 32;
	setp.lt.s32 	%p1, %r5, %r4;
	@%p1 bra 	$L__BB0_1;
	@%p1 mov.b32 	%r30, 7;
	ret;
}
"""


def test_parse_reads_writes_and_labels() -> None:
    instructions, labels = ptx_flow.parse(PTX)
    assert set(labels) == {"$L__BB0_1", "$L__BB0_2"}
    by_op = {i.opcode: i for i in instructions}
    assert by_op["sub.s32"].writes == ("%r3",) and by_op["sub.s32"].reads == ("%r1",)
    mma = by_op["wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16"]
    assert mma.writes == ("%r10", "%r11") and "%rd2" in mma.reads
    store = by_op["st.global.b32"]
    assert store.writes == () and set(store.reads) == {"%rd1", "%r5"}
    guarded = [i for i in instructions if i.opcode == "mov.b32" and i.guard]
    assert guarded[0].guard == "%p1" and "%p1" in guarded[0].reads


def test_taint_follows_registers_guards_and_loop_carried_values() -> None:
    instructions, _ = ptx_flow.parse(PTX)
    bound = ptx_flow.tainted(instructions, 0)
    # lo, hi, the induction variable (written twice), the exit test, and what it guards.
    assert {"%r1", "%r3", "%r4", "%r5", "%p1", "%r30"} <= bound
    assert not {"%r2", "%rd1", "%rd3", "%p2", "%r20"} & bound
    stride = ptx_flow.tainted(instructions, 1)
    assert {"%r2", "%rd3", "%rd1"} <= stride and "%p1" not in stride
    assert ptx_flow.tainted(instructions, 2) == set()


def test_loops_and_the_mma_loops_exit_test() -> None:
    instructions, labels = ptx_flow.parse(PTX)
    edges = ptx_flow.loops(instructions, labels)
    assert [(e.guard, e.mma) for e in edges] == [("%p2", False), ("%p1", True)]
    assert [e.guard for e in ptx_flow.innermost_mma_loops(instructions, labels)] == ["%p1"]
    assert ptx_flow.mma_loop_bounds_read(PTX, 0) == [True]
    assert ptx_flow.mma_loop_bounds_read(PTX, 1) == [False]
    assert ptx_flow.mma_loop_bounds_read(PTX.replace("wgmma.mma_async", "add.s32"), 0) == []


def test_param_index_skips_constexpr_arguments() -> None:
    names = ["Q", "HEAD_DIM", "stride", "window", "BLOCK_M"]
    signature = {"Q": "*fp16", "HEAD_DIM": "constexpr", "stride": "i32", "window": "i32"}
    assert ptx_flow.param_index(names, signature, "window") == 2
    with pytest.raises(ValueError, match="HEAD_DIM"):
        ptx_flow.param_index(names, signature, "HEAD_DIM")
