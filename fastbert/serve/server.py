"""Running the app: load the model, log one line, serve on uvicorn until SIGTERM or Ctrl-C,
then stop accepting, finish the requests already admitted and return."""

from __future__ import annotations

import logging
import signal
import socket
import sys
import threading
import time
from typing import Any

from fastbert.embedding.loading import load_options
from fastbert.embedding.options import EmbedOptions
from fastbert.embedding.text_model import TextModel
from fastbert.execution.cpu_tuning import apply_process_tuning
from fastbert.serve.app import create_app
from fastbert.serve.options import ServeOptions

log = logging.getLogger("fastbert.serve")


def startup_line(model: TextModel, options: ServeOptions, address: str) -> str:
    """The line a server logs once it listens: the model (by the name it was given, with its
    folder), its kind, device, precision and limits, and the address."""
    o = model.options
    precision = o.dtype if o.quantize is None else f"{o.dtype} with {o.quantize} linears"
    source = o.model if o.name is None else f"{o.name} from {o.model}"
    return (
        f"fastbert serve: {source} ({model.kind}) on {o.device}, backend {o.backend}, "
        f"{precision}, max {model.max_length} tokens per input, {o.batch_tokens} per batch, "
        f"at {address}"
    )


def serve(options: ServeOptions, model: TextModel | None = None) -> None:
    """Serve ``model`` (default: load ``options.model``) until SIGTERM or Ctrl-C; returns
    after the admitted requests are answered. Applies the process's CPU settings first
    (fastbert.execution.cpu_tuning), a model handed in included."""
    import uvicorn

    apply_process_tuning()
    configure_logging(options.log_level)
    check_listening(options.host, options.port)  # before the model's load
    if model is None:
        model = load_for_serving(options)
    app = create_app(model, options)
    config = uvicorn.Config(
        app,
        host=options.host,
        port=options.port,
        log_level="warning" if options.log_level != "debug" else "debug",
        access_log=options.log_level == "debug",
        timeout_graceful_shutdown=None,
        lifespan="on",
    )
    server = uvicorn.Server(config)
    _announce(server, model, options)
    _report_shutdown(server, app.state.server)
    with _quiet_signals():
        try:
            server.run()
        except SystemExit:  # uvicorn's own bind failed (another server took the port since)
            if server.started:
                raise
            raise ListenError(f"cannot listen on {options.host}:{options.port}") from None


class ListenError(OSError):
    """The server cannot listen where it was told (the port is taken, the host unknown)."""


def check_listening(host: str, port: int) -> None:
    """ListenError naming ``host``:``port`` and why, when a server could not listen there now
    (the port taken, the host unknown): said before the model loads, in one line. Each address
    the host resolves to is bound and listened on as asyncio's server binds them (an IPv6
    socket for IPv6 only), then closed: uvicorn binds them itself."""
    if port == 0:  # a free port: found when uvicorn binds
        return
    try:
        found = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except OSError as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    for family, kind, protocol, _, address in dict.fromkeys(found):
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
                probe.listen()
            except OSError as exc:
                raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc


def load_for_serving(options: ServeOptions) -> TextModel:
    """The model ``options`` serve, loaded in a thread of its own with ``omp_spin`` (so that
    the model thread's OpenMP team is the process's only one), else on this thread."""
    return load_in_own_thread(options.model) if options.omp_spin else load_options(options.model)


def load_in_own_thread(options: EmbedOptions) -> TextModel:
    """Load the model in a thread that then ends, taking its OpenMP threads with it (with
    ``omp_spin``).

    torch runs CPU ops on a team of OpenMP threads per calling thread; loading runs some. A
    team left on this thread (the event loop's) beside the model thread's would make libgomp
    count more threads than cores, and it then stops spin-waiting: every parallel region of a
    forward pass would put its threads to sleep and wake them (see docs/serve.md, CPU
    threads)."""
    loaded: dict[str, Any] = {}

    def load() -> None:
        try:
            loaded["model"] = load_options(options)
        except BaseException as exc:  # re-raised on the caller's thread
            loaded["error"] = exc

    thread = threading.Thread(target=load, name="fastbert-load", daemon=True)  # Ctrl-C exits
    thread.start()
    thread.join()
    if "error" in loaded:
        raise loaded["error"]
    return loaded["model"]


def _announce(server: Any, model: TextModel, options: ServeOptions) -> None:
    """Log the startup line once the socket listens (with the real port when it was 0)."""
    started = server.startup

    async def startup(sockets: Any = None) -> None:
        await started(sockets=sockets)
        port = options.port
        for listener in getattr(server, "servers", []):
            for sock in listener.sockets:
                port = sock.getsockname()[1]
        log.info(startup_line(model, options, f"http://{options.host}:{port}"))

    server.startup = startup


def _report_shutdown(server: Any, service: Any) -> None:
    """Log a line when the server has shut down: the requests it drained (in flight when the
    shutdown began), the seconds that took, and the requests answered since it started."""
    shutdown = server.shutdown

    async def logged(sockets: Any = None) -> None:
        start, draining = time.perf_counter(), service.in_flight
        await shutdown(sockets=sockets)
        log.info(
            "fastbert serve: shut down in %.1f s, %d requests drained; %d answered since start",
            time.perf_counter() - start,
            draining,
            service.answered,
        )

    server.shutdown = logged


class _quiet_signals:
    """uvicorn shuts down gracefully on SIGTERM / SIGINT, then raises the signal again for the
    handler that was there before it. With this no-op handler there, the process exits 0 after
    a graceful shutdown instead of dying of the signal."""

    def __enter__(self) -> None:
        self.saved = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}

    def __exit__(self, *exc: Any) -> None:
        for s, handler in self.saved.items():
            signal.signal(s, handler)


def configure_logging(level: str) -> None:
    logger = logging.getLogger("fastbert.serve")
    logger.setLevel(level.upper())
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.propagate = False
