"""The encoder's configuration: the subset of a Hugging Face BertConfig fastbert runs."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastbert.families import BERT, Family

# Hugging Face `hidden_act` names -> the activation the fused GEMM epilogue applies.
HIDDEN_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}
# How position ids follow from input_ids: "sequential" is 0..S-1 in every row (BERT, ELECTRA,
# DistilBERT); "padding_offset" is pad_token_id + 1 + the count of non-pad ids so far, and
# pad_token_id at pad ids (RoBERTa, XLM-RoBERTa: create_position_ids_from_input_ids).
POSITION_SCHEMES = ("sequential", "padding_offset")


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Shape and numerics of a BERT encoder (field names follow Hugging Face's BertConfig).

    type_vocab_size 0 means no token types (DistilBERT). embedding_size, when set and unlike
    hidden_size, is the width of the embedding tables, projected to hidden_size after their
    LayerNorm (ELECTRA). position_scheme: one of POSITION_SCHEMES.
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    num_labels: int = 2
    embedding_size: int | None = None
    position_scheme: str = "sequential"

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.hidden_act not in HIDDEN_ACTIVATIONS:
            raise ValueError(
                f"hidden_act {self.hidden_act!r} is not supported; fastbert runs "
                f"{sorted(HIDDEN_ACTIVATIONS)}"
            )
        if self.position_scheme not in POSITION_SCHEMES:
            raise ValueError(
                f"position_scheme must be one of {POSITION_SCHEMES}, got {self.position_scheme!r}"
            )
        for name in ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "num_labels", "embedding_width"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size must be >= 0, got {self.type_vocab_size}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def embedding_width(self) -> int:
        """The width of the embedding tables: embedding_size when set, else hidden_size."""
        return self.embedding_size if self.embedding_size is not None else self.hidden_size

    @property
    def max_sequence_length(self) -> int:
        """The longest input the position table covers (RoBERTa reserves pad_token_id + 1)."""
        if self.position_scheme == "padding_offset":
            return self.max_position_embeddings - self.pad_token_id - 1
        return self.max_position_embeddings

    @property
    def activation(self) -> str:
        """The fused-epilogue name of ``hidden_act``: "gelu" (exact erf) or "gelu_tanh"."""
        return HIDDEN_ACTIVATIONS[self.hidden_act]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], family: Family = BERT) -> BertConfig:
        """Build from a config.json-style mapping of ``family`` (fastbert.families); keys
        fastbert does not use are ignored.

        Raises ValueError for a model fastbert would compute differently (another model_type,
        relative position embeddings, a decoder).
        """
        model_type = values.get("model_type", family.model_type)
        if model_type != family.model_type:
            raise ValueError(
                f"model_type {model_type!r} is not supported here; this loads "
                f"{family.model_type!r}"
            )
        position_type = values.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ValueError(
                f"position_embedding_type {position_type!r} is not supported; fastbert runs "
                "absolute position embeddings"
            )
        if values.get("is_decoder") or values.get("add_cross_attention"):
            raise ValueError("decoder / cross-attention BERT configs are not supported")
        kwargs = family.config_values(values)
        if "num_labels" not in values and values.get("id2label"):
            kwargs["num_labels"] = len(values["id2label"])
        return cls(**kwargs)

    @classmethod
    def from_hf(cls, hf_config: Any, family: Family = BERT) -> BertConfig:
        """Build from a transformers config instance of ``family``."""
        values = hf_config.to_dict()
        values["num_labels"] = hf_config.num_labels
        return cls.from_dict(values, family)

    @classmethod
    def from_json_file(cls, path: str | Path) -> BertConfig:
        with open(path) as f:
            return cls.from_dict(json.load(f))
