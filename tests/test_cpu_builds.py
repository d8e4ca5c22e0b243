"""Each compiled CPU source builds wherever its requirements are met.

A source that stops compiling leaves the PyTorch path in place (by design: users keep a
working encoder), and its own tests then skip as they do on a CPU without the instruction
set. This test is the one that fails instead."""

from __future__ import annotations

import pytest

from fastbert.kernels import (
    cpu_attention,
    cpu_gelu,
    cpu_int8,
    cpu_int8_product,
    cpu_layer_norm,
    cpu_library,
)

LIBRARIES = {
    **{f"cpu_attention {name}": build for name, build in cpu_attention.BUILDS.items()},
    "cpu_gelu": cpu_gelu._LIBRARY,
    "cpu_int8": cpu_int8._LIBRARY,
    **{f"cpu_int8_product {name}": build for name, build in cpu_int8_product.BUILDS.items()},
    "cpu_layer_norm": cpu_layer_norm._LIBRARY,
}


@pytest.mark.parametrize("name", sorted(LIBRARIES))
def test_builds_where_its_requirements_are_met(name: str) -> None:
    library = LIBRARIES[name]
    missing = cpu_library.missing_requirement(library.cpu_flag)
    if missing is not None:
        pytest.skip(f"{name} is never built here: {missing}")
    if not library.switched_on():
        pytest.skip(f"{name} is turned off by its setting")
    assert library.status().startswith("ready"), library.status()


def test_a_cache_folder_that_cannot_be_made_is_named_not_blamed_on_the_compiler(
    monkeypatch, tmp_path
) -> None:
    if cpu_library.missing_requirement() is not None:
        pytest.skip("no build here")
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("FASTBERT_CACHE", str(tmp_path / "a-file" / "cache"))
    library = cpu_library.Library(cpu_gelu.SOURCE, lambda library: None)
    status = library.status()
    assert status.startswith(f"not built: cannot write {tmp_path / 'a-file' / 'cache'}"), status
    assert "$FASTBERT_CACHE" in status and "failed" not in status, status


def test_a_cached_library_cut_short_is_built_again(monkeypatch, tmp_path) -> None:
    """A cached library cut short (a full disk, a copy stopped halfway) killed every process
    that loaded it with SIGBUS; it is built again. A whole library of another source under
    the name leaves the PyTorch path in place, saying so."""
    if cpu_library.missing_requirement() is not None:
        pytest.skip("no build here")
    monkeypatch.setenv("FASTBERT_CACHE", str(tmp_path))
    compiler = cpu_library.compiler()
    built = cpu_library.build(cpu_gelu.SOURCE, compiler)
    assert cpu_library.whole_library(built)
    whole = built.read_bytes()
    built.write_bytes(whole[: len(whole) // 2])
    assert not cpu_library.whole_library(built)
    assert cpu_library.build(cpu_gelu.SOURCE, compiler) == built
    assert built.read_bytes() == whole or cpu_library.whole_library(built)
    other = cpu_library.build(cpu_int8.SOURCE, compiler)
    built.write_bytes(other.read_bytes())
    library = cpu_library.Library(cpu_gelu.SOURCE, cpu_gelu._declare)
    assert library.get() is None
    assert library.status().startswith(f"not loaded: {built}"), library.status()
