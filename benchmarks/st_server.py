"""A plain sentence-transformers server, the baseline of benchmarks/serve_bench.py: a Starlette
app behind uvicorn serving text-embeddings-inference's routes with the model as shipped.

    python -m benchmarks.st_server --model PATH [--host 127.0.0.1] [--port 8080]

A folder whose config.json names a ``*ForSequenceClassification`` architecture is loaded as a
``CrossEncoder`` (``POST /rerank``), a SparseEncoder folder (its
config_sentence_transformers.json says so) as a ``SparseEncoder`` (``POST /embed_sparse``), any
other as a ``SentenceTransformer`` (``POST /embed`` and OpenAI's ``POST /v1/embeddings``).
Each request is one ``encode`` / ``predict`` call, run in one worker thread (so calls run one at
a time, as in the simplest deployment; there is no batching across requests and no admission
limit). ``GET /health`` answers 200 once the model
answers; ``GET /stats`` gives the number of requests answered, by route (the tests compare it
with the load generator's count).

Routes and bodies (TEI's and OpenAI's shapes):

- ``POST /embed`` ``{"inputs": str | [str], "normalize": bool}`` -> ``[[float]]``
- ``POST /embed_sparse`` ``{"inputs": str | [str]}`` -> per input ``[{"index": i, "value":
  v}]``, its non-zero entries
- ``POST /rerank`` ``{"query": str, "texts": [str]}`` -> ``[{"index": i, "score": s}]``, best
  first
- ``POST /v1/embeddings`` ``{"input": str | [str], "model": str}`` -> ``{"data": [...]}``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def is_cross_encoder(folder: str | Path) -> bool:
    """Whether a model folder holds a sequence-classification model (a reranker)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return any("SequenceClassification" in a for a in config.get("architectures") or [])


def is_sparse_encoder(folder: str | Path) -> bool:
    """Whether a sentence-transformers folder holds a SparseEncoder (SPLADE)."""
    try:
        config = json.loads((Path(folder) / "config_sentence_transformers.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("model_type") == "SparseEncoder"


def create_app(model_path: str, device: str = "cpu") -> Any:
    """The Starlette app serving the model in ``model_path``."""
    import numpy as np
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    rerank = is_cross_encoder(model_path)
    sparse = not rerank and is_sparse_encoder(model_path)
    if rerank:
        from sentence_transformers import CrossEncoder

        model = CrossEncoder(model_path, device=device)
    elif sparse:
        from sentence_transformers import SparseEncoder

        model = SparseEncoder(model_path, device=device)
    else:
        from sentence_transformers import SentenceTransformer

        model = SentenceTransformer(model_path, device=device)
    executor = ThreadPoolExecutor(1, thread_name_prefix="model")
    answered: Counter[str] = Counter()

    async def in_thread(fn, *args, **kwargs):
        return await asyncio.get_running_loop().run_in_executor(
            executor, lambda: fn(*args, **kwargs)
        )

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": message, "error_type": "Validation"}, status_code=status)

    async def body(request: Request) -> dict | None:
        try:
            value = await request.json()
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def texts_of(value: Any) -> list[str] | None:
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
            return value
        return None

    async def encode(texts: list[str], normalize: bool) -> np.ndarray:
        return await in_thread(
            model.encode, texts, convert_to_numpy=True, normalize_embeddings=normalize
        )

    async def embed(request: Request) -> Response:
        data = await body(request)
        texts = texts_of(data.get("inputs")) if data else None
        if texts is None:
            return error(422, "inputs: a string or a non-empty list of strings")
        vectors = await encode(texts, bool(data.get("normalize", True)))
        answered["/embed"] += 1
        return JSONResponse(vectors.tolist())

    async def openai_embeddings(request: Request) -> Response:
        data = await body(request)
        texts = texts_of(data.get("input")) if data else None
        if texts is None:
            return error(422, "input: a string or a non-empty list of strings")
        vectors = await encode(texts, False)
        answered["/v1/embeddings"] += 1
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": v}
                    for i, v in enumerate(vectors.tolist())
                ],
                "model": str(data.get("model", model_path)),
                "usage": {"prompt_tokens": 0, "total_tokens": 0},
            }
        )

    async def embed_sparse(request: Request) -> Response:
        data = await body(request)
        texts = texts_of(data.get("inputs")) if data else None
        if texts is None:
            return error(422, "inputs: a string or a non-empty list of strings")
        vectors = await in_thread(model.encode, texts, convert_to_sparse_tensor=True)
        vectors = vectors.coalesce()
        rows, columns = vectors.indices().tolist()
        values = vectors.values().tolist()
        answer: list[list[dict]] = [[] for _ in texts]
        for row, column, value in zip(rows, columns, values):
            answer[row].append({"index": column, "value": value})
        answered["/embed_sparse"] += 1
        return JSONResponse(answer)

    async def rerank_route(request: Request) -> Response:
        data = await body(request)
        query = data.get("query") if data else None
        texts = texts_of(data.get("texts")) if data else None
        if not isinstance(query, str) or texts is None:
            return error(422, "query: a string; texts: a non-empty list of strings")
        scores = await in_thread(model.predict, [(query, t) for t in texts])
        answered["/rerank"] += 1
        ranked = sorted(enumerate(np.asarray(scores).ravel().tolist()), key=lambda p: -p[1])
        return JSONResponse([{"index": i, "score": s} for i, s in ranked])

    async def not_served(request: Request) -> Response:
        kind = "a reranker" if rerank else "a sparse model" if sparse else "an embedding model"
        return error(424, f"{request.url.path}: this server holds {kind}")

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def stats(request: Request) -> Response:
        return JSONResponse(dict(answered))

    if rerank:
        model.predict([("warm", "up")])
    else:
        model.encode(["warm up"])
    dense = not (rerank or sparse)
    routes = [
        Route("/health", health, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
        Route("/embed", embed if dense else not_served, methods=["POST"]),
        Route("/v1/embeddings", openai_embeddings if dense else not_served, methods=["POST"]),
        Route("/embed_sparse", embed_sparse if sparse else not_served, methods=["POST"]),
        Route("/rerank", rerank_route if rerank else not_served, methods=["POST"]),
    ]
    return Starlette(routes=routes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="a sentence-transformers model folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    import uvicorn

    app = create_app(args.model, args.device)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    sys.exit(main())
