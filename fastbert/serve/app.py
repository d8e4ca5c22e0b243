"""The HTTP app on FastAPI (its OpenAPI document at ``/openapi.json``, interactive docs at
``/docs``): the route families (Hugging Face text-embeddings-inference's,
:mod:`~fastbert.serve.routes_tei`; OpenAI's, :mod:`~fastbert.serve.routes_openai`; Cohere's,
:mod:`~fastbert.serve.routes_cohere`), ``/info``, ``/health`` and ``/metrics``, the API key and
body checks, and every error's answer in the route's shape.

Every inference answer carries its timings (``x-total-time``, ``x-tokenization-time``,
``x-queue-time``, ``x-inference-time``, in ms) and its token count (``x-compute-tokens``).
This module imports FastAPI (the ``fastbert[serve]`` extra): nothing imports it until a
server starts.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException

from fastbert.embedding.text_model import TextModel
from fastbert.serve import errors, routes_cohere, routes_openai, routes_tei
from fastbert.serve.info import info_of
from fastbert.serve.options import ServeOptions
from fastbert.serve.service import ClientGone, Server
from fastbert.version import __version__

log = logging.getLogger("fastbert.serve")
# What a request whose client went away gets (nobody reads it), as nginx logs such requests.
CLIENT_GONE = 499
# OpenAI's own routes: a request they refuse gets 400, as OpenAI's API answers (TEI's routes,
# and the Cohere-shaped ones, keep TEI's 422).
OPENAI_ROUTES = ("/v1/embeddings", "/v1/models")


def create_app(model: TextModel, options: ServeOptions) -> Any:
    """The FastAPI app serving ``model`` with ``options``' limits (the batcher starts and stops
    with the app's lifespan)."""
    server = Server(model, options)

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
            "Dense, sparse and multi-vector embeddings, rerank scores and classifications from "
            "a BERT-family model, in Hugging Face text-embeddings-inference's, OpenAI's and "
            "Cohere's shapes."
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
        if content_type is None:  # FastAPI would not parse the body (as TEI: a 415)
            raise errors.UnsupportedMediaType(
                "send the body as JSON (Content-Type: application/json); the request has no "
                "Content-Type"
            )
        kind = content_type.split(";")[0].strip().lower()
        if kind != "application/json" and not kind.endswith("+json"):
            raise errors.UnsupportedMediaType(
                f"send the body as JSON (Content-Type: application/json), not {kind!r}"
            )

    async def check_key_and_json(request: Request) -> None:  # one dependency costs less than two
        await check_key(request)
        await check_json(request)

    guarded = [Depends(check_key)]
    posted = [Depends(check_key_and_json)]
    routes_tei.register(app, server, posted)
    routes_openai.register(app, server, posted, guarded)
    routes_cohere.register(app, server, posted)

    @app.get("/info", dependencies=guarded, tags=["TEI"])
    async def info() -> dict[str, Any]:
        """The model, its kind and its settings (prompts, dimensions, int8 / uint8 ranges),
        and the server's limits."""
        return info_of(server)

    # GET / and /ping too, as TEI answers them (the Inference API's and SageMaker's probes).
    # HEAD is left out of the schema: one function for two methods gave two operations of one
    # operationId, which OpenAPI validators and client generators refuse.
    @app.get("/health", tags=["TEI"])
    @app.head("/health", tags=["TEI"], include_in_schema=False)
    @app.api_route("/", methods=["GET", "HEAD"], tags=["TEI"], include_in_schema=False)
    @app.api_route("/ping", methods=["GET", "HEAD"], tags=["TEI"], include_in_schema=False)
    async def health() -> Response:
        """200 while the model answers; 503 after a failed forward until a probe succeeds
        (HEAD too, as load balancers' and orchestrators' probes may send)."""
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
        if request.method == "POST":  # an alias answers and is counted as the route it runs
            path = server.aliases.get(path, path)
        route = path if path in app.state.known_routes else "other"
        server.metrics.failures.labels(route, error.error_type).inc()
        openai_shaped = path.startswith(("/v1/", "/v2/"))
        body = error.openai_body() if openai_shaped else error.tei_body()
        status = error.status
        if status == 422 and path.startswith(OPENAI_ROUTES):
            status = 400  # OpenAI answers a request it refuses 400: its client's BadRequestError
        log.info("%s %d %s", path, status, error.message)
        return Response(
            orjson.dumps(body), status, headers=error.headers, media_type="application/json"
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
        encoding = request.headers.get("content-encoding", "identity").strip().lower()
        if error.status_code == 400 and encoding != "identity":  # read as text, not unpacked
            return error_response(
                request,
                errors.UnsupportedMediaType(
                    f"send the body uncompressed: this server does not read Content-Encoding "
                    f"{encoding!r}"
                ),
            )
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
    return Counted(PayloadLimit(app, options.payload_limit, error_response), server)


class Counted:
    """ASGI middleware: counts the HTTP requests ``server`` is answering and has answered
    (``in_flight``, ``answered``), for the line the server logs when it shuts down."""

    def __init__(self, app: Any, server: Server):
        self.app = app
        self.server = server
        self.state = app.state

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.server.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.server.in_flight -= 1
            self.server.answered += 1


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
        if problem.get("type") == "unknown_field" and where == "body":  # its message names it
            parts.append(str(problem.get("msg")))
        else:
            parts.append(f"{where}: {problem.get('msg')}")
    param = ".".join(str(x) for x in problems[0].get("loc", ())[1:2]) if problems else None
    if not param and problems and problems[0].get("type") == "unknown_field":
        param = problems[0]["ctx"]["unknown"].split(", ")[0]  # the body's: its first unknown
    return errors.ValidationFailed("; ".join(parts), param=param or None)
