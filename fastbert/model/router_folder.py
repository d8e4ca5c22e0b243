"""A sentence-transformers ``Router`` module: inputs sent by task ("query", "document") to
routes of their own modules, as its router_config.json declares them.

fastbert runs the shape of inference-free SPLADE: one route that is a lone
``SparseStaticEmbedding`` (a weight per vocabulary token: queries cost a tokenizer call and a
lookup, no encoder) and one route that starts with a Transformer (documents: SPLADE). Any other
Router is refused naming what it holds. Nothing here runs a module.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastbert.model.config import read_json_file

STATIC = "SparseStaticEmbedding"
# The Router's class names (sentence-transformers keeps Asym, its older name, as an alias).
ROUTERS = ("Router", "Asym")
# The modality a text input has, as sentence-transformers infers it for routing.
TEXT = "text"


@dataclass(frozen=True)
class RouterSpec:
    """The routes of a Router folder: ``routes`` (their names, in order), ``static_route``
    (the name of the SparseStaticEmbedding's route) with ``static_folder`` (its files: weights
    and tokenizer), ``transformer_route``, ``default_route`` (None: none) and ``mappings``
    ((task, modality) -> route, ``None`` matching any)."""

    routes: tuple[str, ...]
    static_route: str
    static_folder: Path
    transformer_route: str
    default_route: str | None = None
    mappings: Mapping[tuple[Any, Any], str] = field(default_factory=dict)

    def route(self, task: str | None) -> str:
        """The route a text input of ``task`` (None: no task) takes, as sentence-transformers'
        Router resolves it: a mapping of (task, "text"), (task, any), (any, "text"), (any,
        any); a route named for the task, or "text"; the default route. ValueError where it
        finds none (sentence-transformers raises there too)."""
        for key in ((task, TEXT), (task, None), (None, TEXT), (None, None)):
            if key in self.mappings:
                return self.mappings[key]
        if task and task in self.routes:
            return task
        if TEXT in self.routes:
            return TEXT
        if task is None and self.default_route is not None:
            return self.default_route
        raise ValueError(
            f"the model's Router has no route for task {task!r} (its routes: "
            f"{', '.join(self.routes)}); give prompt_name 'query' or 'document'"
        )

    def is_static(self, task: str | None) -> bool:
        """Whether inputs of ``task`` take the SparseStaticEmbedding route."""
        return self.route(task) == self.static_route


def read_router(router_folder: Path, module_spec_of: Any) -> tuple[RouterSpec, list[Any]]:
    """(the Router in ``router_folder`` (where its router_config.json is), the modules of its
    Transformer route in order, each built by ``module_spec_of(name, type, folder)``).
    ValueError naming the file for a Router fastbert does not run: other than one lone
    SparseStaticEmbedding route and one route that starts with a Transformer."""
    path = config_path(router_folder)
    config = read_json_file(path)
    types, structure = config.get("types"), config.get("structure")
    parameters = config.get("parameters") or {}
    if not (isinstance(types, Mapping) and isinstance(structure, Mapping) and structure):
        raise ValueError(f"{path}: a Router's config needs its module types and routes")
    routes: dict[str, list[Any]] = {}
    for route, names in structure.items():
        if not isinstance(names, list) or not names:
            raise ValueError(f"{path}: route {route!r} must list its modules")
        modules = []
        for name in names:
            where = Path(str(name))
            if not isinstance(types.get(name), str) or where.is_absolute() or ".." in where.parts:
                raise ValueError(f"{path}: route {route!r} names an unknown module {name!r}")
            modules.append(module_spec_of(name, types[name], router_folder / name))
        routes[str(route)] = modules
    static = [r for r, ms in routes.items() if ms[0].class_name == STATIC]
    transformer = [r for r, ms in routes.items() if ms[0].class_name.endswith("Transformer")]
    described = "; ".join(
        f"{route}: {', '.join(m.describe() for m in modules)}" for route, modules in routes.items()
    )
    if len(routes) != 2 or len(static) != 1 or len(transformer) != 1:
        raise ValueError(
            f"{path}: fastbert runs a Router of one SparseStaticEmbedding route and one "
            f"Transformer route (inference-free SPLADE); this one routes {described}"
        )
    static_modules = routes[static[0]]
    if len(static_modules) > 1:
        raise ValueError(
            f"{path}: the SparseStaticEmbedding route goes on to "
            f"{', '.join(m.describe() for m in static_modules[1:])}, which fastbert does not run"
        )
    if static_modules[0].config.get("path") is not None:
        raise ValueError(
            f"{static_modules[0].folder / 'config.json'}: its weights come from "
            f"{static_modules[0].config['path']!r} (an IDF file), which fastbert does not read; "
            "save the model with sentence-transformers, which writes the weights beside it"
        )
    default = parameters.get("default_route")
    if default is not None and default not in routes:
        raise ValueError(f"{path}: default_route {default!r} is not one of its routes")
    if default is None and parameters.get("allow_empty_key", True):
        default = next(iter(routes))  # as sentence-transformers' Router takes it
    spec = RouterSpec(
        tuple(routes),
        static[0],
        static_modules[0].folder,
        transformer[0],
        default,
        _mappings(parameters.get("route_mappings") or {}, routes, path),
    )
    return spec, routes[transformer[0]]


def config_path(router_folder: Path) -> Path:
    """The Router's config file in ``router_folder``: router_config.json, else config.json (the
    name older sentence-transformers wrote it under)."""
    path = router_folder / "router_config.json"
    return path if path.exists() else router_folder / "config.json"


def _mappings(raw: Mapping[str, Any], routes: Mapping[str, Any], path: Path) -> dict:
    """route_mappings as saved ("('query', 'text')" -> route) -> {(task, modality): route};
    a key that does not parse is skipped, as sentence-transformers skips it."""
    mappings = {}
    for key, route in raw.items():
        try:
            task, modality = ast.literal_eval(key)
        except (ValueError, SyntaxError, TypeError):
            continue
        if route not in routes:
            raise ValueError(f"{path}: route_mappings sends {key} to an unknown route {route!r}")
        if isinstance(modality, tuple | list):
            modality = tuple(sorted(modality))
        mappings[(task, modality)] = route
    return mappings


__all__ = ["ROUTERS", "RouterSpec", "config_path", "read_router"]
