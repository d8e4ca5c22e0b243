"""Binding fastbert's encoder onto a Hugging Face model's own tensors: the parameters by the
family's name table (query, key and value fused into one tensor whose rows they become views
of), the config as the model's modules run it, and the views a call checks."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from fastbert.model.config import HIDDEN_ACTIVATIONS, BertConfig
from fastbert.model.encoder import BertModel
from fastbert.model.families import Family


def bind_encoder(base: nn.Module, family: Family, config: BertConfig, **kwargs: Any) -> BertModel:
    """A fastbert BertModel whose parameters are ``base``'s tensors (QKV fused; the HF query,
    key and value parameters become views of it). kwargs go to the BertModel constructor.

    Raises ValueError naming a missing or mis-shaped tensor, or tensors of mixed dtype/device.
    """
    params = dict(base.named_parameters())
    with_pooler = bool(family.pooler) and getattr(base, "pooler", None) is not None
    with_projection = config.embedding_width != config.hidden_size
    names = family.weight_names(config.num_hidden_layers, with_pooler, with_projection)
    for ours in family.first_layer_skips if config.num_hidden_layers else ():
        for theirs in family.layer[ours]:
            if f"{family.layer_prefix}.0.{theirs}" in params:
                raise ValueError(
                    f"the {family.name} model's first layer holds {theirs}, which the family's "
                    "first layer has none of (was a layer taken out before it?); fastbert's "
                    "encoder would leave it out"
                )
    first = params[next(iter(names.values()))[0]]
    encoder = BertModel(
        config, dtype=first.dtype, device="meta", add_pooling_layer=with_pooler, **kwargs
    )
    encoder.embeddings.bound_padding_rows = _padding_rows(base, names)
    for ours, theirs in names.items():
        missing = [t for t in theirs if t not in params]
        if missing:
            raise ValueError(f"the {family.name} model lacks {missing[0]!r} (for {ours})")
        tensors = [params[t] for t in theirs]
        for name, t in zip(theirs, tensors):
            if t.dtype != first.dtype or t.device != first.device:
                raise ValueError(
                    f"{name} is {t.dtype} on {t.device}, but the model's embeddings are "
                    f"{first.dtype} on {first.device}; fastbert needs one dtype and device"
                )
        expected = encoder.get_parameter(ours).shape
        param = tensors[0] if len(tensors) == 1 else fuse(tensors)
        if param.shape != expected:
            raise ValueError(
                f"{' + '.join(theirs)} has shape {tuple(param.shape)}, fastbert's {ours} "
                f"expects {tuple(expected)} (from the config)"
            )
        owner, _, attr = ours.rpartition(".")
        setattr(encoder.get_submodule(owner), attr, param)
    unbound = [name for name, p in encoder.named_parameters() if p.is_meta]
    if unbound:
        raise RuntimeError(f"the {family.name} name table maps no tensor to {unbound}")
    for i, layer in enumerate(encoder.layers):
        if len(names[f"layers.{i}.qkv_weight"]) > 1:  # separate query, key and value tensors
            layer.qkv_parts = tuple(
                tuple(params[t] for t in names.get(f"layers.{i}.{ours}", ()))
                for ours in ("qkv_weight", "qkv_bias")
            )
    if encoder.quantize is not None:
        base.requires_grad_(False)  # the separate query / key / value parameters too
        encoder.quantize = encoder.quantize  # quantises the bound tensors
    encoder.resolve_ops_early()
    return encoder.train(base.training)


def _padding_rows(base: nn.Module, names: dict[str, tuple[str, ...]]) -> dict[str, int | None]:
    """The rows without gradient of ``base``'s word and position tables: their nn.Embedding's
    ``padding_idx``, fixed when the modules were built (a config edited since, or a table
    replaced by one without it, changes which rows Hugging Face trains, not the config's)."""
    rows: dict[str, int | None] = {"padding_idx": None, "position_padding_idx": None}
    for key, ours in (
        ("padding_idx", "embeddings.word"),
        ("position_padding_idx", "embeddings.position"),
    ):
        if ours in names:
            rows[key] = base.get_submodule(names[ours][0].rpartition(".")[0]).padding_idx
    return rows


def positions_counted_as_built(base: nn.Module, family: Family, config: BertConfig) -> BertConfig:
    """``config`` with the pad id RoBERTa-style positions count from in ``base``: its
    embeddings module's ``padding_idx``, fixed when built, which Hugging Face's positions read
    (not the config's, which may have been edited since)."""
    if config.position_scheme != "padding_offset":
        return config
    embeddings = base.get_submodule(family.embeddings["embeddings.word"][0].rsplit(".", 2)[0])
    counted_from = getattr(embeddings, "padding_idx", None)
    if not isinstance(counted_from, int) or counted_from == config.pad_token_id:
        return config
    return dataclasses.replace(config, pad_token_id=counted_from)


def fuse(tensors: list[torch.Tensor]) -> nn.Parameter:
    """Concatenate ``tensors`` by rows into one parameter and make each a view of its rows."""
    fused = nn.Parameter(torch.cat([t.detach() for t in tensors]), requires_grad=False)
    row = 0
    for t in tensors:
        t.data = fused.data[row : row + t.shape[0]]
        row += t.shape[0]
    return fused


def config_as_run(config: BertConfig, layers: nn.ModuleList, norms: list[nn.Module]) -> BertConfig:
    """``config`` (from the Hugging Face config) as the model's modules run it: as many layers
    as its layer list holds (Hugging Face's forward runs the list, whatever
    ``num_hidden_layers`` says: a pruned student), each of the attention type the layer
    module holds (ModernBERT), and the eps its LayerNorm modules hold. ValueError where the
    LayerNorms hold different eps (fastbert's encoder takes one)."""
    changes: dict[str, Any] = {}
    if len(layers) != config.num_hidden_layers:
        changes["num_hidden_layers"] = len(layers)
    if config.layer_types is not None:
        types = tuple(getattr(layer, "attention_type", None) for layer in layers)
        if None in types and len(layers) != config.num_hidden_layers:
            raise ValueError(
                f"the model's layer list holds {len(layers)} layers, its config "
                f"{config.num_hidden_layers}, and the layers do not say their attention types"
            )
        if None not in types and types != config.layer_types:
            changes["layer_types"] = types
    eps = {m.eps for m in norms}
    if len(eps) > 1:
        raise ValueError(
            f"the model's LayerNorm modules hold different eps ({sorted(eps)}); fastbert's "
            "encoder takes one: set them to one value, or call the model without fastbert"
        )
    if eps and eps != {config.layer_norm_eps}:
        changes["layer_norm_eps"] = eps.pop()
    return dataclasses.replace(config, **changes) if changes else config


def config_as_built(hf_config: Any, family: Family, layers: nn.ModuleList) -> BertConfig:
    """The fastbert config of ``hf_config`` with the head count and the activation the
    ``layers``' modules were built with written over the config's: Hugging Face's modules run
    those whatever the config says since (an edit, valid or not, changes nothing they
    compute). ValueError where the layers hold different activations, or one fastbert does
    not run."""
    values = hf_config.to_dict()
    values["num_labels"] = hf_config.num_labels
    names = family.config_names
    heads = _heads_as_built(layers[0], values.get(names["hidden_size"])) if len(layers) else None
    if heads is not None:
        values[names["num_attention_heads"]] = heads
    activation = _activation_as_built(layers)
    if activation is not None and HIDDEN_ACTIVATIONS.get(activation) != HIDDEN_ACTIVATIONS.get(
        values.get(names["hidden_act"])
    ):
        values[names["hidden_act"]] = activation  # one fastbert does not run: named
    return BertConfig.from_dict(values, family)


def _heads_as_built(layer: nn.Module, hidden_size: Any) -> int | None:
    """The number of heads ``layer``'s attention was built with (its module's
    ``num_attention_heads`` or ``n_heads``, or the hidden size over its ``head_dim``), which
    it splits its rows into whatever the config says since; None when no module says."""
    for module in layer.modules():
        for name in ("num_attention_heads", "n_heads"):
            heads = getattr(module, name, None)
            if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0:
                return heads
        head_dim = getattr(module, "head_dim", None)
        if isinstance(head_dim, int) and not isinstance(head_dim, bool) and head_dim > 0:
            return hidden_size // head_dim if isinstance(hidden_size, int) else None
    return None


def _activation_as_built(layers: nn.ModuleList) -> str | None:
    """The Hugging Face name of the activation the ``layers``' modules hold (transformers'
    first name for its class; torch's GELU by its approximation), None when they hold none
    of those; ValueError where layers hold different ones (fastbert's encoder runs one)."""
    from transformers.activations import ACT2CLS

    names: dict[type, str] = {}
    for name, entry in ACT2CLS.items():
        names.setdefault(entry[0] if isinstance(entry, tuple) else entry, name)
    held = set()
    for layer in layers:
        for module in layer.modules():
            if isinstance(module, nn.GELU):
                held.add("gelu_pytorch_tanh" if module.approximate == "tanh" else "gelu")
                break
            if type(module) in names:
                held.add(names[type(module)])
                break
    if len({HIDDEN_ACTIVATIONS.get(name, name) for name in held}) > 1:
        raise ValueError(
            f"the model's layers hold different activations ({', '.join(sorted(held))}); "
            "fastbert's encoder runs one: give every layer the same, or call the model without "
            "fastbert"
        )
    return min(held) if held else None


def fused_views(
    base: nn.Module, encoder: BertModel, names: dict[str, tuple[str, ...]]
) -> list[tuple[nn.Parameter, int]]:
    """(parameter, the address it must start at) for each Hugging Face parameter that is a
    row view of a fused encoder tensor (the query, key and value weights and biases)."""
    views = []
    for ours, theirs in names.items():
        if len(theirs) == 1:
            continue
        fused = encoder.get_parameter(ours)
        row_bytes = fused.stride(0) * fused.element_size()
        row = 0
        for name in theirs:
            view = base.get_parameter(name)
            views.append((view, fused.data_ptr() + row * row_bytes))
            row += view.shape[0]
    return views
