"""Modules of a sentence-transformers folder that fastbert has no implementation of, run by
sentence-transformers' own code on fastbert's features.

A module from outside the ``sentence_transformers`` package (a folder's own code) is refused:
fastbert runs no code a model folder brings. So is an input module other than the Transformer
(a tokenizer-level module such as StaticEmbedding or a Router: fastbert's input module is its
own encoder). Everything else is loaded as sentence-transformers loads it and called on the
features dict, in float32 on the model's device.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from fastbert.integrations.models import quiet
from fastbert.model.sentence_folder import ModuleSpec

Features = dict[str, Any]


class ForeignModule:
    """A sentence-transformers module (``module``, an nn.Module) as fastbert's pipeline calls
    it: features in, features out, floating tensors in float32, no gradients."""

    def __init__(self, module: torch.nn.Module, spec: ModuleSpec):
        self.module = module
        self.spec = spec
        self.takes_task = "task" in getattr(module, "forward_kwargs", ())

    def __call__(self, features: Features, task: str | None = None) -> Features:
        features = {
            k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            for k, v in features.items()
        }
        with torch.inference_mode():
            if self.takes_task:
                return self.module(features, task=task)
            return self.module(features)


def load_foreign_module(spec: ModuleSpec, root: Path, device: torch.device) -> ForeignModule:
    """The module ``spec`` names, loaded from its folder under the model folder ``root`` by
    sentence-transformers, on ``device``. ValueError naming the module when it is a folder's
    own code, an input module, or sentence-transformers is not installed."""
    if not spec.type.startswith("sentence_transformers."):
        raise ValueError(
            f"module {spec.describe()} is not part of sentence-transformers; fastbert runs no "
            "code a model folder brings"
        )
    try:
        from sentence_transformers.util import import_from_string
    except ImportError:
        raise ValueError(
            f"module {spec.describe()} has no implementation in fastbert; it runs through "
            "sentence-transformers, which is not installed (pip install sentence-transformers)"
        ) from None
    try:
        module_class = import_from_string(spec.type)
    except ImportError as error:
        raise ValueError(
            f"module {spec.describe()}: this sentence-transformers has no such class ({error})"
        ) from error
    if _is_input_module(module_class):
        raise ValueError(
            f"module {spec.describe()} turns inputs into features itself; fastbert runs folders "
            "whose only input module is the Transformer"
        )
    with quiet():
        module = _load(module_class, spec, root)
    module = module.to(device).float().eval().requires_grad_(False)
    return ForeignModule(module, spec)


def _is_input_module(module_class: type) -> bool:
    """Tokenizer-level modules (StaticEmbedding, WordEmbeddings, Router...): they define how
    inputs are preprocessed or tokenised, or route between module lists by task."""
    names = {c.__name__ for c in module_class.__mro__}
    return bool(names & {"InputModule", "Router"}) or hasattr(module_class, "tokenize")


def _load(module_class: Any, spec: ModuleSpec, root: Path) -> torch.nn.Module:
    """sentence-transformers' two load conventions: ``load(path)`` (older modules) or
    ``load(model_folder, subfolder=...)``."""
    load: Callable[..., torch.nn.Module] = module_class.load
    if len(inspect.signature(load).parameters) == 1:
        return load(str(spec.folder))
    subfolder = spec.folder.relative_to(root).as_posix()
    return load(str(root), subfolder="" if subfolder == "." else subfolder, local_files_only=True)
