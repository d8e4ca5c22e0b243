"""Dynamic batching: one model thread turns the inputs of every waiting request into
token-budget batches and resolves each request with its own rows.

The event loop admits a request only while the inputs and tokens admitted and not yet answered
stay within their bounds: its inputs reserve room before they are tokenised
(:meth:`Batcher.reserve`), its tokens when it is queued (:meth:`Batcher.submit`); past either
bound it gets :class:`~fastbert.serve.errors.Overloaded` at once, so memory, and the work a
request costs before it is refused, stay bounded under any load.
The model thread takes, each time it is free, the batch of waiting inputs that holds the
oldest one: waiting inputs sorted by length and grouped so that the batch's rows in the
forward pass stay within ``batch_tokens`` (its tokens on the packed path; rows x longest row on
the padded one, where length-sorted batches hold little padding); taking the oldest input's
batch first means no input waits behind later ones forever. A batch holds inputs of one
``variant`` only (what the forward pass runs them with: a request's prompt), the oldest's.
Inputs of a request whose client went away are dropped before their batch runs.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fastbert.embedding.batching import pass_rows, token_batches
from fastbert.serve.errors import ModelFailed, Overloaded, ShuttingDown

# forward(token ids, token type ids or None, variant) -> rows [n, ...] (float32)
Forward = Callable[[list[list[int]], "list[list[int]] | None", Hashable], np.ndarray]


@dataclass
class Work:
    """The inputs of one request, waiting for (or in) the model. ``future`` resolves, on the
    event loop, with the rows of every input in order ([n, ...]), or fails with ModelFailed.
    ``queue_seconds``: from admission to the first batch that held one of its inputs;
    ``inference_seconds``: the time of the batches that held them; ``variant``: what the
    forward pass runs them with (inputs of other variants never share a batch)."""

    tokens: list[list[int]]
    type_ids: list[list[int]] | None
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    variant: Hashable = None
    admitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    rows: list[Any] = field(default_factory=list)
    remaining: int = 0
    queue_seconds: float = 0.0
    inference_seconds: float = 0.0
    started: bool = False

    def __post_init__(self) -> None:
        self.rows = [None] * len(self.tokens)
        self.remaining = len(self.tokens)

    @property
    def token_count(self) -> int:
        return sum(len(t) for t in self.tokens)


@dataclass
class Reservation:
    """Room for ``count`` inputs in the admission bound, taken before tokenisation."""

    count: int
    used: bool = False


@dataclass
class _Input:
    work: Work
    row: int

    @property
    def length(self) -> int:
        return len(self.work.tokens[self.row])


class Batcher:
    """The model thread and its queue.

    ``forward``: runs one batch; ``batch_tokens``: the budget of one forward pass (its rows:
    the inputs' tokens when ``packed``, rows x longest row when not); ``max_inputs`` /
    ``max_tokens``: the bounds on inputs (and their tokens) admitted and not yet answered;
    ``on_batch(inputs, rows, seconds)``: told of each forward pass. Start with :meth:`start`,
    stop with :meth:`stop` (it finishes what was admitted first).
    """

    def __init__(
        self,
        forward: Forward,
        batch_tokens: int,
        max_inputs: int,
        max_tokens: int,
        on_batch: Callable[[int, int, float], None] | None = None,
        packed: bool = False,
    ):
        self.forward = forward
        self.batch_tokens = batch_tokens
        self.packed = packed
        self.max_inputs = max_inputs
        self.max_tokens = max_tokens
        self.on_batch = on_batch or (lambda inputs, tokens, seconds: None)
        self.healthy = True
        self._waiting: deque[_Input] = deque()
        self._admitted_inputs = 0
        self._admitted_tokens = 0
        self._tokens_per_second = 0.0
        self._condition = threading.Condition()
        self._stopping = False
        self._first: Callable[[], None] | None = None
        self._first_error: BaseException | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fastbert-model", daemon=True)

    # -- the event loop's side ------------------------------------------------------------

    def start(self, first: Callable[[], None] | None = None) -> None:
        """Start the model thread. It runs ``first`` (a warm-up forward pass) before any batch
        and this returns once it has, raising what ``first`` raised (the thread then ends).
        Every forward pass runs on this one thread: on a CPU, torch gives each calling thread
        a team of OpenMP threads, and with more teams than cores libgomp stops spin-waiting
        between parallel regions (see docs/serve.md, CPU threads)."""
        self._first = first
        self._thread.start()
        self._ready.wait()
        if self._first_error is not None:
            raise self._first_error

    def stop(self, timeout: float | None = None) -> None:
        """Stop admitting; the model thread finishes the admitted inputs, then ends."""
        with self._condition:
            self._stopping = True
            self._condition.notify()
        self._thread.join(timeout)

    @property
    def admitted(self) -> tuple[int, int]:
        """(inputs, tokens) admitted and not yet answered."""
        with self._condition:
            return self._admitted_inputs, self._admitted_tokens

    def reserve(self, count: int) -> Reservation:
        """Room for a request's ``count`` inputs, taken before they are tokenised (called on
        the event loop), so that a request past the bound costs no tokenisation: Overloaded
        when the input bound would be passed (a request that alone passes it is let in when
        nothing else waits), ShuttingDown after :meth:`stop`. Hand it to :meth:`submit`, or
        give it back with :meth:`release`."""
        with self._condition:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if self._admitted_inputs + count > self.max_inputs and self._admitted_inputs > 0:
                raise self._overloaded()
            self._admitted_inputs += count
        return Reservation(count)

    def release(self, reservation: Reservation) -> None:
        """Give back a reservation that will not be submitted (its request failed first)."""
        with self._condition:
            if not reservation.used:
                reservation.used = True
                self._admitted_inputs -= reservation.count

    def submit(
        self,
        tokens: list[list[int]],
        type_ids: list[list[int]] | None = None,
        reservation: Reservation | None = None,
        variant: Hashable = None,
    ) -> Work:
        """Queue one request's inputs (called on the event loop), within ``reservation`` (made
        here when None), to run with ``variant`` (handed to the forward pass); Overloaded when
        the token bound would be passed (the reservation is given back), ShuttingDown after
        :meth:`stop`."""
        reservation = reservation or self.reserve(len(tokens))
        loop = asyncio.get_running_loop()
        work = Work(tokens, type_ids, loop.create_future(), loop, variant)
        with self._condition:
            if reservation.used or reservation.count != len(tokens):
                raise ValueError("a reservation is for one submit of its own inputs")
            tokens_full = self._admitted_tokens + work.token_count > self.max_tokens
            if (self._stopping or tokens_full) and self._admitted_tokens > 0:
                reservation.used = True
                self._admitted_inputs -= reservation.count
                if self._stopping:
                    raise ShuttingDown("the server is shutting down")
                raise self._overloaded()
            reservation.used = True
            self._admitted_tokens += work.token_count
            self._waiting.extend(_Input(work, row) for row in range(len(tokens)))
            self._condition.notify()
        return work

    def _overloaded(self) -> Overloaded:
        return Overloaded(
            f"the server is busy: {self._admitted_inputs} inputs "
            f"({self._admitted_tokens} tokens) are waiting; try again later",
            headers={"Retry-After": str(self._retry_after())},
        )

    def cancel(self, work: Work) -> None:
        """Drop a request's inputs that no batch has taken yet (its client went away)."""
        with self._condition:
            work.cancelled = True
            self._drop_waiting(work)

    def _drop_waiting(self, work: Work) -> None:
        """Remove ``work``'s inputs from the queue and free their admission (condition
        held)."""
        rows = [item.row for item in self._waiting if item.work is work]
        if rows:
            self._waiting = deque(item for item in self._waiting if item.work is not work)
            self._release(work, rows)

    def _retry_after(self) -> int:
        """Seconds until the admitted tokens are likely done (at least 1)."""
        if self._tokens_per_second <= 0:
            return 1
        return max(1, math.ceil(self._admitted_tokens / self._tokens_per_second))

    # -- the model thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self._first is not None:
                self._first()
        except BaseException as exc:  # handed to start()'s caller
            self._first_error = exc
            return
        finally:
            self._ready.set()
        while True:
            with self._condition:
                while not self._waiting and not self._stopping:
                    self._condition.wait()
                if not self._waiting:  # stopping, and nothing left
                    return
                batch = self._take_batch()
            self._run_batch(batch)

    def _take_batch(self) -> list[_Input]:
        """Remove and return the batch (within the budget) holding the oldest waiting input,
        of inputs of its variant."""
        variant = self._waiting[0].work.variant
        waiting = [item for item in self._waiting if item.work.variant == variant]
        lengths = [item.length for item in waiting]
        for positions in token_batches(lengths, self.batch_tokens, self.packed):
            if 0 in positions:
                chosen = {id(waiting[i]) for i in positions}
                self._waiting = deque(item for item in self._waiting if id(item) not in chosen)
                return [waiting[i] for i in positions]
        raise AssertionError("token_batches lost an input")

    def _run_batch(self, batch: list[_Input]) -> None:
        start = time.perf_counter()
        for item in batch:
            if not item.work.started:
                item.work.started = True
                item.work.queue_seconds = start - item.work.admitted
        tokens = [item.work.tokens[item.row] for item in batch]
        with_types = batch[0].work.type_ids is not None
        type_ids = [item.work.type_ids[item.row] for item in batch] if with_types else None
        try:
            rows = self.forward(tokens, type_ids, batch[0].work.variant)
            error = None
        except Exception as exc:  # every request in the batch is told; the server lives on
            rows, error = None, exc
        seconds = time.perf_counter() - start
        lengths = [len(t) for t in tokens]
        self.on_batch(len(batch), pass_rows(lengths, self.packed), seconds)
        with self._condition:
            self.healthy = error is None
            if error is None and seconds > 0:
                rate = sum(lengths) / seconds
                self._tokens_per_second = 0.8 * self._tokens_per_second + 0.2 * rate
            done: dict[int, tuple[Work, list[int]]] = {}
            for i, item in enumerate(batch):
                if error is None:
                    item.work.rows[item.row] = rows[i]
                done.setdefault(id(item.work), (item.work, []))[1].append(item.row)
            for work, work_rows in done.values():
                work.inference_seconds += seconds
                self._release(work, work_rows, error)
                if error is not None:  # the request has failed: its other inputs need not run
                    self._drop_waiting(work)

    def _release(self, work: Work, rows: list[int], error: Exception | None = None) -> None:
        """``rows`` of ``work``'s inputs are done (or dropped): free their admission; resolve
        the request when none is left, or fail it with ``error`` (condition held)."""
        self._admitted_inputs -= len(rows)
        self._admitted_tokens -= sum(len(work.tokens[r]) for r in rows)
        work.remaining -= len(rows)
        if error is not None:
            failure = ModelFailed(f"the model failed: {type(error).__name__}: {error}")
            _call_on_loop(work.loop, _fail, work.future, failure)
        elif work.remaining == 0 and not work.cancelled:
            _call_on_loop(work.loop, _resolve, work.future, work.rows)


def _call_on_loop(loop: asyncio.AbstractEventLoop, function: Callable, *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(function, *args)
    except RuntimeError:  # the loop has closed: nobody waits for the answer any more
        pass


def _resolve(future: asyncio.Future, rows: list[Any]) -> None:
    """The request's answer: its rows stacked when each is one vector (an embedding, a row of
    logits), else the list of them (a sparse row's (indices, values), a row's token vectors)."""
    if not future.done():
        one_each = all(isinstance(r, np.ndarray) and r.ndim == 1 for r in rows)
        future.set_result(np.stack(rows) if one_each else rows)


def _fail(future: asyncio.Future, error: Exception) -> None:
    if not future.done():
        future.set_exception(error)
