"""Which values of a compiled kernel depend on one of its arguments, read from its PTX.

:func:`param_index` maps an argument name to its ``.param`` slot (Triton passes the arguments
that are not constexpr, in order); :func:`tainted` follows, to a fixed point, every register
written by an instruction that reads the argument or a register already depending on it (a
guarded instruction also depends on its guard predicate; a register written twice, as a loop's
induction variable is, depends on it if either write does). :func:`loops` finds each backward
branch (the loops' back edges) with its guard predicate and whether its body holds a
warpgroup / warp MMA, and :func:`innermost_mma_loops` those holding an MMA with no such loop
inside them. So "the exit test of the MMA loop depends on ``window``" is a fact read
off the code that will run, not off the source.

The dependence followed is data flow through registers only: a value that passes through
shared memory (a reduction across warps) or that depends on an argument only through which
branch ran is not followed. A positive answer is therefore a data path from the argument to
the value; a negative one is no proof of independence. The tests check both on made-up PTX.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_REGISTER = re.compile(r"%[a-z]+[0-9]+")
_LABEL = re.compile(r"^(\$[A-Za-z0-9_]+):")
_INSTRUCTION = re.compile(
    r"^(?:@(?P<guard>!?%[a-z]+[0-9]+)\s+)?(?P<op>[a-z][\w.]*)\s*(?P<args>.*);"
)
# Instructions whose first operand is read (an address or a target), not written.
_NO_DESTINATION = ("st.", "cp.async", "red.", "bra", "bar.", "wgmma.fence", "wgmma.commit")
_MMA = ("wgmma.mma_async", "mma.sync")


@dataclass(frozen=True)
class Instruction:
    """One PTX instruction: its line index, opcode, guard register (or None), the registers
    it writes and those it reads (the guard included)."""

    line: int
    opcode: str
    guard: str | None
    writes: tuple[str, ...]
    reads: tuple[str, ...]
    operands: str


@dataclass(frozen=True)
class BackEdge:
    """A branch to a label above it: the loop runs from ``start`` to ``end`` (line indices)
    while ``guard`` holds (None: unconditional); ``mma``: the body holds an MMA."""

    start: int
    end: int
    guard: str | None
    mma: bool


def _split_operands(args: str) -> tuple[str, str]:
    """(first operand, the rest) at the first comma outside braces."""
    depth = 0
    for i, char in enumerate(args):
        depth += char == "{"
        depth -= char == "}"
        if char == "," and depth == 0:
            return args[:i], args[i + 1 :]
    return args, ""


def parse(ptx: str) -> tuple[list[Instruction], dict[str, int]]:
    """The instructions of a one-kernel PTX listing and the line index of each label."""
    instructions, labels = [], {}
    for index, raw in enumerate(ptx.splitlines()):
        line = raw.split("//", 1)[0].strip()
        label = _LABEL.match(line)
        if label:
            labels[label.group(1)] = index
            continue
        match = _INSTRUCTION.match(line)
        if not match or match["op"].startswith("."):
            continue
        op, args = match["op"], match["args"]
        guard = match["guard"].lstrip("!") if match["guard"] else None
        if op.startswith(_NO_DESTINATION):
            first, rest = "", args
        else:
            first, rest = _split_operands(args)
        writes = tuple(_REGISTER.findall(first))
        reads = tuple(_REGISTER.findall(rest)) + ((guard,) if guard else ())
        instructions.append(Instruction(index, op, guard, writes, reads, args))
    return instructions, labels


def param_index(arg_names: list[str], signature: dict[str, str], name: str) -> int:
    """The ``.param`` slot of argument ``name``: its place among the arguments whose
    signature is not ``constexpr`` (Triton drops those from the kernel's parameters)."""
    runtime = [n for n in arg_names if signature.get(n, "constexpr") != "constexpr"]
    if name not in runtime:
        raise ValueError(f"{name!r} is not a runtime argument of the kernel: {runtime}")
    return runtime.index(name)


def tainted(instructions: list[Instruction], param: int) -> set[str]:
    """Every register whose value may depend on ``.param`` slot ``param``."""
    suffix = f"_param_{param}]"
    found = {
        w
        for i in instructions
        if i.opcode.startswith("ld.param") and suffix in i.operands
        for w in i.writes
    }
    changed = True
    while changed:
        changed = False
        for i in instructions:
            if any(r in found for r in i.reads):
                new = set(i.writes) - found
                if new:
                    found |= new
                    changed = True
    return found


def loops(instructions: list[Instruction], labels: dict[str, int]) -> list[BackEdge]:
    """Every backward branch, innermost (shortest) first."""
    edges = []
    for i in instructions:
        if not i.opcode.startswith("bra"):
            continue
        target = labels.get(i.operands.strip())
        if target is None or target > i.line:
            continue
        body = [j for j in instructions if target <= j.line <= i.line]
        mma = any(j.opcode.startswith(_MMA) for j in body)
        edges.append(BackEdge(target, i.line, i.guard, mma))
    return sorted(edges, key=lambda e: e.end - e.start)


def innermost_mma_loops(instructions: list[Instruction], labels: dict[str, int]) -> list[BackEdge]:
    """The loops holding an MMA with no such loop inside them, in address order (as
    tests/sass.py's ``mma_loops`` picks them in the SASS)."""
    holding = [e for e in loops(instructions, labels) if e.mma]
    return sorted(
        (
            e
            for e in holding
            if not any(o is not e and e.start <= o.start and o.end <= e.end for o in holding)
        ),
        key=lambda e: e.start,
    )


def mma_loop_bounds_read(ptx: str, param: int) -> list[bool]:
    """For each innermost loop holding an MMA, in address order: whether its exit test (the
    back edge's guard) has a data path from ``.param`` slot ``param``."""
    instructions, labels = parse(ptx)
    reached = tainted(instructions, param)
    return [e.guard in reached for e in innermost_mma_loops(instructions, labels)]
