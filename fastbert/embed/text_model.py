"""A model folder loaded once for texts: ``fastbert.load(path)`` -> :class:`TextModel`, the
object that ``fastbert.embed``, ``fastbert embed`` and ``fastbert serve`` run.

Two kinds of folder load: an embedding model (a sentence-transformers folder, or a Hugging Face
BERT-family encoder folder) embeds texts, with the pooling, normalisation and maximum length the
folder says; a ``*ForSequenceClassification`` folder (a cross-encoder) scores texts and text
pairs. A TextModel is safe to share between threads: the model's forward is, and each thread
tokenises with its own copy of the tokenizer.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastbert.embed import model, readers, run
from fastbert.embed.options import DTYPES, EmbedOptions
from fastbert.embed.tokenize import Tokenise, Tokens
from fastbert.model.encoder import BertModel

EMBEDDING = "embedding"
CLASSIFICATION = "classification"


class InputTooLong(ValueError):
    """An input over the model's limit, with truncation turned off."""

    def __init__(self, index: int, length: int, limit: int):
        super().__init__(
            f"input {index} has {length} tokens, more than the model's limit of {limit} "
            "(turn truncation on to cut it)"
        )
        self.index, self.length, self.limit = index, length, limit


class TextModel:
    """A model folder, loaded: texts in, embeddings (or classification logits) out.

    ``kind``: "embedding" or "classification"; ``options``: the resolved
    :class:`~fastbert.embed.options.EmbedOptions` (device, dtype, max_length, pooling, normalize,
    batch_tokens all set); ``labels``: a classifier's label names by index (None for an
    embedding model). Load one with :func:`load`.
    """

    def __init__(
        self,
        kind: str,
        options: EmbedOptions,
        tokenizer: Any,
        encoder: model.Encoder | None = None,
        classifier: model.Classifier | None = None,
        labels: list[str] | None = None,
    ):
        self.kind = kind
        self.options = options
        self.tokenise = Tokenise(tokenizer, options.max_length)
        self.encoder = encoder
        self.classifier = classifier
        self.labels = labels
        # The embed loop's encoder: pooled embeddings as computed (float32), normalised (and
        # cut to a width) afterwards, per call.
        self._raw = None
        if encoder is not None:
            self._raw = copy.copy(encoder)
            self._raw.normalize, self._raw.store_dtype = False, np.dtype(np.float32)

    def __repr__(self) -> str:
        o = self.options
        return (
            f"TextModel({o.model!r}, kind={self.kind}, device={o.device}, dtype={o.dtype}, "
            f"backend={o.backend}, max_length={o.max_length})"
        )

    @property
    def max_length(self) -> int:
        """The most tokens an input may have (special tokens included)."""
        return self.options.max_length

    @property
    def vocab_size(self) -> int:
        """The number of token ids the model knows (ids are 0 .. vocab_size - 1)."""
        if self.encoder is not None:
            return self.encoder.model.config.vocab_size
        return self.classifier.model.config.vocab_size

    @property
    def dimensions(self) -> int | None:
        """The width of an embedding (None for a classifier)."""
        return self.encoder.dimensions if self.encoder is not None else None

    def tokenize(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        truncate: bool = True,
        side: str = "right",
    ) -> Tokens:
        """Token ids of ``texts`` (or of the pairs (texts[i], pairs[i])), as the model sees
        them. ``truncate``: cut each input to ``max_length`` tokens from ``side``; without it,
        an input over the limit raises :class:`InputTooLong`."""
        tokens = self.tokenise.encode(
            list(texts), None if pairs is None else list(pairs), truncate=truncate, side=side
        )
        if not truncate:
            for index, ids in enumerate(tokens.ids):
                if len(ids) > self.max_length:
                    raise InputTooLong(index, len(ids), self.max_length)
        return tokens

    def embed(
        self,
        texts: Sequence[str],
        *,
        normalize: bool | None = None,
        dimensions: int | None = None,
        progress: bool = False,
    ) -> np.ndarray:
        """Embeddings of ``texts``: numpy [len(texts), dimensions] (``options.store_dtype``),
        row i for text i. ``normalize``: None for what the folder says; ``dimensions``: keep
        the first N values of each embedding (Matryoshka), then normalise. ValueError naming
        the first text that is not a non-blank string."""
        self._require(EMBEDDING, "embed")
        texts = _checked_texts(texts)
        options = replace(self.options, progress=progress)
        loaded = _Loop(self._raw, self.tokenise, options)
        sink = run.ArraySink(len(texts), self.encoder.dimensions, np.dtype(np.float32))
        rows = (readers.Row(i, i, t, readers.LIST_SOURCE, i) for i, t in enumerate(texts))
        run.run_rows(rows, loaded, sink, 0)
        return finish_embeddings(
            sink.array,
            self.options.normalize if normalize is None else normalize,
            dimensions,
            np.dtype(self.options.store_dtype),
        )

    def embed_tokens(self, tokens: list[list[int]]) -> np.ndarray:
        """Token ids of n inputs -> pooled, unnormalised embeddings, numpy float32
        [n, hidden], in one forward pass (the caller sizes the batch)."""
        self._require(EMBEDDING, "embed")
        with torch.inference_mode():
            pooled = self.encoder.pooled(tokens)
        return pooled.float().cpu().numpy()

    def classify(
        self, texts: Sequence[str], pairs: Sequence[str] | None = None, *, truncate: bool = True
    ) -> np.ndarray:
        """Raw logits, numpy float32 [len(texts), len(labels)], of ``texts`` (or of the pairs
        (texts[i], pairs[i]): a cross-encoder's query and document), in batches of
        ``options.batch_tokens`` tokens."""
        self._require(CLASSIFICATION, "classify")
        texts = _checked_texts(texts)
        if pairs is not None:
            pairs = _checked_texts(pairs)
            if len(pairs) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        tokens = self.tokenize(texts, pairs, truncate=truncate)
        logits = np.zeros((len(texts), len(self.labels)), np.float32)
        lengths = [len(ids) for ids in tokens.ids]
        for batch in run.token_batches(lengths, self.options.batch_tokens):
            type_ids = None if tokens.type_ids is None else [tokens.type_ids[i] for i in batch]
            logits[batch] = self.classify_tokens([tokens.ids[i] for i in batch], type_ids)
        return logits

    def classify_tokens(
        self, tokens: list[list[int]], type_ids: list[list[int]] | None
    ) -> np.ndarray:
        """Token ids (and token types) of n inputs -> raw logits, numpy float32
        [n, len(labels)], in one forward pass."""
        self._require(CLASSIFICATION, "classify")
        return self.classifier(tokens, type_ids)

    def _require(self, kind: str, what: str) -> None:
        if self.kind != kind:
            raise ValueError(
                f"{self.options.model} is a {self.kind} model; it cannot {what} "
                f"(that needs a {kind} model)"
            )


class _Loop:
    """What :func:`fastbert.embed.run.run_rows` runs (see run.Loaded)."""

    def __init__(self, encoder: model.Encoder, tokenise: Tokenise, options: EmbedOptions):
        self.encoder, self.tokenise, self.options = encoder, tokenise, options


def finish_embeddings(
    pooled: np.ndarray, normalize: bool, dimensions: int | None, dtype: np.dtype
) -> np.ndarray:
    """Pooled embeddings [n, hidden] -> their first ``dimensions`` values (all when None),
    L2-normalised when ``normalize``, as ``dtype``. ValueError for a width outside
    1..hidden."""
    if dimensions is not None:
        width = pooled.shape[1]
        if isinstance(dimensions, bool) or not isinstance(dimensions, int):
            raise ValueError(f"dimensions must be an integer, got {dimensions!r}")
        if not 1 <= dimensions <= width:
            raise ValueError(f"dimensions must be between 1 and {width}, got {dimensions}")
        pooled = pooled[:, :dimensions]
    if normalize:
        pooled = pooled.astype(np.float32, copy=False)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        pooled = pooled / np.maximum(norms, 1e-12)
    return pooled.astype(dtype, copy=False)


def _checked_texts(texts: Any) -> list[str]:
    if isinstance(texts, str | Path) or not isinstance(texts, Sequence):
        raise TypeError(f"give a list of strings, got {type(texts).__name__}")
    for i, text in enumerate(texts):
        problem = readers.text_problem(text, "text")
        if problem is not None:
            raise ValueError(f"texts[{i}]: {problem}")
    return list(texts)


def model_kind(folder: Path) -> str:
    """ "classification" for a Hugging Face ``*ForSequenceClassification`` folder (what
    config.json's ``architectures`` says), else "embedding"."""
    if (folder / "modules.json").exists():
        return EMBEDDING
    try:
        architectures = json.loads((folder / "config.json").read_text()).get("architectures")
    except (OSError, ValueError, AttributeError):
        return EMBEDDING
    if any(str(a).endswith("ForSequenceClassification") for a in architectures or ()):
        return CLASSIFICATION
    return EMBEDDING


def resolve(
    options: EmbedOptions, tokenizer: Any, device: torch.device | None = None
) -> tuple[EmbedOptions, int]:
    """(``options`` with every default resolved from the device (``device``, else this
    machine's) and the model folder: device, dtype, batch_tokens, max_length, pooling,
    normalize; the embedding width). Reads the folder's configs only. ValueError for settings
    the model cannot run."""
    options = options.with_defaults(device)
    folder = Path(options.model)
    settings = model.folder_settings(folder)
    config = model.read_config(folder)
    limit = model.model_max_length(config, tokenizer)
    max_length = options.max_length or min(settings.max_length or limit, limit)
    if max_length > config.max_sequence_length:
        raise ValueError(
            f"max_length {max_length} exceeds the model's {config.max_sequence_length} positions"
        )
    normalize = options.normalize if options.normalize is not None else bool(settings.normalize)
    resolved = replace(
        options,
        max_length=max_length,
        normalize=normalize,
        pooling=options.pooling or settings.pooling or "mean",
    )
    return resolved, config.hidden_size


def load_options(options: EmbedOptions, tokenizer: Any = None) -> TextModel:
    """Load the model and tokenizer of ``options.model`` (the tokenizer may be given) and
    resolve the defaults (see :func:`resolve`)."""
    folder = Path(options.model)
    tokenizer = tokenizer or model.load_tokenizer(folder)
    options, _ = resolve(options, tokenizer)
    device = options.resolved_device()
    pad_id = tokenizer.pad_token_id or 0
    if model_kind(folder) == CLASSIFICATION:
        network, labels = _load_classifier(folder, options, device)
        classifier = model.Classifier(network, pad_id)
        return TextModel(CLASSIFICATION, options, tokenizer, classifier=classifier, labels=labels)
    encoder_model = BertModel.from_pretrained(
        options.model,
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
    encoder = model.Encoder(
        encoder_model, pad_id, options.pooling, options.normalize, np.dtype(options.store_dtype)
    )
    return TextModel(EMBEDDING, options, tokenizer, encoder=encoder)


def _load_classifier(
    folder: Path, options: EmbedOptions, device: torch.device
) -> tuple[Any, list[str]]:
    """A Hugging Face sequence classifier from ``folder`` with fastbert's encoder swapped in,
    on ``device`` in ``options.dtype``; and its label names by index."""
    from fastbert.integrations import models
    from fastbert.integrations.optimize import optimize

    with models.quiet():
        network = models.import_transformers().AutoModelForSequenceClassification.from_pretrained(
            str(folder)
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
) -> TextModel:
    """Load a model folder once, to embed (or classify) texts many times.

    ``model``: a sentence-transformers folder or a Hugging Face BERT-family folder (an encoder:
    embeddings; a ``*ForSequenceClassification``: logits). ``device``: "cpu", "cuda" or
    "cuda:N" (default: CUDA when present); ``dtype``: "float32", "float16" or "bfloat16" (or the
    torch dtype; default float16 on CUDA, float32 on the CPU); ``backend``: "auto", "torch" or
    "triton"; ``max_length``, ``pooling`` ("mean" | "cls"), ``normalize``: None for what the
    folder says; ``batch_tokens``: the token budget of one forward pass (default 16384 on CUDA,
    4096 on the CPU); ``quantize``: None (exact), "int8" or "fp8" (see
    :class:`~fastbert.embed.options.EmbedOptions`). ValueError naming a bad setting, before
    anything loads.

    >>> model = fastbert.load("path/to/all-MiniLM-L6-v2")
    >>> model.embed(["a text", "another"])  # numpy [2, 384]
    """
    if isinstance(dtype, torch.dtype):
        names = {value: name for name, value in DTYPES.items()}
        if dtype not in names:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype}")
        dtype = names[dtype]
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
        progress=False,
    )
    return load_options(options)


__all__ = ["InputTooLong", "TextModel", "finish_embeddings", "load", "load_options", "resolve"]
