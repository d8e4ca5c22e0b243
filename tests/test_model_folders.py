"""Every module a model folder declares runs as sentence-transformers runs it, or the load
fails naming the module: fastbert.load / fastbert.embed / fastbert embed against
sentence-transformers' own encode on folders the installed sentence-transformers saved (each
module kind), and on hand-made folders in its older format."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fastbert
from fastbert.embedding.manifest import OutputError
from tests.sentence_folders import (
    HIDDEN,
    TEXTS,
    hf_folder,
    inference_free_folder,
    old_format_folder,
    save_modules,
    transformer,
    write_json,
)

st = pytest.importorskip("sentence_transformers")
from sentence_transformers.base.modules import Dense, Normalize  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402
from sentence_transformers.sparse_encoder.modules import SpladePooling  # noqa: E402

TOLERANCE = 2e-5  # float32 against float32: the same math, summed in other orders


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return hf_folder(tmp_path_factory.mktemp("base") / "bert")


@pytest.fixture(scope="module")
def mlm(tmp_path_factory):
    return hf_folder(tmp_path_factory.mktemp("mlm") / "bert", "BertForMaskedLM", seed=1)


def st_encode(folder, kind="SentenceTransformer", **kw):
    model = getattr(st, kind)(str(folder), device="cpu")
    return model.encode(TEXTS, convert_to_numpy=True, **kw)


def test_dense_module_after_pooling_is_run(base, tmp_path):
    modules = [transformer(base), Pooling(HIDDEN, "cls"), Dense(HIDDEN, 32), Normalize()]
    folder = save_modules(tmp_path / "dense", modules)
    want = st_encode(folder)
    loaded = fastbert.load(folder, device="cpu")
    got = loaded.embed(TEXTS)
    assert want.shape == got.shape == (len(TEXTS), 32) and loaded.dimensions == 32
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    np.testing.assert_allclose(fastbert.embed(TEXTS, model=folder, device="cpu"), want, atol=2e-5)


@pytest.mark.parametrize(
    "mode",
    ["cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken", ("cls", "mean")],
)
def test_every_pooling_mode(base, tmp_path, mode):
    folder = save_modules(tmp_path / "pool", [transformer(base), Pooling(HIDDEN, mode)])
    config = json.loads((folder / "1_Pooling" / "config.json").read_text())
    assert config["pooling_mode"] == (list(mode) if isinstance(mode, tuple) else mode)
    got = fastbert.load(folder, device="cpu").embed(TEXTS)
    np.testing.assert_allclose(got, st_encode(folder), atol=TOLERANCE)


def test_prompts_apply_as_sentence_transformers_applies_them(base, tmp_path):
    prompts = {"query": "query: ", "passage": "passage: "}
    modules = [transformer(base), Pooling(HIDDEN, "mean", include_prompt=False)]
    folder = save_modules(
        tmp_path / "prompts", modules, prompts=prompts, default_prompt_name="query"
    )
    model = st.SentenceTransformer(str(folder), device="cpu")
    loaded = fastbert.load(folder, device="cpu")
    for kwargs in ({}, {"prompt_name": "passage"}, {"prompt": "custom text: "}):
        want = model.encode(TEXTS, convert_to_numpy=True, **kwargs)
        np.testing.assert_allclose(loaded.embed(TEXTS, **kwargs), want, atol=TOLERANCE)
    with pytest.raises(ValueError, match="prompt_name 'nope' is not one of"):
        loaded.embed(TEXTS, prompt_name="nope")
    # The default prompt changes the vectors: without it they differ.
    plain = model.encode(TEXTS, convert_to_numpy=True, prompt="")
    assert np.abs(loaded.embed(TEXTS) - plain).max() > 1e-3


def test_old_format_folder(tmp_path):
    from safetensors.torch import save_file

    legacy_pooling = {
        "word_embedding_dimension": HIDDEN,
        "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False,
        "pooling_mode_max_tokens": True,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    dense = {
        "in_features": HIDDEN,
        "out_features": 16,
        "bias": True,
        "activation_function": "torch.nn.modules.activation.ReLU",
    }
    folder = old_format_folder(
        tmp_path / "old",
        [("Pooling", "1_Pooling", legacy_pooling), ("Dense", "2_Dense", dense)],
        max_seq_length=24,
        do_lower_case=True,
    )
    gen = torch.Generator().manual_seed(5)
    save_file(
        {"linear.weight": torch.randn(16, HIDDEN, generator=gen), "linear.bias": torch.randn(16)},
        str(folder / "2_Dense" / "model.safetensors"),
    )
    texts = [t.upper() for t in TEXTS] + ["word " * 40]
    want = st.SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)
    loaded = fastbert.load(folder, device="cpu")
    assert loaded.max_length == 24
    np.testing.assert_allclose(loaded.embed(texts), want, atol=TOLERANCE)


def test_module_from_sentence_transformers_runs_through_it(base, tmp_path):
    from sentence_transformers.sentence_transformer.modules import LayerNorm

    modules = [transformer(base), Pooling(HIDDEN, "mean"), LayerNorm(HIDDEN)]
    with torch.no_grad():
        modules[2].norm.weight.uniform_(0.5, 1.5)
    folder = save_modules(tmp_path / "layernorm", modules)
    got = fastbert.load(folder, device="cpu").embed(TEXTS)
    np.testing.assert_allclose(got, st_encode(folder), atol=TOLERANCE)


@pytest.mark.parametrize("mode", ["mean", "weightedmean"])
def test_a_pooling_after_word_weights_divides_by_their_sum(base, tmp_path, mode):
    """WordWeights (run by sentence-transformers) weighs the tokens and gives their sum, which
    sentence-transformers' Pooling divides by: the Pooling after it runs there too (fastbert's
    divided by the token count: 0.30 off for mean, 12.6 for weightedmean)."""
    from sentence_transformers.sentence_transformer.modules import WordWeights

    tokenizer = json.loads((base / "tokenizer.json").read_text())
    vocab = sorted(tokenizer["model"]["vocab"], key=tokenizer["model"]["vocab"].get)
    weights = {word: (i % 7) * 0.5 for i, word in enumerate(vocab)}
    modules = [transformer(base), WordWeights(vocab, weights, 0.3), Pooling(HIDDEN, mode)]
    folder = save_modules(tmp_path / "word-weights", modules)
    got = fastbert.load(folder, device="cpu").embed(TEXTS)
    np.testing.assert_allclose(got, st_encode(folder), atol=TOLERANCE)


def test_every_layer_is_refused_where_modules_ask_for_it(base, tmp_path):
    from sentence_transformers.sentence_transformer.modules import WeightedLayerPooling

    modules = [
        transformer(base),
        WeightedLayerPooling(HIDDEN, num_hidden_layers=2, layer_start=1),
        Pooling(HIDDEN),
    ]
    folder = save_modules(tmp_path / "layers", modules)
    # Without output_hidden_states, sentence-transformers' WeightedLayerPooling passes the last
    # layer through: so does fastbert.
    np.testing.assert_allclose(
        fastbert.load(folder, device="cpu").embed(TEXTS), st_encode(folder), atol=TOLERANCE
    )
    config = json.loads((folder / "config.json").read_text())
    write_json(folder / "config.json", {**config, "output_hidden_states": True})
    with pytest.raises(ValueError, match="output_hidden_states.*WeightedLayerPooling"):
        fastbert.load(folder, device="cpu")


def test_a_module_that_cannot_run_fails_the_load_naming_it(base, tmp_path):
    dense = Dense(HIDDEN, 8, module_input_name="no_such_features")
    folder = save_modules(tmp_path / "bad", [transformer(base), Pooling(HIDDEN), dense])
    with pytest.raises(ValueError, match=r"module 2_Dense .*cannot run.*no_such_features"):
        fastbert.load(folder, device="cpu")


def test_code_from_outside_sentence_transformers_is_refused(base, tmp_path):
    folder = save_modules(tmp_path / "custom", [transformer(base), Pooling(HIDDEN)])
    entries = json.loads((folder / "modules.json").read_text())
    entries.append({"idx": 2, "name": "2", "path": "2_Mine", "type": "my_package.MyModule"})
    write_json(folder / "modules.json", entries)
    with pytest.raises(ValueError, match=r"2_Mine \(my_package.MyModule\).*no code a model"):
        fastbert.load(folder, device="cpu")


def test_a_second_input_module_is_refused(base, tmp_path):
    folder = save_modules(tmp_path / "input", [transformer(base), Pooling(HIDDEN)])
    entries = json.loads((folder / "modules.json").read_text())
    static = "sentence_transformers.sentence_transformer.modules.StaticEmbedding"
    entries.insert(1, {"idx": 1, "name": "s", "path": "", "type": static})
    for i, entry in enumerate(entries):
        entry["idx"] = i
    write_json(folder / "modules.json", entries)
    with pytest.raises(ValueError, match="StaticEmbedding.*only input module is the Transformer"):
        fastbert.load(folder, device="cpu")


@pytest.fixture(scope="module")
def inference_free(mlm, tmp_path_factory):
    folder = tmp_path_factory.mktemp("inference-free") / "st"
    prompts = {"query": "find: ", "document": "", "search": "look up: "}
    return inference_free_folder(folder, mlm, prompts=prompts)


def assert_splade_close(got: np.ndarray, want: np.ndarray) -> None:
    """SPLADE vectors as sentence-transformers gives them (see
    test_sparse_folder_gives_splade_vectors for the zeros either side may round to)."""
    differ = (got > 0) != (want > 0)
    assert differ.mean() < 1e-4 and np.all(np.abs(got - want)[differ] < 1e-6)
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=1e-5)


def test_an_inference_free_folder_routes_queries_and_documents_as_sentence_transformers(
    inference_free,
):
    """Inference-free SPLADE: queries take the Router's SparseStaticEmbedding route (their
    tokens' weights, no special tokens, after the query prompt), documents and task-less
    inputs the masked-LM route, as SparseEncoder.encode_query / encode_document / encode."""
    encoder = st.SparseEncoder(str(inference_free), device="cpu")
    loaded = fastbert.load(inference_free, device="cpu")
    assert loaded.kind == "sparse"
    queries = encoder.encode_query(TEXTS).to_dense().numpy()
    np.testing.assert_array_equal(loaded.embed(TEXTS, prompt_name="query").to_dense(), queries)
    as_loaded = fastbert.load(inference_free, device="cpu", prompt_name="query")
    np.testing.assert_array_equal(as_loaded.embed(TEXTS).to_dense(), queries)
    cut = encoder.encode_query(TEXTS, max_active_dims=3).to_dense().numpy()
    got = loaded.embed(TEXTS, prompt_name="query", max_active_dims=3).to_dense()
    np.testing.assert_array_equal(got, cut)
    documents = encoder.encode_document(TEXTS).to_dense().numpy()
    assert_splade_close(loaded.embed(TEXTS, prompt_name="document").to_dense(), documents)
    assert_splade_close(loaded.embed(TEXTS).to_dense(), encoder.encode(TEXTS).to_dense().numpy())


def test_an_inference_free_corpus_job_runs_the_route_of_its_prompt(inference_free, tmp_path):
    import pyarrow.parquet as pq

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    want = st.SparseEncoder(str(inference_free), device="cpu").encode_query(TEXTS)
    want = want.to_dense().numpy()
    out = tmp_path / "out"
    summary = fastbert.embed(
        corpus, model=inference_free, output=out, device="cpu", prompt_name="query"
    )
    assert summary.manifest["task"] == "query" and summary.manifest["prompt"] == "find: "
    table = pq.read_table(out / "part-00000.parquet")
    for row, (indices, values) in enumerate(
        zip(table.column("indices").to_pylist(), table.column("values").to_pylist())
    ):
        np.testing.assert_array_equal(indices, np.flatnonzero(want[row]))
        np.testing.assert_array_equal(values, want[row][indices])


def router_config(folder):
    return json.loads((folder / "router_config.json").read_text())


def test_a_routers_mappings_and_route_names_resolve_as_in_sentence_transformers(
    inference_free, tmp_path
):
    """route_mappings first ((any task, text) -> the static route: documents too), then a
    route named for the task, then the default route; a task no route takes is an error,
    as in sentence-transformers."""
    import shutil

    mapped = shutil.copytree(inference_free, tmp_path / "mapped")
    config = router_config(mapped)
    config["parameters"]["route_mappings"] = {"(None, 'text')": "query"}
    write_json(mapped / "router_config.json", config)
    encoder = st.SparseEncoder(str(mapped), device="cpu")
    loaded = fastbert.load(mapped, device="cpu")
    for prompt_name, encode in (("document", encoder.encode_document), (None, encoder.encode)):
        want = encode(TEXTS).to_dense().numpy()
        np.testing.assert_array_equal(loaded.embed(TEXTS, prompt_name=prompt_name).to_dense(), want)

    renamed = shutil.copytree(inference_free, tmp_path / "renamed")
    config = router_config(renamed)
    config["structure"] = {"q": config["structure"]["query"], "d": config["structure"]["document"]}
    config["parameters"]["default_route"] = "d"
    write_json(renamed / "router_config.json", config)
    encoder = st.SparseEncoder(str(renamed), device="cpu")
    loaded = fastbert.load(renamed, device="cpu")
    assert_splade_close(loaded.embed(TEXTS).to_dense(), encoder.encode(TEXTS).to_dense().numpy())
    with pytest.raises(ValueError, match="No route found for task type 'query'"):
        encoder.encode_query(TEXTS)
    with pytest.raises(ValueError, match="no route for task 'query'"):
        loaded.embed(TEXTS, prompt_name="query")


def test_router_folders_in_every_layout_sentence_transformers_loads(inference_free, tmp_path):
    """No default route (each call names its task, as there), the config under its older
    name (config.json) and the Router's older class name (Asym) load as
    sentence-transformers loads them."""
    import shutil

    queries = st.SparseEncoder(str(inference_free), device="cpu").encode_query(TEXTS)
    queries = queries.to_dense().numpy()
    no_default = shutil.copytree(inference_free, tmp_path / "no-default")
    config = router_config(no_default)
    config["parameters"].update(default_route=None, allow_empty_key=False)
    write_json(no_default / "router_config.json", config)
    with pytest.raises(ValueError, match="Could not determine route"):
        st.SparseEncoder(str(no_default), device="cpu").encode(TEXTS)
    loaded = fastbert.load(no_default, device="cpu")
    with pytest.raises(ValueError, match="no route for task None"):
        loaded.embed(TEXTS)
    np.testing.assert_array_equal(loaded.embed(TEXTS, prompt_name="query").to_dense(), queries)

    older = shutil.copytree(inference_free, tmp_path / "older")
    (older / "router_config.json").rename(older / "config.json")
    entries = json.loads((older / "modules.json").read_text())
    entries[0]["type"] = "sentence_transformers.models.Asym"
    write_json(older / "modules.json", entries)
    want = st.SparseEncoder(str(older), device="cpu").encode_query(TEXTS).to_dense().numpy()
    np.testing.assert_array_equal(want, queries)
    loaded = fastbert.load(older, device="cpu")
    np.testing.assert_array_equal(loaded.embed(TEXTS, prompt_name="query").to_dense(), queries)


def test_another_prompt_keeps_the_task_the_model_loaded_with(inference_free):
    """A model loaded for queries, given another prompt (its text, or the name of one that
    is no task): still queries, as encode_query(prompt=...) / encode_query(prompt_name=...)
    (the documents' route took them)."""
    encoder = st.SparseEncoder(str(inference_free), device="cpu")
    loaded = fastbert.load(inference_free, device="cpu", prompt_name="query")
    for given in ({"prompt": "q: "}, {"prompt_name": "search"}):
        want = encoder.encode_query(TEXTS, **given).to_dense().numpy()
        np.testing.assert_array_equal(loaded.embed(TEXTS, **given).to_dense(), want)


def test_a_query_token_id_is_checked_against_the_query_routes_vocabulary(inference_free):
    """The server's token-id inputs: a query's ids within the query route's weights (a
    masked-LM wider than its tokenizer takes more ids on the document route)."""
    from fastbert.embedding.static_sparse import StaticSparseEncoder
    from fastbert.serve.errors import ValidationFailed
    from fastbert.serve.inputs import tokenize

    loaded = fastbert.load(inference_free, device="cpu")
    loaded.static_encoder = StaticSparseEncoder(loaded.static_encoder.weight[:100])
    query, document = loaded.prompting("query"), loaded.prompting("document")
    assert tokenize(loaded, [[150]], True, None, "inputs", document) == [[150]]
    with pytest.raises(ValidationFailed, match=r"token id 150 is outside the vocabulary \(0 .. 99"):
        tokenize(loaded, [[150]], True, None, "inputs", query)


def test_routers_fastbert_does_not_run_are_refused_naming_them(base, inference_free, tmp_path):
    """A Router of other routes than one SparseStaticEmbedding and one Transformer (a dense
    StaticEmbedding query route), or with modules after it, fails the load naming them."""
    import shutil

    from sentence_transformers.base.modules import Router
    from sentence_transformers.sentence_transformer.modules import StaticEmbedding

    query = StaticEmbedding(transformer(base).tokenizer, embedding_dim=HIDDEN)
    router = Router.for_query_document(
        query_modules=[query, Pooling(HIDDEN)],
        document_modules=[transformer(base), Pooling(HIDDEN)],
    )
    dense = save_modules(tmp_path / "dense", [router])
    with pytest.raises(
        ValueError, match=r"one SparseStaticEmbedding route .*query: .*StaticEmbedding"
    ):
        fastbert.load(dense, device="cpu")

    after = shutil.copytree(inference_free, tmp_path / "after")
    entries = json.loads((after / "modules.json").read_text())
    normalize = "sentence_transformers.base.modules.normalize.Normalize"
    entries.append({"idx": 1, "name": "1", "path": "1_Normalize", "type": normalize})
    write_json(after / "modules.json", entries)
    with pytest.raises(ValueError, match=r"modules after the Router \(1_Normalize"):
        fastbert.load(after, device="cpu")


def test_a_sparse_auto_encoder_folder_is_refused_naming_the_module(base, tmp_path):
    """CSR: a SparseEncoder whose hidden states are made sparse by a SparseAutoEncoder."""
    from sentence_transformers.sparse_encoder.models import SparseAutoEncoder

    csr = SparseAutoEncoder(input_dim=HIDDEN, hidden_dim=2 * HIDDEN, k=8, k_aux=16)
    modules = [transformer(base), Pooling(HIDDEN), csr]
    folder = save_modules(tmp_path / "csr", modules, kind="SparseEncoder")
    with pytest.raises(ValueError, match=r"made sparse by \S+ \(\S+SparseAutoEncoder\)"):
        fastbert.load(folder, device="cpu")


@pytest.mark.parametrize(
    "strategy, activation", [("max", "relu"), ("max", "log1p_relu"), ("sum", "relu")]
)
def test_sparse_folder_gives_splade_vectors(mlm, tmp_path, strategy, activation):
    modules = [
        transformer(mlm, transformer_task="fill-mask"),
        SpladePooling(strategy, activation_function=activation),
    ]
    folder = save_modules(tmp_path / "sparse", modules, kind="SparseEncoder")
    want = st.SparseEncoder(str(folder), device="cpu").encode(TEXTS).to_dense().numpy()
    loaded = fastbert.load(folder, device="cpu")
    assert loaded.kind == "sparse" and loaded.dimensions == want.shape[1]
    got = loaded.embed(TEXTS)
    dense = got.to_dense()
    assert dense.shape == want.shape
    # The zeros are sentence-transformers', but where a logit lies within float32's rounding
    # of zero: there either side may round either way (seen: a logit of -5.9e-8 in float64,
    # against logits of about 0.5, came out +3.0e-8 here and negative there).
    differ = (dense > 0) != (want > 0)
    assert differ.mean() < 1e-4 and np.all(np.abs(dense - want)[differ] < 1e-6)
    np.testing.assert_allclose(dense, want, atol=TOLERANCE, rtol=1e-5)
    assert torch.equal(got.to_torch().to_dense() > 0, torch.from_numpy(dense > 0))


@pytest.mark.parametrize("family", ["bert", "mpnet"])
def test_sparse_folder_of_an_untied_masked_lm_reads_the_decoders_bias(tmp_path, family):
    """A masked-LM saved with tie_word_embeddings=False keeps the decoder's bias apart from
    the head's plain one, which Hugging Face's forward then never reads (nor trains): fastbert
    read the plain one (0.29 from sentence-transformers' vectors; MPNet's, RoBERTa's names)."""
    from tests.sentence_folders import save_with_tokenizer, tokenizer

    untied = {"tie_word_embeddings": False}
    if family == "bert":
        base = hf_folder(tmp_path / "bert", "BertForMaskedLM", seed=4, **untied)
    else:
        from tests.test_mpnet import hf_mpnet

        tok = tokenizer()
        model = hf_mpnet("ForMaskedLM", 4, vocab_size=tok.vocab_size, **untied)
        base = save_with_tokenizer(model, tmp_path / "mpnet")
    modules = [transformer(base, transformer_task="fill-mask"), SpladePooling("max")]
    folder = save_modules(tmp_path / "sparse", modules, kind="SparseEncoder")
    want = st.SparseEncoder(str(folder), device="cpu").encode(TEXTS).to_dense().numpy()
    got = fastbert.load(folder, device="cpu").embed(TEXTS).to_dense()
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=1e-5)


def test_max_active_dims_keeps_the_values_largest_in_magnitude():
    """A module after the SPLADE pooling may give negative values: the values kept are the
    largest in magnitude, as sentence-transformers' select_max_active_dims keeps them."""
    from sentence_transformers.util.tensor import select_max_active_dims

    from fastbert.embedding.sparse import SparseVectors

    dense = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    got = SparseVectors.from_dense(dense, max_active_dims=5)
    want = select_max_active_dims(dense, 5)
    for row in range(dense.shape[0]):
        kept = torch.nonzero(want[row]).flatten()
        start, end = got.indptr[row], got.indptr[row + 1]
        np.testing.assert_array_equal(got.indices[start:end], kept.numpy())
        np.testing.assert_array_equal(got.values[start:end], want[row, kept].numpy())


def test_old_format_sparse_folder(mlm, tmp_path):
    modules = [transformer(mlm, transformer_task="fill-mask"), SpladePooling("max")]
    folder = save_modules(tmp_path / "sparse", modules, kind="SparseEncoder")
    want = st.SparseEncoder(str(folder), device="cpu").encode(TEXTS).to_dense().numpy()
    entries = json.loads((folder / "modules.json").read_text())
    entries[0]["type"] = "sentence_transformers.sparse_encoder.models.MLMTransformer"
    entries[1]["type"] = "sentence_transformers.sparse_encoder.models.SpladePooling"
    write_json(folder / "modules.json", entries)
    settings = json.loads((folder / "sentence_bert_config.json").read_text())
    write_json(
        folder / "sentence_bert_config.json", {"max_seq_length": settings.get("max_seq_length", 48)}
    )
    got = fastbert.load(folder, device="cpu").embed(TEXTS).to_dense()
    np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=1e-5)


def test_a_cross_encoder_folder_with_modules_scores_pairs(tmp_path):
    folder = hf_folder(tmp_path / "ce-base", "BertForSequenceClassification", seed=2)
    cross = st.CrossEncoder(str(folder), device="cpu")
    cross.save(str(tmp_path / "ce"))
    assert (tmp_path / "ce" / "modules.json").exists()
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[3], TEXTS[2])]
    want = st.CrossEncoder(str(tmp_path / "ce"), device="cpu").predict(
        pairs, activation_fn=torch.nn.Identity()
    )
    loaded = fastbert.load(tmp_path / "ce", device="cpu")
    assert loaded.kind == "classification"
    got = loaded.classify([a for a, _ in pairs], [b for _, b in pairs])[:, 0]
    np.testing.assert_allclose(got, want, atol=TOLERANCE)


def test_a_cross_encoder_whose_tokenizer_makes_no_token_types_scores_as_one_type(tmp_path):
    """A BERT classifier whose tokenizer makes no token types (model_input_names without
    them, as DistilBERT's): sentence-transformers and Hugging Face run both texts of a pair
    as type 0; fastbert made the second type 1 (scores 0.005 off)."""
    folder = hf_folder(tmp_path / "ce", "BertForSequenceClassification", seed=2)
    settings = json.loads((folder / "tokenizer_config.json").read_text())
    settings["model_input_names"] = ["input_ids", "attention_mask"]
    write_json(folder / "tokenizer_config.json", settings)
    pairs = [(TEXTS[0], TEXTS[1]), (TEXTS[3], TEXTS[2])]
    want = st.CrossEncoder(str(folder), device="cpu").predict(pairs)
    loaded = fastbert.load(folder, device="cpu")
    got = loaded.scores(loaded.classify([a for a, _ in pairs], [b for _, b in pairs]))[:, 0]
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    # The server's pairs (a text alone among them) run as type 0 too.
    from fastbert.serve.inputs import tokenize_pairs

    ids, types = tokenize_pairs(loaded, [TEXTS[0], TEXTS[3]], [TEXTS[1], None], True, None, "x")
    assert types == [[0] * len(row) for row in ids]


def test_a_cross_encoder_whose_scores_feed_more_modules_is_refused(tmp_path):
    """A Dense on the classifier's scores (sentence-transformers 6 runs it: CrossEncoder's
    num_labels is the Dense's width): fastbert returned the Transformer's logits without it
    (three labels where predict gives two; with one label and a Tanh, another ranking)."""
    hf = hf_folder(tmp_path / "ce-base", "BertForSequenceClassification", seed=2)
    modules = [
        transformer(hf, transformer_task="sequence-classification"),
        Dense(1, 1, activation_function=torch.nn.Tanh(), module_input_name="scores"),
    ]
    folder = save_modules(tmp_path / "ce", modules, kind="CrossEncoder")
    assert st.CrossEncoder(str(folder), device="cpu").predict([TEXTS[:2]]).shape == (1,)
    with pytest.raises(ValueError, match=r"sequence-classification Transformer is followed by "):
        fastbert.load(folder, device="cpu")


def test_a_transformer_reading_another_output_is_refused(base, tmp_path):
    """modality_config reading the first layer's hidden states (sentence-transformers indexes
    the output with it): fastbert pooled the last layer's (cosine 0.77 from encode); so does a
    module_output_name other than the features the next module reads."""
    folder = save_modules(tmp_path / "first-layer", [transformer(base), Pooling(HIDDEN)])
    path = folder / "sentence_bert_config.json"
    settings = json.loads(path.read_text())
    assert settings["modality_config"]["text"]["method_output_name"] == "last_hidden_state"
    first = {"text": {"method": "forward", "method_output_name": ["hidden_states", 1]}}
    write_json(path, {**settings, "modality_config": first})
    with pytest.raises(ValueError, match=r"modality_config .*'hidden_states', 1\]"):
        fastbert.load(folder, device="cpu")
    write_json(path, {**settings, "module_output_name": "sentence_embedding"})
    with pytest.raises(ValueError, match="module_output_name 'sentence_embedding'"):
        fastbert.load(folder, device="cpu")


def test_tokenizer_args_replace_processor_kwargs_as_in_sentence_transformers(base, tmp_path):
    """Both names of the tokenizer's arguments in one folder: sentence-transformers renames the
    older over the newer, so tokenizer_args' model_max_length (12) cuts the texts, not
    processor_kwargs' (40; cosine 0.971 on longer texts)."""
    folder = save_modules(tmp_path / "both", [transformer(base), Pooling(HIDDEN)])
    path = folder / "sentence_bert_config.json"
    settings = json.loads(path.read_text())
    settings.pop("max_seq_length", None)
    both = {"tokenizer_args": 12, "processor_kwargs": 40}
    write_json(path, settings | {k: {"model_max_length": n} for k, n in both.items()})
    texts = [" ".join(["word"] * 30), TEXTS[1]]
    model = st.SentenceTransformer(str(folder), device="cpu")
    assert model.max_seq_length == 12
    np.testing.assert_allclose(
        fastbert.load(folder, device="cpu").embed(texts), model.encode(texts), atol=TOLERANCE
    )


def test_multi_vector_folder_gives_token_vectors(base, tmp_path):
    import string

    model = st.MultiVectorEncoder(str(base), device="cpu")
    model.save(str(tmp_path / "mv"))
    mask_config = tmp_path / "mv" / "2_MultiVectorMask" / "config.json"
    config = json.loads(mask_config.read_text())
    write_json(mask_config, {**config, "skiplist_words": list(string.punctuation)})
    settings_path = tmp_path / "mv" / "sentence_bert_config.json"
    settings = json.loads(settings_path.read_text())
    write_json(settings_path, {**settings, "query_length": 9, "document_length": 12})
    model = st.MultiVectorEncoder(str(tmp_path / "mv"), device="cpu")
    loaded = fastbert.load(tmp_path / "mv", device="cpu")
    assert loaded.kind == "multi-vector"
    queries = fastbert.load(tmp_path / "mv", device="cpu", prompt_name="query")
    documents = fastbert.load(tmp_path / "mv", device="cpu", prompt_name="document")
    for got, want in (
        (loaded.embed(TEXTS), model.encode(TEXTS)),
        (loaded.embed(TEXTS, prompt_name="document"), model.encode_document(TEXTS)),
        (loaded.embed(TEXTS, prompt_name="query"), model.encode_query(TEXTS)),
        # the task of the prompt the model loaded with: its lengths and skiplist
        (queries.embed(TEXTS), model.encode_query(TEXTS)),
        (documents.embed(TEXTS), model.encode_document(TEXTS)),
        (
            fastbert.embed(TEXTS, tmp_path / "mv", device="cpu", prompt_name="query"),
            model.encode_query(TEXTS),
        ),
    ):
        assert [g.shape for g in got] == [tuple(w.shape) for w in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, np.asarray(w), atol=TOLERANCE)
    import pyarrow.parquet as pq  # the corpus job with the query task

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out-query"
    fastbert.embed(corpus, model=tmp_path / "mv", output=out, device="cpu", prompt_name="query")
    got = pq.read_table(out / "part-00000.parquet").column("vectors").to_pylist()
    want = model.encode_query(TEXTS)
    assert [len(g) for g in got] == [len(w) for w in want]
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.array(g), np.asarray(w), atol=TOLERANCE)
    # The task is the job's: the document run is another job (it was found complete).
    with pytest.raises(OutputError, match="task: 'query' there, 'document' now"):
        fastbert.embed(corpus, model=tmp_path / "mv", output=out, prompt_name="document")


def test_a_multi_vector_folders_truncate_dim_cuts_and_normalises_each_token(base, tmp_path):
    """truncate_dim in a multi-vector folder's settings: each token's vector cut to that width
    and L2-normalised, as MultiVectorEncoder gives them (it was ignored: full-width vectors)."""
    from sentence_transformers.multi_vector_encoder.modules import MultiVectorMask

    folder = save_modules(
        tmp_path / "mv",
        [transformer(base), MultiVectorMask()],
        kind="MultiVectorEncoder",
        truncate_dim=8,
    )
    model = st.MultiVectorEncoder(str(folder), device="cpu")
    loaded = fastbert.load(folder, device="cpu")
    assert loaded.dimensions == 8
    for got, want in (
        (loaded.embed(TEXTS), model.encode(TEXTS)),
        (loaded.embed(TEXTS, prompt_name="query"), model.encode_query(TEXTS)),
        # token ids in, as the server runs the model
        (loaded.embed_tokens(loaded.tokenize(TEXTS[:2]).ids), model.encode(TEXTS[:2])),
    ):
        for g, w in zip(got, want):
            assert g.shape[1] == 8
            np.testing.assert_allclose(g, np.asarray(w), atol=TOLERANCE)


def test_corpus_job_writes_what_the_kind_gives(mlm, base, tmp_path):
    import pyarrow.parquet as pq

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(TEXTS) + "\n")
    sparse = save_modules(
        tmp_path / "sparse",
        [transformer(mlm, transformer_task="fill-mask"), SpladePooling("max")],
        kind="SparseEncoder",
    )
    out = tmp_path / "out"
    summary = fastbert.embed(corpus, model=sparse, output=out, device="cpu", max_active_dims=40)
    assert summary.manifest["kind"] == "sparse" and summary.manifest["pooling"] is None
    assert summary.manifest["max_active_dims"] == 40
    table = pq.read_table(out / "part-00000.parquet")
    encoder = st.SparseEncoder(str(sparse), device="cpu")
    want = encoder.encode(TEXTS, max_active_dims=40).to_dense().numpy()
    for row, (indices, values) in enumerate(
        zip(table.column("indices").to_pylist(), table.column("values").to_pylist())
    ):
        assert len(indices) == 40
        np.testing.assert_array_equal(indices, np.flatnonzero(want[row]))
        np.testing.assert_allclose(values, want[row][indices], atol=TOLERANCE, rtol=1e-5)

    multi = tmp_path / "mv"
    st.MultiVectorEncoder(str(base), device="cpu").save(str(multi))
    summary = fastbert.embed(corpus, model=multi, output=tmp_path / "out-mv", device="cpu")
    assert summary.manifest["kind"] == "multi-vector"
    table = pq.read_table(tmp_path / "out-mv" / "part-00000.parquet")
    want = st.MultiVectorEncoder(str(multi), device="cpu").encode(TEXTS)
    assert table.column("num_vectors").to_pylist() == [len(w) for w in want]
    for got, expected in zip(table.column("vectors").to_pylist(), want):
        np.testing.assert_allclose(np.array(got), np.asarray(expected), atol=TOLERANCE)

    dense = save_modules(
        tmp_path / "dense",
        [transformer(base), Pooling(HIDDEN, "cls"), Dense(HIDDEN, 32), Normalize()],
        prompts={"query": "query: "},
    )
    out = tmp_path / "out-dense"
    summary = fastbert.embed(corpus, model=dense, output=out, device="cpu", prompt_name="query")
    assert summary.manifest["kind"] == "embedding" and summary.manifest["dimensions"] == 32
    assert summary.manifest["prompt"] == "query: "
    vectors = np.stack(pq.read_table(out / "part-00000.parquet").column("embedding").to_pylist())
    want = st_encode(dense, prompt_name="query")
    np.testing.assert_allclose(vectors, want, atol=TOLERANCE)


def test_folders_run_the_packed_path_unless_a_module_needs_the_padded_batch(
    base, tmp_path, monkeypatch
):
    """A folder of fastbert's own modules runs packed (forward_packed, never the padded
    forward), and gives what its padded route gives; a folder with a module that runs
    through sentence-transformers (which takes the padded batch) runs padded."""
    import dataclasses

    from fastbert.model.encoder import BertModel

    native = save_modules(
        tmp_path / "native", [transformer(base), Pooling(HIDDEN, "weightedmean"), Normalize()]
    )
    loaded = fastbert.load(native, device="cpu")
    entries = []
    for name in ("forward", "forward_packed"):
        original = getattr(BertModel, name)

        def spy(self, *args, _name=name, _original=original, **kwargs):
            entries.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(BertModel, name, spy)
    # The packed path reads no mask back and packs nothing again: the padded entry's host
    # read of the row lengths and its packing are never called.
    from fastbert.execution import runtime, validation

    def never(*args, **kwargs):
        raise AssertionError("the packed path read or packed a padded batch")

    with monkeypatch.context() as patched:
        patched.setattr(validation, "read_batch", never)
        patched.setattr(runtime, "pack", never)
        packed = loaded.embed(TEXTS)
    assert loaded.encoder.packed and set(entries) == {"forward_packed"}
    entries.clear()
    padded_encoder = dataclasses.replace(loaded.encoder, packed=False)
    padded = padded_encoder(loaded.tokenize(TEXTS).ids)
    assert set(entries) == {"forward"}
    np.testing.assert_allclose(packed, padded, atol=1e-6)

    from sentence_transformers.sentence_transformer.modules import LayerNorm

    foreign = save_modules(
        tmp_path / "foreign", [transformer(base), Pooling(HIDDEN, "mean"), LayerNorm(HIDDEN)]
    )
    assert not fastbert.load(foreign, device="cpu").encoder.packed
