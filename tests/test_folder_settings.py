"""The settings of a sentence-transformers folder beyond its modules' own configs, read as
sentence-transformers reads them: the Transformer's settings file (any of its older names),
the length an input is cut to (tokenizer arguments, max_seq_length, the tokenizer's limit),
the side it is cut from, lowercasing, the modules' order and names, truncate_dim; or the load
fails naming what fastbert does not run. Each compared with sentence-transformers' encode on
a folder it saved, then edited as real folders are written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import fastbert
from tests.sentence_folders import HIDDEN, hf_folder, save_modules, transformer, write_json

st = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.modules import Dense, Normalize  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402
from sentence_transformers.sparse_encoder.modules import SpladePooling  # noqa: E402

TOLERANCE = 2e-5  # float32 against float32: the same math, summed in other orders
LONG = " ".join(f"Sentence {i} is about Paris and the river Seine in spring." for i in range(12))
TEXTS = [
    "A short one.",
    "Fill the [MASK] here [SEP] and there.",
    "ΟΔΟΣ ΚΑΙ ΣΟΦΙΑΣ ΛΟΓΟΣ",  # lowercased letter by letter, a final sigma is no ς
    LONG,
    LONG[:200],
]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return hf_folder(tmp_path_factory.mktemp("base") / "bert")


def folder_of(base: Path, path: Path, *modules, **kw) -> Path:
    """A folder sentence-transformers saved: the Transformer (max_seq_length 48), mean
    pooling, then ``modules``."""
    return save_modules(path, [transformer(base), Pooling(HIDDEN, "mean"), *modules], **kw)


def edit_json(path: Path, **changes) -> None:
    value = json.loads(path.read_text()) if path.exists() else {}
    value.update(changes)
    write_json(path, value)


def assert_as_sentence_transformers(folder: Path, **load) -> np.ndarray:
    want = st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS, convert_to_numpy=True)
    got = fastbert.load(folder, device="cpu", **load).embed(TEXTS)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    return got


def test_the_settings_file_under_an_older_name(base, tmp_path):
    folder = folder_of(base, tmp_path / "m")
    (folder / "sentence_bert_config.json").rename(folder / "sentence_distilbert_config.json")
    edit_json(folder / "sentence_distilbert_config.json", max_seq_length=8)
    assert fastbert.load(folder, device="cpu").max_length == 8
    assert_as_sentence_transformers(folder)


@pytest.mark.parametrize(
    "settings, tokenizer_limit, length",
    [
        ({"max_seq_length": 24}, 8, 24),  # max_seq_length is not capped by the tokenizer's
        ({"max_seq_length": 24, "tokenizer_args": {"model_max_length": 6}}, None, 6),
        ({"max_seq_length": 24, "processor_kwargs": {"model_max_length": 7}}, None, 7),
        ({"max_seq_length": None}, 10, 10),  # none given: the tokenizer's limit
    ],
)
def test_the_length_inputs_are_cut_to(base, tmp_path, settings, tokenizer_limit, length):
    folder = folder_of(base, tmp_path / "m")
    edit_json(folder / "sentence_bert_config.json", **settings)
    if tokenizer_limit is not None:
        edit_json(folder / "tokenizer_config.json", model_max_length=tokenizer_limit)
    assert fastbert.load(folder, device="cpu").max_length == length
    assert_as_sentence_transformers(folder)


def test_a_length_over_the_positions_fails_the_load_unless_given(base, tmp_path):
    folder = folder_of(base, tmp_path / "m")
    edit_json(folder / "sentence_bert_config.json", max_seq_length=1000)
    with pytest.raises(ValueError, match="max_seq_length 1000 exceeds the model's 160 positions"):
        fastbert.load(folder, device="cpu")
    assert fastbert.load(folder, device="cpu", max_length=160).max_length == 160


@pytest.mark.parametrize("key", ["config_args", "config_kwargs", "model_args", "model_kwargs"])
def test_loader_arguments_that_change_the_model_are_refused(base, tmp_path, key):
    folder = folder_of(base, tmp_path / "m")
    edit_json(folder / "sentence_bert_config.json", **{key: {"num_hidden_layers": 1}})
    with pytest.raises(ValueError, match=f"{key}.*num_hidden_layers"):
        fastbert.load(folder, device="cpu")
    edit_json(folder / "sentence_bert_config.json", **{key: {"trust_remote_code": True}})
    assert_as_sentence_transformers(folder)


def test_inputs_are_cut_from_the_tokenizers_side(base, tmp_path):
    folder = folder_of(base, tmp_path / "m")
    edit_json(folder / "tokenizer_config.json", truncation_side="left")
    got = assert_as_sentence_transformers(folder)
    right = fastbert.load(folder_of(base, tmp_path / "r"), device="cpu").embed(TEXTS)
    assert np.abs(got[3] - right[3]).max() > 1e-3  # the long text's cut differs


def test_lowercasing_leaves_special_tokens_and_goes_letter_by_letter(base, tmp_path):
    folder = folder_of(base, tmp_path / "m")
    edit_json(folder / "sentence_bert_config.json", do_lower_case=True)
    assert_as_sentence_transformers(folder)
    ids = fastbert.load(folder, device="cpu").tokenize(["[MASK] ΣΟΦΙΑΣ"]).ids[0]
    assert 103 in ids  # [MASK] stays one special token


def test_modules_run_in_the_order_listed_whatever_their_idx(base, tmp_path):
    folder = folder_of(base, tmp_path / "m", Dense(HIDDEN, 16), Normalize())
    modules = json.loads((folder / "modules.json").read_text())
    dense, normalize = modules[2], modules[3]
    dense["idx"], normalize["idx"] = normalize["idx"], dense["idx"]
    write_json(folder / "modules.json", modules)
    got = assert_as_sentence_transformers(folder)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)


def test_two_modules_of_one_name_are_refused(base, tmp_path):
    folder = folder_of(base, tmp_path / "m", Dense(HIDDEN, 16), Dense(16, 8))
    modules = json.loads((folder / "modules.json").read_text())
    modules[3]["name"] = modules[2]["name"]
    write_json(folder / "modules.json", modules)
    with pytest.raises(ValueError, match="two modules are named"):
        fastbert.load(folder, device="cpu")


def test_a_module_without_its_config_is_refused_naming_it(base, tmp_path):
    folder = folder_of(base, tmp_path / "m", Dense(HIDDEN, 16))
    modules = json.loads((folder / "modules.json").read_text())
    for module in modules[1:]:
        module["path"] = f"{module['path']}_missing"
    write_json(folder / "modules.json", modules)
    with pytest.raises(ValueError, match="Pooling.*no config.json"):
        fastbert.load(folder, device="cpu")


def test_a_dense_config_without_bias_has_one(base, tmp_path):
    folder = folder_of(base, tmp_path / "m", Dense(HIDDEN, 16))
    config_path = next(folder.glob("2_Dense/config.json"))
    config = json.loads(config_path.read_text())
    del config["bias"]
    write_json(config_path, config)
    assert_as_sentence_transformers(folder)


def test_truncate_dim_cuts_as_sentence_transformers_cuts(base, tmp_path):
    folder = folder_of(base, tmp_path / "m", truncate_dim=24)
    assert assert_as_sentence_transformers(folder).shape[1] == 24
    assert fastbert.load(folder, device="cpu").dimensions == 24  # what embed returns
    normalised = folder_of(base, tmp_path / "n", Normalize(), truncate_dim=24)
    settings = json.loads((normalised / "config_sentence_transformers.json").read_text())
    assert settings["truncate_dim"] == 24
    got = assert_as_sentence_transformers(normalised)  # cut after the Normalize: shorter than 1
    assert got.shape[1] == 24 and np.linalg.norm(got, axis=1).max() < 0.999
    model = st.SentenceTransformer(str(normalised), device="cpu")
    want = model.encode(TEXTS, normalize_embeddings=True)
    got = fastbert.load(normalised, device="cpu", normalize=True).embed(TEXTS)
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    np.testing.assert_allclose(
        fastbert.load(normalised, device="cpu").embed(TEXTS, dimensions=64),
        model.encode(TEXTS, truncate_dim=64),
        atol=TOLERANCE,
    )


def test_a_corpus_job_cuts_a_folders_truncate_dim_as_sentence_transformers(base, tmp_path):
    """fastbert embed (to Parquet shards) on a folder cut by truncate_dim after its Normalize:
    the vectors sentence-transformers gives (shorter than 1); the job's options, resolved
    once more when its model loaded, had read the folder's width as one given and normalised
    after the cut."""
    import pyarrow.parquet as pq

    folder = folder_of(base, tmp_path / "n", Normalize(), truncate_dim=24)
    source = tmp_path / "texts.txt"
    source.write_text("".join(t + "\n" for t in TEXTS))
    summary = fastbert.embed(source, folder, output=tmp_path / "out", device="cpu", progress=False)
    assert summary.manifest["rows"] == len(TEXTS)
    table = pq.read_table(tmp_path / "out" / "part-00000.parquet")
    got = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    want = st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    np.testing.assert_allclose(got, want, atol=TOLERANCE)


def test_a_cut_and_normalize_give_the_same_vectors_however_set(base, tmp_path):
    """dimensions= (cut, then normalised as the model normalises) and normalize=False (the
    pooled vectors) give one answer whether set in fastbert.embed, at load or per call, on a
    folder whose own truncate_dim cuts after its Normalize (per call they gave
    sentence-transformers' cut-after-Normalize vectors, 0.36 away, and kept the Normalize)."""
    folder = folder_of(base, tmp_path / "n", Normalize(), truncate_dim=24)
    without_normalize = folder_of(base, tmp_path / "m", truncate_dim=24)
    loaded = fastbert.load(folder, device="cpu")
    cut = {"dimensions": 16, "force_dimensions": True}
    want = st.SentenceTransformer(str(folder), device="cpu").encode(
        TEXTS, truncate_dim=16, normalize_embeddings=True
    )
    for got in (
        loaded.embed(TEXTS, **cut),
        fastbert.embed(TEXTS, folder, device="cpu", progress=False, **cut),
    ):
        np.testing.assert_allclose(got, want, atol=TOLERANCE)
    pooled = st.SentenceTransformer(str(without_normalize), device="cpu").encode(TEXTS)
    for got in (
        loaded.embed(TEXTS, normalize=False),
        fastbert.load(folder, device="cpu", normalize=False).embed(TEXTS),
        fastbert.embed(TEXTS, folder, device="cpu", progress=False, normalize=False),
    ):
        np.testing.assert_allclose(got, pooled, atol=TOLERANCE)


# -- the other kinds: sparse, multi-vector, cross-encoder ------------------------------------


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    return hf_folder(tmp_path_factory.mktemp("mlm") / "bert", "BertForMaskedLM", seed=1)


@pytest.mark.parametrize("max_active_dims", [None, 5])
def test_a_sparse_folders_normalize_and_max_active_dims(mlm, tmp_path, max_active_dims):
    """A final Normalize runs (it was dropped), and the folder's max_active_dims keeps each
    row's largest values after it, as SparseEncoder.encode does."""
    modules = [transformer(mlm, transformer_task="fill-mask"), SpladePooling("max"), Normalize()]
    folder = save_modules(
        tmp_path / "sparse", modules, kind="SparseEncoder", max_active_dims=max_active_dims
    )
    want = st.SparseEncoder(str(folder), device="cpu").encode(TEXTS).to_dense().numpy()
    got = fastbert.load(folder, device="cpu").embed(TEXTS).to_dense()
    if max_active_dims is None:
        np.testing.assert_allclose(np.linalg.norm(want, axis=1), 1.0, atol=1e-5)
    np.testing.assert_array_equal(got > 0, want > 0)
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    if max_active_dims:
        assert ((got > 0).sum(axis=1) == max_active_dims).all()


def test_query_and_document_prompts_exist_in_every_embedding_folder(base, tmp_path):
    """sentence-transformers gives each embedding model empty "query" and "document" prompts
    where the folder declares none (encode_query / encode_document name them)."""
    model = st.MultiVectorEncoder(str(base), device="cpu")
    model.save(str(tmp_path / "mv"))
    edit_json(tmp_path / "mv" / "config_sentence_transformers.json", prompts={})
    model = st.MultiVectorEncoder(str(tmp_path / "mv"), device="cpu")
    loaded = fastbert.load(tmp_path / "mv", device="cpu")
    for got, want in (
        (loaded.embed(TEXTS, prompt_name="query"), model.encode_query(TEXTS)),
        (loaded.embed(TEXTS, prompt_name="document"), model.encode_document(TEXTS)),
    ):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, np.asarray(w), atol=TOLERANCE)
    dense = folder_of(base, tmp_path / "dense")
    np.testing.assert_allclose(
        fastbert.load(dense, device="cpu").embed(TEXTS, prompt_name="query"),
        st.SentenceTransformer(str(dense), device="cpu").encode_query(TEXTS),
        atol=TOLERANCE,
    )


@pytest.mark.parametrize("activation", [None, torch.nn.Identity(), torch.nn.Tanh()])
def test_a_cross_encoder_folders_prompt_and_activation(tmp_path, activation):
    """The default prompt goes before each pair's first text, and scores() applies the
    activation the folder saved, as CrossEncoder.predict does."""
    base = hf_folder(tmp_path / "ce-base", "BertForSequenceClassification", seed=2)
    cross = st.CrossEncoder(
        str(base),
        device="cpu",
        prompts={"rerank": "Judge relevance: "},
        default_prompt_name="rerank",
        activation_fn=activation,
    )
    cross.save(str(tmp_path / "ce"))
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[3], TEXTS[4]), ("what is up?", "nothing much")]
    cross = st.CrossEncoder(str(tmp_path / "ce"), device="cpu")
    loaded = fastbert.load(tmp_path / "ce", device="cpu")
    logits = loaded.classify([a for a, _ in pairs], [b for _, b in pairs])
    want = cross.predict(pairs, activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(logits[:, 0], want, atol=TOLERANCE)
    np.testing.assert_allclose(loaded.scores(logits)[:, 0], cross.predict(pairs), atol=TOLERANCE)


def test_an_untrusted_activation_is_not_replaced_by_the_older_key(tmp_path):
    """config.json naming an activation outside torch (loaded by sentence-transformers only
    with remote code) beside the older sbert_ce_default_activation_function: CrossEncoder
    reads the older key only where the newer is absent, so it falls back to the sigmoid;
    fastbert took the older key's Identity."""
    base = hf_folder(tmp_path / "ce-base", "BertForSequenceClassification", seed=2)
    config_path = base / "config.json"
    config = json.loads(config_path.read_text())
    config["sentence_transformers"] = {"activation_fn": "somewhere.else.Activation"}
    config["sbert_ce_default_activation_function"] = "torch.nn.modules.linear.Identity"
    write_json(config_path, config)
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[3], TEXTS[4])]
    want = st.CrossEncoder(str(base), device="cpu").predict(pairs)
    loaded = fastbert.load(base, device="cpu")
    scores = loaded.scores(loaded.classify([a for a, _ in pairs], [b for _, b in pairs]))
    np.testing.assert_allclose(scores[:, 0], want, atol=TOLERANCE)
    assert ((0 < scores) & (scores < 1)).all()
