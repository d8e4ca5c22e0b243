"""OpenAI's routes: ``/v1/embeddings`` (dense models) and ``/v1/models`` (the served model), in
OpenAI's request, response and error shapes, so that the ``openai`` client works unchanged."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import Response

from fastbert.embedding.model import finish_embeddings
from fastbert.serve import errors, inputs, schemas
from fastbert.serve.service import Server, Timing


def register(app: FastAPI, server: Server, posted: list, guarded: list) -> None:
    """Add OpenAI's routes to ``app``; ``posted`` / ``guarded``: the dependencies of a POST and
    a GET route."""

    server.aliases["/embeddings"] = "/v1/embeddings"  # TEI serves it without /v1

    @app.post("/v1/embeddings", dependencies=posted, tags=["OpenAI"])
    @app.post("/embeddings", dependencies=posted, tags=["OpenAI"], include_in_schema=False)
    async def embeddings(body: schemas.OpenAIEmbeddingsRequest, request: Request) -> Response:
        """OpenAI's embeddings: normalised, as floats or base64 (little-endian float32), each
        after the model's default prompt (OpenAI's request has no prompt field)."""
        timing = Timing()
        server.require("/v1/embeddings")
        server.check_model(body.model)
        if not server.options.openai_token_ids:
            refuse_token_ids(body.input)
        dimensions = server.dimensions_of(body.dimensions, "dimensions")
        pooled = await server.embed_inputs(
            request,
            timing,
            "/v1/embeddings",
            body.input,
            "input",
            None,
            None,  # OpenAI's API has no direction: the model's own
            server.prompting(None),
        )
        vectors = np.ascontiguousarray(finish_embeddings(pooled, True, dimensions, np.dtype("<f4")))
        if body.encoding_format == "base64":
            data = [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors]
        else:
            data = list(vectors)
        content = {
            "object": "list",
            "data": [
                {"object": "embedding", "embedding": e, "index": i} for i, e in enumerate(data)
            ],
            "model": server.name,
            "usage": {"prompt_tokens": timing.tokens, "total_tokens": timing.tokens},
        }
        return server.reply(content, timing, "/v1/embeddings")

    @app.get("/v1/models", dependencies=guarded, tags=["OpenAI"])
    async def models() -> dict[str, Any]:
        """The served model, as OpenAI lists models (with its ``kind`` besides)."""
        return {"object": "list", "data": [_model_card(server)]}

    @app.get("/v1/models/{model:path}", dependencies=guarded, tags=["OpenAI"])
    async def model(model: str) -> dict[str, Any]:
        """The served model by its name (a Hugging Face id's slash included); 404
        ``model_not_found`` for any other."""
        if model != server.name:
            server.check_model(model)
        return {**_model_card(server), "id": model}


def _model_card(server: Server) -> dict[str, Any]:
    return {
        "id": server.name,
        "object": "model",
        "created": server.created,
        "owned_by": "fastbert",
        "kind": server.model.kind,
    }


def refuse_token_ids(given: object) -> None:
    """ValidationFailed (400 on this route) for token-id inputs: OpenAI's API reads token ids
    as its own tokenizer's (LangChain's OpenAIEmbeddings tokenises with it and sends them by
    default), so reading them as this model's would embed other tokens, silently; the server
    reads them as the model's with --openai-token-ids."""
    if any(not isinstance(item, str) for item in inputs.as_list(given)):
        raise errors.ValidationFailed(
            "input holds token ids: OpenAI's API reads them as its own tokenizer's, not this "
            "model's; send the texts (LangChain's OpenAIEmbeddings: "
            "check_embedding_ctx_length=False), or start the server with --openai-token-ids to "
            "read them as this model's token ids, as /embed does",
            param="input",
        )
