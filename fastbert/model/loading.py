"""Loading Hugging Face BERT weights into fastbert's fused layout.

Sources: a local checkpoint folder (config.json + model.safetensors, sharded safetensors or
pytorch_model.bin; a sentence-transformers folder too), a transformers ``BertModel`` /
``BertFor*`` instance, or a sentence-transformers ``SentenceTransformer``. Every tensor is
mapped explicitly by name (:func:`hf_weight_names`, built on the BERT row of
fastbert.model.families; the encoder of another family through its row); a missing or
mis-shaped tensor raises a ValueError naming it, and so does a malformed file of the folder
(config.json, the safetensors index, modules.json, the weights) naming the file.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from fastbert.execution import validation
from fastbert.model.config import BertConfig, read_json_file
from fastbert.model.families import BERT, Family, family_of_class, family_of_model_type
from fastbert.model.router_folder import ROUTERS, config_path

_MASKED_LM_TENSORS = {
    "transform_weight": ("cls.predictions.transform.dense.weight",),
    "transform_bias": ("cls.predictions.transform.dense.bias",),
    "transform_ln_weight": ("cls.predictions.transform.LayerNorm.weight",),
    "transform_ln_bias": ("cls.predictions.transform.LayerNorm.bias",),
    "decoder_bias": ("cls.predictions.bias",),
}
_HEAD_TENSORS = {
    "BertForMaskedLM": _MASKED_LM_TENSORS,
    "BertForPreTraining": {
        **_MASKED_LM_TENSORS,
        "seq_relationship_weight": ("cls.seq_relationship.weight",),
        "seq_relationship_bias": ("cls.seq_relationship.bias",),
    },
    "BertForNextSentencePrediction": {
        "classifier_weight": ("cls.seq_relationship.weight",),
        "classifier_bias": ("cls.seq_relationship.bias",),
    },
    "BertForSequenceClassification": {
        "classifier_weight": ("classifier.weight",),
        "classifier_bias": ("classifier.bias",),
    },
}
# Checkpoints converted from the original TensorFlow BERT name LayerNorm parameters so.
_LEGACY_SUFFIXES = {"LayerNorm.weight": "LayerNorm.gamma", "LayerNorm.bias": "LayerNorm.beta"}


def encoder_weight_names(config: BertConfig, with_pooler: bool) -> dict[str, tuple[str, ...]]:
    """fastbert BertModel parameter name -> Hugging Face BertModel tensor names."""
    return BERT.weight_names(config.num_hidden_layers, with_pooler)


def hf_weight_names(model_class: str, config: BertConfig, with_pooler: bool = True) -> dict:
    """fastbert parameter name -> Hugging Face names, for ``model_class`` (a fastbert class name).

    Encoder tensors of a head model live under ``bert.`` on both sides.
    """
    if model_class == "BertModel":
        return encoder_weight_names(config, with_pooler)
    encoder = encoder_weight_names(config, model_class != "BertForMaskedLM")
    names = {f"bert.{ours}": tuple(f"bert.{t}" for t in theirs) for ours, theirs in encoder.items()}
    names.update(_HEAD_TENSORS[model_class])
    return names


def _lookup(state: Mapping[str, torch.Tensor], name: str) -> torch.Tensor | None:
    if name in state:
        return state[name]
    for new, old in _LEGACY_SUFFIXES.items():
        if name.endswith(new) and name[: -len(new)] + old in state:
            return state[name[: -len(new)] + old]
    return None


def _normalize_prefix(
    state: Mapping[str, torch.Tensor], model_class: str, family: Family = BERT
) -> dict:
    """Give encoder tensors the prefix ``model_class`` expects (``bert.`` for head models; none
    for the encoder, whose tensors a head checkpoint of ``family`` holds under its base
    attribute)."""
    if model_class == "BertModel":
        prefix = f"{family.base_attr}."
        if any(k.startswith(prefix) for k in state):
            return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        return dict(state)
    has_prefix = any(k.startswith("bert.") for k in state)
    if model_class != "BertModel" and not has_prefix:
        return {
            (k if k.startswith(("cls.", "classifier.")) else f"bert.{k}"): v
            for k, v in state.items()
        }
    return dict(state)


def check_tied_decoder(state: Mapping[str, torch.Tensor]) -> None:
    """fastbert's masked-LM decoder is the word-embedding matrix; refuse an untied one."""
    decoder = state.get("cls.predictions.decoder.weight")
    word = _lookup(state, "bert.embeddings.word_embeddings.weight")
    if (
        decoder is not None
        and word is not None
        and not (decoder.data_ptr() == word.data_ptr() or torch.equal(decoder, word))
    ):
        raise ValueError(
            "cls.predictions.decoder.weight differs from the word embeddings; fastbert's "
            "masked-LM head ties them, as BERT does"
        )


def load_weights(
    model: torch.nn.Module, state: Mapping[str, torch.Tensor], family: Family = BERT
) -> None:
    """Copy Hugging Face tensors of ``family`` from ``state`` into ``model``'s parameters
    (cast, moved). fastbert's heads load BERT tensors; its encoder (BertModel) those of every
    family."""
    model_class = type(model).__name__
    if family is not BERT and model_class != "BertModel":
        raise ValueError(
            f"fastbert.{model_class} loads BERT checkpoints; run {family.name} heads through "
            f"fastbert.optimize, or load the encoder alone with fastbert.BertModel"
        )
    state = _normalize_prefix(state, model_class, family)
    if model_class in ("BertForMaskedLM", "BertForPreTraining"):
        check_tied_decoder(state)
        # The decoder bias Hugging Face adds, by the family's precedence (the decoder's own).
        bias = next((n for n in BERT.masked_lm_head.biases if n in state), None)
        if bias is not None:
            state["cls.predictions.bias"] = state[bias]
    params = dict(model.named_parameters())
    with_pooler = "pooler.weight" in params or "bert.pooler.weight" in params
    if family is BERT:
        names = hf_weight_names(model_class, model.config, with_pooler)
    else:
        with_projection = "embeddings.project_weight" in params  # ELECTRA's E != H
        names = family.weight_names(model.config.num_hidden_layers, with_pooler, with_projection)
    unread = sorted(set(params) - set(names))
    if unread:  # a parameter no checkpoint tensor names would keep its initial values
        raise RuntimeError(f"fastbert reads no checkpoint tensor into {unread[0]}")
    for ours, theirs in names.items():
        found = [_lookup(state, t) for t in theirs]
        missing = [t for t, f in zip(theirs, found) if f is None]
        if missing:
            raise ValueError(f"the checkpoint lacks {missing[0]!r} (needed for {ours})")
        source = found[0] if len(found) == 1 else torch.cat(found, dim=0)
        target = params[ours]
        if tuple(source.shape) != tuple(target.shape):
            raise ValueError(
                f"{' + '.join(theirs)} has shape {tuple(source.shape)}, fastbert's {ours} "
                f"expects {tuple(target.shape)} (from the config)"
            )
        target.data.copy_(source.detach())


def _read_checkpoint_folder(
    folder: Path,
) -> tuple[BertConfig, dict, dict[str, torch.Tensor], Family]:
    """(config, config dict, state dict, family) from a local Hugging Face or
    sentence-transformers folder. The config is checked before any weights are read; every
    error names its file."""
    folder = transformer_folder(folder)
    config, raw, family = read_checkpoint_config(folder)
    return config, raw, read_checkpoint_state(folder), family


def read_checkpoint_config(folder: Path) -> tuple[BertConfig, dict, Family]:
    """(config, config dict, family) of the config.json of a Hugging Face checkpoint
    ``folder``, read as its ``model_type``'s family (BERT when it names none fastbert runs, so
    that the error names the model_type); errors name the file."""
    config_path = folder / "config.json"
    if not config_path.exists():
        raise ValueError(f"{folder} has no config.json: not a Hugging Face checkpoint folder")
    raw = read_json_file(config_path)
    family = BERT
    if isinstance(raw, Mapping) and isinstance(raw.get("model_type"), str):
        family = family_of_model_type(raw["model_type"]) or BERT
    return BertConfig.from_dict(raw, family, source=config_path), raw, family


def transformer_folder(folder: Path) -> Path:
    """The folder holding the transformers checkpoint: ``folder`` itself, or for a
    sentence-transformers folder without a config.json, its Transformer module's folder; for
    a Router's folder (whose config.json may be the Router's), its Transformer route's."""
    modules_path = folder / "modules.json"
    if not modules_path.exists():
        return folder
    modules = read_json_file(modules_path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ValueError(f"{modules_path} must be a JSON list of module objects")
    for module in modules:
        kind, path = module.get("type", ""), module.get("path", "")
        if not isinstance(kind, str) or not isinstance(path, str):
            raise ValueError(f"{modules_path}: a module's type and path must be strings")
        if kind.endswith("Transformer"):
            return folder if (folder / "config.json").exists() else folder / path
        if kind.rsplit(".", 1)[-1] in ROUTERS:  # its config.json is the Router's, not a model's
            config = config_path(folder / path)
            types = read_json_file(config).get("types") if config.exists() else None
            for name, module_type in (types or {}).items():
                if str(module_type).endswith("Transformer"):
                    return folder / path / name
    return folder


def read_checkpoint_state(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict of the weights in ``folder`` (the files :func:`checkpoint_files` names),
    read on the CPU."""
    state: dict[str, torch.Tensor] = {}
    for path in checkpoint_files(folder):
        state.update(read_weights_file(path))
    return state


def checkpoint_files(folder: Path) -> list[Path]:
    """The weights files of ``folder`` that Hugging Face reads: model.safetensors first
    (save_pretrained over a sharded checkpoint leaves its index behind), then the shards a
    model.safetensors.index.json names, then pytorch_model.bin, then the shards a
    pytorch_model.bin.index.json names. ValueError when there are none, or the file is a
    link to nothing."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).exists():
            return [folder / name]
        if (folder / name).is_symlink():  # a Hugging Face cache's blob still downloading
            raise ValueError(
                f"{folder / name} links to a file that is not there (a download cut short?)"
            )
        index = folder / f"{name}.index.json"
        if index.exists():
            return _shards(index)
    raise ValueError(
        f"{folder} holds no weights (model.safetensors, pytorch_model.bin or the index.json "
        "of either's shards)"
    )


def read_weights_file(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one weights file (``*.safetensors`` or a ``torch.save`` state dict),
    read on the CPU; ValueError naming ``path`` when it cannot be read."""
    if path.suffix == ".safetensors":
        return _read_safetensors(path)
    return _read_bin(path)


def _shards(index: Path) -> list[Path]:
    """The shard files a weights index (``*.index.json``) names in its weight_map, each once."""
    contents = read_json_file(index)
    weight_map = contents.get("weight_map") if isinstance(contents, dict) else None
    if not isinstance(weight_map, dict):
        raise ValueError(
            f"{index} must be a JSON object with a weight_map object (tensor name -> shard file)"
        )
    names = set(weight_map.values())
    if not all(isinstance(name, str) for name in names):
        raise ValueError(f"{index}: every weight_map value must be a shard file name")
    for name in sorted(names):
        if not (index.parent / name).is_file():
            raise ValueError(f"{index} names the shard {name!r}, which does not exist")
    return [index.parent / name for name in sorted(names)]


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; ValueError naming ``path`` when it is corrupt or empty."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except SafetensorError as error:
        raise ValueError(f"{path} is not a readable safetensors file: {error}") from error


def _read_bin(path: Path) -> dict[str, torch.Tensor]:
    """A pytorch_model.bin's state dict; ValueError naming ``path`` when it cannot be read or
    holds something else."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        # Damaged bytes fail in many ways (the zip reader's RuntimeError, EOFError, the
        # weights-only unpickler's UnpicklingError or IndexError...); torch's own message, often
        # long, stays attached as the cause.
        raise ValueError(
            f"{path} is not a readable PyTorch checkpoint: torch.load(weights_only=True) raised "
            f"{type(error).__name__}"
        ) from error
    if not isinstance(state, Mapping):
        raise ValueError(
            f"{path} holds a {type(state).__name__}, not a state dict (tensor name -> tensor)"
        )
    for name, value in state.items():
        if not isinstance(name, str):
            raise ValueError(f"{path} is not a state dict: its key {name!r} is not a string")
        if not isinstance(value, torch.Tensor):
            raise ValueError(
                f"{path} is not a state dict: {name!r} holds a {type(value).__name__}, not a tensor"
            )
    return dict(state)


def is_sentence_transformer(source: Any) -> bool:
    return type(source).__module__.startswith("sentence_transformers") and hasattr(
        source, "__getitem__"
    )


def read_source(source: Any) -> tuple[BertConfig, dict, Mapping[str, torch.Tensor], Family]:
    """(config, raw config dict, state dict, family) from any supported ``source``."""
    if isinstance(source, (str, Path)):
        folder = Path(source)
        if not folder.is_dir():
            raise ValueError(
                f"{source!r} is not a local folder; fastbert loads local checkpoint folders or "
                "model instances (download hub checkpoints first, e.g. with "
                "huggingface_hub.snapshot_download)"
            )
        return _read_checkpoint_folder(folder)
    if is_sentence_transformer(source):
        source = source[0].auto_model
    if hasattr(source, "config") and hasattr(source, "state_dict"):
        raw = source.config.to_dict()
        found = family_of_class([c.__name__ for c in type(source).__mro__])
        family = found[0] if found is not None else BERT
        return BertConfig.from_hf(source.config, family), raw, source.state_dict(), family
    raise TypeError(
        "from_pretrained takes a checkpoint folder, a transformers BERT model or a "
        f"SentenceTransformer, got {type(source).__name__}"
    )


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class PretrainedMixin:
    """Adds ``from_pretrained`` to fastbert's model classes."""

    @classmethod
    def from_pretrained(
        cls,
        source: Any,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        backend: str = "auto",
        padding_free: str | bool = "auto",
        cuda_graphs: str | bool = "auto",
        quantize: str | None = None,
        packed_weights: bool = False,
    ):
        """Load Hugging Face BERT weights into a new fastbert model.

        source: a local checkpoint folder, a transformers BertModel/BertFor* instance or a
        SentenceTransformer; fastbert.BertModel also loads the encoder of the other families
        (fastbert.model.families: RoBERTa, MPNet, ...) from their folders and instances.
        dtype defaults to float16 on CUDA and float32 elsewhere; device to CUDA when available.
        backend: "auto" (Triton on CUDA, PyTorch elsewhere), "torch" or "triton". padding_free,
        cuda_graphs: "auto", True or False; packed_weights: True or False (see
        fastbert.execution.runtime).
        quantize: None (exact floating point), "int8" or "fp8": the encoder layers' linears on
        int8 (or float8 e4m3) weights (per output channel) and activations (per token), for
        inference (see fastbert.model.quantization); on the CPU with dtype float32 (fp8 there
        is an emulation, for its accuracy), on CUDA on sm_80 (int8) / sm_89 (fp8) or newer.
        Raises TypeError for a dtype other than float16, bfloat16 or float32 (or not float32
        with quantize on the CPU), and ValueError for a CUDA device on a machine without one,
        an unknown quantize or a GPU without its tensor cores, before reading anything;
        ValueError naming
        the file for a malformed config.json, index, modules.json or weights file, and naming
        any missing or mis-shaped tensor.
        """
        if dtype is not None:
            validation.check_dtype(dtype)
        device = validation.check_device(device if device is not None else default_device())
        if dtype is None:
            dtype = torch.float16 if device.type == "cuda" else torch.float32
        validation.check_quantize(quantize, dtype, device)
        config, _, state, family = read_source(source)
        kwargs: dict[str, Any] = {
            "dtype": dtype,
            "device": device,
            "backend": backend,
            "padding_free": padding_free,
            "cuda_graphs": cuda_graphs,
            "packed_weights": packed_weights,
        }
        if cls.__name__ == "BertModel":
            normalized = _normalize_prefix(state, "BertModel", family)
            if "pooler.dense.weight" not in normalized:
                if family.pooler:  # a family without one (ModernBERT, DistilBERT): no news
                    warnings.warn(
                        "the checkpoint has no pooler; pooler_output will be None", stacklevel=2
                    )
                kwargs["add_pooling_layer"] = False
        model = cls(config, **kwargs)
        load_weights(model, state, family)
        if quantize is not None:
            # Quantised from the loaded weights (the constructor's were zeros); frozen.
            model.requires_grad_(False)
            getattr(model, "bert", model).quantize = quantize
        return model.eval()
