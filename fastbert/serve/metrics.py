"""The server's Prometheus metrics (``GET /metrics``), in a registry of its own per app:
requests and failures by route and error type; request, tokenisation, queue and inference
durations; input lengths; the queue in inputs and tokens; batch sizes."""

from __future__ import annotations

import functools
from typing import Any

# Seconds: from well under a millisecond (a short input on a GPU) to a minute (a queue).
_SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


class Metrics:
    """The metrics of one server (a fresh registry, so that several apps in one process, as in
    tests, count apart)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "fastbert_requests", "Requests answered, by route", ["route"], registry=r
        )
        self.failures = Counter(
            "fastbert_request_failures",
            "Requests that failed, by route and error type",
            ["route", "error_type"],
            registry=r,
        )
        durations = functools.partial(Histogram, buckets=_SECONDS, registry=r)
        self.request_seconds = durations(
            "fastbert_request_duration_seconds", "Time from parsing to answer, by route", ["route"]
        )
        self.tokenize_seconds = durations(
            "fastbert_tokenization_duration_seconds", "Time to tokenise a request"
        )
        self.queue_seconds = durations(
            "fastbert_queue_duration_seconds", "Time a request waited for its first batch"
        )
        self.inference_seconds = durations(
            "fastbert_inference_duration_seconds",
            "Time of the forward passes that held a request's inputs",
        )
        self.input_tokens = Histogram(
            "fastbert_input_length_tokens", "Tokens per input", buckets=_TOKENS, registry=r
        )
        self.queue_inputs = Gauge(
            "fastbert_queue_inputs", "Inputs admitted and not yet answered", registry=r
        )
        self.queue_tokens = Gauge(
            "fastbert_queue_tokens",
            "Tokens of the inputs admitted and not yet answered",
            registry=r,
        )
        self.batch_tokens = Histogram(
            "fastbert_batch_tokens",
            "Rows per forward pass: its tokens when packed, inputs x longest when padded",
            buckets=_TOKENS,
            registry=r,
        )
        self.batch_inputs = Histogram(
            "fastbert_batch_inputs",
            "Inputs per forward pass",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.batch_seconds = durations(
            "fastbert_batch_duration_seconds", "Time of one forward pass"
        )

    def on_batch(self, inputs: int, tokens: int, seconds: float) -> None:
        self.batch_inputs.observe(inputs)
        self.batch_tokens.observe(tokens)
        self.batch_seconds.observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """(the exposition text, its content type)."""
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def set_queue(self, admitted: Any) -> None:
        inputs, tokens = admitted
        self.queue_inputs.set(inputs)
        self.queue_tokens.set(tokens)
