"""The import rule between fastbert's rooms, read from the source with ``ast`` (nothing is
imported, so the test runs in well under a second and needs neither a GPU nor transformers).

A room is a package folder (``fastbert.kernels`` is fastbert/kernels/);
ROOMS below is the one table of rooms and what each may import, and the module docstring of
fastbert/__init__.py shows it (``test_the_package_docstring_shows_the_room_table`` keeps the
two in step). Every import statement counts, at any depth, inside functions too; only the
bodies of ``if TYPE_CHECKING:`` are skipped. The rule:

- a room imports only its own modules and the rooms it may import (downward, or sideways
  among the jobs), and a room it may import only lazily only inside functions;
- modules inside the package do not import the façade (``import fastbert``,
  ``from fastbert import BertModel``): only commands and the cli do; a name is imported from
  the room that defines it (``from fastbert import kernels`` names a room, and is fine);
- no private name (``_name``: a module, or a name from one) is imported from another room;
- kernels import no outside package but torch, triton, numpy and the standard library (and
  of fastbert only its settings), fastbert.settings only the standard library, and
  fastbert.version nothing;
- no import cycle between modules (an import's edge goes to the module it names, or to the
  package ``__init__`` for a name the package defines; not to the parent packages that Python
  also initialises);
- tests, benchmarks and examples may import anything but the private names of kernels.

The checker returns one message per broken rule, each naming the importing file and line,
the imported module and the rule; the self-tests at the end feed it small made-up packages to
show it reports each kind of violation (and nothing in clean code).
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Outside code: it may import any room, but not the private names of kernels.
OUTSIDE_DIRS = ("tests", "benchmarks", "examples")

PACKAGE = "fastbert"  # as a room's module, the façade (fastbert/__init__.py) alone
STDLIB = "the standard library"


@dataclass(frozen=True)
class Room:
    name: str
    layer: int
    # Modules, each with everything under it (but PACKAGE is only fastbert/__init__.py).
    modules: tuple[str, ...]
    # Other rooms it may import anywhere, and those it may import only inside functions.
    may_import: tuple[str, ...] = ()
    lazily: tuple[str, ...] = ()
    # The only outside packages it may import (STDLIB: any of the standard library); None: any.
    packages: tuple[str, ...] | None = None


_BELOW_JOBS = ("integrations", "model", "execution", "kernels", "settings", "version")

# The rooms, top to bottom: the single source of the rule.
ROOMS = (
    Room(
        "commands",
        5,
        ("fastbert.commands", "fastbert.cli"),
        ("façade", "accuracy", "bench", "embedding", "serve", *_BELOW_JOBS),
    ),
    Room("façade", 5, (PACKAGE,), _BELOW_JOBS, lazily=("accuracy", "bench", "embedding")),
    Room("accuracy", 4, ("fastbert.accuracy",), ("bench", "embedding", "serve", *_BELOW_JOBS)),
    Room("bench", 4, ("fastbert.bench",), ("accuracy", "embedding", "serve", *_BELOW_JOBS)),
    Room("embedding", 4, ("fastbert.embedding",), ("accuracy", "bench", "serve", *_BELOW_JOBS)),
    Room("serve", 4, ("fastbert.serve",), ("accuracy", "bench", "embedding", *_BELOW_JOBS)),
    Room("integrations", 3, ("fastbert.integrations",), _BELOW_JOBS[1:]),
    Room("model", 2, ("fastbert.model",), _BELOW_JOBS[2:]),
    Room("execution", 1, ("fastbert.execution",), _BELOW_JOBS[3:]),
    Room(
        "kernels",
        0,
        ("fastbert.kernels",),
        ("settings",),
        packages=("torch", "triton", "numpy", STDLIB),
    ),
    Room("settings", 0, ("fastbert.settings",), packages=(STDLIB,)),
    Room("version", 0, ("fastbert.version",), packages=()),
)


def _one_row(a: Room, b: Room) -> bool:
    """Whether rooms ``a`` and ``b`` share a row of the table: one layer, each may import the
    other and both the same other rooms (the jobs), with nothing lazily and no outside-package
    rule."""
    plain = not (a.lazily or b.lazily) and a.packages is None and b.packages is None
    return plain and a.layer == b.layer and {a.name, *a.may_import} == {b.name, *b.may_import}


def _row_groups(rooms: tuple[Room, ...]) -> list[list[Room]]:
    """The table's rows, top to bottom: a room each, but consecutive rooms that share a row
    (:func:`_one_row`) in one."""
    groups: list[list[Room]] = []
    for room in rooms:
        if groups and _one_row(groups[-1][-1], room):
            groups[-1].append(room)
        else:
            groups.append([room])
    return groups


def _may_import_text(group: list[Room], order: list[str]) -> str:
    """The "may import" cell of a row: for rooms that share one, "each other" and the rest."""
    room, sharing = group[0], {r.name for r in group}
    allowed = [name for name in order if name in room.may_import and name not in sharing]
    text = ", ".join(["each other", *allowed] if group[1:] else allowed)
    if room.lazily:
        lazily = ", ".join(name for name in order if name in room.lazily)
        text += f"; {lazily} only inside functions"
    if room.packages is not None:
        names = [p for p in room.packages if p != STDLIB]
        if STDLIB in room.packages:
            names.append(STDLIB)
        outside = " and ".join([", ".join(names[:-1]), names[-1]] if names[1:] else names)
        only = f"only {outside}" if names else "nothing"
        text = f"{text}; outside fastbert {only}" if text else only
    return text


def render_rooms(rooms: tuple[Room, ...] = ROOMS) -> str:
    """The room table as fastbert/__init__.py's docstring shows it."""
    order = [room.name for room in rooms]
    lines = [f"    {'layer':<7}{'room':<14}{'modules':<33}may import"]
    for group in _row_groups(rooms):
        cells = textwrap.wrap(_may_import_text(group, order), 96 - 4 - 7 - 14 - 33) or [""]
        heads = [
            f"    {group[0].layer if i == 0 else '':<7}{room.name:<14}{', '.join(room.modules):<33}"
            for i, room in enumerate(group)
        ]
        for i in range(max(len(heads), len(cells))):
            head = heads[i] if i < len(heads) else " " * len(heads[0])
            lines.append((head + (cells[i] if i < len(cells) else "")).rstrip())
    return "\n".join(lines)


# --- reading the source ------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    name: str  # the dotted module name
    path: str  # relative to the repository, for messages
    text: str
    is_package: bool = False


@dataclass(frozen=True)
class Import:
    path: str
    line: int
    module: str  # absolute, relative imports resolved
    name: str | None  # ``from module import name``; None for ``import module``
    lazy: bool  # inside a function
    bound: str | None = None  # the local name it binds to a module it names (``as`` or not)

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def package_sources(root: Path = ROOT) -> dict[str, Source]:
    """Every module of the package, by dotted name."""
    sources = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        rel = str(path.relative_to(root))
        sources[name] = Source(name, rel, path.read_text(), is_package)
    return sources


def outside_sources(root: Path = ROOT) -> list[Source]:
    """The Python files of the tests, benchmarks and examples (outside the rooms)."""
    return [
        Source(str(path.relative_to(root)), str(path.relative_to(root)), path.read_text())
        for folder in OUTSIDE_DIRS
        for path in sorted((root / folder).rglob("*.py"))
    ]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(nodes: list[ast.AST], lazy: bool) -> Iterator[tuple[ast.AST, bool]]:
    """Every import statement under ``nodes``, with whether it is inside a function."""
    for node in nodes:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _statements(node.orelse, lazy)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, lazy
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _statements(list(ast.iter_child_nodes(node)), inner)


def imports_of(source: Source) -> Iterator[Import]:
    """The imports of one module: ``import a.b`` gives module a.b; ``from a import b, c`` gives
    (a, b) and (a, c); relative imports are resolved against the module's package."""
    tree = ast.parse(source.text, source.path)
    for node, lazy in _statements(tree.body, lazy=False):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(source.path, node.lineno, alias.name, None, lazy, alias.asname)
            continue
        module = node.module or ""
        if node.level:
            package = source.name.split(".")
            if not source.is_package:
                package = package[:-1]
            package = package[: len(package) - (node.level - 1)]
            module = ".".join(package + ([module] if module else []))
        for alias in node.names:
            bound = alias.asname or alias.name
            yield Import(source.path, node.lineno, module, alias.name, lazy, bound)


# --- the rule ----------------------------------------------------------------------------


def room_of(module: str, rooms: tuple[Room, ...] = ROOMS) -> Room | None:
    """The room whose module is ``module`` or the longest of its parents (PACKAGE: itself)."""
    best, length = None, -1
    for room in rooms:
        for prefix in room.modules:
            inside = module == prefix or (prefix != PACKAGE and module.startswith(prefix + "."))
            if inside and len(prefix) > length:
                best, length = room, len(prefix)
    return best


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _target(imp: Import, known: set[str]) -> tuple[str, str | None]:
    """The fastbert module an import loads, and the name it takes from it (None when the
    import names the module itself: ``import a.b``, or ``from a import b`` of module a.b)."""
    if imp.name is not None and f"{imp.module}.{imp.name}" in known:
        return f"{imp.module}.{imp.name}", None
    return imp.module, None if imp.name in (None, "*") else imp.name


def _imported(module: str, name: str | None) -> str:
    return module if name is None else f"{module} ({name})"


def _outside_ok(top: str, room: Room) -> bool:
    if room.packages is None or top == "__future__":
        return True
    return top in room.packages or (STDLIB in room.packages and top in sys.stdlib_module_names)


def check(sources: dict[str, Source], rooms: tuple[Room, ...] = ROOMS) -> list[str]:
    """Every way the modules in ``sources`` break the import rule, one message each."""
    known = set(sources)
    failures: list[str] = []
    edges: dict[str, dict[str, Import]] = {name: {} for name in sources}
    for name, source in sources.items():
        room = room_of(name, rooms)
        if room is None:
            failures.append(f"{source.path}: module {name} belongs to no room")
            continue
        for imp in imports_of(source):
            top = imp.module.split(".")[0]
            if top != PACKAGE:
                if not _outside_ok(top, room):
                    allowed = ", ".join(room.packages) or "nothing"
                    failures.append(
                        f"{imp.where}: imports {imp.module}: room {room.name} may import no "
                        f"outside package but {allowed}"
                    )
                continue
            module, taken = _target(imp, known)
            if module not in known:
                failures.append(f"{imp.where}: imports {module}, which is no module of the package")
                continue
            if module != name:
                edges[name].setdefault(module, imp)
            other = room_of(module, rooms)
            if other is None or other is room:
                continue  # its own room (a module in no room is reported on its own)
            what = f"{imp.where}: imports {_imported(module, taken)}"
            if other.name in room.may_import or (other.name in room.lazily and imp.lazy):
                pass
            elif other.name in room.lazily:
                failures.append(
                    f"{what}: room {room.name} imports room {other.name} only inside functions"
                )
            elif other.modules == (PACKAGE,):
                failures.append(
                    f"{what}: the façade, which only {_importers(other, rooms)} may import; "
                    f"import each name from the room that defines it"
                )
            else:
                allowed = [*room.may_import, *room.lazily]
                failures.append(
                    f"{what}: room {room.name} (layer {room.layer}) may not import room "
                    f"{other.name} (layer {other.layer}); it may import "
                    f"{', '.join(allowed) or 'no other room'}"
                )
            private = [p for p in module.split(".") if _private(p)]
            if taken is not None and _private(taken):
                private.append(taken)
            if private:
                failures.append(
                    f"{what}: private name {', '.join(private)} imported from another room "
                    f"({other.name})"
                )
        failures.extend(_private_attributes(source, room, known, rooms))
    failures.extend(_cycles(edges))
    return failures


def _private_attributes(
    source: Source, room: Room, known: set[str], rooms: tuple[Room, ...]
) -> list[str]:
    """Uses of a private name of another room's module through the module
    (``from fastbert.model import loading`` then ``loading._helper``)."""
    modules = {}
    for imp in imports_of(source):
        module = f"{imp.module}.{imp.name}" if imp.name is not None else imp.module
        if imp.bound is not None and module in known and room_of(module, rooms) is not room:
            modules[imp.bound] = module
    return [
        f"{source.path}:{node.lineno}: uses {modules[node.value.id]} ({node.attr}): private name "
        f"{node.attr} of another room ({room_of(modules[node.value.id], rooms).name})"
        for node in ast.walk(ast.parse(source.text, source.path))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and _private(node.attr)
    ]


def _importers(target: Room, rooms: tuple[Room, ...]) -> str:
    return ", ".join(r.name for r in rooms if target.name in (*r.may_import, *r.lazily))


def _cycles(edges: dict[str, dict[str, Import]]) -> list[str]:
    """One message per knot of modules that import each other (a strongly connected
    component of the import graph), showing one cycle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    knots: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            knot = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                knot.append(member)
                if member == node:
                    break
            if len(knot) > 1:
                knots.append(sorted(knot))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    failures = []
    for knot in sorted(knots):
        start, members = knot[0], set(knot)
        # Breadth first from start, within the knot, back to start: a shortest cycle.
        came_from: dict[str, str] = {}
        frontier, end = [start], None
        while frontier and end is None:
            following = []
            for node in frontier:
                for nxt in sorted(edges[node]):
                    if nxt == start:
                        end = node
                        break
                    if nxt in members and nxt not in came_from:
                        came_from[nxt] = node
                        following.append(nxt)
                if end is not None:
                    break
            frontier = following
        path = [end]
        while path[-1] != start:
            path.append(came_from[path[-1]])
        path.reverse()
        steps = [f"{edges[a][b].where}: imports {b}" for a, b in zip(path, [*path[1:], start])]
        more = (
            f" (a knot of {len(knot)} modules: {', '.join(knot)})" if len(knot) > len(path) else ""
        )
        failures.append(f"import cycle: {' -> '.join(steps)}{more}")
    return failures


def check_outside(outside: list[Source], known: set[str]) -> list[str]:
    """Private names of kernels imported by code outside the package."""
    kernels = room_of("fastbert.kernels")
    failures = []
    for source in outside:
        for imp in imports_of(source):
            if imp.module.split(".")[0] != PACKAGE:
                continue
            module, taken = _target(imp, known)
            if room_of(module) is not kernels:
                continue
            private = [p for p in module.split(".") if _private(p)]
            if taken is not None and _private(taken):
                private.append(taken)
            if private:
                failures.append(
                    f"{imp.where}: imports {_imported(module, taken)}: private name "
                    f"{', '.join(private)} of kernels imported outside the package"
                )
    return failures


def _report(failures: list[str]) -> str:
    return f"{len(failures)} import(s) break the rule:\n" + "\n".join(failures)


# --- the package -------------------------------------------------------------------------


def test_the_package_keeps_the_import_rule() -> None:
    failures = check(package_sources())
    assert not failures, _report(failures)


def test_outside_code_imports_no_private_names_of_kernels() -> None:
    failures = check_outside(outside_sources(), set(package_sources()))
    assert not failures, _report(failures)


def test_every_room_has_modules_and_points_downward() -> None:
    """The table itself: each room names modules of the tree, and may import only rooms
    below it or beside it (the sideways imports are those among the jobs, and the commands'
    of the façade)."""
    names = set(package_sources())
    by_name = {room.name: room for room in ROOMS}
    for room in ROOMS:
        for prefix in room.modules:
            assert any(room_of(n) is room and n.startswith(prefix) for n in names), prefix
        for other in (*room.may_import, *room.lazily):
            assert by_name[other].layer <= room.layer, (room.name, other)


def test_the_package_docstring_shows_the_room_table() -> None:
    init = ROOT / "fastbert" / "__init__.py"
    docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
    table = render_rooms()
    assert table in docstring, f"fastbert/__init__.py's docstring should show:\n{table}"


# --- the checker fails where it should ---------------------------------------------------


def fake(modules: dict[str, str]) -> dict[str, Source]:
    """A made-up package: module name (``x.__init__`` for package x) -> source text."""
    sources = {}
    for name, text in modules.items():
        is_package = name.endswith(".__init__")
        dotted = name.removesuffix(".__init__")
        path = name.replace(".", "/") + ".py"
        sources[dotted] = Source(dotted, path, textwrap.dedent(text), is_package)
    return sources


def failures_of(modules: dict[str, str]) -> list[str]:
    """What the checker reports on the made-up package ``modules`` (see :func:`fake`)."""
    return check(fake(modules))


def facade(top_import: str) -> str:
    """A made-up façade shaped as fastbert's: the encoder and ``top_import`` at the top (lines
    2 and 3), the embedding room only inside ``__getattr__``."""
    return f"""
        from fastbert.model.encoder import BertModel
        {top_import}
        def __getattr__(name):
            import fastbert.embedding
    """


def _exactly(failures: list[str], *expected: tuple[str, ...]) -> None:
    """Each of ``expected`` (the parts of one message) matches one failure, and no failure is
    left over."""
    for parts in expected:
        hits = [f for f in failures if all(p in f for p in parts)]
        assert len(hits) == 1, (parts, failures)
    assert len(failures) == len(expected), failures


def test_checker_reports_an_upward_import() -> None:
    failures = failures_of(
        {
            "fastbert.kernels.ops": """
                def f():
                    from fastbert.model import encoder
            """,
            "fastbert.model.encoder": "from fastbert.integrations.optimize import optimize",
            "fastbert.integrations.optimize": "",
        }
    )
    _exactly(
        failures,
        ("fastbert/kernels/ops.py:3", "fastbert.model.encoder", "may not import room"),
        ("fastbert/model/encoder.py:1", "fastbert.integrations.optimize (optimize)"),
    )


def test_checker_reports_a_private_name_from_another_room() -> None:
    failures = failures_of(
        {
            "fastbert.kernels.__init__": "",
            "fastbert.kernels.launch": "from fastbert.kernels._grid import grid",
            "fastbert.kernels._grid": "from .launch import _cache",  # own room: fine
            "fastbert.execution.runtime": """
                from fastbert.kernels.launch import _tuned, cdiv
                from fastbert.kernels import _grid
                import fastbert.kernels._grid
            """,
        }
    )
    _exactly(
        failures,
        ("runtime.py:2", "fastbert.kernels.launch (_tuned)", "private name _tuned"),
        ("runtime.py:3", "fastbert.kernels._grid", "private name _grid"),
        ("runtime.py:4", "fastbert.kernels._grid", "private name _grid"),
        ("import cycle", "fastbert/kernels/launch.py", "fastbert/kernels/_grid.py"),
    )


def test_checker_reports_a_private_name_used_through_a_module() -> None:
    failures = failures_of(
        {
            "fastbert.kernels.__init__": "",
            "fastbert.kernels.launch": "def _tuned(): pass\ndef cdiv(): pass",
            "fastbert.execution.runtime": """
                from fastbert.kernels import launch
                import fastbert.kernels.launch as L
                launch.cdiv(); launch._tuned(); L._tuned(); launch.__name__
            """,
        }
    )
    # launch._tuned and L._tuned; launch.cdiv and a dunder are fine.
    assert len(failures) == 2, failures
    assert all("runtime.py:4: uses fastbert.kernels.launch (_tuned)" in f for f in failures)


def test_checker_reports_a_cycle() -> None:
    failures = failures_of(
        {
            "fastbert.embedding.__init__": "from fastbert.embedding.api import embed",
            "fastbert.embedding.api": """
                from typing import TYPE_CHECKING
                if TYPE_CHECKING:
                    from fastbert.embedding import pipeline  # ignored
                def embed():
                    from fastbert.embedding import options
            """,
            "fastbert.embedding.options": "from fastbert.bench.progress import Progress",
            "fastbert.bench.progress": """
                def bar():
                    import fastbert.embedding.options
            """,
            "fastbert.embedding.pipeline": "from fastbert.embedding.api import embed",
        }
    )
    assert failures == [
        "import cycle: fastbert/bench/progress.py:3: imports fastbert.embedding.options -> "
        "fastbert/embedding/options.py:1: imports fastbert.bench.progress"
    ], failures


def test_checker_reports_an_outside_package_in_kernels() -> None:
    failures = failures_of(
        {
            "fastbert.kernels.ops": """
                from __future__ import annotations
                import os.path
                import numpy as np
                import torch
                import triton.language as tl
                def f():
                    import transformers
            """,
            "fastbert.version": "import sys",
            "fastbert.model.loading": "import safetensors",  # any outside package: fine
        }
    )
    _exactly(
        failures,
        ("fastbert/kernels/ops.py:8", "transformers", "room kernels"),
        ("fastbert/version.py:1", "sys", "room version"),
    )


def test_checker_reports_the_facade_imported_inside_the_package() -> None:
    failures = failures_of(
        {
            "fastbert.__init__": facade("from fastbert import bench"),
            "fastbert.model.__init__": "",
            "fastbert.model.encoder": "",
            "fastbert.embedding.__init__": "",
            "fastbert.bench.__init__": "",
            "fastbert.bench.peers": """
                from fastbert import model
                def build():
                    from fastbert import BertModel
            """,
            "fastbert.embedding.pipeline": "import fastbert",
            "fastbert.commands.demo": "import fastbert",  # commands may
            "fastbert.cli": "from fastbert import BertModel",  # so may the cli
        }
    )
    _exactly(
        failures,
        ("fastbert/__init__.py:3", "fastbert.bench", "only inside functions"),
        ("fastbert/bench/peers.py:4", "fastbert (BertModel)", "the façade"),
        ("fastbert/embedding/pipeline.py:1", "imports fastbert: the façade"),
    )


def test_checker_reports_a_module_in_no_room_and_a_missing_module() -> None:
    failures = failures_of(
        {"fastbert.attic.old": "", "fastbert.model.heads": "from fastbert.model import gone"}
    )
    _exactly(
        failures,
        ("fastbert/attic/old.py", "belongs to no room"),
        ("fastbert/model/heads.py:1", "fastbert.model", "no module of the package"),
    )


def test_checker_passes_code_that_keeps_the_rule() -> None:
    failures = failures_of(
        {
            "fastbert.__init__": facade("from fastbert.version import __version__"),
            "fastbert.version": '__version__ = "0"',
            "fastbert.kernels.__init__": "from .ops import attention",
            "fastbert.kernels.ops": "import math\nimport torch\nfrom . import launch",
            "fastbert.kernels.launch": "import triton",
            "fastbert.execution.runtime": "from fastbert.kernels import launch, attention",
            "fastbert.model.encoder": "from fastbert.execution import runtime",
            "fastbert.embedding.__init__": "from fastbert.embedding.api import embed",
            "fastbert.embedding.api": """
                def embed():
                    from fastbert.embedding import pipeline
            """,
            "fastbert.embedding.pipeline": """
                import pyarrow
                from fastbert.bench.progress import Progress
                from fastbert.model.encoder import BertModel
                from fastbert.version import __version__
            """,
            "fastbert.bench.progress": "",
            "fastbert.commands.embed": "import fastbert\nfrom fastbert.embedding import api",
        }
    )
    assert failures == []


def test_checker_reports_private_kernel_names_imported_outside() -> None:
    known = {"fastbert.kernels", "fastbert.kernels.launch", "fastbert.kernels._grid"}
    outside = [
        Source(
            "tests/test_x.py",
            "tests/test_x.py",
            "from fastbert.kernels.launch import _tuned, cdiv\n"
            "from fastbert.kernels import _grid, launch\n"
            "from fastbert.model.encoder import _helper\n",  # not kernels: out of scope
        )
    ]
    failures = check_outside(outside, known)
    _exactly(
        failures,
        ("tests/test_x.py:1", "fastbert.kernels.launch (_tuned)", "private name"),
        ("tests/test_x.py:2", "fastbert.kernels._grid", "private name"),
    )
