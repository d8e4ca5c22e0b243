"""What models are available here (``fastbert models``): each packaged model, installed or
not, and each model in the Hugging Face cache that fastbert can run, with its family, its size
in parameters and its kind of output.

Read from the folders' configs and the weights' headers: no model is loaded, nothing is
downloaded.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastbert.integrations.model_names import (
    HF_CACHE,
    PACKAGED,
    PACKAGED_SOURCE,
    cached_models,
    hub_cache,
)
from fastbert.model.config import read_json_file
from fastbert.model.families import family_of_model_type
from fastbert.model.sentence_folder import read_folder

# Bytes per parameter of a torch.save checkpoint, by the config's dtype (safetensors files
# give exact counts from their header).
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Description:
    """What a model folder is: ``family`` (BERT, RoBERTa, MPNet, ModernBERT, ...),
    ``parameters`` of its encoder (``exact``: counted from safetensors headers; else estimated
    from a checkpoint's bytes) and ``kind`` ("embedding", "sparse", "multi-vector",
    "classification")."""

    family: str
    parameters: int | None
    exact: bool
    kind: str


@dataclass(frozen=True)
class CatalogEntry:
    """One model: ``name`` (what to give as ``--model``), its Hugging Face ``id``, ``source``
    ("packaged" or "hf-cache"), ``folder`` (None for a packaged model not installed),
    ``install`` (the command that installs it, when it is not), and its description (None
    when not installed)."""

    name: str
    id: str
    source: str
    folder: Path | None
    install: str | None
    description: Description | None

    def to_dict(self) -> dict[str, Any]:
        """The entry as JSON-ready values."""
        entry = asdict(self)
        entry["folder"] = None if self.folder is None else str(self.folder)
        entry["installed"] = self.folder is not None
        return entry


@dataclass(frozen=True)
class Catalog:
    """The models available here (``models``), the Hugging Face cache read (``cache``), and
    the cached models fastbert cannot run, each with why (``skipped``: (id, reason))."""

    models: list[CatalogEntry]
    cache: Path
    skipped: list[tuple[str, str]]

    def to_dict(self) -> dict[str, Any]:
        """The catalog as JSON-ready values."""
        return {
            "models": [m.to_dict() for m in self.models],
            "hf_cache": str(self.cache),
            "not_runnable": [{"id": i, "reason": r} for i, r in self.skipped],
        }


def describe(folder: Path) -> Description:
    """The :class:`Description` of a model folder; ValueError saying why fastbert cannot run
    it (an unknown model_type, a module it does not run, no config)."""
    spec = read_folder(folder)
    config_path = spec.transformer.folder / "config.json"
    if not config_path.is_file():
        raise ValueError(f"no config.json in {spec.transformer.folder}")
    config = read_json_file(config_path)
    model_type = config.get("model_type")
    family = family_of_model_type(model_type) if isinstance(model_type, str) else None
    if family is None:
        raise ValueError(f"model_type {model_type!r} is not a family fastbert runs")
    try:
        parameters, exact = count_parameters(spec.transformer.folder, config)
    except OSError as exc:  # a weights file whose blob is missing (a download cut short)
        raise ValueError(f"its weights cannot be read (a download cut short?): {exc}") from exc
    if parameters is None:
        raise ValueError(
            f"no weights (model.safetensors or pytorch_model.bin) in {config_path.parent}"
        )
    return Description(family.name, parameters, exact, spec.kind)


def count_parameters(folder: Path, config: dict[str, Any]) -> tuple[int | None, bool]:
    """(parameters of the checkpoint in ``folder``, whether counted exactly): the sum of the
    tensor shapes in its safetensors headers, else its ``pytorch_model*.bin`` bytes over the
    bytes of the config's dtype; (None, False) when it holds no weights."""
    shards = sorted(folder.glob("*.safetensors"))
    if shards:
        return sum(_safetensors_parameters(s) for s in shards), True
    pickled = sorted(folder.glob("pytorch_model*.bin"))
    if not pickled:
        return None, False
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return sum(p.stat().st_size for p in pickled) // _DTYPE_BYTES.get(dtype, 4), False


def _safetensors_parameters(path: Path) -> int:
    """The parameters in a safetensors file, from its header (8 bytes of length, then JSON):
    its floating-point tensors' sizes."""
    with path.open("rb") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
    total = 0
    for name, tensor in header.items():
        # Parameters are floating point; integer tensors are buffers (BERT's position_ids).
        if name != "__metadata__" and tensor["dtype"].startswith(("F", "BF")):
            count = 1
            for size in tensor["shape"]:
                count *= size
            total += count
    return total


def catalog() -> Catalog:
    """Every packaged model (installed or not) and every model in the Hugging Face cache that
    fastbert can run, described; the cached ones it cannot run in ``skipped``."""
    entries = []
    for packaged in PACKAGED:
        if not packaged.installed():
            entries.append(
                CatalogEntry(
                    packaged.short, packaged.id, PACKAGED_SOURCE, None, packaged.install, None
                )
            )
            continue
        folder = packaged.locate()
        entries.append(
            CatalogEntry(
                packaged.short, packaged.id, PACKAGED_SOURCE, folder, None, describe(folder)
            )
        )
    skipped = []
    for cached in cached_models():
        if cached.folder is None:
            skipped.append(
                (cached.id, "its refs/main names no snapshot with a config.json (cut short?)")
            )
            continue
        try:
            description = describe(cached.folder)
        except ValueError as exc:
            skipped.append((cached.id, str(exc)))
            continue
        entries.append(
            CatalogEntry(cached.id, cached.id, HF_CACHE, cached.folder, None, description)
        )
    return Catalog(entries, hub_cache(), skipped)


__all__ = ["Catalog", "CatalogEntry", "Description", "catalog", "count_parameters", "describe"]
