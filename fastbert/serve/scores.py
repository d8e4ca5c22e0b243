"""A cross-encoder's scores, as the rerank and predict routes give them: raw logits of texts
and text pairs run through the batcher, rerank scores of (query, text) pairs, and the sigmoid
and softmax that turn logits into scores."""

from __future__ import annotations

from typing import Any

import numpy as np

from fastbert.serve import errors, inputs
from fastbert.serve.service import Server, Timing


async def pair_scores(
    server: Server,
    request: Any,
    timing: Timing,
    firsts: list[str],
    seconds: list[str | None],
    truncate: bool | None,
    direction: str | None,
    field: str,
) -> np.ndarray:
    """Raw logits [n, labels] of texts (``seconds[i]`` None) and text pairs."""
    return await server.tokenize_and_run(
        request,
        timing,
        len(firsts),
        None,
        inputs.tokenize_pairs,
        server.model,
        firsts,
        seconds,
        server.truncating(truncate),
        direction,
        field,
        characters=inputs.characters(firsts) + inputs.characters(seconds),
    )


async def rerank_scores(
    server: Server,
    request: Any,
    timing: Timing,
    route: str,
    query: str,
    texts: list[str],
    truncate: bool | None,
    direction: str | None,
    field: str,
) -> np.ndarray:
    """The logit [n] of (query, text) for each text: a cross-encoder with one output only
    (ModelFailed naming its labels otherwise, before any work)."""
    server.require(route)
    model = server.model
    if len(model.labels) != 1:
        raise errors.ModelFailed(
            f"reranking needs a model with one output (a cross-encoder); {server.name} has "
            f"{len(model.labels)} labels: use /predict"
        )
    inputs.check_text(query, "query", "query")
    inputs.check_count(texts, server.limits, field)
    logits = await pair_scores(
        server, request, timing, [query] * len(texts), list(texts), truncate, direction, field
    )
    return logits[:, 0]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def probabilities(logits: np.ndarray, function: str | None = None) -> np.ndarray:
    """``function`` ("softmax", "sigmoid" or "none": the logits) of each row of ``logits``
    [n, labels]; None: softmax over the labels, sigmoid for a single output."""
    if function == "none":
        return logits
    if function == "sigmoid" or (function is None and logits.shape[1] == 1):
        return sigmoid(logits)
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)
