"""The HTTP app: Hugging Face text-embeddings-inference's routes (``/embed``, ``/rerank``,
``/predict``, ``/tokenize``, ``/info``, ``/health``, ``/metrics``), OpenAI's
``/v1/embeddings`` and Cohere's ``/v1/rerank``, on FastAPI (its OpenAPI document at
``/openapi.json``, interactive docs at ``/docs``).

The event loop only parses, admits and replies: tokenisation runs in a small pool of threads,
the forward passes in the batcher's model thread (:mod:`~fastbert.serve.batcher`). Every
inference answer carries its timings (``x-total-time``, ``x-tokenization-time``,
``x-queue-time``, ``x-inference-time``, in ms) and its token count (``x-compute-tokens``).
This module imports FastAPI (the ``fastbert[serve]`` extra): nothing imports it until a
server starts.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from fastbert.embed.model import pooling_name
from fastbert.embed.text_model import TextModel, finish_embeddings
from fastbert.model.sentence_folder import CLASSIFICATION, EMBEDDING, MULTI_VECTOR, SPARSE
from fastbert.serve import errors, inputs, schemas
from fastbert.serve.batcher import Batcher, Reservation
from fastbert.serve.metrics import Metrics
from fastbert.serve.options import ServeOptions
from fastbert.version import __version__

log = logging.getLogger("fastbert.serve")

# The routes each kind of model serves.
ROUTES = {
    EMBEDDING: ("/embed", "/v1/embeddings"),
    SPARSE: (),
    MULTI_VECTOR: (),
    CLASSIFICATION: ("/rerank", "/v1/rerank", "/predict"),
}
# Who serves a route: the kind of model it needs, as error messages name it.
NEEDS = {
    "/embed": "an embedding model",
    "/v1/embeddings": "an embedding model",
    "/rerank": "a classification model (a cross-encoder)",
    "/v1/rerank": "a classification model (a cross-encoder)",
    "/predict": "a classification model (a cross-encoder)",
}
# What a request whose client went away gets (nobody reads it), as nginx logs such requests.
CLIENT_GONE = 499


@dataclass
class Timing:
    """Where a request's time went, in seconds, and how many tokens it ran."""

    start: float = field(default_factory=time.perf_counter)
    tokenization: float = 0.0
    queue: float = 0.0
    inference: float = 0.0
    tokens: int = 0

    def headers(self) -> dict[str, str]:
        total = time.perf_counter() - self.start
        return {
            "x-total-time": f"{total * 1e3:.3f}",
            "x-tokenization-time": f"{self.tokenization * 1e3:.3f}",
            "x-queue-time": f"{self.queue * 1e3:.3f}",
            "x-inference-time": f"{self.inference * 1e3:.3f}",
            "x-compute-tokens": str(self.tokens),
        }


class Server:
    """What the routes share: the model, the limits, the batcher, the tokenizer threads and
    the metrics."""

    def __init__(self, model: TextModel, options: ServeOptions):
        self.model = model
        self.options = options
        self.name = options.model_name()
        self.limits = inputs.Limits(options.max_client_batch_size, options.auto_truncate)
        self.metrics = Metrics()
        max_tokens = options.max_queued_tokens or (
            options.max_concurrent_requests * model.max_length
        )
        self.batcher = Batcher(
            self._forward,
            model.options.batch_tokens,
            options.max_concurrent_requests,
            max_tokens,
            self.metrics.on_batch,
        )
        self.pool = ThreadPoolExecutor(options.tokenize_workers, "fastbert-tokenize")
        self.probe = model.tokenize(["health"]).ids

    def _forward(self, tokens: list[list[int]], type_ids: list[list[int]] | None) -> Any:
        if self.model.kind == CLASSIFICATION:
            return self.model.classify_tokens(tokens, type_ids)
        return self.model.embed_tokens(tokens)

    def warm_up(self) -> None:
        """One forward pass before the first request, so that it does not pay for the first
        call's setup."""
        types = [[0] * len(self.probe[0])] if self.model.kind == CLASSIFICATION else None
        self._forward(self.probe, types)

    def require(self, route: str) -> None:
        """ModelFailed (424) when this server's model does not serve ``route``."""
        if route not in ROUTES[self.model.kind]:
            raise errors.ModelFailed(
                f"this server's model ({self.name}) is {_article(self.model.kind)} model; "
                f"{route} needs {NEEDS[route]}"
            )

    async def tokenize(self, timing: Timing, function: Callable, *args: Any) -> Any:
        """``function(*args)`` in a tokenizer thread, timed."""
        start = time.perf_counter()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self.pool, function, *args)
        finally:
            timing.tokenization = time.perf_counter() - start
            self.metrics.tokenize_seconds.observe(timing.tokenization)

    async def tokenize_and_run(
        self, request: Any, timing: Timing, count: int, function: Callable, *args: Any
    ) -> np.ndarray:
        """Admit ``count`` inputs (429 at once past the bound, before any work), tokenise them
        with ``function(*args)`` -> token ids (or (token ids, token types)), and run them."""
        reservation = self.batcher.reserve(count)
        try:
            tokens = await self.tokenize(timing, function, *args)
        except BaseException:
            self.batcher.release(reservation)
            raise
        ids, types = tokens if isinstance(tokens, tuple) else (tokens, None)
        return await self.run(request, timing, ids, types, reservation)

    async def run(
        self,
        request: Any,
        timing: Timing,
        tokens: list[list[int]],
        type_ids: list[list[int]] | None = None,
        reservation: Reservation | None = None,
    ) -> np.ndarray:
        """The model's rows for ``tokens``, batched with whatever else waits. Raises
        Overloaded (429) at once when the queue is full, ModelFailed when the forward fails,
        and ClientGone when the client disconnects first (its inputs are dropped, as they are
        when the server cancels the request: Ray Serve does when its client goes away)."""
        work = self.batcher.submit(tokens, type_ids, reservation)
        timing.tokens = work.token_count
        for row in tokens:
            self.metrics.input_tokens.observe(len(row))
        self.metrics.set_queue(self.batcher.admitted)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({work.future, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self.batcher.cancel(work)
            work.future.cancel()
            raise
        finally:
            gone.cancel()
            self.metrics.set_queue(self.batcher.admitted)
        if not work.future.done():
            self.batcher.cancel(work)
            work.future.cancel()
            raise ClientGone()
        timing.queue, timing.inference = work.queue_seconds, work.inference_seconds
        self.metrics.queue_seconds.observe(work.queue_seconds)
        self.metrics.inference_seconds.observe(work.inference_seconds)
        return work.future.result()

    async def healthy(self) -> bool:
        """True while the model answers: after a failed forward, only once a probe forward
        succeeds."""
        if self.batcher.healthy:
            return True
        types = [[0] * len(self.probe[0])] if self.model.kind == CLASSIFICATION else None
        try:
            work = self.batcher.submit(self.probe, types)
            await asyncio.wait_for(asyncio.shield(work.future), timeout=60)
        except (errors.ServeError, asyncio.TimeoutError):
            return False
        return self.batcher.healthy


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


async def _disconnected(request: Any) -> None:
    """Returns when the client of ``request`` (whose body has been read) disconnects."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def create_app(model: TextModel, options: ServeOptions) -> Any:
    """The FastAPI app serving ``model`` with ``options``' limits (the batcher starts and stops
    with the app's lifespan)."""
    server = Server(model, options)
    numpy_json = orjson.OPT_SERIALIZE_NUMPY

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        if options.omp_spin:  # the model thread's OpenMP team stays the only one
            server.batcher.start(server.warm_up)
        else:  # a team on this thread too: libgomp then throttles spin-waiting
            server.warm_up()
            server.batcher.start()
        try:
            yield
        finally:
            server.batcher.stop()
            server.pool.shutdown(wait=False)

    app = FastAPI(
        title="fastbert serve",
        version=__version__,
        description=(
            "Embeddings, rerank scores and classifications from a BERT-family model, in "
            "Hugging Face text-embeddings-inference's and OpenAI's shapes."
        ),
        lifespan=lifespan,
    )
    app.state.server = server

    async def check_key(request: Request) -> None:
        if options.api_key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            token.strip().encode(), options.api_key.encode()
        ):
            raise errors.Unauthorized(
                "missing or wrong API key: send the header 'Authorization: Bearer <key>'",
                headers={"WWW-Authenticate": "Bearer"},
            )

    async def check_json(request: Request) -> None:
        content_type = request.headers.get("content-type")
        if content_type is None:
            return
        kind = content_type.split(";")[0].strip().lower()
        if kind != "application/json" and not kind.endswith("+json"):
            raise errors.UnsupportedMediaType(
                f"send the body as JSON (Content-Type: application/json), not {kind!r}"
            )

    guarded = [Depends(check_key)]
    posted = [Depends(check_key), Depends(check_json)]

    def reply(content: Any, timing: Timing, route: str) -> Response:
        body = content if isinstance(content, bytes) else orjson.dumps(content, option=numpy_json)
        server.metrics.requests.labels(route).inc()
        seconds = time.perf_counter() - timing.start
        server.metrics.request_seconds.labels(route).observe(seconds)
        log.debug("%s 200 %d tokens %.1f ms", route, timing.tokens, seconds * 1e3)
        return Response(body, media_type="application/json", headers=timing.headers())

    def truncating(truncate: bool | None) -> bool:
        return options.auto_truncate if truncate is None else truncate

    async def embeddings(
        request: Request,
        timing: Timing,
        route: str,
        raw_inputs: Any,
        field: str,
        truncate: bool,
        direction: str,
        dimensions: int | None,
    ) -> np.ndarray:
        """Pooled embeddings [n, hidden] of a request's inputs (validated, tokenised, run)."""
        server.require(route)
        items = inputs.as_list(raw_inputs)
        inputs.check_count(items, server.limits, field)
        if dimensions is not None and dimensions > model.dimensions:
            raise errors.ValidationFailed(
                f"dimensions {dimensions} is more than the model's {model.dimensions}",
                param="dimensions",
            )
        return await server.tokenize_and_run(
            request,
            timing,
            len(items),
            inputs.tokenize,
            model,
            items,
            truncating(truncate),
            direction,
            field,
        )

    @app.post("/embed", dependencies=posted, tags=["TEI"], response_model=list[list[float]])
    async def embed(body: schemas.EmbedRequest, request: Request) -> Response:
        """Embeddings of the inputs, normalised unless ``normalize`` is false."""
        timing = Timing()
        pooled = await embeddings(
            request,
            timing,
            "/embed",
            body.inputs,
            "inputs",
            body.truncate,
            body.truncation_direction,
            body.dimensions,
        )
        vectors = finish_embeddings(pooled, body.normalize, body.dimensions, np.dtype(np.float32))
        return reply(
            orjson.dumps(np.ascontiguousarray(vectors), option=numpy_json), timing, "/embed"
        )

    @app.post("/v1/embeddings", dependencies=posted, tags=["OpenAI"])
    async def openai_embeddings(
        body: schemas.OpenAIEmbeddingsRequest, request: Request
    ) -> Response:
        """OpenAI's embeddings: normalised, as floats or base64 (little-endian float32)."""
        timing = Timing()
        pooled = await embeddings(
            request, timing, "/v1/embeddings", body.input, "input", None, "right", body.dimensions
        )
        vectors = np.ascontiguousarray(
            finish_embeddings(pooled, True, body.dimensions, np.dtype("<f4"))
        )
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
        return reply(content, timing, "/v1/embeddings")

    async def pair_scores(
        request: Request,
        timing: Timing,
        firsts: list[str],
        seconds: list[str | None],
        truncate: bool | None,
        direction: str,
        field: str,
    ) -> np.ndarray:
        """Raw logits [n, labels] of texts / text pairs."""
        return await server.tokenize_and_run(
            request,
            timing,
            len(firsts),
            inputs.tokenize_pairs,
            model,
            firsts,
            seconds,
            truncating(truncate),
            direction,
            field,
        )

    async def rerank_scores(
        request: Request,
        timing: Timing,
        route: str,
        query: str,
        texts: list[str],
        truncate: Any,
        direction: str,
        field: str,
    ) -> np.ndarray:
        server.require(route)
        if len(model.labels) != 1:  # refused before any work
            raise errors.ModelFailed(
                f"reranking needs a model with one output (a cross-encoder); {server.name} has "
                f"{len(model.labels)} labels: use /predict"
            )
        if not query.strip():
            raise errors.EmptyInput("query is empty", param="query")
        inputs.check_count(texts, server.limits, field)
        logits = await pair_scores(
            request, timing, [query] * len(texts), list(texts), truncate, direction, field
        )
        return logits[:, 0]

    @app.post("/rerank", dependencies=posted, tags=["TEI"])
    async def rerank(body: schemas.RerankRequest, request: Request) -> Response:
        """Scores of (query, text) for each text, best first (sigmoid unless ``raw_scores``)."""
        timing = Timing()
        logits = await rerank_scores(
            request,
            timing,
            "/rerank",
            body.query,
            body.texts,
            body.truncate,
            body.truncation_direction,
            "texts",
        )
        scores = logits if body.raw_scores else _sigmoid(logits)
        order = np.argsort(-scores, kind="stable")
        content = []
        for i in order:
            entry: dict[str, Any] = {"index": int(i), "score": float(scores[i])}
            if body.return_text:
                entry["text"] = body.texts[i]
            content.append(entry)
        return reply(content, timing, "/rerank")

    @app.post("/v1/rerank", dependencies=posted, tags=["Cohere"])
    async def cohere_rerank(body: schemas.CohereRerankRequest, request: Request) -> Response:
        """Cohere's rerank: relevance scores (sigmoid of the logit), best first, ``top_n``."""
        timing = Timing()
        texts = [d if isinstance(d, str) else d.text for d in body.documents]
        logits = await rerank_scores(
            request, timing, "/v1/rerank", body.query, texts, None, "right", "documents"
        )
        scores = _sigmoid(logits)
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
        return reply(content, timing, "/v1/rerank")

    @app.post("/predict", dependencies=posted, tags=["TEI"])
    async def predict(body: schemas.PredictRequest, request: Request) -> Response:
        """Label scores of a text, a pair, or a list of either, best first (softmax, or
        sigmoid for one label, unless ``raw_scores``)."""
        timing = Timing()
        server.require("/predict")
        single, sequences = _sequences(body.inputs)
        inputs.check_count([" ".join(s) for s in sequences], server.limits, "inputs")
        logits = await pair_scores(
            request,
            timing,
            [s[0] for s in sequences],
            [s[1] if len(s) == 2 else None for s in sequences],
            body.truncate,
            body.truncation_direction,
            "inputs",
        )
        scores = logits if body.raw_scores else _probabilities(logits)
        labels = model.labels
        answers = [
            [{"score": float(row[j]), "label": labels[j]} for j in np.argsort(-row, kind="stable")]
            for row in scores
        ]
        return reply(answers[0] if single else answers, timing, "/predict")

    @app.post("/tokenize", dependencies=posted, tags=["TEI"])
    async def tokenize(body: schemas.TokenizeRequest, request: Request) -> Response:
        """Every token of each input: id, text, whether special, character offsets."""
        timing = Timing()
        texts = [body.inputs] if isinstance(body.inputs, str) else body.inputs
        inputs.check_count(texts, server.limits, "inputs")
        details = await server.tokenize(
            timing, model.tokenise.details, texts, body.add_special_tokens
        )
        timing.tokens = sum(len(d) for d in details)
        return reply(details, timing, "/tokenize")

    @app.get("/info", dependencies=guarded, tags=["TEI"])
    async def info() -> dict[str, Any]:
        """The model, its kind and settings, and the server's limits."""
        o = model.options
        if model.kind == CLASSIFICATION:
            kind: dict[str, Any] = {"classifier": {"id2label": dict(enumerate(model.labels))}}
        else:
            kind = {
                model.kind: {
                    "pooling": pooling_name(model.spec, o.pooling),
                    "normalize": o.normalize,
                    "dimensions": model.dimensions,
                    "prompts": model.prompts,
                }
            }
        return {
            "model_id": o.model,
            "served_model_name": server.name,
            "model_type": kind,
            "model_kind": model.kind,
            "routes": list(ROUTES[model.kind]),
            "dtype": o.dtype,
            "quantize": o.quantize,
            "device": o.device,
            "backend": o.backend,
            "max_input_length": model.max_length,
            "max_batch_tokens": o.batch_tokens,
            "max_client_batch_size": options.max_client_batch_size,
            "max_concurrent_requests": options.max_concurrent_requests,
            "max_queued_tokens": server.batcher.max_tokens,
            "auto_truncate": options.auto_truncate,
            "payload_limit": options.payload_limit,
            "tokenization_workers": options.tokenize_workers,
            "omp_spin": options.omp_spin,
            "version": __version__,
        }

    @app.get("/health", tags=["TEI"])
    async def health() -> Response:
        """200 while the model answers; 503 after a failed forward until a probe succeeds."""
        if await server.healthy():
            return Response(status_code=200)
        raise errors.Unhealthy("the model is failing; a probe forward pass failed")

    @app.get("/metrics", tags=["TEI"])
    async def metrics() -> Response:
        """Prometheus metrics."""
        server.metrics.set_queue(server.batcher.admitted)
        content, content_type = server.metrics.render()
        return Response(content, media_type=content_type)

    def error_response(request: Request, error: errors.ServeError) -> Response:
        path = request.url.path
        route = path if path in app.state.known_routes else "other"
        server.metrics.failures.labels(route, error.error_type).inc()
        body = error.openai_body() if path.startswith("/v1/") else error.tei_body()
        log.debug("%s %d %s", path, error.status, error.message)
        return Response(
            orjson.dumps(body), error.status, headers=error.headers, media_type="application/json"
        )

    @app.exception_handler(errors.ServeError)
    async def on_serve_error(request: Request, error: errors.ServeError) -> Response:
        return error_response(request, error)

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, error: ClientGone) -> Response:
        server.metrics.failures.labels(request.url.path, "client_gone").inc()
        return Response(status_code=CLIENT_GONE)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, error: RequestValidationError) -> Response:
        return error_response(request, _validation_error(error))

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, error: HTTPException) -> Response:
        kinds = {400: errors.BadRequest, 404: errors.NotFound, 405: errors.MethodNotAllowed}
        kind = kinds.get(error.status_code, errors.ServeError)
        detail = str(error.detail)
        if error.status_code == 400:  # FastAPI could not decode the body (not UTF-8)
            detail = f"the body could not be read as JSON text (UTF-8): {detail}"
        wrapped = kind(detail)
        wrapped.status = error.status_code
        return error_response(request, wrapped)

    @app.exception_handler(Exception)
    async def on_unexpected(request: Request, error: Exception) -> Response:
        log.exception("unexpected error on %s", request.url.path)
        return error_response(request, errors.ServeError(f"internal error: {type(error).__name__}"))

    app.state.known_routes = {route.path for route in app.routes}
    return PayloadLimit(app, options.payload_limit, error_response)


class PayloadLimit:
    """ASGI middleware: reads each request body up to ``limit`` bytes and answers 413 (in the
    route's error shape) past it, before the app parses anything."""

    def __init__(self, app: Any, limit: int, error_response: Callable):
        self.app = app
        self.limit = limit
        self.error_response = error_response
        self.state = app.state

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        too_large = declared is not None and declared.isdigit() and int(declared) > self.limit
        chunks: list[bytes] = []
        size = 0
        more = not too_large
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                too_large = True
                break
            chunks.append(chunk)
            more = message.get("more_body", False)
        if too_large:
            await self._reject(scope, receive, send)
            return
        body = b"".join(chunks)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: dict, receive: Callable, send: Callable) -> None:
        error = errors.PayloadTooLarge(
            f"the request body is over this server's limit of {self.limit} bytes (--payload-limit)"
        )
        response = self.error_response(Request(scope, receive), error)
        await response(scope, receive, send)


def _validation_error(error: Any) -> errors.ServeError:
    """FastAPI's validation error -> BadRequest (the body is not JSON) or ValidationFailed."""
    problems = error.errors()
    if any(p.get("type") == "json_invalid" for p in problems):
        detail = next(p for p in problems if p.get("type") == "json_invalid")
        return errors.BadRequest(
            f"the body is not valid JSON: {detail.get('ctx', {}).get('error', '')}".strip()
        )
    parts = []
    for problem in problems[:5]:
        where = ".".join(str(x) for x in problem.get("loc", ())[1:]) or "body"
        parts.append(f"{where}: {problem.get('msg')}")
    param = ".".join(str(x) for x in problems[0].get("loc", ())[1:2]) if problems else None
    return errors.ValidationFailed("; ".join(parts), param=param or None)


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


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def _probabilities(logits: np.ndarray) -> np.ndarray:
    """Softmax over the labels; sigmoid for a single output."""
    if logits.shape[1] == 1:
        return _sigmoid(logits)
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)
