"""What a sentence-transformers model folder declares: its modules in order, its transformer's
settings, its prompts, and so the kind of output it gives.

Both config formats are read: sentence-transformers 6 (``sentence_transformers.base.modules``
types, ``Pooling`` with ``pooling_mode``, ``Transformer`` with ``transformer_task``) and the
older one (``sentence_transformers.models`` types, ``Pooling`` with ``pooling_mode_*_tokens``
flags, ``MLMTransformer`` for sparse models). A plain Hugging Face folder (no modules.json)
reads as sentence-transformers reads it: a Transformer, then mean pooling (or, for a
``*ForSequenceClassification`` checkpoint, a cross-encoder). Nothing here runs a module:
:mod:`fastbert.model.sentence_modules` does. Every error names the file at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastbert.execution.arguments import positive_integer
from fastbert.model.config import read_json_file
from fastbert.model.router_folder import ROUTERS, RouterSpec, read_router

EMBEDDING = "embedding"
SPARSE = "sparse"
MULTI_VECTOR = "multi-vector"
CLASSIFICATION = "classification"
KINDS = (EMBEDDING, SPARSE, MULTI_VECTOR, CLASSIFICATION)

# config_sentence_transformers.json's model_type -> the kind of output it gives.
_MODEL_TYPES = {
    "SentenceTransformer": EMBEDDING,
    "SparseEncoder": SPARSE,
    "MultiVectorEncoder": MULTI_VECTOR,
    "CrossEncoder": CLASSIFICATION,
}
# The Transformer's task (sentence-transformers 6) -> what its output is.
_TASKS = {
    "feature-extraction": "hidden states",
    "fill-mask": "masked-LM logits",
    "sequence-classification": "classification logits",
}
# What a Transformer of each task reads from the model's output (its modality_config's
# "text" method_output_name) and the feature it writes (module_output_name): the only ones
# fastbert computes (sentence-transformers' defaults; a folder saved before these settings
# existed gets them).
_TASK_OUTPUTS = {
    "feature-extraction": ("last_hidden_state", "token_embeddings"),
    "fill-mask": ("logits", "token_embeddings"),
    "sequence-classification": ("logits", "scores"),
}
# Input modules: the one that turns texts into features. fastbert runs a Transformer.
_TRANSFORMERS = ("Transformer", "MLMTransformer")
# The Transformer's settings file, by the names sentence-transformers tries in turn (older
# folders name it for their architecture).
_TRANSFORMER_SETTINGS = (
    "sentence_bert_config.json",
    "sentence_roberta_config.json",
    "sentence_distilbert_config.json",
    "sentence_camembert_config.json",
    "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json",
    "sentence_xlnet_config.json",
)
# Arguments a Transformer's settings may pass to transformers' loaders that leave its outputs
# as they are (sentence-transformers drops trust_remote_code itself; the rest only say where
# and how the files load). Any other model or config argument changes the model, which
# fastbert builds from config.json alone, so it is refused.
_HARMLESS_LOADER_ARGUMENTS = frozenset(
    {
        "trust_remote_code",
        "attn_implementation",
        "low_cpu_mem_usage",
        "cache_dir",
        "revision",
        "token",
        "local_files_only",
        "subfolder",
    }
)


@dataclass(frozen=True)
class ModuleSpec:
    """One entry of modules.json: ``name`` (its key), ``class_name`` (the last part of
    ``type``), ``type`` (the full class path), ``folder`` (where its files are) and ``config``
    (its config.json, {} when it has none)."""

    name: str
    type: str
    folder: Path
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def class_name(self) -> str:
        return self.type.rsplit(".", 1)[-1]

    def describe(self) -> str:
        """How an error names the module: ``2_Dense (sentence_transformers...Dense)``."""
        return f"{self.folder.name or self.name} ({self.type})"


@dataclass(frozen=True)
class TransformerSpec:
    """The Transformer module: ``folder`` (its Hugging Face checkpoint), ``task``
    ("feature-extraction", "fill-mask" or "sequence-classification"), ``max_seq_length``,
    ``do_lower_case``, for a multi-vector model the most tokens of a query and of a document
    (``query_length``, ``document_length``), and ``tokenizer_kwargs``: the arguments its
    settings give the tokenizer's loader (``tokenizer_args`` / ``processor_kwargs``); None /
    False / {} where the folder says nothing."""

    folder: Path
    task: str = "feature-extraction"
    max_seq_length: int | None = None
    do_lower_case: bool = False
    query_length: int | None = None
    document_length: int | None = None
    tokenizer_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def task_length(self, task: str | None) -> int | None:
        """The most tokens an input of ``task`` ("query", "document" or None) may have, where
        a multi-vector model sets it (None: the model's limit)."""
        return {"query": self.query_length, "document": self.document_length}.get(task)


@dataclass(frozen=True)
class FolderSpec:
    """A model folder as sentence-transformers would load it.

    ``kind``: "embedding" (dense vectors), "sparse", "multi-vector" or "classification";
    ``transformer``: the input module; ``modules``: every module after it, in order; ``prompts`` /
    ``default_prompt_name``: the folder's named prompts and the one applied by default (None:
    none); ``similarity``: its similarity function's name (None when unset); ``declared``:
    whether the folder has a modules.json (False: a plain Hugging Face folder); ``matryoshka``:
    whether its model card (README.md) says it was trained to be cut to fewer dimensions
    (Matryoshka representation learning); ``truncate_dim``: the width its embeddings are cut
    to after every module, and ``max_active_dims``: the values a sparse vector keeps
    (config_sentence_transformers.json's; None: not cut); ``activation_fn``: the class path
    of a cross-encoder's activation it saved there (None: none); ``router``: the routes of a
    folder whose input module is a Router (inference-free SPLADE: ``transformer`` and
    ``modules`` are its Transformer route's; None: no Router)."""

    folder: Path
    kind: str
    transformer: TransformerSpec
    modules: tuple[ModuleSpec, ...] = ()
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity: str | None = None
    declared: bool = True
    matryoshka: bool = False
    truncate_dim: int | None = None
    max_active_dims: int | None = None
    activation_fn: str | None = None
    router: RouterSpec | None = None

    def prompt(self, prompt_name: str | None = None, prompt: str | None = None) -> str:
        """The text put before every input, as sentence-transformers chooses it: ``prompt``
        itself, else the prompt named ``prompt_name``, else the default prompt's, else "".
        ValueError for both given, or for a name the folder does not declare."""
        if prompt is not None and prompt_name is not None:
            raise ValueError("give prompt or prompt_name, not both")
        if prompt is not None:
            if not isinstance(prompt, str):
                raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
            return prompt
        if prompt_name is not None:
            if prompt_name in ("query", "document") and self.kind != CLASSIFICATION:
                # sentence-transformers gives every embedding model these two, empty unless
                # the folder declares them (encode_query / encode_document name them).
                return self.prompts.get(prompt_name, "")
            if prompt_name not in self.prompts:
                known = ", ".join(repr(n) for n in self.prompts) or "none"
                raise ValueError(
                    f"prompt_name {prompt_name!r} is not one of this model's prompts ({known})"
                )
            return self.prompts[prompt_name]
        if self.default_prompt_name is not None:
            return self.prompts.get(self.default_prompt_name, "")
        return ""


def read_folder(folder: str | Path) -> FolderSpec:
    """The :class:`FolderSpec` of a local sentence-transformers or Hugging Face folder.

    ValueError naming the file for a malformed modules.json or module config, a modules.json
    whose first module is not a Transformer (or a Router fastbert runs, see
    :mod:`fastbert.model.router_folder`; or that holds a second one), or a Transformer
    task fastbert does not run."""
    folder = Path(folder)
    settings = _read_optional(folder / "config_sentence_transformers.json")
    modules_path = folder / "modules.json"
    if not modules_path.exists():
        return _plain_folder(folder)
    entries = _module_entries(modules_path)
    router = None
    if entries[0].class_name in ROUTERS:
        if entries[1:]:
            raise ValueError(
                f"{modules_path}: modules after the Router "
                f"({', '.join(m.describe() for m in entries[1:])}) are not run by fastbert"
            )
        router, entries = read_router(entries[0].folder, _module_spec)
    first, rest = entries[0], entries[1:]
    if first.class_name not in _TRANSFORMERS:
        raise ValueError(
            f"{modules_path}: the first module is {first.describe()}; fastbert runs folders "
            "whose input module is a Transformer"
        )
    for module in rest:
        if module.class_name in _TRANSFORMERS:
            raise ValueError(f"{modules_path}: a second Transformer module, {module.describe()}")
    transformer = _transformer(first)
    if _read_optional(transformer.folder / "config.json").get("output_hidden_states"):
        users = ", ".join(m.describe() for m in rest) or "none"
        raise ValueError(
            f"{transformer.folder / 'config.json'} asks for every layer's hidden states "
            f"(output_hidden_states) for its modules ({users}); fastbert's encoder gives the "
            "last layer's only"
        )
    prompts = settings.get("prompts") or {}
    if not isinstance(prompts, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ValueError(
            f"{folder / 'config_sentence_transformers.json'}: prompts must map names to strings"
        )
    default = settings.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(
            f"{folder / 'config_sentence_transformers.json'}: default_prompt_name {default!r} "
            "is not one of its prompts"
        )
    cuts = {}
    for name in ("truncate_dim", "max_active_dims"):
        value = settings.get(name)
        if value is not None:
            where = folder / "config_sentence_transformers.json"
            value = positive_integer(f"{where}: {name}", value)
        cuts[name] = value
    kind = _kind(settings.get("model_type"), transformer, rest, folder)
    if router is not None and kind != SPARSE:
        raise ValueError(
            f"{folder}: its Router's SparseStaticEmbedding gives sparse vectors, but the folder "
            f"is {'an' if kind[0] in 'aeiou' else 'a'} {kind} model"
        )
    return FolderSpec(
        folder=folder,
        kind=kind,
        transformer=transformer,
        modules=tuple(rest),
        prompts=dict(prompts),
        default_prompt_name=default,
        similarity=settings.get("similarity_fn_name"),
        matryoshka=_card_says_matryoshka(folder),
        **cuts,
        activation_fn=settings.get("activation_fn"),
        router=router,
    )


def _plain_folder(folder: Path) -> FolderSpec:
    """A Hugging Face folder: a cross-encoder when its architectures say
    ``*ForSequenceClassification``, else an encoder read with mean pooling."""
    config = _read_optional(folder / "config.json")
    architectures = config.get("architectures") or ()
    if any(str(a).endswith("ForSequenceClassification") for a in architectures):
        transformer = TransformerSpec(folder, "sequence-classification")
        return FolderSpec(folder, CLASSIFICATION, transformer, declared=False)
    pooling = ModuleSpec("pooling", "Pooling", folder, {"pooling_mode": "mean"})
    return FolderSpec(
        folder,
        EMBEDDING,
        TransformerSpec(folder),
        (pooling,),
        declared=False,
        matryoshka=_card_says_matryoshka(folder),
    )


def _card_says_matryoshka(folder: Path) -> bool:
    """Whether the folder's model card names Matryoshka training (sentence-transformers' cards
    list their loss, MatryoshkaLoss, in the tags and the training details)."""
    try:
        card = (folder / "README.md").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "matryoshka" in card.lower()


def _module_entries(path: Path) -> list[ModuleSpec]:
    """modules.json's modules in the order it lists them (the order sentence-transformers runs
    them in, whatever their ``idx``). ValueError for two modules of one name: sentence-
    transformers keeps one module per name, running the last of them in the first's place."""
    raw = read_json_file(path)
    if not isinstance(raw, list) or not raw or not all(isinstance(m, Mapping) for m in raw):
        raise ValueError(f"{path} must be a non-empty JSON list of module objects")
    entries = []
    names = set()
    for module in raw:
        kind, sub, name = module.get("type"), module.get("path", ""), module.get("name", "")
        if not isinstance(kind, str) or not kind or not isinstance(sub, str):
            raise ValueError(f"{path}: a module's type and path must be strings")
        if Path(sub).is_absolute() or ".." in Path(sub).parts:
            raise ValueError(f"{path}: module path {sub!r} leaves the model folder")
        if str(name) in names:
            raise ValueError(
                f"{path}: two modules are named {str(name)!r}; sentence-transformers would run "
                "only the last of them, in the first one's place"
            )
        names.add(str(name))
        entries.append(_module_spec(str(name), kind, path.parent / sub, bool(sub)))
    return entries


def _module_spec(name: str, type_: str, folder: Path, own_folder: bool = True) -> ModuleSpec:
    """The module ``name`` of class path ``type_`` whose files are in ``folder`` (its
    config.json read where the module has a folder of its own)."""
    config = _read_optional(folder / "config.json") if own_folder else {}
    return ModuleSpec(name, type_, folder, config)


def _transformer(module: ModuleSpec) -> TransformerSpec:
    """The Transformer's settings from its sentence_bert_config.json (either format; in an
    older folder, the first of the other names sentence-transformers tries that exists).
    ValueError for loader arguments that change the model (see _loader_arguments)."""
    candidates = [module.folder / name for name in _TRANSFORMER_SETTINGS]
    settings_path = next((p for p in candidates if p.exists()), candidates[0])
    settings = _read_optional(settings_path)
    task = settings.get("transformer_task")
    if task is None:
        task = "fill-mask" if module.class_name == "MLMTransformer" else "feature-extraction"
    if task not in _TASKS:
        raise ValueError(
            f"{settings_path}: transformer_task {task!r} is not one fastbert runs "
            f"({', '.join(_TASKS)})"
        )
    for unsupported in ("query_expansion", "processing_kwargs"):
        if settings.get(unsupported):
            raise ValueError(
                f"{settings_path}: {unsupported} {settings[unsupported]!r} is not run by fastbert"
            )
    _check_outputs(settings, task, settings_path)
    lengths = {}
    for name in ("max_seq_length", "query_length", "document_length"):
        value = settings.get(name)
        if value is not None:
            value = positive_integer(f"{settings_path}: {name}", value)
        lengths[name] = value
    _loader_arguments(
        settings, ("model_args", "model_kwargs", "config_args", "config_kwargs"), settings_path
    )
    tokenizer_kwargs = _loader_arguments(
        settings, ("tokenizer_args", "processor_kwargs"), settings_path
    )
    return TransformerSpec(
        module.folder,
        task,
        lengths["max_seq_length"],
        bool(settings.get("do_lower_case", False)),
        lengths["query_length"],
        lengths["document_length"],
        tokenizer_kwargs,
    )


def _check_outputs(settings: Mapping[str, Any], task: str, path: Path) -> None:
    """ValueError unless the Transformer reads the model output and writes the feature that
    fastbert computes for its ``task`` (:data:`_TASK_OUTPUTS`): a modality_config reading
    another output (``["hidden_states", 1]``: the first layer's) or a module_output_name
    feeding other modules would be run differently."""
    read, written = _TASK_OUTPUTS[task]
    modalities = settings.get("modality_config")
    if modalities is not None:
        text = modalities.get("text") if isinstance(modalities, Mapping) else None
        method = text.get("method") if isinstance(text, Mapping) else None
        output = text.get("method_output_name") if isinstance(text, Mapping) else None
        if method != "forward" or output not in (read, [read]):
            raise ValueError(
                f"{path}: modality_config {modalities!r} reads {output!r} of the model's "
                f"{method!r} for text; fastbert computes the {task} Transformer's {read!r} "
                "of forward only"
            )
    name = settings.get("module_output_name")
    if name is not None and name != written:
        raise ValueError(
            f"{path}: module_output_name {name!r}; fastbert's {task} Transformer writes "
            f"{written!r}, which the modules after it read"
        )


def _loader_arguments(settings: Mapping[str, Any], keys: tuple[str, ...], path: Path) -> dict:
    """The arguments the settings' ``keys`` (an older and a newer name of one thing) give
    transformers' loaders, less trust_remote_code (which sentence-transformers drops). For
    the model's and config's loaders (model_args / config_args), ValueError naming any
    argument that could change the model: fastbert builds it from config.json alone."""
    merged: dict[str, Any] = {}
    for key in keys:
        value = settings.get(key) or {}
        if not isinstance(value, Mapping):
            raise ValueError(f"{path}: {key} must be a JSON object")
        merged.update(value)
    if keys[0] == "tokenizer_args" and "tokenizer_args" in settings:
        # sentence-transformers renames the older key to the newer, replacing it: the older
        # one's arguments are the tokenizer's, the newer one's dropped.
        merged = dict(settings["tokenizer_args"] or {})
    merged.pop("trust_remote_code", None)
    if keys[0] != "tokenizer_args":
        changing = sorted(k for k in merged if k not in _HARMLESS_LOADER_ARGUMENTS)
        if changing:
            raise ValueError(
                f"{path}: {' / '.join(keys)} pass {', '.join(changing)} to transformers' "
                "loaders, which changes the model sentence-transformers builds; fastbert builds "
                "it from config.json alone and does not run these"
            )
    return merged


def _kind(
    model_type: object, transformer: TransformerSpec, modules: list[ModuleSpec], folder: Path
) -> str:
    """The folder's kind: its model_type when it declares one, else what its modules give."""
    if model_type is not None:
        if model_type not in _MODEL_TYPES:
            raise ValueError(
                f"{folder / 'config_sentence_transformers.json'}: model_type {model_type!r} is "
                f"not one fastbert runs ({', '.join(_MODEL_TYPES)})"
            )
        kind = _MODEL_TYPES[model_type]
    elif transformer.task == "sequence-classification":
        kind = CLASSIFICATION
    elif transformer.task == "fill-mask":
        kind = SPARSE
    else:
        kind = EMBEDDING
    if kind == CLASSIFICATION and modules:
        raise ValueError(
            f"{folder / 'modules.json'}: the cross-encoder's sequence-classification "
            f"Transformer is followed by {', '.join(m.describe() for m in modules)}, which "
            "fastbert does not run on its scores (it runs the Transformer's classifier alone)"
        )
    needs = {SPARSE: "fill-mask", CLASSIFICATION: "sequence-classification"}.get(kind)
    if needs is not None and transformer.task != needs:
        problem = (
            f"{folder}: a {kind} model needs a {needs} Transformer; its Transformer gives "
            f"{_TASKS[transformer.task]}"
        )
        if kind == SPARSE and modules[1:]:  # a sparse head on hidden states (CSR's)
            problem += (
                f", made sparse by {', '.join(m.describe() for m in modules[1:])}, which "
                "fastbert does not run (its sparse models are SPLADE: an MLMTransformer, then "
                "SpladePooling)"
            )
        raise ValueError(problem)
    if kind in (EMBEDDING, MULTI_VECTOR) and transformer.task != "feature-extraction":
        raise ValueError(
            f"{folder}: a {kind} model needs a feature-extraction Transformer; its Transformer "
            f"gives {_TASKS[transformer.task]}"
        )
    return kind


def _read_optional(path: Path) -> dict[str, Any]:
    """A JSON object file's contents, {} when the file does not exist."""
    if not path.exists():
        return {}
    value = read_json_file(path)
    if not isinstance(value, Mapping):
        raise ValueError(f"{path} must hold a JSON object")
    return dict(value)


__all__ = [
    "CLASSIFICATION",
    "EMBEDDING",
    "KINDS",
    "MULTI_VECTOR",
    "SPARSE",
    "FolderSpec",
    "ModuleSpec",
    "TransformerSpec",
    "read_folder",
]
