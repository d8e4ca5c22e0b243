"""Hugging Face text-embeddings-inference's inference routes: ``/embed`` and ``/similarity``
(dense models), ``/embed_sparse`` (sparse), ``/embed_all`` (multi-vector), ``/rerank`` and
``/predict`` (cross-encoders), ``/tokenize`` and ``/decode``, in TEI's request and response
shapes."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import ValidationError

from fastbert.embedding.model import finish_embeddings
from fastbert.model.sentence_folder import CLASSIFICATION, EMBEDDING, MULTI_VECTOR, SPARSE
from fastbert.serve import inputs, schemas
from fastbert.serve.errors import EmptyInput, ValidationFailed
from fastbert.serve.scores import pair_scores, probabilities, rerank_scores
from fastbert.serve.service import NUMPY_JSON, Server, Timing


def register(app: FastAPI, server: Server, posted: list) -> None:
    """Add TEI's routes to ``app``; ``posted``: the dependencies of a POST route."""
    model = server.model

    async def run_embedding(
        body: schemas.TeiEmbedRequest, request: Request, timing: Timing, route: str
    ) -> Any:
        server.require(route)
        prompting = server.prompting(body.prompt_name)
        return await server.embed_inputs(
            request,
            timing,
            route,
            body.inputs,
            "inputs",
            body.truncate,
            body.truncation_direction,
            prompting,
        )

    @app.post("/embed", dependencies=posted, tags=["TEI"], response_model=list[list[float]])
    async def embed(body: schemas.EmbedRequest, request: Request) -> Response:
        """Embeddings of the inputs (dense models), normalised unless ``normalize`` is false,
        each after the prompt ``prompt_name`` names (default: the model's default prompt)."""
        timing = Timing()
        server.require("/embed")
        dimensions = server.dimensions_of(body.dimensions, "dimensions")
        pooled = await run_embedding(body, request, timing, "/embed")
        vectors = finish_embeddings(pooled, body.normalize, dimensions, np.dtype(np.float32))
        return server.reply(
            orjson.dumps(np.ascontiguousarray(vectors), option=NUMPY_JSON), timing, "/embed"
        )

    @app.post("/embed_sparse", dependencies=posted, tags=["TEI"])
    async def embed_sparse(body: schemas.EmbedSparseRequest, request: Request) -> Response:
        """Sparse embeddings (SPLADE models): per input, its non-zero entries over the
        vocabulary, ``[{index, value}]`` by index."""
        timing = Timing()
        rows = await run_embedding(body, request, timing, "/embed_sparse")
        content = [
            [{"index": i, "value": v} for i, v in zip(indices.tolist(), values.tolist())]
            for indices, values in rows
        ]
        return server.reply(content, timing, "/embed_sparse")

    @app.post("/embed_all", dependencies=posted, tags=["TEI"])
    async def embed_all(body: schemas.EmbedAllRequest, request: Request) -> Response:
        """Per-token vectors (multi-vector models): per input, the vector of every token the
        model scores, ``[[float]]`` (``prompt_name`` "query" / "document" picks the task)."""
        timing = Timing()
        rows = await run_embedding(body, request, timing, "/embed_all")
        return server.reply(
            orjson.dumps([np.ascontiguousarray(r) for r in rows], option=NUMPY_JSON),
            timing,
            "/embed_all",
        )

    @app.post("/rerank", dependencies=posted, tags=["TEI"])
    async def rerank(body: schemas.RerankRequest, request: Request) -> Response:
        """Scores of (query, text) for each text, best first (as CrossEncoder.predict gives
        them: the folder's activation, Sigmoid unless it saved another; the logits with
        ``raw_scores``)."""
        timing = Timing()
        logits = await rerank_scores(
            server,
            request,
            timing,
            "/rerank",
            body.query,
            body.texts,
            body.truncate,
            body.truncation_direction,
            "texts",
        )
        scores = logits if body.raw_scores else model.scores(logits[:, None])[:, 0]
        order = np.argsort(-scores, kind="stable")
        content = []
        for i in order:
            entry: dict[str, Any] = {"index": int(i), "score": float(scores[i])}
            if body.return_text:
                entry["text"] = body.texts[i]
            content.append(entry)
        return server.reply(content, timing, "/rerank")

    @app.post("/predict", dependencies=posted, tags=["TEI"])
    async def predict(body: schemas.PredictRequest, request: Request) -> Response:
        """Label scores of a text, a pair, or a list of either, best first (softmax, or
        sigmoid for one label, unless ``raw_scores``)."""
        timing = Timing()
        server.require("/predict")
        single, sequences = _sequences(body.inputs)
        inputs.check_count([" ".join(s) for s in sequences], server.limits, "inputs")
        for i, sequence in enumerate(sequences):  # each side of a pair, not only the two
            for j, text in enumerate(sequence):
                inputs.check_text(text, f"inputs[{i}][{j}]", "inputs")
        logits = await pair_scores(
            server,
            request,
            timing,
            [s[0] for s in sequences],
            [s[1] if len(s) == 2 else None for s in sequences],
            body.truncate,
            body.truncation_direction,
            "inputs",
        )
        parameters = body.parameters or schemas.PredictParameters()
        function = parameters.function_to_apply
        if body.raw_scores and function not in (None, "none"):
            raise ValidationFailed(
                f"raw_scores asks for the logits and parameters.function_to_apply for their "
                f"{function}: give one",
                param="raw_scores",
            )
        if function is None and model.multi_label:
            function = "sigmoid"  # its labels hold apart: each scored alone, as the pipeline does
        scores = logits if body.raw_scores else probabilities(logits, function)
        labels = model.labels
        answers = [
            [
                {"score": float(row[j]), "label": labels[j]}
                for j in np.argsort(-row, kind="stable")[: parameters.top_k]
            ]
            for row in scores
        ]
        return server.reply(answers[0] if single else answers, timing, "/predict")

    @app.post("/tokenize", dependencies=posted, tags=["TEI"])
    async def tokenize(body: schemas.TokenizeRequest, request: Request) -> Response:
        """Every token of each input after the prompt ``prompt_name`` names (the tokens
        ``/embed`` runs): id, text, whether special, character offsets into the prompted
        input, as TEI gives them."""
        timing = Timing()
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        inputs.check_count(texts, server.limits, "inputs")
        prompting = server.prompting(body.prompt_name)
        texts = [prompting.text + text for text in texts]
        # An inference-free SPLADE model's queries: its query route's tokens, no special ones.
        tokenizer = model.static_tokenizer if prompting.static else model.text_tokenizer
        details = await server.tokenize(
            timing,
            tokenizer.details,
            texts,
            body.add_special_tokens and not prompting.static,
            characters=inputs.characters(texts),
        )
        timing.tokens = sum(len(d) for d in details)
        return server.reply(details, timing, "/tokenize")

    @app.post("/similarity", dependencies=posted, tags=["TEI"], response_model=list[float])
    async def similarity(body: schemas.SimilarityRequest, request: Request) -> Response:
        """The cosine similarity of ``inputs.source_sentence`` to each of ``inputs.sentences``
        (dense models; cosine, as TEI computes it), each embedded as ``/embed`` embeds it:
        ``parameters`` holds its ``truncate``, ``truncation_direction`` and ``prompt_name``.
        An input over the limit is named by its place in [source_sentence, *sentences]."""
        timing = Timing()
        server.require("/similarity")
        if not body.inputs.sentences:
            raise EmptyInput("inputs.sentences is empty: give at least one", param="inputs")
        inputs.check_text(body.inputs.source_sentence, "inputs.source_sentence", "inputs")
        for i, sentence in enumerate(body.inputs.sentences):
            inputs.check_text(sentence, f"inputs.sentences[{i}]", "inputs")
        parameters = body.parameters or schemas.SimilarityParameters()
        pooled = await server.embed_inputs(
            request,
            timing,
            "/similarity",
            [body.inputs.source_sentence, *body.inputs.sentences],
            "inputs",
            parameters.truncate,
            parameters.truncation_direction,
            server.prompting(parameters.prompt_name),
        )
        dimensions = server.dimensions_of(None, "dimensions")  # the model's own width
        vectors = finish_embeddings(pooled, True, dimensions, np.dtype(np.float32))
        return server.reply(vectors[1:] @ vectors[0], timing, "/similarity")

    @app.post("/decode", dependencies=posted, tags=["TEI"], response_model=list[str])
    async def decode(body: schemas.DecodeRequest, request: Request) -> Response:
        """The text of each list of token ids, as the model's tokenizer decodes it (special
        tokens left out unless ``skip_special_tokens`` is false)."""
        timing = Timing()
        # As TEI reads ids: a list of ids first ([] too: the empty text), else a batch.
        rows = body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids]
        inputs.check_size(rows, server.limits, "ids")  # an empty list is no empty input
        for i, row in enumerate(rows):
            inputs.check_ids(row, model.vocab_size, f"ids[{i}]")
        texts = await server.tokenize(
            timing,
            model.text_tokenizer.decode,
            rows,
            body.skip_special_tokens,
            characters=sum(len(row) for row in rows),
        )
        return server.reply(texts, timing, "/decode")

    # TEI's compatibility routes: POST / (Hugging Face's InferenceClient posts there) and
    # /invocations (SageMaker's) run the model's own route, as TEI maps them.
    handlers = {
        EMBEDDING: ("/embed", embed),
        SPARSE: ("/embed_sparse", embed_sparse),
        MULTI_VECTOR: ("/embed_all", embed_all),
    }
    # A cross-encoder: one with one label reranks, another predicts.
    reranks = model.kind == CLASSIFICATION and len(model.labels) == 1
    route, handler = handlers.get(model.kind) or (
        ("/rerank", rerank) if reranks else ("/predict", predict)
    )
    if model.kind == EMBEDDING:

        async def embed_or_similarity(body: dict[str, Any], request: Request) -> Response:
            """A dense model's POST /: /similarity for a body whose inputs is an object
            (``{source_sentence, sentences}``: what InferenceClient.sentence_similarity
            posts), else /embed."""
            similar = isinstance(body.get("inputs"), dict)
            schema = schemas.SimilarityRequest if similar else schemas.EmbedRequest
            try:
                parsed = schema.model_validate(body)
            except ValidationError as exc:  # as FastAPI answers a body it cannot validate
                raise RequestValidationError(
                    [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
                ) from None
            return await (similarity(parsed, request) if similar else embed(parsed, request))

        handler = embed_or_similarity
    for path in ("/", "/invocations"):
        app.add_api_route(
            path,
            handler,
            methods=["POST"],
            dependencies=posted,
            tags=["TEI"],
            openapi_extra=_body_of(model.kind),
        )
        server.aliases[path] = route


def _body_of(kind: str) -> dict[str, Any] | None:
    """The OpenAPI request body of POST / for a dense model, which takes /embed's body or
    /similarity's (its handler reads a plain object); None for the others (the handler's
    own)."""
    if kind != EMBEDDING:
        return None
    names = ("EmbedRequest", "SimilarityRequest")
    schema = {"oneOf": [{"$ref": f"#/components/schemas/{name}"} for name in names]}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _sequences(raw: Any) -> tuple[bool, list[list[str]]]:
    """TEI's predict inputs -> (whether it was one input, [[text] or [text, pair], ...]): a
    text or a list of two texts is one input (a pair); any other list is a list of inputs."""
    if isinstance(raw, str):
        return True, [[raw]]
    if len(raw) == 2 and all(isinstance(x, str) for x in raw):
        return True, [list(raw)]
    if len(raw) == 1 and isinstance(raw[0], str):
        return True, [[raw[0]]]
    return False, [[x] if isinstance(x, str) else list(x) for x in raw]
