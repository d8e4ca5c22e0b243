"""Cohere's routes: ``/v1/rerank`` (cross-encoders) and ``/v2/embed`` (dense models), in
Cohere's request and response shapes.

``/v2/embed`` maps Cohere's ``input_type`` onto the folder's prompts (:func:`prompt_name`) and
gives each of ``embedding_types``: ``float`` (normalised), ``int8`` / ``uint8`` (buckets
between the server's calibrated ranges, ``GET /info``), ``binary`` / ``ubinary`` (packed bits),
as sentence-transformers' ``quantize_embeddings`` gives them.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response

from fastbert.embedding.model import finish_embeddings
from fastbert.embedding.quantized import RANGED, quantize_embeddings
from fastbert.serve import inputs, schemas
from fastbert.serve.scores import rerank_scores
from fastbert.serve.service import Server, Timing

# Cohere's input_type -> the prompt sentence-transformers' encode_query / encode_document
# use. They try "query", and "document", "passage", "corpus" in turn, but sentence-transformers
# 6 gives every embedding model a "query" and a "document" prompt (empty unless the folder
# declares them, fastbert.model.sentence_folder.FolderSpec.prompt), so the first is taken.
TASK_PROMPTS = {"search_query": "query", "search_document": "document"}
# Cohere's truncate -> (whether to cut, from which side).
TRUNCATION = {"NONE": (False, "right"), "START": (True, "left"), "END": (True, "right")}


def prompt_name(input_type: str | None, prompts: dict[str, str]) -> str | None:
    """The prompt a Cohere ``input_type`` asks for: the folder's prompt named as the
    input_type, else (search_query) "query" or (search_document) "document", as
    sentence-transformers' ``encode_query`` / ``encode_document`` choose (empty where the
    folder declares none); None for no input_type, or another one the folder has no prompt
    of."""
    if input_type is None:
        return None
    if input_type in prompts:
        return input_type
    return TASK_PROMPTS.get(input_type)


def register(app: FastAPI, server: Server, posted: list) -> None:
    """Add Cohere's routes to ``app``; ``posted``: the dependencies of a POST route."""

    @app.post("/v2/embed", dependencies=posted, tags=["Cohere"])
    async def embed(body: schemas.CohereEmbedRequest, request: Request) -> Response:
        """Cohere's embed (v2): each of ``embedding_types`` of every text, after the prompt
        its ``input_type`` maps to (without one: the model's default prompt; with one the
        folder has no prompt for: none)."""
        timing = Timing()
        server.require("/v2/embed")
        server.check_model(body.model)
        dimensions = server.dimensions_of(body.output_dimension, "output_dimension")
        inputs.check_count(body.texts, server.limits, "texts")
        name = prompt_name(body.input_type, server.model.prompts)
        if body.input_type is None or name is not None:
            prompting = server.prompting(name)
        else:
            prompting = server.prompting(None, prompt="")
        if body.max_tokens is not None:  # each input's tokens, cut as truncate says
            limit = prompting.max_length or server.model.max_length
            prompting = replace(prompting, max_length=min(body.max_tokens, limit))
        truncate, direction = TRUNCATION[body.truncate]
        pooled = await server.embed_inputs(
            request, timing, "/v2/embed", body.texts, "texts", truncate, direction, prompting
        )
        vectors = finish_embeddings(pooled, True, dimensions, np.dtype(np.float32))
        embeddings: dict[str, Any] = {}
        for kind in dict.fromkeys(body.embedding_types):
            if kind == "float":
                embeddings[kind] = np.ascontiguousarray(vectors)
                continue
            ranges = None
            if kind in RANGED:
                ranges = server.calibration.ranges(dimensions)
            embeddings[kind] = quantize_embeddings(vectors, kind, ranges)
        content = {
            "id": str(uuid.uuid4()),
            "embeddings": embeddings,
            "texts": body.texts,
            "meta": {
                "api_version": {"version": "2"},
                "billed_units": {"input_tokens": timing.tokens},
            },
            "response_type": "embeddings_by_type",
        }
        return server.reply(content, timing, "/v2/embed")

    server.aliases["/v2/rerank"] = "/v1/rerank"  # the v2 client's path; its answer is v1's

    @app.post("/v1/rerank", dependencies=posted, tags=["Cohere"])
    @app.post("/v2/rerank", dependencies=posted, tags=["Cohere"], include_in_schema=False)
    async def rerank(body: schemas.CohereRerankRequest, request: Request) -> Response:
        """Cohere's rerank: relevance scores (as CrossEncoder.predict gives them), best first,
        ``top_n``."""
        timing = Timing()
        server.require("/v1/rerank")
        server.check_model(body.model)
        texts = [d if isinstance(d, str) else d.text for d in body.documents]
        logits = await rerank_scores(
            server,
            request,
            timing,
            "/v1/rerank",
            body.query,
            texts,
            body.truncate,
            None,
            "documents",
        )
        scores = server.model.scores(logits[:, None])[:, 0]
        order = np.argsort(-scores, kind="stable")[: body.top_n]
        results = []
        for i in order:
            entry: dict[str, Any] = {"index": int(i), "relevance_score": float(scores[i])}
            if body.return_documents:
                entry["document"] = {"text": texts[i]}
            results.append(entry)
        content = {
            "id": f"rerank-{time.time_ns()}",
            "model": server.name,
            "results": results,
            "usage": {"total_tokens": timing.tokens},
        }
        return server.reply(content, timing, "/v1/rerank")
