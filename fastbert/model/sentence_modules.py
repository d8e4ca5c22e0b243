"""The sentence-transformers modules fastbert runs itself, computing what sentence-transformers
computes: Pooling (every mode), Dense (on the sentence embedding or on every token), Normalize,
SpladePooling and MultiVectorMask.

Each module reads its folder (:class:`~fastbert.model.sentence_folder.ModuleSpec`) when built
and then maps a features dict to a features dict, as sentence-transformers' modules do. The
keys: ``token_embeddings`` [B, S, H], ``attention_mask`` [B, S] (1 = a real token),
``input_ids`` [B, S], ``sentence_embedding`` [B, D] and ``prompt_length`` (the tokens of the
prompt put before every input, 0 for none). Every module here also takes packed features: the
B sequences end to end, ``token_embeddings`` [T, H], ``attention_mask`` and ``input_ids``
[T], and ``cu_seqlens`` int32 [B + 1] (sequence b is rows ``cu_seqlens[b]`` to
``cu_seqlens[b + 1]``), the key that marks them packed. What a module adds is float32 (sums
in float32, as sentence-transformers accumulates half precision). :func:`native_module` builds
the module a spec names, or returns None when fastbert has no implementation of its own.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from fastbert.model.loading import read_weights_file
from fastbert.model.pooling import LEGACY_POOLING_FLAGS, POOLINGS, Segments, pool, pool_packed
from fastbert.model.sentence_folder import ModuleSpec

Features = dict[str, Any]


class Pooling:
    """Token embeddings -> ``sentence_embedding`` [B, len(modes) * H], the modes concatenated in
    order. ``include_prompt=False`` leaves the prompt's tokens out."""

    def __init__(self, modes: tuple[str, ...], include_prompt: bool = True):
        unknown = [m for m in modes if m not in POOLINGS]
        if unknown or not modes:
            raise ValueError(
                f"pooling mode {unknown or modes!r} is not one of {', '.join(POOLINGS)}"
            )
        self.modes = modes
        self.include_prompt = include_prompt

    @classmethod
    def from_spec(cls, spec: ModuleSpec) -> Pooling:
        """Either config format: ``pooling_mode`` (a name or a list), or the older
        ``pooling_mode_*`` flags (none set: mean, as sentence-transformers reads it).
        ValueError for a module without a config (sentence-transformers cannot build it)."""
        config = _required_config(spec)
        mode = config.get("pooling_mode")
        if mode is None:
            flagged = tuple(m for key, m in LEGACY_POOLING_FLAGS.items() if config.get(key))
            modes = flagged or ("mean",)
        else:
            modes = (mode,) if isinstance(mode, str) else tuple(mode)
        try:
            return cls(modes, bool(config.get("include_prompt", True)))
        except ValueError as error:
            raise ValueError(f"{spec.describe()}: {error}") from None

    def __call__(self, features: Features) -> Features:
        prompt_length = 0 if self.include_prompt else features.get("prompt_length", 0)
        hidden, mask = features["token_embeddings"], features["attention_mask"]
        cu_seqlens = features.get("cu_seqlens")
        features["sentence_embedding"] = (
            pool(hidden, mask, self.modes, prompt_length)
            if cu_seqlens is None
            else pool_packed(hidden, mask, cu_seqlens, self.modes, prompt_length)
        )
        return features


class Dense(nn.Module):
    """``activation(linear(x))`` (+ ``x`` or a projection of it, with ``use_residual``) on the
    features key ``module_input_name`` ([B, D] or, for a token-level Dense, [B, S, D]), in
    float32, written to ``module_output_name``."""

    def __init__(self, spec: ModuleSpec):
        super().__init__()
        config = _required_config(spec, "in_features", "out_features")
        self.input_name = config.get("module_input_name", "sentence_embedding")
        self.output_name = config.get("module_output_name") or self.input_name
        self.activation = _activation(config.get("activation_function"), spec)
        state = _module_state(spec)
        self.linear = nn.Linear(
            config["in_features"], config["out_features"], config.get("bias", True)
        )
        self.residual = None
        if config.get("use_residual", False) and config["in_features"] != config["out_features"]:
            self.residual = nn.Linear(config["in_features"], config["out_features"], bias=False)
        self.use_residual = bool(config.get("use_residual", False))
        try:
            self.load_state_dict(state)
        except RuntimeError as error:
            raise ValueError(
                f"{spec.describe()}: its weights do not fit its config: {error}"
            ) from error
        self.requires_grad_(False)

    def __call__(self, features: Features) -> Features:
        x = features[self.input_name].float()
        out = self.activation(self.linear(x))
        if self.use_residual:
            out = out + (x if self.residual is None else self.residual(x))
        features[self.output_name] = out
        return features


class Normalize:
    """L2-normalises the features key ``module_input_name`` (each row, or each token's
    vector) into ``module_output_name``."""

    def __init__(self, spec: ModuleSpec):
        self.input_name = spec.config.get("module_input_name", "sentence_embedding")
        self.output_name = spec.config.get("module_output_name") or self.input_name

    def __call__(self, features: Features) -> Features:
        value = features.get(self.input_name)
        if value is not None:
            features[self.output_name] = nn.functional.normalize(value.float(), p=2, dim=-1)
        return features


class SpladePooling:
    """Masked-LM logits (``token_embeddings`` [B, S, V]) -> ``sentence_embedding`` [B, V]: the
    max (or sum) over real tokens of ``log1p(relu(logit))`` (``log1p_relu``: of
    ``log1p(log1p(relu(logit)))``). A model whose SpladePooling takes the max right after its
    transformer never holds those logits: its encoder pools them in the masked-LM head
    (:meth:`fastbert.model.masked_lm_head.MaskedLMHead.splade`)."""

    def __init__(self, spec: ModuleSpec):
        config = spec.config
        self.strategy = config.get("pooling_strategy", "max")
        activation = config.get("activation_function", "relu")
        if self.strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
            raise ValueError(
                f"{spec.describe()}: pooling_strategy {self.strategy!r} / activation_function "
                f"{activation!r} is not one sentence-transformers defines"
            )
        self.log_steps = 2 if activation == "log1p_relu" else 1

    def __call__(self, features: Features) -> Features:
        logits = features["token_embeddings"].float()
        mask = features["attention_mask"].to(torch.float32).unsqueeze(-1)
        values = (logits * mask).relu()
        for _ in range(self.log_steps):
            values = values.log1p()
        cu_seqlens = features.get("cu_seqlens")
        if cu_seqlens is None:
            pooled = values.amax(dim=1) if self.strategy == "max" else values.sum(dim=1)
        else:  # the values are >= 0: a max from zeros is the max over the sequence
            segments = Segments.of(cu_seqlens, values.shape[0])
            maximum = self.strategy == "max"
            pooled = segments.reduce(values, "amax", 0.0) if maximum else segments.sum(values)
        features["sentence_embedding"] = pooled
        return features


class MultiVectorMask:
    """The tokens a late-interaction (ColBERT) model scores with: ``attention_mask`` without
    the skiplist's tokens for the tasks in ``skiplist_tasks`` (no task counts as "document"),
    and for any task but "query" only ``keep_only_token_ids`` when set. ``tokenizer`` turns the
    skiplist's words into ids (words that are no single token are dropped, as
    sentence-transformers drops them)."""

    def __init__(self, spec: ModuleSpec, tokenizer: Any):
        config = spec.config
        words = list(config.get("skiplist_words") or [])
        tasks = config.get("skiplist_tasks")
        self.skiplist_tasks = [tasks] if isinstance(tasks, str) else list(tasks or ["document"])
        self.keep_only = config.get("keep_only_token_ids")
        unk = getattr(tokenizer, "unk_token_id", None)
        ids = [tokenizer.convert_tokens_to_ids(w) for w in words]
        kept = [i for w, i in zip(words, ids) if i != unk or w == tokenizer.unk_token]
        self.skip_ids = torch.tensor(kept, dtype=torch.long) if kept else None

    def __call__(self, features: Features, task: str | None = None) -> Features:
        ids = features["input_ids"]
        mask = features["attention_mask"].bool()
        if (task or "document") in self.skiplist_tasks and self.skip_ids is not None:
            mask = mask & ~torch.isin(ids, self.skip_ids.to(ids.device))
        if task != "query" and self.keep_only:
            keep = torch.as_tensor(self.keep_only, dtype=torch.long, device=ids.device)
            mask = mask & torch.isin(ids, keep)
        features["attention_mask"] = mask
        return features


# The modules that run on packed features (all of fastbert's own).
PACKED_MODULES = (Pooling, Dense, Normalize, SpladePooling, MultiVectorMask)


def native_module(spec: ModuleSpec, tokenizer: Any) -> Any | None:
    """fastbert's own implementation of the module ``spec`` names, built from its folder (its
    ``spec`` attribute names it in errors); None when fastbert has none (it then runs through
    sentence-transformers, or is refused)."""
    builders = {
        "Pooling": Pooling.from_spec,
        "Dense": Dense,
        "Normalize": Normalize,
        "SpladePooling": SpladePooling,
        "MultiVectorMask": lambda s: MultiVectorMask(s, tokenizer),
    }
    build = builders.get(spec.class_name)
    if build is None:
        return None
    module = build(spec)
    module.spec = spec
    return module


def takes_task(module: Any) -> bool:
    """Whether the module's call takes the task ("query", "document" or None)."""
    return isinstance(module, MultiVectorMask) or getattr(module, "takes_task", False)


def torch_module_class(path: object) -> type[nn.Module] | None:
    """The ``torch.nn.Module`` class a model folder names by its path (e.g.
    "torch.nn.modules.activation.Tanh"), or None: sentence-transformers' rule, only classes
    under ``torch`` load from a config (anything else would run code the folder brings)."""
    if not isinstance(path, str) or not path.startswith("torch."):
        return None
    module_name, _, class_name = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), class_name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) and issubclass(found, nn.Module) else None


def _activation(path: str | None, spec: ModuleSpec) -> nn.Module:
    """A torch.nn activation module from its class path (sentence-transformers' rule: only
    ``torch.*`` nn.Module classes load from a config); Tanh when the config names none."""
    if path is None:
        return nn.Tanh()
    activation = torch_module_class(path)
    if activation is None:
        raise ValueError(
            f"{spec.describe()}: activation_function {path!r} is not a torch.nn module class; "
            "fastbert runs no code a model folder brings"
        )
    return activation()


def _required_config(spec: ModuleSpec, *keys: str) -> Mapping[str, Any]:
    """The module's config; ValueError naming the module when it has none or lacks ``keys``."""
    if not spec.config:
        raise ValueError(f"{spec.describe()}: no config.json in {spec.folder}")
    missing = [key for key in keys if key not in spec.config]
    if missing:
        raise ValueError(f"{spec.describe()}: its config.json has no {', '.join(missing)}")
    return spec.config


def _module_state(spec: ModuleSpec) -> Mapping[str, torch.Tensor]:
    """The weights in a module's folder (model.safetensors or pytorch_model.bin)."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        path = spec.folder / name
        if path.exists():
            return read_weights_file(path)
    raise ValueError(f"{spec.describe()} has no weights (model.safetensors or pytorch_model.bin)")
