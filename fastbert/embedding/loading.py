"""Loading a model folder for texts: ``fastbert.load(path)`` and :func:`load_options` give the
:class:`~fastbert.embedding.text_model.TextModel` that ``fastbert.embed``, ``fastbert embed`` and
``fastbert serve`` run; :func:`resolve` reads the folder's settings alone (the corpus job's
manifest is written from them before anything loads).

A folder loads as sentence-transformers would load it (:mod:`fastbert.model.sentence_folder`):
every module it declares runs, or the load fails naming the module.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastbert.embedding import model
from fastbert.embedding.options import DTYPES, EmbedOptions
from fastbert.embedding.static_sparse import load_static_route
from fastbert.embedding.text_model import TextModel, article, not_matryoshka
from fastbert.execution.backends import resolve_backend
from fastbert.execution.cpu_tuning import apply_process_tuning
from fastbert.model.sentence_folder import (
    CLASSIFICATION,
    EMBEDDING,
    MULTI_VECTOR,
    SPARSE,
    FolderSpec,
    read_folder,
)


def resolve(
    options: EmbedOptions, tokenizer: Any, device: torch.device | None = None
) -> tuple[EmbedOptions, FolderSpec, int | None]:
    """(``options`` with every default resolved from the device (``device``, else this
    machine's) and the model folder: device, dtype, batch_tokens, max_length, normalize and
    prompt (the text itself); the folder as read; the output's width when the folder's configs
    tell it, else None). Reads the folder's configs only. ValueError for settings the model
    cannot run."""
    options = options.with_defaults(device)
    resolve_backend(options.backend, options.device)  # backend="triton" where it cannot run
    spec = read_folder(options.model)
    config = model.read_config(Path(options.model))
    positions = config.max_sequence_length
    max_length = options.max_length
    if max_length is None:
        max_length, source = model.folder_max_length(spec, config, tokenizer)
        if max_length > positions:  # sentence-transformers would fail on the longer texts
            raise ValueError(
                f"{options.model}: its {source} {max_length} exceeds the model's {positions} "
                f"positions; give max_length (at most {positions}) to load it"
            )
    elif max_length > positions:
        raise ValueError(f"max_length {max_length} exceeds the model's {positions} positions")
    special = tokenizer.num_special_tokens_to_add() if tokenizer is not None else 0
    if max_length <= special:
        raise ValueError(
            f"max_length {max_length} leaves no token for the text after the tokenizer's "
            f"{special} special tokens"
        )
    if spec.kind != EMBEDDING:
        names = ("pooling", "normalize", "dimensions")
        dense_only = [n for n in names if getattr(options, n) is not None]
        for name in ("store_dtype", "precision"):
            if getattr(options, name) != "float32":
                dense_only.append(name)
        if dense_only:
            raise ValueError(
                f"{', '.join(dense_only)} applies to dense embeddings; {options.model} is "
                f"{article(spec.kind)} model"
            )
    if options.dimensions is not None and not (options.force_dimensions or spec.matryoshka):
        raise ValueError(not_matryoshka(options.model, options.dimensions))
    if spec.kind != SPARSE and options.max_active_dims is not None:
        raise ValueError(
            f"max_active_dims applies to sparse embeddings; {options.model} is "
            f"{article(spec.kind)} model"
        )
    normalize = options.normalize
    if normalize is None and spec.kind == EMBEDDING:
        normalize = model.ends_with_normalize(spec)
    dimensions, force = options.dimensions, options.force_dimensions
    if _cuts_to_truncate_dim(options, spec):
        dimensions, force = spec.truncate_dim, True  # the folder's own width
    max_active_dims = options.max_active_dims
    if max_active_dims is None and spec.kind == SPARSE:
        max_active_dims = spec.max_active_dims
    resolved = replace(
        options,
        max_length=max_length,
        normalize=normalize,
        dimensions=dimensions,
        force_dimensions=force,
        max_active_dims=max_active_dims,
        prompt_name=None,
        prompt=spec.prompt(options.prompt_name, options.prompt),  # a cross-encoder's: the query's
    )
    width = dimensions or model.declared_dimensions(spec, config, options.pooling)
    return resolved, spec, width


def _cuts_to_truncate_dim(options: EmbedOptions, spec: FolderSpec) -> bool:
    """Whether the embeddings are cut to the folder's truncate_dim: a dense model's, unless
    ``options`` name a width."""
    return spec.truncate_dim is not None and spec.kind == EMBEDDING and options.dimensions is None


def normalizes_before_cut(options: EmbedOptions, spec: FolderSpec) -> bool:
    """Whether a dense model normalises its embeddings before cutting them (else after):
    when they are cut to the folder's own truncate_dim and ``options`` leave normalising to
    the folder, as sentence-transformers runs the folder's final Normalize and then cuts
    (vectors shorter than 1). A width given (``dimensions``) or ``normalize`` set cuts first
    and then normalises, when normalising: unit vectors of that width."""
    return _cuts_to_truncate_dim(options, spec) and options.normalize is None


def load_options(options: EmbedOptions, tokenizer: Any = None) -> TextModel:
    """Load the model and tokenizer of ``options.model`` (the tokenizer may be given) and
    resolve the defaults (see :func:`resolve`). ValueError naming a module of the folder that
    cannot run. Applies the process's CPU settings first (fastbert.execution.cpu_tuning)."""
    apply_process_tuning()
    folder = Path(options.model)
    tokenizer = tokenizer or model.load_tokenizer(folder)
    given = options
    options, spec, _ = resolve(options, tokenizer)
    device = options.resolved_device()
    pad_id = tokenizer.pad_token_id or 0
    if spec.kind == CLASSIFICATION:
        network, labels = _load_classifier(spec.transformer.folder, options, device)
        classifier = model.Classifier(network, pad_id)
        probe = tokenizer(["a probe", "a longer probe"], ["a text", "a"])
        classifier.probe(probe["input_ids"], probe.get("token_type_ids"))
        return TextModel(spec, options, tokenizer, classifier=classifier, labels=labels)
    encoder_model = model.load_encoder_model(
        str(spec.transformer.folder),
        dtype=DTYPES[options.dtype],
        device=device,
        backend=options.backend,
        quantize=options.quantize,
        # On CUDA the packed path skips the padding; on the CPU the length-sorted batches hold
        # little padding and the dense path is the faster one.
        padding_free=True if device.type == "cuda" else "auto",
        # This model's weights are only read: the CPU linears may keep packed copies.
        packed_weights=True,
    )
    head = model.load_masked_lm_head(spec, encoder_model) if spec.kind == SPARSE else None
    # A sparse or multi-vector model's final Normalize runs as a module (their vectors are
    # finished by no normalize setting); a dense model's is the encoder's normalize, before or
    # after the cut to fewer dimensions (see normalizes_before_cut).
    keep_normalize = spec.kind != EMBEDDING
    modules, _ = model.build_modules(spec, tokenizer, device, options.pooling, keep_normalize)
    encoder = model.FolderPipeline(
        encoder_model,
        pad_id,
        modules,
        spec.kind,
        options.normalize,
        np.dtype(options.store_dtype),
        head,
        normalize_first=normalizes_before_cut(given, spec),
    )
    encoder.probe(tokenizer(["a probe"])["input_ids"])
    if spec.kind == MULTI_VECTOR and spec.truncate_dim is not None:
        encoder.truncate_dim = min(spec.truncate_dim, encoder.dimensions)
    # An inference-free SPLADE model's queries: a route of their own, without the encoder.
    static = load_static_route(spec.router.static_folder) if spec.router is not None else None
    loaded = TextModel(
        spec, options, tokenizer, encoder=encoder, prompt_name=given.prompt_name, static=static
    )
    if options.dimensions is not None:
        loaded.check_dimensions(options.dimensions, options.force_dimensions)
        encoder.truncate_dim = options.dimensions
    encoder.max_active_dims = options.max_active_dims
    return loaded


def _load_classifier(
    folder: Path, options: EmbedOptions, device: torch.device
) -> tuple[Any, list[str]]:
    """A Hugging Face sequence classifier from ``folder`` with fastbert's encoder swapped in,
    on ``device`` in ``options.dtype``; and its label names by index."""
    from fastbert.integrations import models
    from fastbert.integrations.optimize import optimize

    with models.quiet():
        network = models.import_transformers().AutoModelForSequenceClassification.from_pretrained(
            str(folder), local_files_only=True
        )
    network = network.to(device).eval()
    optimize(
        network,
        dtype=DTYPES[options.dtype],
        backend=options.backend,
        padding_free=True if device.type == "cuda" else "auto",
        quantize=options.quantize,
        packed_weights=True,
    )
    id2label = network.config.id2label or {}
    labels = [str(id2label.get(i, f"LABEL_{i}")) for i in range(network.config.num_labels)]
    return network, labels


def load(
    model: str | Path,
    *,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    backend: str = "auto",
    max_length: int | None = None,
    pooling: str | None = None,
    normalize: bool | None = None,
    batch_tokens: int | None = None,
    store_dtype: str = "float32",
    quantize: str | None = None,
    prompt_name: str | None = None,
    prompt: str | None = None,
    dimensions: int | None = None,
    force_dimensions: bool = False,
) -> TextModel:
    """Load a model folder once, to embed (or classify) texts many times.

    ``model``: a sentence-transformers folder (every kind: dense, sparse, multi-vector,
    cross-encoder) or a Hugging Face BERT-family folder (an encoder: embeddings; a
    ``*ForSequenceClassification``: logits). ``device``: "cpu", "cuda" or "cuda:N" (default:
    CUDA when present); ``dtype``: "float32", "float16" or "bfloat16" (or the torch dtype;
    default float16 on CUDA, float32 on the CPU); ``backend``: "auto", "torch" or "triton";
    ``max_length``, ``pooling`` (a sentence-transformers pooling mode: "mean", "cls", "max",
    "mean_sqrt_len_tokens", "weightedmean", "lasttoken"), ``normalize``: None for what the
    folder says; ``batch_tokens``: the token budget of one forward pass (default 16384 on CUDA,
    4096 on the CPU); ``quantize``: None (exact), "int8" or "fp8"; ``prompt_name`` /
    ``prompt``: the prompt put before every input by default; ``dimensions``: the width of
    a dense model's embeddings by default (the first N values, normalised again where the
    model normalises, as sentence-transformers' ``encode(truncate_dim=N,
    normalize_embeddings=True)``; a model not Matryoshka-trained needs
    ``force_dimensions=True``; see :class:`~fastbert.embedding.options.EmbedOptions`).
    ValueError naming a bad setting, before anything loads, or a module of the folder that
    cannot run.

    >>> model = fastbert.load("path/to/all-MiniLM-L6-v2")
    >>> model.embed(["a text", "another"])  # numpy [2, 384]
    """
    options = EmbedOptions(
        model=str(model),
        device=device,
        dtype=dtype,
        backend=backend,
        max_length=max_length,
        pooling=pooling,
        normalize=normalize,
        batch_tokens=batch_tokens,
        store_dtype=store_dtype,
        quantize=quantize,
        prompt_name=prompt_name,
        prompt=prompt,
        dimensions=dimensions,
        force_dimensions=force_dimensions,
        progress=False,
    )
    return load_options(options)


def model_files(folder: Path, outside: Path | None = None) -> list[tuple[str, int, int]]:
    """(path relative to ``folder``, size, modification time in nanoseconds) of each file a
    model loads from ``folder`` (at any depth: a sentence-transformers folder keeps its
    weights in a subfolder), sorted; none under ``outside`` (an output folder inside it).
    Another list means other weights, settings or vocabulary may load. ValueError for a file
    that links to nothing (a Hugging Face cache's blob still downloading)."""
    folder = Path(folder).resolve()
    skip = None if outside is None else Path(outside).resolve()
    found = []
    for root, _, files in os.walk(folder):
        if skip is not None and (Path(root) == skip or skip in Path(root).parents):
            continue
        for name in files:
            if name.endswith((".json", ".safetensors", ".bin", ".txt", ".model")):
                path = os.path.join(root, name)
                try:
                    stat = os.stat(path)
                except FileNotFoundError:  # a link to a blob not there
                    raise ValueError(
                        f"{path} links to a file that is not there (a download cut short?)"
                    ) from None
                found.append((os.path.relpath(path, folder), stat.st_size, stat.st_mtime_ns))
    return sorted(found)


__all__ = ["load", "load_options", "model_files", "normalizes_before_cut", "resolve"]
