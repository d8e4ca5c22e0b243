"""A model folder loaded once for texts: :class:`TextModel`, what ``fastbert.load(path)``
gives (:mod:`fastbert.embedding.loading`) and ``fastbert.embed``, ``fastbert embed`` and
``fastbert serve`` run.

A folder loads as sentence-transformers would load it (:mod:`fastbert.model.sentence_folder`):
every module it declares runs, or the load fails naming the module. Its kind decides what it
gives: an embedding model (a sentence-transformers folder, or a Hugging Face BERT-family
encoder folder, read with mean pooling) gives dense vectors; a sparse model (SPLADE) sparse
vectors over its vocabulary; a multi-vector model (ColBERT) a vector per token; a
cross-encoder (a ``*ForSequenceClassification`` folder) scores texts and text pairs. The
folder's prompts apply as sentence-transformers applies them. A TextModel is safe to share
between threads: the model's forward is, and each thread tokenises with its own copy of the
tokenizer.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastbert.embedding import model, readers, run
from fastbert.embedding.options import EmbedOptions
from fastbert.embedding.quantized import (
    check_precision,
    check_ranges,
    check_ranges_apply,
    quantize_embeddings,
)
from fastbert.embedding.sparse import SparseVectors
from fastbert.embedding.static_sparse import StaticSparseEncoder
from fastbert.embedding.tokenize import TextTokenizer, Tokens
from fastbert.execution.arguments import positive_integer
from fastbert.model.sentence_folder import (
    CLASSIFICATION,
    EMBEDDING,
    MULTI_VECTOR,
    SPARSE,
    FolderSpec,
)


class InputTooLong(ValueError):
    """An input over the model's limit, with truncation turned off."""

    def __init__(self, index: int, length: int, limit: int):
        super().__init__(
            f"input {index} has {length} tokens, more than the model's limit of {limit} "
            "(turn truncation on to cut it)"
        )
        self.index, self.length, self.limit = index, length, limit


@dataclass(frozen=True)
class Prompting:
    """What one prompt choice changes in how inputs are tokenised and run: ``text`` goes
    before each input; ``length``: its tokens (a Pooling with ``include_prompt: false`` leaves
    them out); ``task``: a multi-vector model's "query" or "document" (None: neither);
    ``max_length``: the tokens an input may have for that task (None: the model's);
    ``static``: whether the task takes an inference-free SPLADE model's SparseStaticEmbedding
    route (tokenised without special tokens, no encoder), not its Transformer."""

    text: str
    length: int
    task: str | None = None
    max_length: int | None = None
    static: bool = False


# The prompt names that pick a task: a multi-vector model's lengths, skiplist and pooling; an
# inference-free SPLADE model's route.
TASKS = ("query", "document")


def task_of(prompt_name: str | None) -> str | None:
    """The task a prompt name picks: "query" or "document", else None."""
    return prompt_name if prompt_name in TASKS else None


class TextModel:
    """A model folder, loaded: texts in, what its kind gives out.

    ``kind``: "embedding", "sparse", "multi-vector" or "classification"; ``spec``: the
    folder as read (its modules, prompts); ``options``: the resolved
    :class:`~fastbert.embedding.options.EmbedOptions` (device, dtype, max_length, pooling,
    normalize, prompt, batch_tokens all set); ``labels``: a classifier's label names by index
    (None for the other kinds). Load one with :func:`load`.
    """

    def __copy__(self) -> TextModel:
        """A shallow copy: the same tokenizers, encoder and options."""
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __reduce__(self) -> tuple:
        raise TypeError(
            "a TextModel does not pickle (nor deepcopy): it holds its tokenizers' pool and the "
            "model's compiled state; load it in each process, fastbert.load(folder), or pass "
            "the folder to the worker"
        )

    def __init__(
        self,
        spec: FolderSpec,
        options: EmbedOptions,
        tokenizer: Any,
        encoder: model.FolderPipeline | None = None,
        classifier: model.Classifier | None = None,
        labels: list[str] | None = None,
        prompt_name: str | None = None,
        static: tuple[TextTokenizer, StaticSparseEncoder] | None = None,
    ):
        self.spec = spec
        self.kind = spec.kind
        self.options = options
        # The task of the prompt the model loaded with, by name ("query" or "document": a
        # multi-vector model's); its text is options.prompt.
        self._task = task_of(prompt_name)
        self.text_tokenizer = TextTokenizer(tokenizer, options.max_length)
        # An inference-free SPLADE model's query route (spec.router): its tokenizer, encoder.
        self.static_tokenizer, self.static_encoder = static or (None, None)
        if self.static_encoder is not None:
            self.static_encoder.max_active_dims = options.max_active_dims
        self.encoder = encoder
        self.classifier = classifier
        # A cross-encoder's: what CrossEncoder.predict applies to the logits (see scores).
        self.activation = (
            None
            if classifier is None
            else model.cross_encoder_activation(spec, classifier.model.config)
        )
        self.labels = labels
        # Whether a classifier's labels hold apart (multi-label): scored one by one (sigmoid),
        # as transformers' text-classification pipeline scores them, not against each other.
        self.multi_label = (
            classifier is not None
            and classifier.model.config.problem_type == "multi_label_classification"
        )
        self._promptings: dict[tuple[str | None, str | None], Prompting] = {}
        # The embed loop's encoder: embeddings as computed (float32), normalised (and cut to a
        # width) afterwards, per call.
        self._raw = None
        if encoder is not None:
            try:
                self._loaded_with = self.prompting()
            except ValueError:  # a Router without a default route: each call names its task
                self._loaded_with = Prompting(self.options.prompt or "", 0, self._task)
            self._raw = encoder.with_prompt(self._loaded_with.length, self._loaded_with.task)
            self._raw.normalize, self._raw.store_dtype = False, np.dtype(np.float32)
            # A sparse model's vectors keep the values the folder (or the options) say, as
            # sentence-transformers' encode keeps them: the server's too.
            self._raw.max_active_dims = options.max_active_dims

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
    def packed(self) -> bool:
        """Whether the forward passes run the packed path (a batch of n inputs is their tokens'
        rows end to end, no padding), which sets how ``options.batch_tokens`` counts a batch:
        its tokens when packed, rows x longest row when padded."""
        return (self.encoder or self.classifier).packed

    @property
    def vocab_size(self) -> int:
        """The number of token ids the model knows (ids are 0 .. vocab_size - 1)."""
        if self.encoder is not None:
            return self.encoder.model.config.vocab_size
        return self.classifier.model.config.vocab_size

    def vocabulary(self, prompting: Prompting | None = None) -> int:
        """The number of token ids inputs run with ``prompting`` may hold (0 .. n - 1): an
        inference-free SPLADE model's query route's for its queries, else :attr:`vocab_size`."""
        if prompting is not None and prompting.static:
            return self.static_encoder.dimensions
        return self.vocab_size

    @property
    def dimensions(self) -> int | None:
        """The width of the embeddings :meth:`embed` returns: a dense vector's (the loaded
        ``dimensions``, or the folder's truncate_dim, where one cuts it), a sparse vector's
        (the vocabulary) or each token's vector of a multi-vector model (None for a
        classifier)."""
        if self.encoder is None:
            return None
        if self.kind == MULTI_VECTOR and self.encoder.truncate_dim is not None:
            return self.encoder.truncate_dim  # the folder's truncate_dim
        return self.options.dimensions or self.encoder.dimensions

    @property
    def full_dimensions(self) -> int | None:
        """The width the model computes, before any cut: the most ``dimensions`` a call may
        ask for (None for a classifier)."""
        return self.encoder.dimensions if self.encoder is not None else None

    @property
    def prompts(self) -> dict[str, str]:
        """The folder's named prompts (name -> the text put before an input)."""
        return dict(self.spec.prompts)

    def tokenize(
        self,
        texts: Sequence[str],
        pairs: Sequence[str] | None = None,
        *,
        truncate: bool = True,
        side: str | None = None,
        prompt: str | None = None,
        max_length: int | None = None,
        static: bool = False,
    ) -> Tokens:
        """Token ids of ``texts`` (or of the pairs (texts[i], pairs[i])), as the model sees
        them, each text after ``prompt`` (None: the prompt the model loaded with).
        ``truncate``: cut each input to ``max_length`` tokens (None: the model's
        :attr:`max_length`) from ``side`` (None: the tokenizer's own side, as
        sentence-transformers cuts); without it, an input over the limit raises
        :class:`InputTooLong`. ``static``: as an inference-free SPLADE model's query route
        tokenises them (:attr:`Prompting.static`). ValueError / TypeError naming a bad
        argument."""
        texts = _checked_texts(texts)
        if pairs is not None:
            pairs = _checked_texts(pairs, "pairs")
            if len(pairs) != len(texts):
                raise ValueError(f"{len(texts)} texts but {len(pairs)} pairs")
        if max_length is not None:
            max_length = positive_integer("max_length", max_length)
        if prompt is not None and not isinstance(prompt, str):
            raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
        if not texts:
            return Tokens([], None if pairs is None else [], [])
        tokenizer = self._tokenizer(static)
        limit = max_length or tokenizer.max_length
        tokens = tokenizer.encode(
            texts,
            pairs,
            truncate=truncate,
            side=side,
            prefix=self.options.prompt or "" if prompt is None else prompt,
            max_length=limit,
        )
        if not truncate:
            for index, ids in enumerate(tokens.ids):
                if len(ids) > limit:
                    raise InputTooLong(index, len(ids), limit)
        return tokens

    def _tokenizer(self, static: bool) -> TextTokenizer:
        if static and self.static_tokenizer is None:
            raise ValueError(f"{self.options.model} has no static (SparseStaticEmbedding) route")
        return self.static_tokenizer if static else self.text_tokenizer

    @property
    def pools_without_prompt(self) -> bool:
        """Whether a Pooling of the model leaves the prompt's tokens out (its
        ``include_prompt`` is false)."""
        modules = self.encoder.modules if self.encoder is not None else ()
        return any(getattr(module, "include_prompt", True) is False for module in modules)

    def prompt(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The text put before each input: ``prompt``, else the folder's prompt named
        ``prompt_name``, else the one the model loaded with (the folder's default unless
        told otherwise). ValueError for both, or for a name the folder does not have."""
        if prompt_name is None and prompt is None:
            return self.options.prompt or ""
        return self.spec.prompt(prompt_name, prompt)

    def prompting(self, prompt_name: str | None = None, prompt: str | None = None) -> Prompting:
        """What the prompt :meth:`prompt` chooses changes (see :class:`Prompting`); a
        ``prompt_name`` of "query" or "document" also picks a multi-vector model's task (none
        given: the task of the prompt the model loaded with). ValueError as :meth:`prompt`
        raises it."""
        key = (prompt_name, prompt)
        found = self._promptings.get(key)
        if found is None:
            text = self.prompt(prompt_name, prompt)
            # Another prompt keeps the task the model loaded with unless it names a task (a
            # query model's queries with another prompt are still queries, as
            # encode_query(prompt=...) and encode_query(prompt_name=...) keep them).
            task = task_of(prompt_name) or self._task
            router = self.spec.router
            if router is not None and router.is_static(task):
                limit = self.static_tokenizer.max_length
                found = Prompting(text, 0, task, limit, static=True)
            else:
                # A multi-vector model may cut queries and documents to lengths of their own.
                limit = self.spec.transformer.task_length(task)
                found = Prompting(text, self.text_tokenizer.prompt_length(text), task, limit)
            self._promptings[key] = found
        return found

    def embed(
        self,
        texts: Sequence[str],
        *,
        normalize: bool | None = None,
        dimensions: int | None = None,
        force_dimensions: bool = False,
        max_active_dims: int | None = None,
        prompt_name: str | None = None,
        prompt: str | None = None,
        precision: str = "float32",
        ranges: Any = None,
        calibration_embeddings: Any = None,
        progress: bool = False,
    ) -> np.ndarray | SparseVectors | list[np.ndarray]:
        """What the model gives for ``texts``, row i for text i, each after the prompt (see
        :meth:`prompt`):

        - an embedding model: numpy [len(texts), dimensions] (``options.store_dtype``);
          ``normalize``: None for what the folder says (cut to the folder's own
          ``truncate_dim``, after its final Normalize, as sentence-transformers gives them:
          shorter than 1), True to L2-normalise after any cut, False for the pooled vectors
          as they are; ``dimensions``: keep the first N values of each embedding, then
          normalise when the model does (sentence-transformers' ``encode(truncate_dim=N,
          normalize_embeddings=True)``; a model whose card does not say it is
          Matryoshka-trained needs ``force_dimensions=True``; None: the width the model
          loaded with); ``precision``: "float32", or quantized as sentence-transformers'
          ``quantize_embeddings`` gives them ("int8" / "uint8": numpy int8 / uint8
          [n, dimensions], each dimension's buckets spanning ``ranges`` [2, dimensions], else
          the min and max of ``calibration_embeddings``, else of these embeddings; "binary" /
          "ubinary": packed bits [n, ceil(dimensions / 8)]; see
          :mod:`fastbert.embedding.quantized`);
        - a sparse model: :class:`~fastbert.embedding.sparse.SparseVectors` over the vocabulary
          (``max_active_dims``: each row's N largest values only; None: as loaded);
        - a multi-vector model: a list of float32 arrays [tokens_i, dimensions], one vector per
          token the model scores (``prompt_name`` "query" or "document" also picks the task).

        ValueError naming the first text that is not a non-blank string, and for ``ranges``
        or ``calibration_embeddings`` with a precision that has no buckets (float32, binary,
        ubinary), where sentence-transformers' ``quantize_embeddings`` ignores them."""
        self._require((EMBEDDING, SPARSE, MULTI_VECTOR), "embed")
        for name, flag in (("normalize", normalize), ("force_dimensions", force_dimensions)):
            if flag is not None and not isinstance(flag, bool):  # "false" would read as True
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        if self.kind != EMBEDDING and (normalize is not None or dimensions is not None):
            raise ValueError(f"normalize and dimensions apply to dense embeddings, not {self.kind}")
        if self.kind != SPARSE and max_active_dims is not None:
            raise ValueError(f"max_active_dims applies to sparse embeddings, not {self.kind}")
        check_precision(precision)
        if self.kind != EMBEDDING and precision != "float32":
            raise ValueError(f"precision applies to dense embeddings, not {self.kind}")
        check_ranges_apply(precision, ranges=ranges, calibration_embeddings=calibration_embeddings)
        # The loaded model's order of normalising and cutting, unless this call names a
        # width or says whether to normalise (see loading.normalizes_before_cut).
        first = getattr(self.encoder, "normalize_first", False)  # a classifier has no encoder
        normalize_first = first and normalize is None and dimensions is None
        if dimensions is not None:
            dimensions = self.check_dimensions(dimensions, force_dimensions)
        elif self.kind == EMBEDDING:
            dimensions = self.options.dimensions  # checked when the model loaded
        texts = _checked_texts(texts)
        raw = self._raw  # its max_active_dims: the loaded model's, unless this call names one
        if max_active_dims is not None:
            max_active_dims = positive_integer("max_active_dims", max_active_dims)
            raw = raw.with_prompt(raw.prompt_length)
            raw.max_active_dims = max_active_dims
        loop = self._loop(raw, prompt_name, prompt, progress)
        sink = (
            run.ArraySink(len(texts), self.encoder.dimensions, np.dtype(np.float32))
            if self.kind == EMBEDDING
            else run.ListSink(len(texts))
        )
        rows = readers.ListRows(texts)
        run.run_rows(rows, loop, sink, 0)
        if self.kind == SPARSE:
            return SparseVectors.from_rows(sink.items, loop.encoder.dimensions)
        if self.kind == MULTI_VECTOR:
            return sink.items
        vectors = model.finish_embeddings(
            sink.array,
            self.options.normalize if normalize is None else normalize,
            dimensions,
            np.dtype(self.options.store_dtype),
            normalize_first,
        )
        if precision == "float32":
            return vectors
        if ranges is not None:
            ranges = check_ranges(ranges, vectors.shape[1])
        return quantize_embeddings(vectors, precision, ranges, calibration_embeddings)

    def check_dimensions(self, dimensions: int, force: bool = False) -> int:
        """``dimensions`` as an int, when it is a width this dense model's embeddings may be
        cut to: 1 .. their width, and (unless ``force``) a model whose card says it was trained
        for it (Matryoshka); ValueError otherwise."""
        dimensions = model.checked_width(dimensions, self.full_dimensions)
        if not (force or self.spec.matryoshka or dimensions == self.full_dimensions):
            raise ValueError(not_matryoshka(self.options.model, dimensions))
        return dimensions

    def job(self, progress: bool = True) -> _Loop:
        """What the corpus job's loop runs (:func:`fastbert.embedding.run.run_rows`): this model's
        encoder, as the folder and the options finish its outputs, and its tokeniser, every
        input after the prompt the model loaded with."""
        return self._loop(self.encoder, None, None, progress)

    def _loop(
        self,
        encoder: model.FolderPipeline | StaticSparseEncoder,
        prompt_name: str | None,
        prompt: str | None,
        progress: bool,
    ) -> _Loop:
        chosen = self.prompting(prompt_name, prompt)
        if chosen.static:  # keeping what the call asked of the vectors
            encoder = replace(self.static_encoder, max_active_dims=encoder.max_active_dims)
        encoder = encoder.with_prompt(chosen.length, chosen.task)
        tokenise = functools.partial(
            self._tokenizer(chosen.static), prefix=chosen.text, max_length=chosen.max_length
        )
        return _Loop(encoder, tokenise, replace(self.options, progress=progress))

    def embed_tokens(
        self, tokens: list[list[int]], prompting: Prompting | None = None
    ) -> np.ndarray | SparseVectors | list:
        """Token ids of n inputs (the prompt already before each) -> in one forward pass (the
        caller sizes the batch): an embedding model's pooled, unnormalised embeddings, numpy
        float32 [n, dimensions]; a sparse model's SparseVectors; a multi-vector model's list
        of [tokens_i, dimensions] arrays. ``prompting``: the prompt the inputs were tokenised
        with (:meth:`prompting`; None: the one the model loaded with)."""
        self._require((EMBEDDING, SPARSE, MULTI_VECTOR), "embed")
        encoder = self._raw
        if prompting is None:
            prompting = self._loaded_with
        if prompting.static:
            encoder = self.static_encoder
        encoder = encoder.with_prompt(prompting.length, prompting.task)
        if self.kind != EMBEDDING:
            return encoder(tokens)
        with torch.inference_mode():
            pooled = encoder.pooled(tokens)
        return pooled.float().cpu().numpy()

    def classify(
        self, texts: Sequence[str], pairs: Sequence[str] | None = None, *, truncate: bool = True
    ) -> np.ndarray:
        """Raw logits, numpy float32 [len(texts), len(labels)], of ``texts`` (or of the pairs
        (texts[i], pairs[i]): a cross-encoder's query and document), in batches of
        ``options.batch_tokens`` tokens."""
        self._require((CLASSIFICATION,), "classify")
        tokens = self.tokenize(texts, pairs, truncate=truncate)
        logits = np.zeros((len(tokens.ids), len(self.labels)), np.float32)
        lengths = [len(ids) for ids in tokens.ids]
        for batch in run.token_batches(lengths, self.options.batch_tokens, self.packed):
            type_ids = None if tokens.type_ids is None else [tokens.type_ids[i] for i in batch]
            logits[batch] = self.classify_tokens([tokens.ids[i] for i in batch], type_ids)
        return logits

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """A cross-encoder's raw logits [n, labels] (:meth:`classify`) -> its scores, float32,
        as sentence-transformers' ``CrossEncoder.predict`` gives them: the activation the
        folder saved (Sigmoid for one label, Identity for more, when it saved none)."""
        self._require((CLASSIFICATION,), "score pairs")
        try:
            logits = np.asarray(logits, np.float32)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"logits must be numbers [n, {len(self.labels)}]: {exc}") from None
        if logits.ndim != 2 or logits.shape[1] != len(self.labels):
            raise ValueError(
                f"logits must be [n, {len(self.labels)}] (classify's), got shape {logits.shape}"
            )
        with torch.no_grad():
            scores = self.activation(torch.from_numpy(logits))
        return scores.numpy()

    def classify_tokens(
        self, tokens: list[list[int]], type_ids: list[list[int]] | None
    ) -> np.ndarray:
        """Token ids (and token types) of n inputs -> raw logits, numpy float32
        [n, len(labels)], in one forward pass."""
        self._require((CLASSIFICATION,), "classify")
        return self.classifier(tokens, type_ids)

    def _require(self, kinds: tuple[str, ...], what: str) -> None:
        if self.kind not in kinds:
            raise ValueError(
                f"{self.options.model} is {article(self.kind)} model; it cannot "
                f"{what} (that needs {' or '.join(article(k) for k in kinds)} model)"
            )


def not_matryoshka(model: str, dimensions: int) -> str:
    """The error message for cutting a model not trained for it to ``dimensions``."""
    return (
        f"{model}: its model card does not say it was trained to be cut to fewer dimensions "
        f"(Matryoshka); cut to {dimensions} anyway with force_dimensions=True "
        "(--force-dimensions)"
    )


def article(kind: str) -> str:
    """``kind`` with its indefinite article ("an embedding", "a sparse")."""
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


class _Loop:
    """What :func:`fastbert.embedding.run.run_rows` runs (see run.Loaded)."""

    def __init__(
        self,
        encoder: model.FolderPipeline | StaticSparseEncoder,
        tokenise: Callable[[list[str]], tuple[list[list[int]], list[bool]]],
        options: EmbedOptions,
    ):
        self.encoder, self.tokenise, self.options = encoder, tokenise, options


def _checked_texts(texts: Any, argument: str = "texts") -> list[str]:
    """``texts`` as a list; TypeError for one text (or bytes) or a non-sequence, ValueError
    naming ``argument``'s first item that is no non-blank Unicode string."""
    if isinstance(texts, str | Path | bytes | bytearray) or not isinstance(texts, Sequence):
        raise TypeError(f"{argument}: give a list of strings, got {type(texts).__name__}")
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            name = type(text).__name__
            kind = "None" if text is None else f"{'an' if name[0] in 'aeiou' else 'a'} {name}"
            raise ValueError(f"{argument}[{i}]: {kind}, not a string")
        problem = readers.text_problem(text, "text")
        if problem is not None:
            raise ValueError(f"{argument}[{i}]: {problem}")
    return list(texts)


__all__ = ["InputTooLong", "TextModel"]
