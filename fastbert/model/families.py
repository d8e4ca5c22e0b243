"""The BERT family as data: how each Hugging Face architecture maps onto fastbert's encoder.

BERT, RoBERTa, XLM-RoBERTa, ELECTRA, DistilBERT and MPNet run the same post-LayerNorm encoder;
they differ only in tensor and config names, the position-id scheme, token types, the pooler,
(ELECTRA) an embedding projection and (MPNet) a relative position bias shared by every layer.
ModernBERT runs the same encoder with its config switches on (fastbert.model.config):
pre-LayerNorm without biases, rotary positions, a GeGLU FFN and sliding-window layers.
Each :class:`Family` records those differences, so the loader (fastbert/model/loading.py) and
``fastbert.optimize`` need no per-model code. No transformers import here: names are plain
strings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

# fastbert BertConfig field -> Hugging Face config attribute (the same name for BERT).
_BERT_CONFIG_NAMES = {
    name: name
    for name in (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "max_position_embeddings",
        "type_vocab_size",
        "layer_norm_eps",
        "pad_token_id",
        "num_labels",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "classifier_dropout",
        "problem_type",
        "initializer_range",
    )
}
# fastbert parameter name -> Hugging Face names under the base model (several = concatenated).
_BERT_EMBEDDINGS = {
    "embeddings.word": ("embeddings.word_embeddings.weight",),
    "embeddings.position": ("embeddings.position_embeddings.weight",),
    "embeddings.token_type": ("embeddings.token_type_embeddings.weight",),
    "embeddings.ln_weight": ("embeddings.LayerNorm.weight",),
    "embeddings.ln_bias": ("embeddings.LayerNorm.bias",),
}
# The same without the token-type table (DistilBERT, MPNet).
_BERT_EMBEDDINGS_WITHOUT_TOKEN_TYPES = {
    k: v for k, v in _BERT_EMBEDDINGS.items() if k != "embeddings.token_type"
}
# fastbert BertLayer parameter name -> Hugging Face names under one layer.
_BERT_LAYER = {
    "qkv_weight": tuple(f"attention.self.{n}.weight" for n in ("query", "key", "value")),
    "qkv_bias": tuple(f"attention.self.{n}.bias" for n in ("query", "key", "value")),
    "attn_out_weight": ("attention.output.dense.weight",),
    "attn_out_bias": ("attention.output.dense.bias",),
    "attn_ln_weight": ("attention.output.LayerNorm.weight",),
    "attn_ln_bias": ("attention.output.LayerNorm.bias",),
    "ffn_in_weight": ("intermediate.dense.weight",),
    "ffn_in_bias": ("intermediate.dense.bias",),
    "ffn_out_weight": ("output.dense.weight",),
    "ffn_out_bias": ("output.dense.bias",),
    "ffn_ln_weight": ("output.LayerNorm.weight",),
    "ffn_ln_bias": ("output.LayerNorm.bias",),
}
_BERT_POOLER = {"pooler.weight": ("pooler.dense.weight",), "pooler.bias": ("pooler.dense.bias",)}
_ENCODER_HEADS = (
    "ForMaskedLM",
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForQuestionAnswering",
    "ForMultipleChoice",
)


@dataclasses.dataclass(frozen=True)
class MaskedLMHeadNames:
    """Where a family's masked-LM head keeps its tensors in a ``*ForMaskedLM`` checkpoint, and
    how it computes: ``dense`` and ``norm`` are module names (``.weight`` / ``.bias`` follow),
    ``decoder`` the decoder weight's name (absent when tied to the word embeddings),
    ``biases`` the decoder bias's names, first found (the decoder's own first: Hugging Face
    reads the head's plain bias only where the checkpoint ties the decoder's to it); the
    transform's activation is ``activation`` when the family fixes it, else the config's
    ``activation_key``; the LayerNorm's epsilon is the config's ``eps_key`` (or ``eps`` when
    the family fixes it)."""

    dense: str
    norm: str
    decoder: str
    biases: tuple[str, ...]
    activation: str | None = None
    activation_key: str = "hidden_act"
    eps_key: str | None = "layer_norm_eps"
    eps: float = 1e-12


_BERT_MASKED_LM = MaskedLMHeadNames(
    "cls.predictions.transform.dense",
    "cls.predictions.transform.LayerNorm",
    "cls.predictions.decoder.weight",
    ("cls.predictions.decoder.bias", "cls.predictions.bias"),
)
_ROBERTA_MASKED_LM = MaskedLMHeadNames(
    "lm_head.dense",
    "lm_head.layer_norm",
    "lm_head.decoder.weight",
    ("lm_head.decoder.bias", "lm_head.bias"),
    activation="gelu",
)


@dataclasses.dataclass(frozen=True)
class Family:
    """One Hugging Face architecture, described by names.

    model_type: ``config.model_type``; prefix: the transformers class-name prefix ("Bert");
    base_attr: the attribute of a head model that holds the base model ("bert"); heads: the
    supported head-class suffixes; config_names: fastbert BertConfig field -> HF config
    attribute; config_constants: BertConfig fields fixed by the architecture; embeddings,
    projection, layer, pooler: fastbert parameter name -> HF tensor names (under the base
    model; ``layer`` under ``f"{layer_prefix}.{i}."``; several names are concatenated by rows);
    masked_lm_head: where its ``*ForMaskedLM`` checkpoints keep the head (None: not read);
    shared: the same for the base model's tensors outside the embeddings and layers (MPNet's
    relative position bias table, ModernBERT's final norm); first_layer_skips: ``layer`` names
    the first layer lacks (ModernBERT's attention norm); attention_dropout: the attention
    probabilities' nn.Dropout under each layer; derive: config dict -> more BertConfig
    keyword arguments, for fields that are no plain renaming (it raises ValueError for what
    fastbert does not run); output_class: the transformers.modeling_outputs class the base
    model returns; config_defaults, config_aliases: what the family's transformers config
    class fills in and reads otherwise (:meth:`as_hugging_face_reads`; tests compare them with
    transformers').
    """

    name: str
    model_type: str
    prefix: str
    base_attr: str
    heads: tuple[str, ...]
    output_class: str
    config_names: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: dict(_BERT_CONFIG_NAMES)
    )
    config_constants: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    embeddings: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: dict(_BERT_EMBEDDINGS)
    )
    projection: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    layer_prefix: str = "encoder.layer"
    # The nn.Dropout of the attention probabilities in each layer ("" for none); the base
    # model's other nn.Dropout modules apply the hidden dropout.
    attention_dropout: str = "attention.self.dropout"
    layer: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: dict(_BERT_LAYER)
    )
    pooler: Mapping[str, tuple[str, ...]] = dataclasses.field(
        default_factory=lambda: dict(_BERT_POOLER)
    )
    shared: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    first_layer_skips: tuple[str, ...] = ()
    masked_lm_head: MaskedLMHeadNames | None = None
    derive: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    config_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    config_aliases: Mapping[str, tuple[str, int]] = dataclasses.field(default_factory=dict)

    @property
    def classes(self) -> tuple[str, ...]:
        """The supported transformers class names: the base model first, then the heads."""
        return (f"{self.prefix}Model",) + tuple(self.prefix + h for h in self.heads)

    @property
    def has_token_types(self) -> bool:
        """Whether the architecture has a token-type table (all but DistilBERT)."""
        return self.config_constants.get("type_vocab_size") != 0

    def as_hugging_face_reads(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A config dict as the family's transformers config class holds it: its defaults
        (``config_defaults``: where BertConfig's, or ``derive``'s reading, would differ) for
        what the dict leaves out, and each alias key of ``config_aliases``
        (alias -> (key, factor)) read as ``key = factor * value``, as the class's setters
        read it."""
        read = {**self.config_defaults, **values}
        for alias, (key, factor) in self.config_aliases.items():
            if read.get(alias) is not None:
                read[key] = factor * read[alias]
        return read

    def config_values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """fastbert BertConfig keyword arguments from a Hugging Face config dict."""
        kwargs = {
            ours: values[theirs] for ours, theirs in self.config_names.items() if theirs in values
        }
        kwargs.update(self.config_constants)
        return kwargs

    def weight_names(
        self, num_layers: int, with_pooler: bool, with_projection: bool = False
    ) -> dict[str, tuple[str, ...]]:
        """fastbert BertModel parameter name -> HF base-model tensor names."""
        names = dict(self.embeddings)
        names.update(self.shared)
        if with_projection:
            names.update(self.projection)
        for i in range(num_layers):
            for ours, theirs in self.layer.items():
                if i == 0 and ours in self.first_layer_skips:
                    continue
                names[f"layers.{i}.{ours}"] = tuple(f"{self.layer_prefix}.{i}.{t}" for t in theirs)
        if with_pooler:
            names.update(self.pooler)
        return names


_WITH_POOLER = "BaseModelOutputWithPoolingAndCrossAttentions"

BERT = Family(
    "BERT",
    "bert",
    "Bert",
    "bert",
    ("ForPreTraining", "ForNextSentencePrediction") + _ENCODER_HEADS,
    _WITH_POOLER,
    masked_lm_head=_BERT_MASKED_LM,
)
ROBERTA = Family(
    "RoBERTa",
    "roberta",
    "Roberta",
    "roberta",
    _ENCODER_HEADS,
    _WITH_POOLER,
    config_constants={"position_scheme": "padding_offset"},
    masked_lm_head=_ROBERTA_MASKED_LM,
    config_defaults={"vocab_size": 50265, "pad_token_id": 1},
)
XLM_ROBERTA = dataclasses.replace(
    ROBERTA,
    name="XLM-RoBERTa",
    model_type="xlm-roberta",
    prefix="XLMRoberta",
    config_defaults={"pad_token_id": 1},
)
ELECTRA = Family(
    "ELECTRA",
    "electra",
    "Electra",
    "electra",
    ("ForPreTraining",) + _ENCODER_HEADS,
    "BaseModelOutputWithPastAndCrossAttentions",
    config_names={**_BERT_CONFIG_NAMES, "embedding_size": "embedding_size"},
    projection={
        "embeddings.project_weight": ("embeddings_project.weight",),
        "embeddings.project_bias": ("embeddings_project.bias",),
    },
    pooler={},
    masked_lm_head=MaskedLMHeadNames(
        "generator_predictions.dense",
        "generator_predictions.LayerNorm",
        "generator_lm_head.weight",
        ("generator_lm_head.bias",),
        activation="gelu",
    ),
    config_defaults={
        "hidden_size": 256,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "embedding_size": 128,
    },
)
DISTILBERT = Family(
    "DistilBERT",
    "distilbert",
    "DistilBert",
    "distilbert",
    _ENCODER_HEADS,
    "BaseModelOutput",
    config_names={
        "vocab_size": "vocab_size",
        "hidden_size": "dim",
        "num_hidden_layers": "n_layers",
        "num_attention_heads": "n_heads",
        "intermediate_size": "hidden_dim",
        "hidden_act": "activation",
        "max_position_embeddings": "max_position_embeddings",
        "pad_token_id": "pad_token_id",
        "num_labels": "num_labels",
        "hidden_dropout_prob": "dropout",
        "attention_probs_dropout_prob": "attention_dropout",
        "classifier_dropout": "seq_classif_dropout",
        "problem_type": "problem_type",
    },
    # No token types; every DistilBERT LayerNorm is built with eps=1e-12.
    # Hugging Face's DistilBERT adds the attention output to its input with no dropout.
    config_constants={
        "type_vocab_size": 0,
        "layer_norm_eps": 1e-12,
        "attention_output_dropout": False,
    },
    embeddings=dict(_BERT_EMBEDDINGS_WITHOUT_TOKEN_TYPES),
    config_defaults={"n_layers": 6, "seq_classif_dropout": 0.2},
    # transformers' attribute_map: BERT's names for DistilBERT's fields.
    config_aliases={
        "hidden_size": ("dim", 1),
        "num_hidden_layers": ("n_layers", 1),
        "num_attention_heads": ("n_heads", 1),
    },
    layer_prefix="transformer.layer",
    attention_dropout="attention.dropout",
    layer={
        "qkv_weight": tuple(f"attention.{n}_lin.weight" for n in "qkv"),
        "qkv_bias": tuple(f"attention.{n}_lin.bias" for n in "qkv"),
        "attn_out_weight": ("attention.out_lin.weight",),
        "attn_out_bias": ("attention.out_lin.bias",),
        "attn_ln_weight": ("sa_layer_norm.weight",),
        "attn_ln_bias": ("sa_layer_norm.bias",),
        "ffn_in_weight": ("ffn.lin1.weight",),
        "ffn_in_bias": ("ffn.lin1.bias",),
        "ffn_out_weight": ("ffn.lin2.weight",),
        "ffn_out_bias": ("ffn.lin2.bias",),
        "ffn_ln_weight": ("output_layer_norm.weight",),
        "ffn_ln_bias": ("output_layer_norm.bias",),
    },
    pooler={},
    masked_lm_head=MaskedLMHeadNames(
        "vocab_transform",
        "vocab_layer_norm",
        "vocab_projector.weight",
        ("vocab_projector.bias",),
        activation_key="activation",
        eps_key=None,
    ),
)
MPNET = Family(
    "MPNet",
    "mpnet",
    "MPNet",
    "mpnet",
    _ENCODER_HEADS,
    "BaseModelOutputWithPooling",
    config_names={
        **_BERT_CONFIG_NAMES,
        "relative_attention_num_buckets": "relative_attention_num_buckets",
    },
    # No token types; positions count from padding index 1 (Hugging Face's MPNetEmbeddings
    # fixes it at 1, whatever the config's pad_token_id).
    config_constants={"type_vocab_size": 0, "position_scheme": "padding_offset", "pad_token_id": 1},
    attention_dropout="attention.attn.dropout",
    embeddings=dict(_BERT_EMBEDDINGS_WITHOUT_TOKEN_TYPES),
    layer={
        "qkv_weight": tuple(f"attention.attn.{n}.weight" for n in "qkv"),
        "qkv_bias": tuple(f"attention.attn.{n}.bias" for n in "qkv"),
        "attn_out_weight": ("attention.attn.o.weight",),
        "attn_out_bias": ("attention.attn.o.bias",),
        "attn_ln_weight": ("attention.LayerNorm.weight",),
        "attn_ln_bias": ("attention.LayerNorm.bias",),
        "ffn_in_weight": ("intermediate.dense.weight",),
        "ffn_in_bias": ("intermediate.dense.bias",),
        "ffn_out_weight": ("output.dense.weight",),
        "ffn_out_bias": ("output.dense.bias",),
        "ffn_ln_weight": ("output.LayerNorm.weight",),
        "ffn_ln_bias": ("output.LayerNorm.bias",),
    },
    shared={"relative_bias": ("encoder.relative_attention_bias.weight",)},
    masked_lm_head=_ROBERTA_MASKED_LM,
    config_defaults={"vocab_size": 30527, "relative_attention_num_buckets": 32},
)


def _modernbert_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """BertConfig keyword arguments from a ModernBERT config dict: the layer types (listed, or
    every ``global_attn_every_n_layers``-th layer global), the two RoPE bases (from
    ``rope_parameters`` or the older ``global_rope_theta`` / ``local_rope_theta``) and the
    biases. Raises ValueError for what fastbert does not run: scaled RoPE, biases in the
    linears or LayerNorms, nonzero dropout."""
    layers = values["num_hidden_layers"]
    layer_types = values.get("layer_types")
    if layer_types is None:
        every = values["global_attn_every_n_layers"]
        layer_types = [
            "sliding_attention" if i % every else "full_attention" for i in range(layers)
        ]
    rope = values.get("rope_parameters") or {}
    scaling = values.get("rope_scaling") or {}  # the older key, read into both layer types
    thetas = {}
    for kind, old_name in (
        ("full_attention", "global_rope_theta"),
        ("sliding_attention", "local_rope_theta"),
    ):
        params = {**(rope.get(kind) or {}), **scaling}
        if params.get("rope_type", "default") != "default":
            raise ValueError(
                f"rope_type {params['rope_type']!r} ({kind}) is not supported; fastbert runs "
                "the default RoPE"
            )
        thetas[kind] = params.get("rope_theta", values[old_name])
    for name in ("attention_bias", "mlp_bias", "norm_bias"):
        if values.get(name, False):
            raise ValueError(
                f"{name}=True is not supported; fastbert runs ModernBERT's linears and "
                "LayerNorms without biases (as the released checkpoints are configured)"
            )
    for name in ("embedding_dropout", "attention_dropout", "mlp_dropout"):
        if values.get(name, 0.0):
            raise ValueError(
                f"{name} {values[name]!r} is not supported; fastbert runs ModernBERT with "
                "dropout 0 (as the released checkpoints are configured)"
            )
    return {
        "layer_types": tuple(layer_types),
        "rope_theta": thetas["full_attention"],
        "local_rope_theta": thetas["sliding_attention"],
    }


MODERNBERT = Family(
    "ModernBERT",
    "modernbert",
    "ModernBert",
    "model",
    _ENCODER_HEADS,
    "BaseModelOutput",
    config_names={
        "vocab_size": "vocab_size",
        "hidden_size": "hidden_size",
        "num_hidden_layers": "num_hidden_layers",
        "num_attention_heads": "num_attention_heads",
        "intermediate_size": "intermediate_size",
        "hidden_act": "hidden_activation",
        "max_position_embeddings": "max_position_embeddings",
        "layer_norm_eps": "norm_eps",
        "pad_token_id": "pad_token_id",
        "num_labels": "num_labels",
        "problem_type": "problem_type",
        "initializer_range": "initializer_range",
        "local_attention": "local_attention",
    },
    config_constants={
        "type_vocab_size": 0,
        "position_scheme": "rotary",
        "norm_position": "pre",
        "glu": True,
        "linear_bias": False,
        "norm_bias": False,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    },
    embeddings={
        "embeddings.word": ("embeddings.tok_embeddings.weight",),
        "embeddings.ln_weight": ("embeddings.norm.weight",),
    },
    layer_prefix="layers",
    attention_dropout="",  # a float of the attention module; nonzero dropout is refused
    layer={
        "qkv_weight": ("attn.Wqkv.weight",),
        "attn_out_weight": ("attn.Wo.weight",),
        "attn_ln_weight": ("attn_norm.weight",),
        "ffn_in_weight": ("mlp.Wi.weight",),
        "ffn_out_weight": ("mlp.Wo.weight",),
        "ffn_ln_weight": ("mlp_norm.weight",),
    },
    pooler={},
    shared={"final_ln_weight": ("final_norm.weight",)},
    first_layer_skips=("attn_ln_weight",),
    masked_lm_head=MaskedLMHeadNames(
        "head.dense",
        "head.norm",
        "decoder.weight",
        ("decoder.bias",),
        activation_key="classifier_activation",
        eps_key="norm_eps",
        eps=1e-5,
    ),
    derive=_modernbert_values,
    config_defaults={
        "vocab_size": 50368,
        "num_hidden_layers": 22,
        "intermediate_size": 1152,
        "max_position_embeddings": 8192,
        "norm_eps": 1e-5,
        "pad_token_id": 50283,
        "local_attention": 128,
        "global_attn_every_n_layers": 3,
        # The RoPE bases of the older config.json (before rope_parameters).
        "global_rope_theta": 160_000.0,
        "local_rope_theta": 10_000.0,
    },
    # sliding_window is half the window local_attention spans (transformers' setter).
    config_aliases={"sliding_window": ("local_attention", 2)},
)
FAMILIES = (BERT, ROBERTA, XLM_ROBERTA, ELECTRA, DISTILBERT, MPNET, MODERNBERT)


def family_of_model_type(model_type: str) -> Family | None:
    """The family whose ``config.model_type`` is ``model_type``, or None."""
    return next((f for f in FAMILIES if f.model_type == model_type), None)


def family_of_class(class_names: list[str]) -> tuple[Family, str] | None:
    """(family, matched class name) for the first supported name in ``class_names`` (an MRO)."""
    for name in class_names:
        for family in FAMILIES:
            if name in family.classes:
                return family, name
    return None


def supported_classes() -> str:
    """The supported transformers classes, one family per clause, for error messages."""
    return "; ".join(f"{f.name}: {', '.join(f.classes)}" for f in FAMILIES)
