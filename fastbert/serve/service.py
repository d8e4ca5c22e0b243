"""What every route shares: the :class:`Server` (the model, the limits, the batcher, the
tokenizer threads, the metrics, the int8 / uint8 calibration) and the steps of a request
(check the route, the model name, the dimensions and the prompt; tokenise; run in the
batcher's model thread; reply with the timing headers).

The event loop parses, admits and replies, and tokenises a request of at most
INLINE_CHARACTERS characters itself; longer ones are tokenised in a small pool of threads, the
forward passes run in the batcher's model thread (:mod:`~fastbert.serve.batcher`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
from fastapi.responses import Response

from fastbert.embedding.text_model import Prompting, TextModel, article
from fastbert.model.sentence_folder import CLASSIFICATION, EMBEDDING, MULTI_VECTOR, SPARSE
from fastbert.serve import errors, inputs
from fastbert.serve.batcher import Batcher, Reservation
from fastbert.serve.calibration import Calibration
from fastbert.serve.metrics import Metrics
from fastbert.serve.options import ServeOptions

log = logging.getLogger("fastbert.serve")

# The routes each kind of model serves.
ROUTES = {
    EMBEDDING: ("/embed", "/v1/embeddings", "/v2/embed", "/similarity"),
    SPARSE: ("/embed_sparse",),
    MULTI_VECTOR: ("/embed_all",),
    CLASSIFICATION: ("/rerank", "/v1/rerank", "/predict"),
}
RERANK_ROUTES = ("/rerank", "/v1/rerank")
# Who serves a route: the kind of model it needs, as error messages name it.
NEEDS = {
    "/embed": "an embedding model",
    "/v1/embeddings": "an embedding model",
    "/v2/embed": "an embedding model",
    "/similarity": "an embedding model",
    "/embed_sparse": "a sparse model (SPLADE)",
    "/embed_all": "a multi-vector model (ColBERT)",
    "/rerank": "a classification model (a cross-encoder)",
    "/v1/rerank": "a classification model (a cross-encoder)",
    "/predict": "a classification model (a cross-encoder)",
}
NUMPY_JSON = orjson.OPT_SERIALIZE_NUMPY
# A request whose texts hold at most this many characters is tokenised on the event loop: that
# takes about a tenth of a millisecond, less than handing it to a tokenizer thread and back
# (two thread switches, right after a forward pass has filled the caches with weights).
INLINE_CHARACTERS = 256


@dataclass
class Timing:
    """Where a request's time went, in seconds, and how many inputs and tokens it ran."""

    start: float = field(default_factory=time.perf_counter)
    tokenization: float = 0.0
    queue: float = 0.0
    inference: float = 0.0
    inputs: int = 0
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


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


class Server:
    """What the routes share: the model, the limits, the batcher, the tokenizer threads, the
    metrics and (a dense model's, once :meth:`warm_up` ran) the int8 / uint8 calibration."""

    def __init__(self, model: TextModel, options: ServeOptions):
        self.model = model
        self.options = options
        self.name = options.model_name()
        self.created = int(time.time())
        self.limits = inputs.Limits(options.max_client_batch_size, options.auto_truncate)
        self.metrics = Metrics()
        self.calibration: Calibration | None = None
        max_tokens = options.max_queued_tokens or (
            options.max_concurrent_requests * model.max_length
        )
        self.batcher = Batcher(
            self._forward,
            model.options.batch_tokens,
            options.max_concurrent_requests,
            max_tokens,
            self.metrics.on_batch,
            model.packed,
        )
        self.pool = ThreadPoolExecutor(options.tokenize_workers, "fastbert-tokenize")
        self.probe = model.tokenize(["health"]).ids
        # POST paths that run another route (TEI's /, /invocations): counted as that route.
        self.aliases: dict[str, str] = {}
        # HTTP requests being answered, and answered since the start (the shutdown's line).
        self.in_flight = 0
        self.answered = 0

    def _forward(
        self, tokens: list[list[int]], type_ids: list[list[int]] | None, variant: Any
    ) -> Any:
        if self.model.kind == CLASSIFICATION:
            return self.model.classify_tokens(tokens, type_ids)
        return self.model.embed_tokens(tokens, variant)

    def warm_up(self) -> None:
        """One forward pass before the first request, so that it does not pay for the first
        call's setup; then, for a dense model, the int8 / uint8 calibration."""
        types = [[0] * len(self.probe[0])] if self.model.kind == CLASSIFICATION else None
        self._forward(self.probe, types, None)
        if self.model.kind == EMBEDDING:
            self.calibration = Calibration.of(self.model, self.options.calibration)

    @property
    def routes(self) -> tuple[str, ...]:
        """The routes this server answers: its kind's, less reranking for a classifier with
        several labels (reranking reads one score per pair; /predict serves such a model)."""
        routes = ROUTES[self.model.kind]
        if self.model.kind == CLASSIFICATION and len(self.model.labels) != 1:
            return tuple(route for route in routes if route not in RERANK_ROUTES)
        return routes

    # -- checks, before any work ------------------------------------------------------------

    def require(self, route: str) -> None:
        """ModelFailed (424) when this server's model does not serve ``route``."""
        if route not in ROUTES[self.model.kind]:
            raise errors.ModelFailed(
                f"this server's model ({self.name}) is {article(self.model.kind)} model; "
                f"{route} needs {NEEDS[route]}"
            )

    def check_model(self, name: str | None) -> None:
        """ModelNotFound (404) when a request names a model other than this server's (unless
        it was started to accept any name)."""
        if name is None or name == self.name or self.options.accept_any_model:
            return
        raise errors.ModelNotFound(
            f"the model {name!r} does not exist: this server serves {self.name!r} (GET /v1/models)",
            param="model",
        )

    def dimensions_of(self, dimensions: int | None, param: str) -> int | None:
        """The width a request's embeddings are cut to: ``dimensions``, else the model's own
        (a folder's truncate_dim; None: not cut). ValidationFailed (422) for a cut wider than
        the embeddings, or of a model whose card does not say it is Matryoshka-trained (unless
        the server allows any)."""
        if dimensions is None:
            return self.model.options.dimensions
        width = self.model.full_dimensions
        if dimensions > width:
            raise errors.ValidationFailed(
                f"{param} {dimensions} is more than the model's {width}", param=param
            )
        if dimensions == width or self.model.spec.matryoshka:
            return dimensions
        if not self.options.allow_any_dimensions:
            raise errors.ValidationFailed(
                f"{param} {dimensions}: this server's model ({self.name}) has no model card "
                "saying it was trained to be cut to fewer dimensions (Matryoshka), and cut "
                "embeddings of such a model lose more accuracy; start the server with "
                "--allow-any-dimensions to cut them anyway",
                param=param,
            )
        return dimensions

    def prompting(
        self, prompt_name: str | None, prompt: str | None = None, param: str = "prompt_name"
    ) -> Prompting:
        """The prompt a request names (None: the folder's default); ValidationFailed (422)
        naming a name the folder does not have."""
        try:
            return self.model.prompting(prompt_name, prompt)
        except ValueError as exc:
            raise errors.ValidationFailed(str(exc), param=param) from exc

    def prompting_of(self, items: list, prompting: Prompting, field: str) -> Prompting:
        """The prompting a request's ``items`` run with: token-id inputs carry no prompt, so
        a request of token ids only runs with none to leave out of the pooling.
        ValidationFailed for texts and token ids in one request when the model's pooling
        leaves a prompt out (one batch runs with one prompt length)."""
        ids = [isinstance(item, list) for item in items]
        if not any(ids) or not prompting.length:
            return prompting
        if all(ids):
            return replace(prompting, text="", length=0)
        if self.model.pools_without_prompt:
            raise errors.ValidationFailed(
                f"{field} mixes texts and token ids, and this model's pooling leaves the "
                "prompt of the texts out: send them in separate requests",
                param=field,
            )
        return prompting

    def truncating(self, truncate: bool | None) -> bool:
        return self.options.auto_truncate if truncate is None else truncate

    # -- running ----------------------------------------------------------------------------

    async def embed_inputs(
        self,
        request: Any,
        timing: Timing,
        route: str,
        raw_inputs: Any,
        field: str,
        truncate: bool | None,
        direction: str | None,
        prompting: Prompting,
    ) -> Any:
        """What the model gives for a request's inputs (validated, tokenised after the prompt,
        run with it): a dense model's pooled embeddings [n, hidden], a sparse model's rows of
        (indices, values), a multi-vector model's [tokens, dimensions] arrays."""
        self.require(route)
        items = inputs.as_list(raw_inputs)
        inputs.check_count(items, self.limits, field)
        prompting = self.prompting_of(items, prompting, field)
        return await self.tokenize_and_run(
            request,
            timing,
            len(items),
            prompting,
            inputs.tokenize,
            self.model,
            items,
            self.truncating(truncate),
            direction,
            field,
            prompting,
            characters=inputs.characters(items) + len(prompting.text) * len(items),
        )

    async def tokenize(
        self, timing: Timing, function: Callable, *args: Any, characters: int | None = None
    ) -> Any:
        """``function(*args)``, timed: on the event loop when the request's text is at most
        INLINE_CHARACTERS long (``characters``), else in a tokenizer thread."""
        start = time.perf_counter()
        try:
            if characters is not None and characters <= INLINE_CHARACTERS:
                return function(*args)
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.pool, function, *args)
        finally:
            timing.tokenization = time.perf_counter() - start
            self.metrics.tokenize_seconds.observe(timing.tokenization)

    async def tokenize_and_run(
        self,
        request: Any,
        timing: Timing,
        count: int,
        variant: Any,
        function: Callable,
        *args: Any,
        characters: int | None = None,
    ) -> Any:
        """Admit ``count`` inputs (429 at once past the bound, before any work), tokenise them
        with ``function(*args)`` -> token ids (or (token ids, token types)), and run them with
        ``variant``. ``characters``: the length of the request's text (see :meth:`tokenize`)."""
        reservation = self.batcher.reserve(count)
        try:
            tokens = await self.tokenize(timing, function, *args, characters=characters)
        except BaseException:
            self.batcher.release(reservation)
            raise
        ids, types = tokens if isinstance(tokens, tuple) else (tokens, None)
        return await self.run(request, timing, ids, types, reservation, variant)

    async def run(
        self,
        request: Any,
        timing: Timing,
        tokens: list[list[int]],
        type_ids: list[list[int]] | None = None,
        reservation: Reservation | None = None,
        variant: Any = None,
    ) -> Any:
        """The model's rows for ``tokens``, batched with whatever else waits. Raises
        Overloaded (429) at once when the queue is full, ModelFailed when the forward fails,
        and ClientGone when the client disconnects first (its inputs are dropped, as they are
        when the server cancels the request: Ray Serve does when its client goes away)."""
        work = self.batcher.submit(tokens, type_ids, reservation, variant)
        timing.inputs, timing.tokens = len(tokens), work.token_count
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

    def reply(self, content: Any, timing: Timing, route: str) -> Response:
        """200 with ``content`` as JSON (bytes: already JSON), the timing headers, counted."""
        body = content if isinstance(content, bytes) else orjson.dumps(content, option=NUMPY_JSON)
        self.metrics.requests.labels(route).inc()
        seconds = time.perf_counter() - timing.start
        self.metrics.request_seconds.labels(route).observe(seconds)
        log.info(
            "%s 200 %d inputs %d tokens %.1f ms", route, timing.inputs, timing.tokens, seconds * 1e3
        )
        return Response(body, media_type="application/json", headers=timing.headers())

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


async def _disconnected(request: Any) -> None:
    """Returns when the client of ``request`` (whose body has been read) disconnects."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
