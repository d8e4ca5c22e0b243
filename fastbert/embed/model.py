"""The model side of embedding: the settings a sentence-transformers folder carries (pooling,
normalisation, maximum length), loading the encoder and its tokenizer, and one batch of token
ids -> pooled embeddings."""

from __future__ import annotations

import inspect
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
        """token ids of n rows (any lengths) -> embeddings [n, hidden], normalised when the
        folder (or the options) say so, in ``store_dtype``."""
        with torch.inference_mode():
            pooled = self.pooled(tokens)
            if self.normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
        return pooled.cpu().numpy().astype(self.store_dtype, copy=False)

    def pooled(self, tokens: list[list[int]]) -> torch.Tensor:
        """token ids of n rows -> pooled, unnormalised embeddings [n, hidden] (the model's
        dtype and device). Call under torch.inference_mode()."""
        input_ids, mask, _ = pad(tokens, None, self.pad_id, self.model.device)
        hidden = self.model(input_ids, attention_mask=mask).last_hidden_state
        return self.pool(hidden, mask)


class Classifier:
    """Batches of token ids (a text or a text pair each) -> logits (numpy float32
    [n, num_labels]).

    ``model``: a Hugging Face ``*ForSequenceClassification`` model with fastbert's encoder
    swapped in (fastbert.optimize); ``pad_id``: the tokenizer's padding id.
    """

    def __init__(self, model: Any, pad_id: int):
        self.model = model
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        # DistilBERT has no token types: its forward takes no token_type_ids.
        self.takes_token_types = "token_type_ids" in inspect.signature(model.forward).parameters

    def __call__(self, tokens: list[list[int]], type_ids: list[list[int]] | None) -> np.ndarray:
        """token ids (and token types, or None) of n inputs -> logits [n, num_labels]."""
        if not self.takes_token_types:
            type_ids = None
        input_ids, mask, token_types = pad(tokens, type_ids, self.pad_id, self.device)
        arguments = {"input_ids": input_ids, "attention_mask": mask}
        if token_types is not None:
            arguments["token_type_ids"] = token_types
        with torch.inference_mode():
            logits = self.model(**arguments).logits
        return logits.float().cpu().numpy()


def pad(
    tokens: list[list[int]], type_ids: list[list[int]] | None, pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Right-padded int64 input ids, 0/1 attention mask and (when ``type_ids`` is given) token
    type ids, each [n, longest], on ``device``."""
    longest = max(len(t) for t in tokens)
    ids = torch.full((len(tokens), longest), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(tokens), longest), dtype=torch.int64)
    types = None if type_ids is None else torch.zeros((len(tokens), longest), dtype=torch.int64)
    for i, row in enumerate(tokens):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
        mask[i, : len(row)] = 1
        if types is not None:
            types[i, : len(row)] = torch.tensor(type_ids[i], dtype=torch.int64)
    moved = [t.to(device, non_blocking=True) if t is not None else None for t in (ids, mask, types)]
    return moved[0], moved[1], moved[2]
