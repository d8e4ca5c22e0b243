"""The encoder's configuration: the subset of a Hugging Face BertConfig fastbert runs."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Hugging Face `hidden_act` names -> the activation the fused GEMM epilogue applies.
HIDDEN_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Shape and numerics of a BERT encoder (field names follow Hugging Face's BertConfig)."""

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
        for name in ("vocab_size", "hidden_size", "num_attention_heads", "intermediate_size",
                     "max_position_embeddings", "type_vocab_size", "num_labels"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def activation(self) -> str:
        """The fused-epilogue name of ``hidden_act``: "gelu" (exact erf) or "gelu_tanh"."""
        return HIDDEN_ACTIVATIONS[self.hidden_act]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> BertConfig:
        """Build from a config.json-style mapping; keys fastbert does not use are ignored.

        Raises ValueError for a model fastbert would compute differently (not BERT, relative
        position embeddings, a decoder).
        """
        model_type = values.get("model_type", "bert")
        if model_type != "bert":
            raise ValueError(f"model_type {model_type!r} is not supported; fastbert runs 'bert'")
        position_type = values.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise ValueError(
                f"position_embedding_type {position_type!r} is not supported; fastbert runs "
                "absolute position embeddings"
            )
        if values.get("is_decoder") or values.get("add_cross_attention"):
            raise ValueError("decoder / cross-attention BERT configs are not supported")
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in fields}
        if "num_labels" not in values and values.get("id2label"):
            kwargs["num_labels"] = len(values["id2label"])
        return cls(**kwargs)

    @classmethod
    def from_hf(cls, hf_config: Any) -> BertConfig:
        """Build from a transformers ``BertConfig`` instance."""
        values = hf_config.to_dict()
        values["num_labels"] = hf_config.num_labels
        return cls.from_dict(values)

    @classmethod
    def from_json_file(cls, path: str | Path) -> BertConfig:
        with open(path) as f:
            return cls.from_dict(json.load(f))
