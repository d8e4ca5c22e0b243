"""The settings of a server: what to load (the embedding job's options) and the limits it keeps,
validated once for the command, the Python API and Ray Serve."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastbert.execution.arguments import positive_integer
from fastbert.settings import API_KEY, SERVE_OMP_SPIN

if TYPE_CHECKING:  # imported only for the annotation: the command's parser reads this module
    from fastbert.embedding.options import EmbedOptions

API_KEY_VARIABLE = API_KEY.name
OMP_SPIN_VARIABLE = SERVE_OMP_SPIN.name
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def default_tokenize_workers() -> int:
    """Tokenizer threads by default: half the cores (the model's forward uses the rest on a
    CPU), between 1 and 4."""
    return max(1, min(4, (os.cpu_count() or 2) // 2))


def default_omp_spin() -> bool:
    """Whether the model's OpenMP threads spin-wait by default: ``$FASTBERT_SERVE_OMP_SPIN``
    (1/true/on or 0/false/off), else on."""
    return SERVE_OMP_SPIN.read()


@dataclass(frozen=True)
class ServeOptions:
    """How to serve a model folder.

    ``model``: what to load and how (folder, device, dtype, backend, max_length; its
    ``batch_tokens`` is the token budget of one forward pass, ``--max-batch-tokens``).
    ``max_client_batch_size``: inputs per request; ``max_concurrent_requests``: inputs admitted
    and not yet answered, across requests (past it a request gets 429); ``max_queued_tokens``:
    their tokens (None: ``max_concurrent_requests`` x the model's ``max_length``);
    ``auto_truncate``: cut inputs over ``max_length`` (else 422); ``payload_limit``: the most
    bytes a request body may have (else 413); ``api_key``: the bearer token every route but
    health and metrics asks for (None: open); ``tokenize_workers``: tokenizer threads;
    ``omp_spin``: on a CPU, run every torch op of the server on the model thread so that its
    OpenMP threads are the process's only team and spin-wait between parallel regions as
    libgomp does by default (``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` tune it), as in a program
    calling the model; off, a second team on the event loop's thread makes libgomp put them to
    sleep after ~100 spins, leaving the cores to other work (see docs/serve.md, CPU threads);
    ``allow_any_dimensions``: let requests cut the embeddings of a model whose card does not
    say it is Matryoshka-trained (else such a request gets 422);
    ``accept_any_model``: answer requests whose ``model`` names another model (else 404
    ``model_not_found``); ``openai_token_ids``: read token-id inputs on ``/v1/embeddings`` as
    this model's token ids (else refused: OpenAI's API reads them as its own tokenizer's,
    which clients such as LangChain's OpenAIEmbeddings send); ``calibration``: a file of
    texts, one per line, whose embeddings give the int8 / uint8 ranges (None: a built-in
    sample of English, see :mod:`fastbert.serve.calibration`).
    """

    model: EmbedOptions
    host: str = "127.0.0.1"
    port: int = 8080
    served_model_name: str | None = None
    max_client_batch_size: int = 32
    max_concurrent_requests: int = 512
    max_queued_tokens: int | None = None
    auto_truncate: bool = True
    payload_limit: int = 2_000_000
    api_key: str | None = field(default=None, repr=False)
    tokenize_workers: int = field(default_factory=default_tokenize_workers)
    omp_spin: bool = field(default_factory=default_omp_spin)
    allow_any_dimensions: bool = False
    accept_any_model: bool = False
    openai_token_ids: bool = False
    calibration: str | None = None
    log_level: str = "info"

    def __post_init__(self) -> None:
        for name in (
            "max_client_batch_size",
            "max_concurrent_requests",
            "payload_limit",
            "tokenize_workers",
            "max_queued_tokens",
        ):
            if getattr(self, name) is not None:  # a frozen dataclass: as plain ints
                object.__setattr__(self, name, positive_integer(name, getattr(self, name)))
        object.__setattr__(self, "port", positive_integer("port", self.port, minimum=0))
        if self.port > 65535:
            raise ValueError(f"port must be between 0 and 65535, got {self.port!r}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(LOG_LEVELS)}")
        for name in ("omp_spin", "allow_any_dimensions", "accept_any_model", "openai_token_ids"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.calibration is not None and not os.path.isfile(self.calibration):
            raise ValueError(f"calibration: {self.calibration!r} is not a file")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be blank")

    def model_name(self) -> str:
        """The name the OpenAI routes answer with: ``served_model_name``, else the name the
        model was given by (``all-MiniLM-L6-v2``), else its folder's."""
        return (
            self.served_model_name
            or self.model.name
            or os.path.basename(os.path.normpath(self.model.model))
        )
