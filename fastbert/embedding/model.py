"""The model side of embedding: a model folder's modules built as sentence-transformers would
run them, its tokenizer, and one batch of token ids -> what the folder's kind gives.

Every module a folder declares runs, or the load fails naming it: fastbert's own
implementations (:mod:`fastbert.model.sentence_modules`) where it has one, otherwise
sentence-transformers' (:mod:`fastbert.integrations.sentence_modules`).
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastbert.embedding.sparse import SparseVectors
from fastbert.execution.arguments import positive_integer
from fastbert.integrations import packed_classifier
from fastbert.model.masked_lm_head import MaskedLMHead
from fastbert.model.sentence_folder import (
    EMBEDDING,
    MULTI_VECTOR,
    SPARSE,
    FolderSpec,
    ModuleSpec,
)
from fastbert.model.sentence_modules import (
    PACKED_MODULES,
    Normalize,
    Pooling,
    SpladePooling,
    native_module,
    takes_task,
    torch_module_class,
)

Features = dict[str, Any]
# What each kind's pipeline must leave in the features.
OUTPUT_KEYS = {EMBEDDING: "sentence_embedding", SPARSE: "sentence_embedding"}


def read_config(folder: Path) -> Any:
    """The fastbert BertConfig of a model folder (Hugging Face or sentence-transformers).
    ValueError when it has no config.json or no weights: said before a job writes anything."""
    from fastbert.model.loading import checkpoint_files, read_checkpoint_config, transformer_folder

    checkpoint = transformer_folder(folder)
    config = read_checkpoint_config(checkpoint)[0]
    checkpoint_files(checkpoint)
    return config


def folder_max_length(spec: FolderSpec, config: Any, tokenizer: Any) -> tuple[int, str]:
    """The most tokens a text may have as sentence-transformers reads the folder, and what
    says so: the Transformer's tokenizer arguments' ``model_max_length``, else its
    ``max_seq_length`` (neither capped: sentence-transformers takes them as they are), else
    the tokenizer's own limit capped by the model's position table (a tokenizer without a
    limit reports a huge number)."""
    settings = spec.transformer
    if "model_max_length" in settings.tokenizer_kwargs:
        value = settings.tokenizer_kwargs["model_max_length"]
        name = f"{spec.folder}: tokenizer_args' model_max_length"
        return positive_integer(name, value), "tokenizer_args' model_max_length"
    if settings.max_seq_length is not None:
        return settings.max_seq_length, "max_seq_length"
    positions = config.max_sequence_length
    limit = getattr(tokenizer, "model_max_length", positions) or positions
    return int(min(limit, positions)), "tokenizer's model_max_length"


def load_tokenizer(folder: Path) -> Any:
    """The tokenizer of a Hugging Face folder, or of the transformer inside a
    sentence-transformers folder, set up as sentence-transformers sets it up: loaded with the
    Transformer's tokenizer arguments, and for ``do_lower_case`` lowercasing every text as the
    first step of its normaliser (special tokens such as [MASK] are matched before it)."""
    from fastbert.integrations import models
    from fastbert.model.loading import transformer_folder
    from fastbert.model.sentence_folder import read_folder

    # A sentence-transformers folder's modules first (one fastbert cannot run is named), then
    # a folder without a model's config.json: say so, not the tokenizer.
    spec = read_folder(folder) if (Path(folder) / "modules.json").is_file() else None
    read_config(folder)
    settings = (spec or read_folder(folder)).transformer
    arguments = {**settings.tokenizer_kwargs, "local_files_only": True}
    with models.quiet():
        tokenizer = models.import_transformers().AutoTokenizer.from_pretrained(
            str(transformer_folder(folder)), **arguments
        )
    if settings.do_lower_case:
        _lowercase_first(tokenizer)
    return tokenizer


def _lowercase_first(tokenizer: Any) -> None:
    """Make ``tokenizer`` lowercase its input: a fast tokenizer's normaliser gains a Lowercase
    step in front unless it has one; a slow tokenizer's ``do_lower_case`` is set."""
    if not tokenizer.is_fast:
        try:
            tokenizer.do_lower_case = True
        except AttributeError:  # a read-only property; the basic tokenizer holds the switch
            tokenizer.basic_tokenizer.do_lower_case = True
        return
    from tokenizers import normalizers

    backend = tokenizer.backend_tokenizer
    current = backend.normalizer
    steps = list(current) if isinstance(current, normalizers.Sequence) else [current]
    steps = [step for step in steps if step is not None]
    if not any(isinstance(step, normalizers.Lowercase) for step in steps):
        backend.normalizer = normalizers.Sequence([normalizers.Lowercase(), *steps])


def build_modules(
    spec: FolderSpec,
    tokenizer: Any,
    device: torch.device,
    pooling: str | None = None,
    keep_normalize: bool = False,
) -> tuple[list[Any], bool]:
    """(the modules after the transformer, built; whether a final Normalize of the sentence
    embedding was taken off, to be applied when the embeddings are finished, unless
    ``keep_normalize``). ``pooling``: a pooling mode that replaces the folder's (a folder
    without a Pooling module gets one). ValueError naming a module that cannot run."""
    from fastbert.integrations.sentence_modules import ForeignModule, load_foreign_module

    specs = list(spec.modules)
    if pooling is not None:
        replacement = ModuleSpec("pooling", "Pooling", spec.folder, {"pooling_mode": pooling})
        places = [i for i, m in enumerate(specs) if m.class_name == "Pooling"]
        if places:
            specs[places[0]] = replacement
        elif spec.kind == EMBEDDING:
            specs.insert(0, replacement)
    modules: list[Any] = []
    for module_spec in specs:
        # After a module sentence-transformers runs, its Pooling too: it reads what such a
        # module may add to the features (WordWeights' token_weights_sum, its divisor).
        foreign_pooling = (
            module_spec.class_name == "Pooling"
            and module_spec.type.startswith("sentence_transformers.")
            and any(isinstance(m, ForeignModule) for m in modules)
        )
        module = None if foreign_pooling else native_module(module_spec, tokenizer)
        if module is None:
            module = load_foreign_module(module_spec, spec.folder, device)
        modules.append(module)
    normalize = False
    last = modules[-1] if modules else None
    if (
        not keep_normalize
        and isinstance(last, Normalize)
        and last.input_name == last.output_name == "sentence_embedding"
    ):
        modules.pop()
        normalize = True
    return modules, normalize


def ends_with_normalize(spec: FolderSpec) -> bool:
    """Whether the folder's last module L2-normalises the sentence embedding (fastbert then
    normalises when it finishes the embeddings, after any cut to fewer dimensions)."""
    if not spec.modules or spec.modules[-1].class_name != "Normalize":
        return False
    config = spec.modules[-1].config
    names = (config.get("module_input_name"), config.get("module_output_name"))
    return all(name in (None, "sentence_embedding") for name in names)


def pooling_name(spec: FolderSpec, pooling: str | None = None) -> str | None:
    """The pooling the model runs, for people and manifests: ``pooling`` when it replaces
    the folder's, else the folder's Pooling modes ("mean", "cls+mean"), else None (a model
    without a Pooling module)."""
    if pooling is not None:
        return pooling
    module = next((m for m in spec.modules if m.class_name == "Pooling"), None)
    return None if module is None else "+".join(Pooling.from_spec(module).modes)


def declared_dimensions(spec: FolderSpec, config: Any, pooling: str | None = None) -> int | None:
    """The output's width as the folder's configs tell it (each token's vector for a
    multi-vector model), or None where a module fastbert does not run itself decides it.
    ``config``: the transformer's fastbert BertConfig; ``pooling``: a pooling mode replacing
    the folder's."""
    width = config.vocab_size if spec.kind == SPARSE else config.hidden_size
    for module in spec.modules:
        name, settings = module.class_name, module.config
        if name == "Pooling":
            modes = 1 if pooling is not None else len(Pooling.from_spec(module).modes)
            width *= modes
        elif name == "Dense":
            if "out_features" not in settings:
                return None  # building the module names what its config lacks
            width = int(settings["out_features"])
        elif name not in ("Normalize", "SpladePooling", "MultiVectorMask"):
            return None
    if spec.kind == MULTI_VECTOR and spec.truncate_dim is not None:
        width = min(width, spec.truncate_dim)  # each token's vector, cut
    return width


@dataclasses.dataclass
class FolderPipeline:
    """Batches of token ids -> the folder's output, each module run in order.

    ``model``: a fastbert.BertModel; ``pad_id``: the tokenizer's padding id; ``modules``: what
    runs after the transformer (:func:`build_modules`); ``kind``: the folder's; ``normalize``:
    L2-normalise the sentence embeddings, after the cut to ``truncate_dim`` or, with
    ``normalize_first``, before it (as sentence-transformers runs a folder's final Normalize
    and then its truncate_dim); ``store_dtype``: what :meth:`__call__` returns;
    ``head``: the masked-LM head of a sparse model (its logits are the transformer's output);
    ``prompt_length`` and ``task``: the prompt's tokens at the start of each input and the
    task ("query", "document" or None) of the calls (see :meth:`with_prompt`);
    ``truncate_dim`` / ``max_active_dims``: what :meth:`__call__` keeps of a dense embedding
    or of each token's vector of a multi-vector model (its first values; a token's then
    normalised, as sentence-transformers' MultiVectorEncoder cuts them) and of a sparse vector
    (its largest); ``dimensions``: the output's width before any cut (learnt by
    :meth:`probe`).

    ``packed``: run the packed path, the batch's token ids end to end (packed once, on the
    host) through :meth:`fastbert.BertModel.forward_packed` and every module on the packed
    rows; it is turned off for a folder with a module that runs through sentence-transformers
    (which takes the padded batch). Off, the ids are padded into a [n, longest] batch with a
    mask and run through the model's padded entry.
    """

    model: Any
    pad_id: int
    modules: list[Any]
    kind: str
    normalize: bool
    store_dtype: np.dtype
    head: MaskedLMHead | None = None
    prompt_length: int = 0
    task: str | None = None
    truncate_dim: int | None = None
    max_active_dims: int | None = None
    dimensions: int = 0
    packed: bool = True
    normalize_first: bool = False

    def __post_init__(self) -> None:
        self.store_dtype = np.dtype(self.store_dtype)
        self.packed = self.packed and all(isinstance(m, PACKED_MODULES) for m in self.modules)
        # SPLADE's max right after the head: pooled in the head, the logits never held.
        first = self.modules[0] if self.modules else None
        self.fused_splade = (
            first if isinstance(first, SpladePooling) and first.strategy == "max" else None
        )

    def with_prompt(self, prompt_length: int, task: str | None = None) -> FolderPipeline:
        """This encoder for inputs that start with a prompt of ``prompt_length`` tokens, for
        ``task``: a shallow copy (the model is shared)."""
        return dataclasses.replace(self, prompt_length=prompt_length, task=task)

    def probe(self, tokens: list[list[int]]) -> None:
        """Run ``tokens`` through every module once, to learn the output's width and to fail
        at load (naming the module) where a module cannot run on fastbert's features."""
        with torch.inference_mode():
            features, modules = self._encoded(tokens)
            for module in modules:
                try:
                    features = self._run(module, features)
                except Exception as error:
                    raise ValueError(
                        f"module {_describe(module)} cannot run on fastbert's features: "
                        f"{type(error).__name__}: {error}"
                    ) from error
        key = OUTPUT_KEYS.get(self.kind, "token_embeddings")
        value = features.get(key)
        if not isinstance(value, torch.Tensor):
            names = ", ".join(_describe(m) for m in self.modules) or "none"
            raise ValueError(
                f"the folder's modules ({names}) give no {key}: {self.kind} models need one"
            )
        self.dimensions = int(value.shape[-1])

    def features(self, tokens: list[list[int]]) -> Features:
        """token ids of n rows -> the features dict after every module (see
        :mod:`fastbert.model.sentence_modules` for its keys). Call under
        torch.inference_mode()."""
        features, modules = self._encoded(tokens)
        for module in modules:
            features = self._run(module, features)
        return features

    def _run(self, module: Any, features: Features) -> Features:
        return module(features, self.task) if takes_task(module) else module(features)

    def _encoded(self, tokens: list[list[int]]) -> tuple[Features, list[Any]]:
        """(the features the transformer gives, packed or padded, see ``packed``; the modules
        still to run): a sparse model's fused SPLADE pooling runs here, in its masked-LM
        head."""
        device = self.model.device
        if self.packed:
            input_ids, offsets = pack(tokens, device)
            hidden = self.model.forward_packed(input_ids, offsets)
            cu_seqlens = offsets.to(device, non_blocking=True)
            mask = torch.ones_like(input_ids)
        else:
            input_ids, mask, _ = pad(tokens, None, self.pad_id, device)
            hidden = self.model(input_ids, attention_mask=mask).last_hidden_state
            cu_seqlens = None
        features = {
            "input_ids": input_ids,
            "attention_mask": mask,
            "token_embeddings": hidden,
            "prompt_length": self.prompt_length,
        }
        if cu_seqlens is not None:
            features["cu_seqlens"] = cu_seqlens
        if self.head is None:
            return features, self.modules
        ops = self.model.ops()
        if self.fused_splade is None:
            features["token_embeddings"] = self.head.logits(ops, hidden)
            return features, self.modules
        if cu_seqlens is None:  # padded: the head reads the real tokens' rows
            lengths = np.cumsum([0] + [len(t) for t in tokens], dtype=np.int32)
            cu_seqlens = torch.from_numpy(lengths).to(device)
            hidden = hidden[mask.bool()]
        features["sentence_embedding"] = self.head.splade(
            ops, hidden, cu_seqlens, self.fused_splade.log_steps
        )
        return features, self.modules[1:]

    def pooled(self, tokens: list[list[int]]) -> torch.Tensor:
        """token ids of n rows -> the sentence embeddings [n, dimensions], float32, before the
        final normalisation. Call under torch.inference_mode()."""
        return self.features(tokens)["sentence_embedding"].float()

    def __call__(self, tokens: list[list[int]]) -> Any:
        """token ids of n rows (any lengths) -> by kind: sentence embeddings [n, dimensions]
        (``store_dtype``; the first ``truncate_dim`` values, then normalised when the folder or
        the options say so); a sparse model's :class:`~fastbert.embedding.sparse.SparseVectors`
        (each row's ``max_active_dims`` largest values); a multi-vector model's list of
        float32 [tokens_i, dimensions] arrays, the tokens it scores."""
        with torch.inference_mode():
            if self.kind == MULTI_VECTOR:
                rows = scored_tokens(self.features(tokens), [len(t) for t in tokens])
                return rows if self.truncate_dim is None else cut_tokens(rows, self.truncate_dim)
            pooled = self.pooled(tokens)
            if self.kind == SPARSE:
                return SparseVectors.from_dense(pooled, self.max_active_dims)
        return finish_embeddings(
            pooled.cpu().numpy(),
            self.normalize,
            self.truncate_dim,
            self.store_dtype,
            self.normalize_first,
        )


def checked_width(dimensions: object, width: int) -> int:
    """``dimensions`` as an int from 1 to ``width`` (a NumPy integer too); ValueError naming
    it otherwise."""
    dimensions = positive_integer("dimensions", dimensions)
    if dimensions > width:
        raise ValueError(f"dimensions must be between 1 and {width}, got {dimensions}")
    return dimensions


def finish_embeddings(
    pooled: np.ndarray,
    normalize: bool,
    dimensions: int | None,
    dtype: np.dtype,
    normalize_first: bool = False,
) -> np.ndarray:
    """Pooled embeddings [n, hidden] -> their first ``dimensions`` values (all when None),
    L2-normalised when ``normalize``: after the cut, or before it with ``normalize_first``
    (see :func:`fastbert.embedding.loading.normalizes_before_cut`); as ``dtype``. ValueError
    for a width outside 1..hidden."""
    if normalize and normalize_first:
        pooled = _unit_rows(pooled)
    if dimensions is not None:
        pooled = pooled[:, : checked_width(dimensions, pooled.shape[1])]
    if normalize and not normalize_first:
        pooled = _unit_rows(pooled)
    return pooled.astype(dtype, copy=False)


def _unit_rows(pooled: np.ndarray) -> np.ndarray:
    pooled = pooled.astype(np.float32, copy=False)
    norms = np.linalg.norm(pooled, axis=1, keepdims=True)
    return pooled / np.maximum(norms, 1e-12)


def scored_tokens(features: Features, lengths: list[int]) -> list[np.ndarray]:
    """A multi-vector model's features (packed or padded) -> each input's float32
    [tokens_i, dimensions] array of the vectors its mask keeps; ``lengths``: the inputs'
    token counts."""
    vectors = features["token_embeddings"].float().cpu()
    keep = features["attention_mask"].bool().cpu()
    if "cu_seqlens" in features:  # packed: each input's rows
        vectors, keep = vectors.split(lengths), keep.split(lengths)
    return [row[kept].numpy() for row, kept in zip(vectors, keep)]


def cut_tokens(rows: list[np.ndarray], width: int) -> list[np.ndarray]:
    """Each token vector of ``rows`` (float32 [tokens_i, dimensions]) cut to its first
    ``width`` values and L2-normalised, as sentence-transformers' MultiVectorEncoder applies
    its truncate_dim."""
    cut = [row[:, :width] for row in rows]
    return [row / np.maximum(np.linalg.norm(row, axis=1, keepdims=True), 1e-12) for row in cut]


def load_masked_lm_head(spec: FolderSpec, encoder_model: Any) -> MaskedLMHead:
    """The masked-LM head of a sparse folder's checkpoint, beside its loaded encoder."""
    from fastbert.model.config import read_json_file
    from fastbert.model.families import BERT, family_of_model_type
    from fastbert.model.loading import read_checkpoint_state
    from fastbert.model.masked_lm_head import read_masked_lm_head

    folder = spec.transformer.folder
    raw = read_json_file(folder / "config.json")
    family = family_of_model_type(str(raw.get("model_type"))) or BERT
    return read_masked_lm_head(
        read_checkpoint_state(folder), family, raw, encoder_model.embeddings.word, folder
    )


def load_encoder_model(source: str, **settings: Any) -> Any:
    """fastbert.BertModel.from_pretrained(source, **settings), without the warning a
    masked-LM checkpoint (which has no pooler) would give: embeddings never read it."""
    from fastbert.model.encoder import BertModel

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="the checkpoint has no pooler")
        return BertModel.from_pretrained(source, **settings)


def _describe(module: Any) -> str:
    spec = getattr(module, "spec", None)
    return spec.describe() if spec is not None else type(module).__name__


def cross_encoder_activation(spec: FolderSpec, config: Any) -> torch.nn.Module:
    """What sentence-transformers' ``CrossEncoder.predict`` applies to the logits of the folder
    ``spec`` with the transformers ``config``: the first ``torch.nn`` class named by the
    folder's config_sentence_transformers.json (``activation_fn``), its config.json
    (``sentence_transformers.activation_fn``, or, only where that key is absent, the older
    ``sbert_ce_default_activation_function``), else Sigmoid for one label and Identity for
    more. A class outside ``torch`` is passed over (sentence-transformers loads one only when
    trusted with remote code)."""
    saved = getattr(config, "sentence_transformers", None) or {}
    if "activation_fn" in saved:
        in_config = saved["activation_fn"]
    else:
        in_config = getattr(config, "sbert_ce_default_activation_function", None)
    for path in (spec.activation_fn, in_config):
        activation = torch_module_class(path)
        if activation is not None:
            return activation()
    return torch.nn.Sigmoid() if config.num_labels == 1 else torch.nn.Identity()


class Classifier:
    """Batches of token ids (a text or a text pair each) -> logits (numpy float32
    [n, num_labels]).

    ``model``: a Hugging Face ``*ForSequenceClassification`` model with fastbert's encoder
    swapped in (fastbert.optimize); ``pad_id``: the tokenizer's padding id. ``packed``: run
    the inputs packed end to end (fastbert.integrations.packed_classifier: the head reads the
    rows it needs of the packed hidden state); :meth:`probe` turns it on where the model's
    head reads only those rows. Off, the ids are padded into a [n, longest] batch with a mask
    and run through the model as Hugging Face runs it.
    """

    def __init__(self, model: Any, pad_id: int):
        self.model = model
        self.pad_id = pad_id
        self.device = next(model.parameters()).device
        # DistilBERT has no token types: its forward takes no token_type_ids.
        self.takes_token_types = "token_type_ids" in inspect.signature(model.forward).parameters
        self.packed = False

    def probe(self, tokens: list[list[int]], type_ids: list[list[int]] | None) -> None:
        """Turn :attr:`packed` on when the model's head gives the same logits from the rows
        the packed path gives it as from the whole hidden state, for these inputs (two or more
        of different lengths)."""
        arguments = self._padded(tokens, type_ids)
        self.packed = packed_classifier.reads_head_rows_only(
            self.model,
            arguments["input_ids"],
            arguments["attention_mask"],
            arguments.get("token_type_ids"),
        )

    def __call__(self, tokens: list[list[int]], type_ids: list[list[int]] | None) -> np.ndarray:
        """token ids (and token types, or None) of n inputs -> logits [n, num_labels]."""
        with torch.inference_mode():
            if self.packed:
                input_ids, offsets = pack(tokens, self.device)
                types = None
                if type_ids is not None and self.takes_token_types:
                    types = pack(type_ids, self.device)[0]
                logits = packed_classifier.packed_logits(self.model, input_ids, offsets, types)
            else:
                logits = self.model(**self._padded(tokens, type_ids)).logits
        return logits.float().cpu().numpy()

    def _padded(
        self, tokens: list[list[int]], type_ids: list[list[int]] | None
    ) -> dict[str, torch.Tensor]:
        """The model's keyword inputs for ``tokens`` right-padded into a [n, longest] batch."""
        if not self.takes_token_types:
            type_ids = None
        input_ids, mask, token_types = pad(tokens, type_ids, self.pad_id, self.device)
        arguments = {"input_ids": input_ids, "attention_mask": mask}
        if token_types is not None:
            arguments["token_type_ids"] = token_types
        return arguments


def pack(tokens: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The n rows of ``tokens`` end to end: (int64 ids [T] on ``device``, int32 cu_seqlens
    [n + 1] on the host, each row's first index and then T)."""
    lengths = np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens))
    offsets = np.zeros(len(tokens) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = itertools.chain.from_iterable(tokens)
    ids = torch.from_numpy(np.fromiter(flat, dtype=np.int64, count=int(offsets[-1])))
    return ids.to(device, non_blocking=True), torch.from_numpy(offsets.astype(np.int32))


def pad(
    tokens: list[list[int]], type_ids: list[list[int]] | None, pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Right-padded int64 input ids, 0/1 attention mask and (when ``type_ids`` is given) token
    type ids, each [n, longest], on ``device``."""
    longest = max(len(t) for t in tokens)
    ids = torch.full((len(tokens), longest), pad_id, dtype=torch.int64)
    mask = torch.zeros((len(tokens), longest), dtype=torch.int64)
    types = None if type_ids is None else torch.zeros((len(tokens), longest), dtype=torch.int64)
    for i, row in enumerate(tokens):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.int64)
        mask[i, : len(row)] = 1
        if types is not None:
            types[i, : len(row)] = torch.tensor(type_ids[i], dtype=torch.int64)
    moved = [t.to(device, non_blocking=True) if t is not None else None for t in (ids, mask, types)]
    return moved[0], moved[1], moved[2]


__all__ = [
    "Classifier",
    "FolderPipeline",
    "build_modules",
    "folder_max_length",
    "load_encoder_model",
    "load_masked_lm_head",
    "load_tokenizer",
    "pack",
    "pad",
    "read_config",
]
