"""What an optimized model's own modules say about training, read at each training call: the
dropout probabilities its nn.Dropout modules apply, and the activation checkpointing Hugging
Face set on it (fastbert.integrations.optimize applies both to the encoder)."""

from __future__ import annotations

from torch import nn

from fastbert.model.config import BertConfig
from fastbert.model.encoder import CHECKPOINT, BertModel
from fastbert.model.families import Family


def dropout_modules(base: nn.Module, family: Family) -> list[tuple[nn.Dropout, str]]:
    """The nn.Dropout modules under ``base``, each with its kind: "attention" (the attention
    probabilities' dropout of a layer, at ``family.attention_dropout``) or "hidden"."""
    attention = "." + family.attention_dropout
    return [
        (
            module,
            "attention"
            if family.attention_dropout
            and name.startswith(family.layer_prefix + ".")
            and name.endswith(attention)
            else "hidden",
        )
        for name, module in base.named_modules()
        if isinstance(module, nn.Dropout)
    ]


def dropout_applies(dropouts: list[tuple[nn.Dropout, str]]) -> bool:
    """Whether any of the model's ``dropouts`` (:func:`dropout_modules`) is in training mode
    with a nonzero p: Monte Carlo dropout in a model put in eval mode, which Hugging Face
    applies per module."""
    return any(module.training and module.p for module, _ in dropouts)


def dropout_now(
    dropouts: list[tuple[nn.Dropout, str]], family: Family, config: BertConfig, layers: nn.Module
) -> tuple[float, float]:
    """(hidden, attention) dropout probabilities the model's own ``dropouts``
    (:func:`dropout_modules`) apply now, for the encoder to apply in training mode: a model
    whose modules were set after optimize (all to 0 to train without dropout, as TRL's
    trainers do; or put in eval mode) trains as Hugging Face's would. The ``config``'s where
    the model has no such module. Raises ValueError when the modules of one kind differ
    (fastbert applies one probability of each), or for any dropout in a family fastbert runs
    without it (:func:`refuse_dropout`)."""
    found: dict[str, set[float]] = {"hidden": set(), "attention": set()}
    for module, kind in dropouts:
        found[kind].add(float(module.p) if module.training else 0.0)
    if family.config_constants.get("hidden_dropout_prob") == 0.0:
        refuse_dropout(found, family, layers)
    for kind, values in found.items():
        if len(values) > 1:
            raise ValueError(
                f"the model's {kind} dropout modules apply different probabilities "
                f"{sorted(values)} (a module in eval mode applies 0); a fastbert-optimized "
                f"model applies one (set every {kind} nn.Dropout's p and mode alike)"
            )
    (hidden,) = found["hidden"] or {config.hidden_dropout_prob}
    (attention,) = found["attention"] or {config.attention_probs_dropout_prob}
    return hidden, attention


def refuse_dropout(found: dict[str, set[float]], family: Family, layers: nn.Module) -> None:
    """ValueError for dropout in a family fastbert runs without it (ModernBERT, whose nonzero
    dropout ``optimize`` refuses): set since on an nn.Dropout in training mode (``found``: the
    probabilities by kind) or on an attention module's float ``attention_dropout`` under
    ``layers``."""
    floats = {  # Hugging Face applies them in the module's training mode only
        float(getattr(m, "attention_dropout", 0.0))
        for m in layers.modules()
        if m.training and isinstance(getattr(m, "attention_dropout", None), float)
    }
    applied = sorted(p for p in {*found["hidden"], *found["attention"], *floats} if p)
    if applied:
        raise ValueError(
            f"the model's dropout modules now apply {applied}; fastbert runs {family.name} "
            "without dropout (set them back to 0, or train the model without "
            "fastbert.optimize)"
        )


def follow_checkpointing(base: nn.Module, encoder: BertModel) -> None:
    """Hugging Face's activation checkpointing as ``activation_checkpointing_enable``
    (``gradient_checkpointing_enable`` before transformers 5.25) set it on ``base``'s
    modules, onto ``encoder``: on when any module's ``gradient_checkpointing`` is True; the
    checkpoint function it set (the checkpoint's arguments, ``offload``); and where the
    model's layers are Hugging Face's GradientCheckpointingLayer, one per encoder layer,
    which of them it checkpoints (``every_n_layers``)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    modules = list(base.modules())
    flagged = [m for m in modules if getattr(m, "gradient_checkpointing", False) is True]
    encoder.gradient_checkpointing = bool(flagged)
    if not flagged:
        return
    layers = [m for m in modules if isinstance(m, GradientCheckpointingLayer)]
    encoder.checkpointed_layers = (
        tuple(layer.gradient_checkpointing is True for layer in layers)
        if len(layers) == len(encoder.layers)
        else None
    )
    encoder.checkpoint_function = getattr(flagged[-1], "_gradient_checkpointing_func", CHECKPOINT)
