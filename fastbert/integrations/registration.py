"""Registering ``attn_implementation="fastbert"`` with transformers, now or when it loads.

``import fastbert`` calls :func:`register_on_import`: transformers' ``modeling_utils`` and
``masking_utils`` already loaded get fastbert's entries at once; otherwise an import hook
registers them as soon as each finishes loading, so fastbert never imports transformers
itself. This module imports only the standard library, and the entries
(:mod:`fastbert.integrations.attention`, which imports torch and the kernels) are loaded only
when there is a transformers module to register them in: ``import fastbert`` stays light.
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

NAME = "fastbert"
# transformers module -> (its registry, the function of the attention module registered in it).
ENTRIES = {
    "transformers.modeling_utils": ("AttentionInterface", "attention_forward"),
    "transformers.masking_utils": ("AttentionMaskInterface", "padding_mask"),
}


def register_in(module: ModuleType, entries: ModuleType) -> None:
    """Register in the loaded transformers ``module`` (a key of :data:`ENTRIES`) the function
    of ``entries`` (the attention module) that it takes."""
    registry, function = ENTRIES[module.__name__]
    getattr(module, registry).register(NAME, getattr(entries, function))


def register_on_import(load_entries: Callable[[], ModuleType]) -> None:
    """Register in each transformers module of :data:`ENTRIES` now if it is loaded, else as
    soon as it is; ``load_entries()`` returns the attention module and is called only then."""

    def registrar(module: ModuleType) -> None:
        register_in(module, load_entries())

    pending = set()
    for name in ENTRIES:
        module = sys.modules.get(name)
        if module is None:
            pending.add(name)
        else:
            registrar(module)
    if pending and not any(isinstance(f, _RegisterOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport(pending, registrar))


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the loader of each pending module to register after it."""

    def __init__(self, pending: set[str], registrar: Callable[[ModuleType], None]):
        self.pending = pending
        self.registrar = registrar

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.pending:
            return None
        self.pending.discard(fullname)
        if not self.pending:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _RegisteringLoader(spec.loader, self.registrar)
                return spec
        return None


class _RegisteringLoader(importlib.abc.Loader):
    """Runs the real loader, then registers fastbert in the freshly executed module."""

    def __init__(self, loader: Any, registrar: Callable[[ModuleType], None]):
        self.loader = loader
        self.registrar = registrar

    def create_module(self, spec: Any) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        try:
            self.registrar(module)
        except Exception as exc:  # a transformers without these interfaces: say so, go on
            warnings.warn(
                f"fastbert could not register attn_implementation='fastbert' with "
                f"{module.__name__}: {exc}",
                stacklevel=2,
            )

    def __getattr__(self, name: str) -> Any:
        # get_source, get_resource_reader, is_package, ...: the real loader's.
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)
