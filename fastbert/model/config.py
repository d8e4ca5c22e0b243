"""The encoder's configuration: the subset of a Hugging Face BertConfig fastbert runs."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fastbert.kernels.checks import RELATIVE_BUCKETS
from fastbert.model.families import BERT, Family
from fastbert.model.losses import PROBLEM_TYPES

# Hugging Face `hidden_act` names -> the activation the fused GEMM epilogue applies.
HIDDEN_ACTIVATIONS = {
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",  # the same tanh form, written out
}
# How position ids follow from input_ids: "sequential" is 0..S-1 in every row (BERT, ELECTRA,
# DistilBERT); "padding_offset" is pad_token_id + 1 + the count of non-pad ids so far, and
# pad_token_id at pad ids (RoBERTa, XLM-RoBERTa: create_position_ids_from_input_ids);
# "rotary" has no position table: positions 0..S-1 rotate the queries and keys in the
# attention (RoPE, ModernBERT).
POSITION_SCHEMES = ("sequential", "padding_offset", "rotary")
# Where each layer's LayerNorms sit: "post" after each residual add (BERT); "pre" before the
# attention and the FFN, with a final norm after the last layer and none before the first
# layer's attention (its input is the embeddings' norm), as ModernBERT.
NORM_POSITIONS = ("post", "pre")
# A layer's attention: over every key, or over a sliding window (ModernBERT's local layers).
LAYER_TYPES = ("full_attention", "sliding_attention")
# Integer fields and the least value each may take (0 layers: the embeddings alone, as in
# Hugging Face; 0 token types: the family has none, e.g. DistilBERT).
_INT_MINIMUMS = {
    "vocab_size": 1,
    "hidden_size": 1,
    "num_hidden_layers": 0,
    "num_attention_heads": 1,
    "intermediate_size": 1,
    "max_position_embeddings": 1,
    "type_vocab_size": 0,
    "num_labels": 1,
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Shape and numerics of a BERT encoder (field names follow Hugging Face's BertConfig).

    type_vocab_size 0 means no token types (DistilBERT). embedding_size, when set and unlike
    hidden_size, is the width of the embedding tables, projected to hidden_size after their
    LayerNorm (ELECTRA). position_scheme: one of POSITION_SCHEMES. The dropout probabilities
    apply in training mode only (``model.train()``): hidden_dropout_prob after the embeddings
    and on the attention-output (unless attention_output_dropout is False: DistilBERT has
    none there) and FFN-output projections, attention_probs_dropout_prob on
    the attention probabilities, classifier_dropout (hidden_dropout_prob when None) before a
    sequence classifier. problem_type: how a sequence classifier's loss reads its labels
    (fastbert.model.losses.PROBLEM_TYPES; None infers it from the labels, as Hugging Face does).
    initializer_range: the standard deviation of ``init_weights``' normal initialisation.
    relative_attention_num_buckets: 0 (no relative position bias), or the rows of the
    [buckets, heads] relative position bias table shared by every layer (MPNet); the attention
    reads its first RELATIVE_BUCKETS (32) rows, as Hugging Face's MPNet does whatever the
    table's size.

    ModernBERT's switches: norm_position (NORM_POSITIONS); glu: the FFN's input projection
    gives 2 * intermediate_size columns, act(input) * gate (GeGLU); linear_bias / norm_bias:
    whether the linears / LayerNorms have biases; position_scheme "rotary" with rope_theta (the
    global layers' RoPE base) and local_rope_theta (the sliding-window layers'); layer_types:
    one of LAYER_TYPES per layer (None: all full); local_attention: the sliding window's width,
    each query attending to the keys at most local_attention // 2 positions away.
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
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    classifier_dropout: float | None = None
    attention_output_dropout: bool = True
    problem_type: str | None = None
    initializer_range: float = 0.02
    relative_attention_num_buckets: int = 0
    norm_position: str = "post"
    glu: bool = False
    linear_bias: bool = True
    norm_bias: bool = True
    rope_theta: float = 10000.0
    local_rope_theta: float = 10000.0
    layer_types: tuple[str, ...] | None = None
    local_attention: int = 0

    def __post_init__(self) -> None:
        """Raise ValueError naming the first field of the wrong type or out of range."""
        for name, minimum in _INT_MINIMUMS.items():
            _check_int(name, getattr(self, name), minimum)
        if self.embedding_size is not None:
            _check_int("embedding_size", self.embedding_size, 1)
        _check_int("relative_attention_num_buckets", self.relative_attention_num_buckets, 0)
        if 0 < self.relative_attention_num_buckets < RELATIVE_BUCKETS:
            raise ValueError(
                f"relative_attention_num_buckets must be 0 or >= {RELATIVE_BUCKETS} (the buckets "
                f"the attention indexes), got {self.relative_attention_num_buckets}"
            )
        if self.pad_token_id is not None:
            _check_int("pad_token_id", self.pad_token_id)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout"):
            _check_probability(name, getattr(self, name), optional=name == "classifier_dropout")
        if self.problem_type not in (None, *PROBLEM_TYPES):
            raise ValueError(
                f"problem_type must be None or one of {PROBLEM_TYPES}, got {self.problem_type!r}"
            )
        eps = self.layer_norm_eps
        if not _is_number(eps) or not math.isfinite(eps) or eps < 0:
            raise ValueError(f"layer_norm_eps must be a finite number >= 0, got {eps!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if not isinstance(self.hidden_act, str):
            raise ValueError(f"hidden_act must be a string, got {self.hidden_act!r}")
        if self.hidden_act not in HIDDEN_ACTIVATIONS:
            raise ValueError(
                f"hidden_act {self.hidden_act!r} is not supported; fastbert runs "
                f"{sorted(HIDDEN_ACTIVATIONS)}"
            )
        if self.position_scheme not in POSITION_SCHEMES:
            raise ValueError(
                f"position_scheme must be one of {POSITION_SCHEMES}, got {self.position_scheme!r}"
            )
        if self.position_scheme == "padding_offset":
            self._check_padding_offset()
        self._check_modern_switches()

    def _check_modern_switches(self) -> None:
        """The ModernBERT fields: known values, one layer type per layer, a window for
        sliding layers, RoPE bases > 0 and an even head dim for rotary positions."""
        if self.norm_position not in NORM_POSITIONS:
            raise ValueError(
                f"norm_position must be one of {NORM_POSITIONS}, got {self.norm_position!r}"
            )
        for name in ("glu", "linear_bias", "norm_bias"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("rope_theta", "local_rope_theta"):
            value = getattr(self, name)
            if not _is_number(value) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        if self.position_scheme == "rotary" and self.head_dim % 2:
            raise ValueError(f"rotary positions need an even head dim, got {self.head_dim}")
        _check_int("local_attention", self.local_attention, 0)
        if self.layer_types is None:
            return
        if not isinstance(self.layer_types, tuple) or len(self.layer_types) != (
            self.num_hidden_layers
        ):
            raise ValueError(
                f"layer_types must be a tuple of one type per layer ({self.num_hidden_layers}), "
                f"got {self.layer_types!r}"
            )
        unknown = [t for t in self.layer_types if t not in LAYER_TYPES]
        if unknown:
            raise ValueError(f"layer_types must each be one of {LAYER_TYPES}, got {unknown[0]!r}")
        if "sliding_attention" in self.layer_types and self.local_attention < 1:
            raise ValueError("sliding_attention layers need local_attention >= 1 (the window)")

    def layer_type(self, index: int) -> str:
        """The attention of layer ``index``: one of LAYER_TYPES."""
        return "full_attention" if self.layer_types is None else self.layer_types[index]

    @property
    def window(self) -> int:
        """How far a sliding-window layer's queries see: local_attention // 2 positions."""
        return self.local_attention // 2

    def _check_padding_offset(self) -> None:
        """Positions counted from pad_token_id + 1 need a pad id and room for one position."""
        if self.pad_token_id is None or self.pad_token_id < 0:
            raise ValueError(
                "pad_token_id must be an integer >= 0 for padding_offset positions, got "
                f"{self.pad_token_id!r}"
            )
        if self.max_sequence_length < 1:
            raise ValueError(
                f"max_position_embeddings {self.max_position_embeddings} leaves no position "
                f"after the {self.pad_token_id + 1} reserved by pad_token_id {self.pad_token_id}"
            )

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
    def position_rows(self) -> int:
        """The rows of the position table (none with rotary positions: one zero row stands
        in)."""
        return 1 if self.position_scheme == "rotary" else self.max_position_embeddings

    @property
    def activation(self) -> str:
        """The fused-epilogue name of ``hidden_act``: "gelu" (exact erf) or "gelu_tanh"."""
        return HIDDEN_ACTIVATIONS[self.hidden_act]

    @classmethod
    def from_dict(
        cls, values: Mapping[str, Any], family: Family = BERT, *, source: str | Path | None = None
    ) -> BertConfig:
        """Build from a config.json-style mapping of ``family`` (fastbert.model.families); keys
        fastbert does not use are ignored. ``source``: the file ``values`` came from, named in
        every error.

        Raises ValueError for a malformed config (not a mapping, a field of the wrong type or
        out of range, no token types in a family that has them) and for a model fastbert would
        compute differently (another model_type, relative position embeddings, a decoder).
        """
        try:
            return cls._from_mapping(values, family)
        except ValueError as error:
            if source is None:
                raise
            raise ValueError(f"{source}: {error}") from error

    @classmethod
    def _from_mapping(cls, values: Mapping[str, Any], family: Family) -> BertConfig:
        if not isinstance(values, Mapping):
            raise ValueError(
                f"a {family.name} config must be a JSON object of fields, got "
                f"{type(values).__name__}"
            )
        model_type = values.get("model_type", family.model_type)
        if model_type != family.model_type:
            raise ValueError(
                f"model_type {model_type!r} is not supported here; this loads {family.model_type!r}"
            )
        position_type = values.get("position_embedding_type")
        if position_type is None:  # absent or null: the default, as in Hugging Face
            position_type = "absolute"
        if position_type != "absolute":
            raise ValueError(
                f"position_embedding_type {position_type!r} is not supported; fastbert runs "
                "absolute position embeddings"
            )
        if values.get("is_decoder") or values.get("add_cross_attention"):
            raise ValueError("decoder / cross-attention BERT configs are not supported")
        values = family.as_hugging_face_reads(values)
        kwargs = family.config_values(values)
        if family.derive is not None:
            kwargs.update(family.derive(values))
        if "num_labels" not in values and values.get("id2label"):
            kwargs["num_labels"] = len(values["id2label"])
        config = cls(**kwargs)
        if family.has_token_types and config.type_vocab_size == 0:
            raise ValueError(f"type_vocab_size must be >= 1: {family.name} models have token types")
        return config

    @classmethod
    def from_hf(cls, hf_config: Any, family: Family = BERT) -> BertConfig:
        """Build from a transformers config instance of ``family``."""
        values = hf_config.to_dict()
        values["num_labels"] = hf_config.num_labels
        return cls.from_dict(values, family)

    @classmethod
    def from_json_file(cls, path: str | Path, family: Family = BERT) -> BertConfig:
        """Build from a config.json file of ``family``; every error names ``path``."""
        return cls.from_dict(read_json_file(path), family, source=path)


def read_json_file(path: str | Path) -> Any:
    """The parsed contents of the JSON file ``path``; ValueError naming it when it is not
    valid JSON (or not UTF-8 text)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid JSON: {error}") from error


def _is_number(value: object) -> bool:
    """An int or float, not a bool (JSON's true / false)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_probability(name: str, value: object, optional: bool = False) -> None:
    """Raise ValueError unless ``value`` is a number in [0, 1) (or None when ``optional``)."""
    if value is None and optional:
        return
    if not _is_number(value) or not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")


def _check_int(name: str, value: object, minimum: int | None = None) -> None:
    """Raise ValueError unless ``value`` is an integer (not a bool or float) >= ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
