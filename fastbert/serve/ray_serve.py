"""``fastbert serve --ray``: the app of :mod:`~fastbert.serve.app` as a Ray Serve deployment.

Each replica loads the model and serves the very app ``fastbert serve`` runs on uvicorn (the
same routes, batching, limits, errors and metrics): Ray Serve's ingress runs the app's lifespan
in the replica, which warms the model up and starts its batcher thread, and stops it when the
replica stops. Ray Serve's proxies (one per node) listen on ``--host`` / ``--port`` and spread
requests over the replicas; each replica's own ``/health`` probe is also Ray Serve's health
check, so a replica whose model keeps failing is replaced.

Replicas: one per GPU of the cluster (a GPU each), else one per two CPUs (two CPUs and two torch
threads each); with ``--replicas N``, N of them, each with a GPU or two CPUs, or an equal share
of the cluster's when N would not fit.

This is the only module of fastbert.serve that imports ray (inside its functions).
"""

from __future__ import annotations

import logging
import math
import signal
import threading
from dataclasses import dataclass, replace
from typing import Any

import torch

from fastbert.embedding.ray_driver import connect, worker_device
from fastbert.serve.app import create_app
from fastbert.serve.options import ServeOptions
from fastbert.serve.server import configure_logging, load_for_serving, startup_line

log = logging.getLogger("fastbert.serve")

APP_NAME = "fastbert"  # the Ray Serve application (and deployment) name
CPUS_PER_REPLICA = 2
# Ray Serve's health check calls the replica's probe every period; the probe waits up to 60 s
# for a forward pass behind a busy queue.
HEALTH_CHECK_PERIOD_S = 10
HEALTH_CHECK_TIMEOUT_S = 90


@dataclass(frozen=True)
class Plan:
    """How many replicas, and what each asks Ray for."""

    replicas: int
    num_cpus: float
    num_gpus: float
    threads: int  # torch threads in a CPU replica

    def describe(self) -> str:
        each = _count(self.num_gpus, "GPU") if self.num_gpus else _count(self.num_cpus, "CPU")
        return f"{_count(self.replicas, 'Ray Serve replica')}, {each} each"


def _count(n: float, noun: str) -> str:
    return f"{n:g} {noun}{'s' if n > 1 else ''}"


def plan(on_gpu: bool, gpus: float, cpus: float, replicas: int | None) -> Plan:
    """The replicas on a cluster with ``gpus`` and ``cpus``: by default one per GPU, else one
    per two CPUs; ``replicas`` of them when given, each with a GPU or two CPUs, or an equal
    share of the cluster's when that many would not fit."""
    if on_gpu:
        count = replicas or max(1, int(gpus))
        return Plan(count, num_cpus=1, num_gpus=min(1.0, gpus / count), threads=1)
    count = replicas or max(1, int(cpus) // CPUS_PER_REPLICA)
    share = min(float(CPUS_PER_REPLICA), cpus / count)
    # Ray schedules fractions of a CPU in hundredths.
    share = max(0.01, math.floor(share * 100) / 100)
    return Plan(count, num_cpus=share, num_gpus=0, threads=max(1, int(share)))


class Replica:
    """One Ray Serve replica: the model, loaded on the device Ray gave it, and the app serving
    it. Ray Serve's ingress (:func:`deployment`) serves :meth:`__serve_build_asgi_app__`'s app
    and runs its lifespan; :meth:`check_health` is its health check."""

    def __init__(self, options: ServeOptions, device: str, threads: int):
        configure_logging(options.log_level)
        if device == "cpu":
            torch.set_num_threads(threads)
        # On CUDA, "cuda" is the GPU Ray gave this replica (CUDA_VISIBLE_DEVICES).
        options = replace(options, model=replace(options.model, device=device))
        self.options = options
        self.model = load_for_serving(options)
        # Not ``self.app``: Ray Serve's ingress wrapper names the app it serves so.
        self.http_app = create_app(self.model, options)

    def __serve_build_asgi_app__(self) -> Any:
        return self.http_app

    async def check_health(self) -> None:
        """Raises while the model fails (the probe ``GET /health`` runs), so that Ray Serve
        replaces the replica."""
        if not await self.http_app.state.server.healthy():
            raise RuntimeError("the model is failing; a probe forward pass failed")

    def startup_line(self, address: str) -> str:
        return startup_line(self.model, self.options, address)


def deployment(serve: Any, options: ServeOptions, device: str, replicas: Plan) -> Any:
    """The bound Ray Serve application: :class:`Replica` as an ingress deployment."""
    ingress = serve.ingress()(Replica)
    return serve.deployment(
        ingress,
        name=APP_NAME,
        num_replicas=replicas.replicas,
        ray_actor_options={"num_cpus": replicas.num_cpus, "num_gpus": replicas.num_gpus},
        # Admission is the batcher's (429 past --max-concurrent-requests): let that many
        # requests in, so that they batch together.
        max_ongoing_requests=options.max_concurrent_requests,
        health_check_period_s=HEALTH_CHECK_PERIOD_S,
        health_check_timeout_s=HEALTH_CHECK_TIMEOUT_S,
    ).bind(options, device, replicas.threads)


def serve(options: ServeOptions, address: str | None = None, replicas: int | None = None) -> None:
    """Serve ``options.model`` as a Ray Serve deployment on the cluster at ``address`` (None:
    a new local Ray instance, or the one this process started) until SIGTERM or Ctrl-C; then
    remove it (Ray Serve too when nothing else runs on it, and Ray where this call started it)
    and return. ValueError for settings the cluster cannot run."""
    ray, ray_serve = _import_ray()
    configure_logging(options.log_level)
    if options.port == 0:
        raise ValueError("--ray needs a --port: Ray Serve's proxies cannot pick a free one")
    started = connect(ray, address)
    try:
        resources = ray.cluster_resources()
        gpus, cpus = resources.get("GPU", 0), resources.get("CPU", 1)
        device = worker_device(options.model, int(gpus)).type
        replica_plan = plan(device == "cuda", gpus, cpus, replicas)
        ray_serve.start(http_options={"host": options.host, "port": options.port})
        try:
            handle = _run(ray_serve, deployment(ray_serve, options, device, replica_plan))
            where = f"http://{options.host}:{options.port}, {replica_plan.describe()}"
            log.info(handle.startup_line.remote(where).result())
            _wait_for_signal()
        finally:
            _stop(ray_serve)
    finally:
        if started:
            ray.shutdown()


def _run(serve: Any, application: Any) -> Any:
    """Deploy ``application`` at ``/``; its handle once every replica is ready. ValueError
    when they fail to start (a model they cannot load)."""
    try:
        return serve.run(application, name=APP_NAME, route_prefix="/")
    except RuntimeError as exc:
        raise ValueError(
            f"{exc} (the replicas' errors are in logs/serve/ of the Ray session directory, "
            "/tmp/ray/session_latest by default)"
        ) from exc


def _import_ray() -> tuple[Any, Any]:
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        message = f"--ray needs Ray Serve: pip install 'fastbert[serve,ray]' ({exc})"
        raise ImportError(message) from exc
    return ray, serve


def _wait_for_signal() -> None:
    """Block until SIGTERM or SIGINT (Ctrl-C)."""
    stop = threading.Event()
    saved = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while not stop.wait(0.5):
            pass
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _stop(serve: Any) -> None:
    """Remove the application (its replicas finish the requests they hold), and shut Ray Serve
    down when no other application runs on it."""
    log.info("fastbert serve: stopping the Ray Serve replicas")
    serve.delete(APP_NAME)
    if not serve.status().applications:
        serve.shutdown()
