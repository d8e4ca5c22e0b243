"""The model a benchmark runs: an embedded shape with random weights, or a model by folder or
name (the packaged all-MiniLM-L6-v2, a model in the Hugging Face cache).

Every contender is built from one Hugging Face ``BertModel`` held on the CPU in float32 (the
*reference*), so all of them compute with identical weights. The Hugging Face side is
fastbert.integrations.models (transformers is imported only when a benchmark runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from fastbert.bench.shapes import MODEL_SHAPES, MODEL_TYPES, model_config
from fastbert.integrations import models as hf_models
from fastbert.integrations.model_names import resolve_model
from fastbert.model.config import BertConfig
from fastbert.model.loading import (
    read_checkpoint_config,
    read_checkpoint_state,
    read_source,
    transformer_folder,
)

Loaded = TypeVar("Loaded")


@dataclasses.dataclass
class Reference:
    """A Hugging Face BertModel (CPU, float32, eval) and fastbert's view of its config."""

    name: str
    hf_model: Any
    config: BertConfig


def random_reference(name: str, seed: int = 0) -> Reference:
    """An embedded model shape (see shapes.MODEL_SHAPES) with seeded random weights."""
    if name in MODEL_TYPES:
        hf_model = hf_models.random_model(MODEL_TYPES[name], MODEL_SHAPES[name], seed)
    else:
        hf_model = hf_models.random_bert(MODEL_SHAPES[name], seed)
    return Reference(name, hf_model, model_config(name))


def load_checked(folder: str | Path, load: Callable[..., Loaded], *args: Any) -> Loaded:
    """``load(folder, *args)``, a Hugging Face (or sentence-transformers) loader of the local
    checkpoint ``folder``, with the folder read as fastbert's own loader (and so
    ``fastbert embed``) reads it: its config.json first, and when the load fails, its weights.
    A ValueError naming the file and what is wrong (no config.json, not valid JSON, a value
    fastbert refuses, no weights, unreadable weights) instead of the loader's OSError."""
    checkpoint = transformer_folder(Path(folder))
    read_checkpoint_config(checkpoint)
    try:
        return load(folder, *args)
    except Exception as error:
        try:
            read_checkpoint_state(checkpoint)
        except (OSError, ValueError) as problem:
            raise ValueError(str(problem)) from error
        if isinstance(error, OSError):
            raise ValueError(f"{folder} could not be loaded: {error}") from error
        raise


def checkpoint_reference(folder: str | Path) -> Reference:
    """A local Hugging Face (or sentence-transformers) BERT checkpoint folder; ValueError
    naming the file when the folder cannot be read (see :func:`load_checked`)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{str(folder)!r} is not a local checkpoint folder")
    model = load_checked(folder, hf_models.load_checkpoint)
    return Reference(folder.name, model, read_source(model)[0])


def load_reference(model: str, seed: int = 0) -> Reference:
    """``model``: an embedded shape name (random weights), else a model folder or name of any
    family fastbert runs (``"minilm"`` / ``"mpnet"``: the packaged all-MiniLM-L6-v2 /
    all-mpnet-base-v2; see :func:`~fastbert.integrations.model_names.resolve_model`), named
    in the results by its id's name part or its folder's name."""
    if model in MODEL_SHAPES:
        return random_reference(model, seed)
    found = resolve_model(model, also=tuple(MODEL_SHAPES))
    return dataclasses.replace(checkpoint_reference(found.folder), name=found.label)
