"""fastbert serve for every model kind, as a real process called with plain httpx: a dense
model's /embed with prompt_name and Cohere's /v2/embed (input_type mapped to the folder's
prompts, every embedding type, output_dimension), a sparse model's /embed_sparse and a
multi-vector model's /embed_all, each compared with sentence-transformers on the same texts
(SentenceTransformer.encode with the prompt, quantize_embeddings with the server's ranges,
SparseEncoder.encode, MultiVectorEncoder.encode / encode_query / encode_document); the routes a
kind does not serve (424), /info's settings and the request errors of the new routes. One
server per kind, on tiny random folders (tests/sentence_folders.py)."""

from __future__ import annotations

import contextlib
import json
import string
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
st = pytest.importorskip("sentence_transformers")

from sentence_transformers.base.modules import Normalize  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling  # noqa: E402
from sentence_transformers.sparse_encoder.modules import SpladePooling  # noqa: E402
from sentence_transformers.util.quantization import quantize_embeddings  # noqa: E402

from tests.sentence_folders import (  # noqa: E402
    HIDDEN,
    hf_folder,
    inference_free_folder,
    save_modules,
    transformer,
    write_json,
)
from tests.serve_process import serving  # noqa: E402
from tests.test_embed import corpus  # noqa: E402

TOLERANCE = 2e-5  # float32 against float32, through JSON: the same math in other orders
TEXTS = corpus(12, offset=700, max_words=30)
PROMPTS = {"query": "query: ", "passage": "passage: ", "classification": "classify this: "}
CALIBRATION = corpus(150, offset=900, max_words=30)


@contextlib.contextmanager
def served_client(folder, tmp_path, *arguments: str):
    """An httpx client of a running ``fastbert serve`` of ``folder``."""
    with serving(folder, *arguments, tmp_path=tmp_path) as server:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            yield client


def served_fixture(folder_fixture: str):
    """A module-scoped fixture: an httpx client of a running ``fastbert serve`` of the folder
    that the fixture named ``folder_fixture`` makes."""

    @pytest.fixture(scope="module")
    def served(request, tmp_path_factory):
        folder = request.getfixturevalue(folder_fixture)
        with served_client(folder, tmp_path_factory.mktemp(f"{folder_fixture}-serve")) as client:
            yield client

    return served


def texts_body(prompt_name: str | None) -> dict:
    """A request body of TEXTS, naming ``prompt_name`` when it is one (None: no prompt_name)."""
    return {"inputs": TEXTS} | ({"prompt_name": prompt_name} if prompt_name else {})


def post(client, route: str, body: dict) -> httpx.Response:
    return client.post(route, json=body)


def ok(response: httpx.Response):
    assert response.status_code == 200, response.text
    return response.json()


def assert_error(response: httpx.Response, status: int, *words: str) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    message = body["error"]["message"] if isinstance(body["error"], dict) else body["error"]
    for word in words:
        assert word in message, message
    return body


# -- a dense model with prompts ---------------------------------------------------------------


@pytest.fixture(scope="module")
def dense_folder(tmp_path_factory):
    """Mean pooling without the prompt's tokens (so that a prompt's length matters), normalised,
    with named prompts ("query" the default) and a model card naming Matryoshka training."""
    base = hf_folder(tmp_path_factory.mktemp("base") / "bert", seed=6)
    modules = [transformer(base), Pooling(HIDDEN, "mean", include_prompt=False), Normalize()]
    folder = save_modules(
        tmp_path_factory.mktemp("dense") / "st",
        modules,
        prompts=PROMPTS,
        default_prompt_name="query",
    )
    (folder / "README.md").write_text("Trained with MatryoshkaLoss.\n")
    return folder


@pytest.fixture(scope="module")
def dense(dense_folder, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dense-serve")
    calibration = tmp / "calibration.txt"
    calibration.write_text("".join(t + "\n" for t in CALIBRATION))
    arguments = ("--calibration", str(calibration), "--served-model-name", "org/tiny")
    arguments += ("--openai-token-ids",)  # /v1/embeddings reads token ids as the model's
    with served_client(dense_folder, tmp, *arguments) as client:
        yield client


@pytest.fixture(scope="module")
def st_dense(dense_folder):
    return st.SentenceTransformer(str(dense_folder), device="cpu")


def test_embed_prompt_name_as_sentence_transformers(dense, st_dense):
    for prompt_name in (None, "query", "passage"):
        got = np.array(ok(post(dense, "/embed", texts_body(prompt_name))))
        want = st_dense.encode(TEXTS, prompt_name=prompt_name, convert_to_numpy=True)
        np.testing.assert_allclose(got, want, atol=TOLERANCE)
    # The default prompt ("query") applies when none is named: without it the vectors differ.
    plain = st_dense.encode(TEXTS, prompt="", convert_to_numpy=True)
    assert np.abs(np.array(ok(post(dense, "/embed", {"inputs": TEXTS}))) - plain).max() > 1e-3
    answer = assert_error(
        post(dense, "/embed", {"inputs": "x", "prompt_name": "nope"}), 422, "'nope'", "query"
    )
    assert answer["error_type"] == "validation"


def test_token_ids_carry_no_prompt_to_leave_out(dense, st_dense):
    """Token-id inputs are run as given: none of their tokens is taken for a prompt (this
    model's pooling leaves a prompt's tokens out), on /embed and /v1/embeddings; texts and
    ids in one request are refused, since one batch runs with one prompt length."""
    ids = st_dense.tokenizer(TEXTS[:2])["input_ids"]
    want = st_dense.encode(TEXTS[:2], prompt="", convert_to_numpy=True)
    got = np.array(ok(post(dense, "/embed", {"inputs": ids})))
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    short = np.array(ok(post(dense, "/embed", {"inputs": ids[0][:2]})))  # [CLS] and one more
    assert np.abs(short).max() > 0
    openai = ok(post(dense, "/v1/embeddings", {"input": ids, "model": "org/tiny"}))
    got = np.array([row["embedding"] for row in openai["data"]])
    np.testing.assert_allclose(got, want, atol=TOLERANCE)
    mixed = post(dense, "/embed", {"inputs": [TEXTS[0], ids[0]]})
    assert assert_error(mixed, 422, "mixes texts and token ids")["error_type"] == "validation"


def test_tokenize_gives_the_tokens_embed_runs(dense, st_dense):
    """/tokenize after the prompt prompt_name names, the default prompt without one (as TEI):
    the tokens /embed runs and bills."""
    for name, prompt in ((None, PROMPTS["query"]), ("passage", PROMPTS["passage"])):
        body = {"inputs": TEXTS[:2]} | ({"prompt_name": name} if name else {})
        details = ok(post(dense, "/tokenize", body))
        want = st_dense.tokenizer([prompt + t for t in TEXTS[:2]])["input_ids"]
        assert [[token["id"] for token in row] for row in details] == want
        first = details[0][1]  # the prompt's first token, its offsets into the prompted input
        assert (first["start"], first["special"]) == (0, False)
        billed = post(dense, "/embed", {"inputs": TEXTS[:2]} | body)
        assert int(billed.headers["x-compute-tokens"]) == sum(len(row) for row in want)
    assert_error(post(dense, "/tokenize", {"inputs": "x", "prompt_name": "nope"}), 422, "nope")


def test_requests_with_other_prompts_share_no_batch(dense, st_dense):
    """Requests with different prompts at once: each answer is its own prompt's (a batch
    holds one prompt's inputs: a prompt's length changes the pooling)."""
    names = ["query", "passage", "classification"]
    want = {n: st_dense.encode(TEXTS, prompt_name=n, convert_to_numpy=True) for n in names}

    def call(i: int) -> tuple[int, str, np.ndarray]:
        name, row = names[i % 3], i % len(TEXTS)
        body = {"inputs": [TEXTS[row]], "prompt_name": name}
        return row, name, np.array(ok(post(dense, "/embed", body)))[0]

    with ThreadPoolExecutor(6) as pool:
        for row, name, got in pool.map(call, range(36)):
            np.testing.assert_allclose(got, want[name][row], atol=TOLERANCE)


def cohere(client, **body) -> dict:
    return ok(post(client, "/v2/embed", {"texts": TEXTS, **body}))


@pytest.mark.parametrize(
    ("input_type", "encode", "prompt"),
    [
        ("search_query", "encode_query", None),  # falls back to "query"
        # "document" first, as encode_document: sentence-transformers 6 saves an empty one
        # beside the folder's own ("passage"), so no prompt here
        ("search_document", "encode_document", None),
        ("classification", "encode", "classify this: "),  # the prompt of that very name
        ("clustering", "encode", ""),  # no prompt of that name: none
        (None, "encode", None),  # no input_type: the default prompt
    ],
)
def test_cohere_input_type_picks_the_prompt(dense, st_dense, input_type, encode, prompt):
    body = {} if input_type is None else {"input_type": input_type}
    answer = cohere(dense, **body)
    assert answer["texts"] == TEXTS and answer["response_type"] == "embeddings_by_type"
    assert answer["meta"]["billed_units"]["input_tokens"] > len(TEXTS)
    extra = {} if prompt is None else {"prompt": prompt}
    want = getattr(st_dense, encode)(TEXTS, convert_to_numpy=True, **extra)
    np.testing.assert_allclose(np.array(answer["embeddings"]["float"]), want, atol=TOLERANCE)


def test_search_document_on_a_folder_without_a_document_prompt(dense_folder, tmp_path):
    """A folder written before sentence-transformers 6 (a "passage" prompt, no "document"):
    sentence-transformers adds an empty "document" prompt when it loads it, so
    encode_document takes that (no prompt), not "passage"; /v2/embed's search_document too."""
    import shutil

    older = tmp_path / "older"
    shutil.copytree(dense_folder, older)
    config_path = older / "config_sentence_transformers.json"
    config = json.loads(config_path.read_text())
    config["prompts"].pop("document")
    config_path.write_text(json.dumps(config))
    model = st.SentenceTransformer(str(older), device="cpu")
    want = model.encode_document(TEXTS, convert_to_numpy=True)
    assert not np.allclose(want, model.encode(TEXTS, prompt_name="passage"), atol=1e-3)
    with served_client(older, tmp_path) as client:
        answer = cohere(client, input_type="search_document")
    np.testing.assert_allclose(np.array(answer["embeddings"]["float"]), want, atol=TOLERANCE)


def test_info_reports_the_kind_and_the_calibrated_ranges(dense, st_dense):
    info = ok(dense.get("/info"))
    settings = info["model_type"]["embedding"]
    assert info["model_kind"] == "embedding"
    assert info["routes"] == ["/embed", "/v1/embeddings", "/v2/embed", "/similarity"]
    # sentence-transformers 6 saves an empty "document" prompt beside the folder's own
    assert settings["prompts"] == {**PROMPTS, "document": ""}
    assert settings["default_prompt_name"] == "query"
    assert settings["matryoshka"] is True and settings["dimensions"] == HIDDEN
    calibration = settings["quantization"]["int8_uint8_calibration"]
    assert calibration["texts"] == len(CALIBRATION) and calibration["source"].endswith(".txt")
    # The calibration texts' embeddings, with the default prompt: their min and max.
    sample = st_dense.encode(CALIBRATION, convert_to_numpy=True)
    np.testing.assert_allclose(calibration["ranges"], [sample.min(0), sample.max(0)], atol=1e-6)
    models = ok(dense.get("/v1/models"))["data"]
    assert [(m["id"], m["object"], m["kind"]) for m in models] == [
        ("org/tiny", "model", "embedding")
    ]
    assert ok(dense.get("/v1/models/org/tiny"))["id"] == "org/tiny"  # a Hugging Face id's slash
    assert_error(dense.get("/v1/models/org/other"), 404, "'org/other'")


def near_buckets(got: np.ndarray, want: np.ndarray) -> None:
    """int8 / uint8 buckets of the server against sentence-transformers' of its own floats:
    floats equal to their last bits land in the same bucket but on a bucket's edge."""
    difference = np.abs(got.astype(int) - want.astype(int))
    assert difference.max() <= 1 and (difference == 0).mean() > 0.98


def near_bits(got: np.ndarray, want: np.ndarray, floats: np.ndarray) -> None:
    """Packed bits: they differ only where a float is (all but) zero."""
    flipped = np.unpackbits(got.view(np.uint8), axis=1) != np.unpackbits(
        want.view(np.uint8), axis=1
    )
    assert np.abs(floats[flipped[:, : floats.shape[1]]]).max(initial=0) < 1e-5


@pytest.mark.parametrize("dimensions", [None, 24])
def test_cohere_embedding_types_as_quantize_embeddings(dense, st_dense, dimensions):
    types = ["float", "int8", "uint8", "binary", "ubinary"]
    extra = {} if dimensions is None else {"output_dimension": dimensions}
    answer = cohere(dense, input_type="search_query", embedding_types=types, **extra)
    embeddings = answer["embeddings"]
    assert list(embeddings) == types
    floats = st_dense.encode_query(TEXTS, convert_to_numpy=True)
    sample = st_dense.encode(CALIBRATION, convert_to_numpy=True)
    if dimensions is not None:  # cut, then normalised again
        floats = floats[:, :dimensions] / np.linalg.norm(floats[:, :dimensions], axis=1)[:, None]
        sample = sample[:, :dimensions] / np.linalg.norm(sample[:, :dimensions], axis=1)[:, None]
    ranges = np.vstack([sample.min(0), sample.max(0)])
    np.testing.assert_allclose(np.array(embeddings["float"]), floats, atol=TOLERANCE)
    for kind in types[1:]:
        got = np.array(embeddings[kind], dtype=np.int8 if kind in ("int8", "binary") else np.uint8)
        want = quantize_embeddings(floats, kind, ranges=ranges)
        assert got.shape == want.shape == (len(TEXTS), want.shape[1])
        if kind.endswith("binary"):
            assert want.shape[1] == ((dimensions or HIDDEN) + 7) // 8
            near_bits(got, want, floats)
        else:
            near_buckets(got, want)
    # The server's own floats give its buckets exactly, with the ranges GET /info reports.
    if dimensions is None:
        served = np.array(embeddings["float"], dtype=np.float32)
        info = ok(dense.get("/info"))["model_type"]["embedding"]["quantization"]
        own_ranges = np.array(info["int8_uint8_calibration"]["ranges"], dtype=np.float32)
        own = quantize_embeddings(served, "uint8", ranges=own_ranges)
        near_buckets(np.array(embeddings["uint8"], dtype=np.uint8), own)


def test_matryoshka_cuts_are_allowed_on_a_matryoshka_model(dense, st_dense):
    got = np.array(ok(post(dense, "/embed", {"inputs": TEXTS, "dimensions": 16})))
    want = st_dense.encode(TEXTS, truncate_dim=16, convert_to_numpy=True)
    want /= np.linalg.norm(want, axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, atol=TOLERANCE)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"texts": []}, 400, ("texts is empty",)),
        ({"texts": ["x"], "embedding_types": ["int4"]}, 422, ("embedding_types",)),
        ({"texts": ["x"], "input_type": "search"}, 422, ("input_type",)),
        ({"texts": ["x"], "truncate": "MIDDLE"}, 422, ("truncate",)),
        ({"texts": ["word " * 600], "truncate": "NONE"}, 422, ("truncate",)),
        ({"texts": ["x"], "output_dimension": 65}, 422, ("output_dimension 65",)),
        ({"texts": ["x"], "model": "other"}, 404, ("'other'", "'org/tiny'")),
    ],
)
def test_cohere_errors(dense, body, status, words):
    answer = assert_error(post(dense, "/v2/embed", body), status, *words)
    assert set(answer["error"]) == {"message", "type", "param", "code"}
    if status == 404:
        assert answer["error"]["code"] == "model_not_found"
    ok(post(dense, "/v2/embed", {"texts": ["still serving"]}))


def test_cohere_truncate_start_and_end(dense, st_dense):
    long = " ".join(CALIBRATION)  # past the folder's 48 tokens
    end = cohere(dense, texts=[long], truncate="END")["embeddings"]["float"]
    start = cohere(dense, texts=[long], truncate="START")["embeddings"]["float"]
    want = st_dense.encode([long], convert_to_numpy=True)
    np.testing.assert_allclose(end, want, atol=TOLERANCE)
    assert np.abs(np.array(start) - want).max() > 1e-3


# -- a sparse model ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sparse_folder(tmp_path_factory):
    mlm = hf_folder(tmp_path_factory.mktemp("mlm") / "bert", "BertForMaskedLM", seed=7)
    modules = [transformer(mlm, transformer_task="fill-mask"), SpladePooling("max")]
    return save_modules(
        tmp_path_factory.mktemp("sparse") / "st",
        modules,
        kind="SparseEncoder",
        prompts={"query": "query: "},
    )


sparse = served_fixture("sparse_folder")


def test_embed_sparse_as_sparse_encoder(sparse, sparse_folder):
    encoder = st.SparseEncoder(str(sparse_folder), device="cpu")
    for prompt_name in (None, "query"):
        rows = ok(post(sparse, "/embed_sparse", texts_body(prompt_name)))
        want = encoder.encode(TEXTS, prompt_name=prompt_name).to_dense().numpy()
        assert len(rows) == len(TEXTS)
        for row, expected in zip(rows, want):
            indices = [entry["index"] for entry in row]
            assert set(row[0]) == {"index", "value"} and indices == sorted(indices)
            np.testing.assert_array_equal(indices, np.flatnonzero(expected))
            values = [entry["value"] for entry in row]
            np.testing.assert_allclose(values, expected[indices], atol=TOLERANCE, rtol=1e-5)
    one = ok(post(sparse, "/embed_sparse", {"inputs": TEXTS[0]}))
    assert len(one) == 1
    assert ok(post(sparse, "/", {"inputs": TEXTS[0]})) == one  # TEI's / on a SPLADE model


@pytest.fixture(scope="module")
def inference_free(tmp_path_factory):
    mlm = hf_folder(tmp_path_factory.mktemp("mlm") / "bert", "BertForMaskedLM", seed=8)
    folder = tmp_path_factory.mktemp("inference-free") / "st"
    return inference_free_folder(folder, mlm, max_active_dims=12)


served_inference_free = served_fixture("inference_free")


def test_embed_sparse_routes_queries_and_keeps_the_folders_active_dims(
    served_inference_free, inference_free
):
    """An inference-free SPLADE model: prompt_name "query" takes the SparseStaticEmbedding
    route, "document" and none the masked-LM's, and every vector keeps the folder's
    max_active_dims largest values, as SparseEncoder.encode_query / encode_document / encode
    give them."""
    encoder = st.SparseEncoder(str(inference_free), device="cpu")
    encodings = {
        "query": encoder.encode_query,
        "document": encoder.encode_document,
        None: encoder.encode,
    }
    for prompt_name, encode in encodings.items():
        rows = ok(post(served_inference_free, "/embed_sparse", texts_body(prompt_name)))
        want = encode(TEXTS).to_dense().numpy()
        for row, expected in zip(rows, want):
            indices = [entry["index"] for entry in row]
            assert len(indices) <= 12
            np.testing.assert_array_equal(indices, np.flatnonzero(expected))
            values = [entry["value"] for entry in row]
            np.testing.assert_allclose(values, expected[indices], atol=TOLERANCE, rtol=1e-5)


def test_tokenize_gives_an_inference_free_models_query_tokens(served_inference_free):
    """/tokenize with prompt_name "query": the tokens the query route runs (no special
    tokens); without it, the document route's."""
    query = ok(
        post(served_inference_free, "/tokenize", {"inputs": TEXTS[0], "prompt_name": "query"})
    )
    document = ok(post(served_inference_free, "/tokenize", {"inputs": TEXTS[0]}))
    assert [t["id"] for t in query[0]] == [t["id"] for t in document[0]][1:-1]
    assert not any(t["special"] for t in query[0])


def test_sparse_model_routes_info_and_errors(sparse):
    for route, body in [("/embed", {"inputs": "x"}), ("/embed_all", {"inputs": "x"})]:
        assert_error(post(sparse, route, body), 424, "is a sparse model", route)
    assert_error(post(sparse, "/v2/embed", {"texts": ["x"]}), 424, "/v2/embed needs")
    assert_error(post(sparse, "/embed_sparse", {"inputs": []}), 400, "empty")
    assert_error(post(sparse, "/embed_sparse", {"inputs": "x", "prompt_name": "doc"}), 422)
    info = ok(sparse.get("/info"))
    assert info["model_kind"] == "sparse" and info["routes"] == ["/embed_sparse"]
    assert info["model_type"]["sparse"]["dimensions"] == 30522
    assert info["model_type"]["sparse"]["prompts"] == {"query": "query: ", "document": ""}
    assert ok(sparse.get("/v1/models"))["data"][0]["kind"] == "sparse"


# -- a multi-vector model ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def multi_folder(tmp_path_factory):
    """A ColBERT-style folder with a punctuation skiplist and query / document lengths of its
    own (as tests/test_model_folders.py makes one)."""
    base = hf_folder(tmp_path_factory.mktemp("mv-base") / "bert", seed=8)
    folder = tmp_path_factory.mktemp("mv") / "st"
    st.MultiVectorEncoder(str(base), device="cpu").save(str(folder))
    mask_config = folder / "2_MultiVectorMask" / "config.json"
    config = json.loads(mask_config.read_text())
    write_json(mask_config, {**config, "skiplist_words": list(string.punctuation)})
    settings_path = folder / "sentence_bert_config.json"
    settings = json.loads(settings_path.read_text())
    write_json(settings_path, {**settings, "query_length": 9, "document_length": 12})
    return folder


multi = served_fixture("multi_folder")


def test_embed_all_as_multi_vector_encoder(multi, multi_folder):
    encoder = st.MultiVectorEncoder(str(multi_folder), device="cpu")
    cases = [
        (None, encoder.encode(TEXTS)),
        ("query", encoder.encode_query(TEXTS)),
        ("document", encoder.encode_document(TEXTS)),
    ]
    for prompt_name, want in cases:
        got = ok(post(multi, "/embed_all", texts_body(prompt_name)))
        assert [np.shape(g) for g in got] == [tuple(w.shape) for w in want]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, np.asarray(w), atol=TOLERANCE)


def test_multi_vector_model_routes_info_and_errors(multi):
    assert_error(post(multi, "/embed", {"inputs": "x"}), 424, "multi-vector model", "/embed")
    assert_error(post(multi, "/embed_sparse", {"inputs": "x"}), 424, "multi-vector model")
    assert_error(post(multi, "/embed_all", {"inputs": "x", "prompt_name": "nope"}), 422, "nope")
    long = " ".join(CALIBRATION)
    refused = post(multi, "/embed_all", {"inputs": long, "truncate": False, "prompt_name": "query"})
    assert_error(refused, 422, "limit of 9")
    info = ok(multi.get("/info"))
    settings = info["model_type"]["multi-vector"]
    assert info["routes"] == ["/embed_all"]
    assert settings["query_length"] == 9 and settings["document_length"] == 12
    assert set(settings["prompts"]) == {"query", "document"}


def test_a_folders_truncate_dim_is_the_width_served(tmp_path):
    """A folder cut by truncate_dim after its Normalize: /embed (normalising, as TEI does)
    and /v1/embeddings give the cut, renormalised; /info says the width served."""
    base = hf_folder(tmp_path / "bert", seed=8)
    modules = [transformer(base), Pooling(HIDDEN, "mean"), Normalize()]
    folder = save_modules(tmp_path / "st", modules, truncate_dim=24)
    want = st.SentenceTransformer(str(folder), device="cpu").encode(TEXTS[:3])
    want = want / np.linalg.norm(want, axis=1, keepdims=True)
    with served_client(folder, tmp_path, "--accept-any-model-name") as client:
        got = np.array(ok(post(client, "/embed", {"inputs": TEXTS[:3]})))
        np.testing.assert_allclose(got, want, atol=TOLERANCE)
        openai = ok(post(client, "/v1/embeddings", {"input": TEXTS[:3], "model": "st"}))
        got = np.array([row["embedding"] for row in openai["data"]])
        np.testing.assert_allclose(got, want, atol=TOLERANCE)
        assert client.get("/info").json()["model_type"]["embedding"]["dimensions"] == 24


def test_rerank_scores_with_the_folders_activation(tmp_path):
    """/rerank and /v1/rerank score as CrossEncoder.predict does: here the Identity the folder
    saved, not a sigmoid."""
    import torch

    base = hf_folder(tmp_path / "ce-base", "BertForSequenceClassification", seed=4)
    st.CrossEncoder(str(base), device="cpu", activation_fn=torch.nn.Identity()).save(
        str(tmp_path / "ce")
    )
    query, docs = TEXTS[0], TEXTS[1:5]
    want = st.CrossEncoder(str(tmp_path / "ce"), device="cpu").predict([(query, d) for d in docs])
    with served_client(tmp_path / "ce", tmp_path, "--accept-any-model-name") as client:
        ranked = ok(post(client, "/rerank", {"query": query, "texts": docs}))
        for row in ranked:
            assert row["score"] == pytest.approx(float(want[row["index"]]), abs=1e-4)
        cohere = ok(post(client, "/v1/rerank", {"query": query, "documents": docs}))
        for row in cohere["results"]:
            assert row["relevance_score"] == pytest.approx(float(want[row["index"]]), abs=1e-4)


def test_pairs_are_cut_from_the_side_the_models_tokenizer_cuts(tmp_path):
    """A cross-encoder whose tokenizer cuts from the left: /rerank, /v1/rerank and /predict
    cut long pairs from the left too, by default, as CrossEncoder.predict does (they cut from
    the right, which changed the scores and the ranking). On a --no-auto-truncate server,
    /v1/rerank takes ``truncate`` (it had no way to ask for the cut its 422 named)."""
    import torch

    base = hf_folder(tmp_path / "ce-base", "BertForSequenceClassification", seed=4)
    st.CrossEncoder(str(base), device="cpu", max_length=24, activation_fn=torch.nn.Identity()).save(
        str(tmp_path / "ce")
    )
    config_path = tmp_path / "ce" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "truncation_side": "left"}))
    query, docs = TEXTS[0], [" ".join(TEXTS[1:4]), " ".join(TEXTS[4:7])]
    model = st.CrossEncoder(str(tmp_path / "ce"), device="cpu")
    assert model.tokenizer.truncation_side == "left"
    want = model.predict([(query, d) for d in docs])
    with served_client(tmp_path / "ce", tmp_path, "--accept-any-model-name") as client:
        for row in ok(post(client, "/rerank", {"query": query, "texts": docs})):
            assert row["score"] == pytest.approx(float(want[row["index"]]), abs=1e-4)
        cohere = ok(post(client, "/v1/rerank", {"query": query, "documents": docs}))
        for row in cohere["results"]:
            assert row["relevance_score"] == pytest.approx(float(want[row["index"]]), abs=1e-4)
        pairs = {"inputs": [[query, d] for d in docs], "raw_scores": True}
        predicted = ok(post(client, "/predict", pairs))
        for (row,), score in zip(predicted, want):
            assert row["score"] == pytest.approx(float(score), abs=1e-4)
    with served_client(tmp_path / "ce", tmp_path, "--no-auto-truncate") as client:
        body = {"query": query, "documents": docs}
        assert_error(post(client, "/v1/rerank", body), 422, "truncate")
        cohere = ok(post(client, "/v1/rerank", {**body, "truncate": True}))
        for row in cohere["results"]:
            assert row["relevance_score"] == pytest.approx(float(want[row["index"]]), abs=1e-4)
