"""The load generator of benchmarks/serve_bench.py: asyncio and a minimal HTTP/1.1 client of
its own (:class:`Client`: keep-alive connections, one pool), run in a process of its own
(:class:`Generator`) so that the client's work is not the server's.

The client is this module's own rather than httpx because the generator shares the CPU with
the servers it measures: on a 2-core machine httpx's per-request work kept an open loop at a
few hundred requests/s from sending on time, and the servers lost CPU to it.

Two ways to send, over a fixed window after a warm-up:

- closed loop (:func:`closed_loop`): ``concurrency`` workers, each sending its next request when
  its previous one has answered (after a 429, when its Retry-After has passed, as a client
  that backs off would). A request counts in the window when its answer arrives in it;
  latency is from the send to the end of the answer.
- open loop (:func:`open_loop`): requests sent at a fixed mean arrival rate, whatever the
  answers; the gaps between intended send times are exponential (a Poisson process, seeded),
  so bursts happen as they do with independent clients. A request counts in the window when its
  intended send time falls in it, and is waited for after the window (up to ``drain`` seconds);
  its latency is from the intended send time to the end of the answer (so a client that could
  not send on time, or a server that queues, does not hide the wait: no coordinated omission),
  and the service time from the actual send is kept beside it.

Throughput (requests/s, inputs/s, tokens/s) is the ok answers that arrived in the window, over
the window, in both loops: in an open loop past capacity it is what the server served, not
what was offered (``offered_rate``).

A request is ok when the server answers 200 with a body of the expected shape (one result per
input); everything else is counted by its status code (``"429"``, ``"500"``...), or as
``"bad-response"`` (200 with the wrong shape), ``"timeout"``, ``"connect"`` (no connection) or
``"unfinished"`` (open loop: no answer by the end of the drain). This module imports only the
standard library.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

# The shapes of an answer the generator checks: where the list of results is.
SHAPE_LIST = "list"  # TEI: the body is the list ([[float]] or [{"index", "score"}])
SHAPE_DATA = "data"  # OpenAI embeddings: {"data": [...]}
SHAPE_RESULTS = "results"  # infinity-emb's (Cohere's) rerank: {"results": [...]}
MAX_RETRY_AFTER = 5.0  # seconds: a closed-loop worker waits at most this long after a 429


@dataclass(frozen=True)
class Call:
    """One request ready to send: route, JSON body, what it holds and the answer's shape."""

    path: str
    body: bytes
    inputs: int  # texts embedded, or documents scored
    tokens: int  # tokens the model sees (counted by the client's tokenizer)
    shape: str = SHAPE_LIST


@dataclass(frozen=True)
class Plan:
    """One cell: where, what, and how to send it."""

    base_url: str
    calls: tuple[Call, ...]  # sent in turn, round and round
    mode: str  # "closed" or "open"
    concurrency: int = 1  # closed loop
    rate: float = 0.0  # open loop: mean arrivals per second
    seconds: float = 15.0  # the measured window
    warmup: float = 3.0  # sent before the window, not counted (closed loop: at least)
    min_rounds: float = 3.0  # closed loop: the window lasts at least this many median latencies
    seed: int = 0
    timeout: float = 120.0  # per request
    drain: float | None = None  # open loop: wait this long for answers after the last send
    # The open loop's pool (a closed loop uses one connection per worker): larger than what a
    # server under test admits (512 inputs is TEI's and fastbert's bound), so that requests
    # past its capacity reach it and meet its admission control, instead of waiting here for
    # a free connection (a wait that would count as their latency, and keep the server from
    # ever seeing more than the pool).
    max_connections: int = 4096
    keep_samples: bool = False  # return each request's record (the tests read them)


@dataclass
class Record:
    """What happened to one request (times in seconds on the generator's monotonic clock)."""

    intended: float  # when it was meant to go (closed loop: when it went)
    start: float  # when it was handed to the client
    end: float  # when the answer had been read (or the error raised)
    outcome: str  # "ok" or an error key
    inputs: int
    tokens: int


@dataclass
class Result:
    """A cell's counts and latencies (seconds), as measured by the generator."""

    mode: str
    window_s: float
    window: tuple[float, float]  # its start and end on the generator's clock
    sent_total: int  # every request sent, warm-up and drain included
    counted: int  # requests counted in the window (see _result): ok + errors
    ok: int
    errors: dict[str, int] = field(default_factory=dict)
    answered: int = 0  # ok answers that arrived in the window (the throughput)
    inputs: int = 0  # of those answers
    tokens: int = 0
    latencies: list[float] = field(default_factory=list)  # of the ok counted, sorted
    service: list[float] = field(default_factory=list)  # open loop: from the actual send
    send_lag: list[float] = field(default_factory=list)  # open loop: actual - intended send
    offered_rate: float | None = None  # open loop: requests meant to go per second
    samples: list[Record] | None = None


def percentile(sorted_values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) of already sorted values, linear between ranks (numpy's
    default); None for no values."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


def summary(result: Result) -> dict:
    """Requests/s, inputs/s, tokens/s, p50/p90/p99 (ms) and error counts of a cell."""
    lat = result.latencies
    window = result.window_s
    out = {
        "mode": result.mode,
        "window_s": window,
        "sent_total": result.sent_total,
        "counted": result.counted,
        "ok": result.ok,
        "errors": dict(sorted(result.errors.items())),
        "rejected_429": result.errors.get("429", 0),
        "other_errors": sum(n for key, n in result.errors.items() if key != "429"),
        "answered": result.answered,
        "requests_per_s": result.answered / window,
        "inputs_per_s": result.inputs / window,
        "tokens_per_s": result.tokens / window,
    }
    for q in (50, 90, 99):
        value = percentile(lat, q)
        out[f"p{q}_ms"] = None if value is None else value * 1e3
    out["max_ms"] = lat[-1] * 1e3 if lat else None
    if result.mode == "closed":
        # How many rounds of requests (median latencies) the window held.
        p50 = percentile(lat, 50)
        out["window_rounds"] = window / p50 if p50 else None
    if result.mode == "open":
        out["offered_rate"] = result.offered_rate
        for q in (50, 99):
            value = percentile(result.service, q)
            out[f"service_p{q}_ms"] = None if value is None else value * 1e3
        # How late the generator itself sent (a client that cannot keep up inflates latency).
        value = percentile(result.send_lag, 99)
        out["send_lag_p99_ms"] = None if value is None else value * 1e3
    return out


def _check(body: bytes, call: Call) -> bool:
    """Whether a 200's body holds one result per input, where its shape says."""
    try:
        value = json.loads(body)
        if call.shape != SHAPE_LIST:
            value = value[call.shape]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(value, list) and len(value) == call.inputs


class Client:
    """A minimal HTTP/1.1 client for one server: ``post(path, body)`` sends a JSON POST on a
    kept-alive connection (at most ``connections`` open; a caller past that waits for one, and
    that wait counts as latency) and returns (status, lower-cased headers, body). A response is
    read by its Content-Length or chunked; ``timeout`` bounds each request's exchange. A reused
    connection that the server closed meanwhile (its keep-alive timeout) is replaced once,
    before any byte of an answer has arrived, as browsers and httpx do."""

    def __init__(self, base_url: str, connections: int, timeout: float) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"the load generator speaks plain http://host:port, not {base_url!r}")
        self.host, self.port = url.hostname, url.port or 80
        self.timeout = timeout
        self._slots = asyncio.Semaphore(connections)
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._head = (
            f"Host: {self.host}:{self.port}\r\nContent-Type: application/json\r\nContent-Length: "
        )

    async def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        request = f"POST {path} HTTP/1.1\r\n{self._head}{len(body)}\r\n\r\n".encode() + body
        async with self._slots:
            reused = bool(self._idle)
            try:
                return await asyncio.wait_for(self._exchange(request), self.timeout)
            except (ConnectionError, asyncio.IncompleteReadError) as error:
                stale = reused and getattr(error, "partial", b"") == b""
                if not stale:
                    raise
                return await asyncio.wait_for(self._exchange(request, fresh=True), self.timeout)

    async def _exchange(self, request: bytes, fresh: bool = False):
        if self._idle and not fresh:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            writer.write(request)
            status, headers, body = await _read_response(reader)
        except BaseException:
            writer.close()
            raise
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            self._idle.append((reader, writer))
        return status, headers, body

    async def aclose(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Status, headers (names lower-cased) and body of one HTTP/1.1 response."""
    line = await reader.readuntil(b"\r\n")
    status = int(line.split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while (line := await reader.readuntil(b"\r\n")) != b"\r\n":
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
            pass
        return status, headers, b"".join(chunks)
    return status, headers, await reader.readexactly(int(headers.get("content-length", 0)))


async def _send(client: Client, call: Call) -> tuple[str, float]:
    """The outcome of one request, and the seconds a 429 asks to wait (Retry-After; 0.1 when
    it names none), else 0."""
    try:
        status, headers, body = await client.post(call.path, call.body)
    except asyncio.TimeoutError:
        return "timeout", 0.0
    except (ConnectionRefusedError, OSError) as exc:
        return ("connect" if isinstance(exc, ConnectionRefusedError) else type(exc).__name__), 0.0
    except (asyncio.IncompleteReadError, ValueError) as exc:
        return type(exc).__name__, 0.0
    if status == 429:
        try:
            wait = float(headers.get("retry-after", ""))
        except ValueError:
            wait = 0.1
        return "429", min(max(wait, 0.0), MAX_RETRY_AFTER)
    if status != 200:
        return str(status), 0.0
    return ("ok" if _check(body, call) else "bad-response"), 0.0


def _client(plan: Plan, connections: int) -> Client:
    return Client(plan.base_url, connections, plan.timeout)


async def closed_loop(plan: Plan) -> Result:
    """``plan.concurrency`` workers, each sending its next call when the previous answers; the
    calls taken in turn (worker i starts at call i). The warm-up lasts ``plan.warmup`` seconds
    and at least until every worker has had one answer (so that the window starts in the
    steady state even where one round of requests takes longer than the warm-up); the window
    lasts ``plan.seconds`` and at least ``plan.min_rounds`` times the median latency of the
    answers it holds (one round of requests)."""
    records: list[Record] = []
    window = [math.inf, math.inf]
    answered_once: set[int] = set()
    everyone = asyncio.Event()
    async with _client(plan, plan.concurrency) as client:

        async def worker(i: int) -> None:
            k = i
            while time.perf_counter() < window[1]:
                call = plan.calls[k % len(plan.calls)]
                k += plan.concurrency
                start = time.perf_counter()
                outcome, retry_after = await _send(client, call)
                end = time.perf_counter()
                records.append(Record(start, start, end, outcome, call.inputs, call.tokens))
                answered_once.add(i)
                if len(answered_once) == plan.concurrency:
                    everyone.set()
                if retry_after:  # a client told to come back later does
                    await asyncio.sleep(retry_after)

        async def clock() -> None:
            await asyncio.sleep(plan.warmup)
            await everyone.wait()
            # Answers of a batching server come in bursts a round apart: a window of a few
            # rounds at least counts whole bursts, not the luck of where the window falls.
            # A round is the median latency of the window's own answers (the warm-up's, met
            # by an empty queue, were a fraction of it under load), so the end moves out until
            # the window holds min_rounds of them; it is decided a round before the end, while
            # every worker is still sending.
            window[0] = time.perf_counter()
            window[1] = window[0] + max(plan.seconds, plan.min_rounds * _median_latency(records))
            while True:
                round_ = _median_latency(r for r in records if r.end >= window[0])
                guard = (window[1] - window[0]) / 2 if round_ is None else round_
                await asyncio.sleep(max(0.0, window[1] - guard - time.perf_counter()))
                round_ = _median_latency(r for r in records if r.end >= window[0])
                if round_ is None:  # no answer yet: a round is longer than the window so far
                    window[1] += window[1] - window[0]
                elif window[1] - window[0] < plan.min_rounds * round_:
                    window[1] = window[0] + plan.min_rounds * round_
                else:
                    break

        await asyncio.gather(clock(), *(worker(i) for i in range(plan.concurrency)))
    return _result(plan, records, (window[0], window[1]))


def _median_latency(records) -> float | None:
    """The median of ``records``' latencies (end - start), None for none."""
    latencies = [r.end - r.start for r in records]
    return statistics.median(latencies) if latencies else None


async def open_loop(plan: Plan) -> Result:
    """Calls sent at exponential gaps of mean ``1 / plan.rate`` (seeded) through the warm-up
    and the window, whatever the answers; then up to ``plan.drain`` seconds for the answers."""
    if plan.rate <= 0:
        raise ValueError("an open loop needs a rate > 0")
    rng = random.Random(plan.seed)
    records: list[Record] = []
    tasks: set[asyncio.Task] = set()
    async with _client(plan, plan.max_connections) as client:

        async def one(call: Call, intended: float) -> None:
            # Recorded before sending: a request cancelled after the drain stays "unfinished".
            record = Record(intended, time.perf_counter(), math.nan, "unfinished", call.inputs, 0)
            records.append(record)
            outcome, _ = await _send(client, call)
            record.end, record.outcome, record.tokens = time.perf_counter(), outcome, call.tokens

        t0 = time.perf_counter()
        window_start = t0 + plan.warmup
        window_end = window_start + plan.seconds
        intended, k = t0, 0
        while True:
            intended += rng.expovariate(plan.rate)
            if intended >= window_end:
                break
            delay = intended - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            call = plan.calls[k % len(plan.calls)]
            k += 1
            task = asyncio.create_task(one(call, intended))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        drain = plan.drain if plan.drain is not None else max(10.0, 2 * plan.seconds)
        if tasks:
            _, unfinished = await asyncio.wait(set(tasks), timeout=drain)
            for task in unfinished:
                task.cancel()
            await asyncio.gather(*unfinished, return_exceptions=True)
    now = time.perf_counter()
    for record in records:
        if record.outcome == "unfinished":
            record.end = now
    return _result(plan, records, (window_start, window_end))


def _result(plan: Plan, records: list[Record], window: tuple[float, float]) -> Result:
    """Counts of a cell: errors and latencies of the requests counted in the window (closed
    loop: answered in it; open loop: meant to be sent in it), throughput of the ok answers
    that arrived in it."""
    start, end = window
    key = (lambda r: r.end) if plan.mode == "closed" else (lambda r: r.intended)
    counted = [r for r in records if start <= key(r) < end]
    ok = [r for r in counted if r.outcome == "ok"]
    answered = [r for r in records if r.outcome == "ok" and start <= r.end < end]
    errors: dict[str, int] = {}
    for r in counted:
        if r.outcome != "ok":
            errors[r.outcome] = errors.get(r.outcome, 0) + 1
    return Result(
        mode=plan.mode,
        window_s=end - start,
        window=window,
        sent_total=len(records),
        counted=len(counted),
        ok=len(ok),
        errors=errors,
        answered=len(answered),
        inputs=sum(r.inputs for r in answered),
        tokens=sum(r.tokens for r in answered),
        latencies=sorted(r.end - r.intended for r in ok),
        service=sorted(r.end - r.start for r in ok) if plan.mode == "open" else [],
        send_lag=sorted(r.start - r.intended for r in counted) if plan.mode == "open" else [],
        offered_rate=len(counted) / plan.seconds if plan.mode == "open" else None,
        samples=list(records) if plan.keep_samples else None,
    )


def run(plan: Plan) -> Result:
    """Run one cell to its end (in whichever process calls it)."""
    loop = closed_loop if plan.mode == "closed" else open_loop
    return asyncio.run(loop(plan))


def _serve(conn) -> None:
    """The generator process: run each plan received, send back its result."""
    while True:
        plan = conn.recv()
        if plan is None:
            return
        try:
            conn.send(("ok", run(plan)))
        except Exception:  # noqa: BLE001 - reported to the caller, which raises it
            import traceback

            conn.send(("error", traceback.format_exc()))


class Generator:
    """A process of its own (spawned: no state shared with the caller) that runs plans one at
    a time; ``with Generator() as g: g.run(plan)``. Leaving the block on an exception (Ctrl-C)
    ends the process at once, whatever it was sending."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True)
        self._process.start()
        child.close()

    def run(self, plan: Plan) -> Result:
        self._conn.send(plan)
        status, value = self._conn.recv()
        if status != "ok":
            raise RuntimeError(f"the load generator failed:\n{value}")
        return value

    def close(self, wait: bool = True) -> None:
        if wait and self._process.is_alive():
            with contextlib.suppress(OSError):
                self._conn.send(None)
            self._process.join(30)
        if self._process.is_alive():
            self._process.terminate()
            self._process.join()
        self._conn.close()

    def __enter__(self) -> Generator:
        return self

    def __exit__(self, exc_type, *exc: object) -> None:
        self.close(wait=exc_type is None)


def as_dict(result: Result) -> dict:
    return asdict(result)
