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

    config = tiny_config(vocab_size=tokenizer().vocab_size, num_labels=1, **overrides)
    torch.manual_seed(seed)
    return save_with_tokenizer(randomize(getattr(transformers, cls_name)(config), seed), path)


def save_with_tokenizer(model: torch.nn.Module, path: Path) -> Path:
    """``model`` saved at ``path`` with MiniLM's tokenizer beside it."""
    model.save_pretrained(path)
    tokenizer().save_pretrained(path)
    return path


# Encoder families of the sentence-transformers models in the tests, and the prefix of their
# transformers classes.
FAMILIES = {"bert": "Bert", "mpnet": "MPNet", "modernbert": "ModernBert"}


def family_folder(path: Path, family: str, head: str = "Model", seed: int = 0) -> Path:
    """A random model of ``family`` (a key of FAMILIES) with ``head`` ("Model", "ForMaskedLM",
    "ForSequenceClassification", ...), MiniLM's vocabulary, special token ids and tokenizer,
    saved at ``path``: the small BERT of :func:`hf_folder`, the MPNet of tests/test_mpnet.py,
    or the ModernBERT of tests/test_modernbert.py (ModernBERT-base's structure: head dim 64,
    intermediate 1.5 x hidden, a global layer every third; the other two attend within 16
    positions each side). MiniLM's BERT tokenizer makes token types, which sentence-transformers
    passes on and Hugging Face's MPNet ignores; the ModernBERT tokenizer class transformers
    picks for the folder makes none."""
    if family == "bert":
        return hf_folder(path, f"Bert{head}", seed)
    tok = tokenizer()
    ids = dict(vocab_size=tok.vocab_size, pad_token_id=tok.pad_token_id, num_labels=1)
    if family == "mpnet":
        from tests.test_mpnet import hf_mpnet

        return save_with_tokenizer(hf_mpnet(head, seed, **ids), path)
    from tests.test_modernbert import hf_modernbert

    model = hf_modernbert(
        head,
        seed,
        **ids,
        cls_token_id=tok.cls_token_id,
        sep_token_id=tok.sep_token_id,
        bos_token_id=tok.cls_token_id,
        eos_token_id=tok.sep_token_id,
        hidden_size=HIDDEN,
        num_hidden_layers=3,
        num_attention_heads=1,
        intermediate_size=96,
        max_position_embeddings=64,
    )
    return save_with_tokenizer(model, path)


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


def inference_free_folder(path: Path, mlm: Path, seed: int = 0, **kw: Any) -> Path:
    """An inference-free SPLADE model saved at ``path`` by the installed sentence-transformers:
    a Router whose "query" route is a SparseStaticEmbedding of random weights (some zero, as
    IDF weights of unseen tokens are) and whose "document" route is the masked-LM ``mlm``
    (a folder) and SpladePooling; ``kw``: the SparseEncoder's settings."""
    from sentence_transformers.base.modules import Router
    from sentence_transformers.sparse_encoder.modules import SparseStaticEmbedding, SpladePooling

    document = transformer(mlm, transformer_task="fill-mask")
    generator = torch.Generator().manual_seed(seed)
    weight = torch.rand(len(document.tokenizer.get_vocab()), generator=generator) * 3
    weight[::7] = 0.0
    router = Router.for_query_document(
        query_modules=[SparseStaticEmbedding(document.tokenizer, weight, frozen=True)],
        document_modules=[document, SpladePooling("max", activation_function="log1p_relu")],
    )
    return save_modules(path, [router], kind="SparseEncoder", similarity_fn_name="dot", **kw)
