"""The model side of embedding: the settings a sentence-transformers folder carries (pooling,
normalisation, maximum length), loading the encoder and its tokenizer, and one batch of token
ids -> pooled embeddings."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastbert.model.pooling import POOLINGS

# sentence-transformers' 1_Pooling/config.json keys for the modes fastbert pools with.
_POOLING_KEYS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}


@dataclass(frozen=True)
class FolderSettings:
    """What a model folder says about embedding with it (None where it says nothing)."""

    pooling: str | None = None
    normalize: bool | None = None
    max_length: int | None = None


def folder_settings(folder: Path) -> FolderSettings:
    """The pooling, normalisation and max_seq_length of a sentence-transformers folder (from
    modules.json, its Pooling module's config.json and sentence_bert_config.json); all None for
    a plain Hugging Face folder. ValueError for a pooling mode fastbert does not run."""
    modules_file = folder / "modules.json"
    if not modules_file.exists():
        return FolderSettings()
    modules = _read_json(modules_file)
    kinds = {m.get("type", "").rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    pooling = None
    if "Pooling" in kinds:
        config = _read_json(folder / kinds["Pooling"].get("path", "") / "config.json")
        modes = [mode for key, mode in _POOLING_KEYS.items() if config.get(key)]
        others = [
            k
            for k, v in config.items()
            if k.startswith("pooling_mode") and v and k not in _POOLING_KEYS
        ]
        if others or len(modes) != 1:
            raise ValueError(
                f"{folder}: pooling {others + modes} is not one fastbert runs "
                "(mean or cls); choose one with pooling="
            )
        pooling = modes[0]
    max_length = None
    st_config = folder / "sentence_bert_config.json"
    if st_config.exists():
        max_length = _read_json(st_config).get("max_seq_length")
    return FolderSettings(pooling, "Normalize" in kinds, max_length)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot be read as JSON ({exc})") from exc


def read_config(folder: Path) -> Any:
    """The fastbert BertConfig of a model folder (Hugging Face or sentence-transformers)."""
    from fastbert.model.loading import read_checkpoint_config, transformer_folder

    return read_checkpoint_config(transformer_folder(folder))[0]


def model_max_length(config: Any, tokenizer: Any) -> int:
    """The most tokens a text may have: the tokenizer's limit, capped by the model's position
    table (a tokenizer without a limit reports a huge number)."""
    positions = config.max_sequence_length
    limit = getattr(tokenizer, "model_max_length", positions) or positions
    return int(min(limit, positions))


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer of a Hugging Face folder, or of the transformer inside a
    sentence-transformers folder."""
    from fastbert.integrations import models
    from fastbert.model.loading import transformer_folder

    with models.quiet():
        return models.import_transformers().AutoTokenizer.from_pretrained(
            str(transformer_folder(folder))
        )


class Encoder:
    """Batches of token ids -> pooled embeddings (numpy [n, hidden], ``store_dtype``).

    ``model``: a fastbert.BertModel; ``pad_id``: the tokenizer's padding id.
    """

    def __init__(
        self, model: Any, pad_id: int, pooling: str, normalize: bool, store_dtype: np.dtype
    ):
        self.model = model
        self.pad_id = pad_id
        self.pool = POOLINGS[pooling]
        self.normalize = normalize
        self.store_dtype = store_dtype

    @property
    def dimensions(self) -> int:
        return self.model.config.hidden_size

    def __call__(self, tokens: list[list[int]]) -> np.ndarray:
        """token ids of n rows (any lengths) -> float embeddings [n, hidden]."""
        input_ids, mask = self.pad(tokens)
        with torch.inference_mode():
            hidden = self.model(input_ids, attention_mask=mask).last_hidden_state
            pooled = self.pool(hidden, mask)
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.cpu().numpy().astype(self.store_dtype, copy=False)

    def pad(self, tokens: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded int64 input ids and 0/1 attention mask [n, longest], on the model's
        device."""
        longest = max(len(t) for t in tokens)
        ids = torch.full((len(tokens), longest), self.pad_id, dtype=torch.int64)
        mask = torch.zeros((len(tokens), longest), dtype=torch.int64)
        for i, row in enumerate(tokens):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
            mask[i, : len(row)] = 1
        device = self.model.device
        return ids.to(device, non_blocking=True), mask.to(device, non_blocking=True)
