"""Small random-weight model folders of real vocabulary (all-MiniLM-L6-v2's tokenizer), saved
by the installed sentence-transformers or written by hand in its older format, for the tests
that compare fastbert with sentence-transformers on them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tests.hf_models import randomize, tiny_config

HIDDEN = 64  # tests.hf_models.tiny_config's
TEXTS = [
    "A sentence about cats.",
    "Another, longer sentence about the weather: rain, then sun!",
    "x",
    "query: what is the capital of France?",
]


def tokenizer() -> Any:
    from fastbert.integrations import models

    return models.load_tokenizer(str(models.packaged_minilm_path()))


def hf_folder(path: Path, cls_name: str = "BertModel", seed: int = 0, **overrides: Any) -> Path:
    """A random BERT of ``cls_name`` (BertModel, BertForMaskedLM, ...) with MiniLM's
    vocabulary and tokenizer, saved at ``path``."""
    import transformers

    tok = tokenizer()
    config = tiny_config(vocab_size=tok.vocab_size, num_labels=1, **overrides)
    torch.manual_seed(seed)
    model = randomize(getattr(transformers, cls_name)(config), seed)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def save_modules(path: Path, modules: list[Any], kind: str = "SentenceTransformer", **kw) -> Path:
    """A sentence-transformers model of ``kind`` built from ``modules``, saved at ``path`` by
    the installed sentence-transformers."""
    import sentence_transformers

    getattr(sentence_transformers, kind)(modules=modules, device="cpu", **kw).save(str(path))
    return path


def transformer(path: Path, **kw: Any) -> Any:
    from sentence_transformers.base.modules import Transformer

    return Transformer(str(path), max_seq_length=48, **kw)


def write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2))


def old_format_folder(path: Path, modules: list[tuple[str, str, dict]], **settings: Any) -> Path:
    """A folder in sentence-transformers' older layout: the transformer in ``0_Transformer``
    (``sentence_transformers.models.Transformer``), then ``modules`` as (class name, folder,
    config) under ``sentence_transformers.models``; ``settings``: sentence_bert_config.json."""
    hf_folder(path / "0_Transformer", seed=3)
    write_json(path / "0_Transformer" / "sentence_bert_config.json", settings)
    entries = [
        {
            "idx": 0,
            "name": "0",
            "path": "0_Transformer",
            "type": "sentence_transformers.models.Transformer",
        }
    ]
    for i, (name, sub, config) in enumerate(modules, start=1):
        entries.append(
            {"idx": i, "name": str(i), "path": sub, "type": f"sentence_transformers.models.{name}"}
        )
        write_json(path / sub / "config.json", config)
    write_json(path / "modules.json", entries)
    return path
