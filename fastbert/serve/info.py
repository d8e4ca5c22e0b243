"""What ``GET /info`` says: the model, its kind and that kind's settings (pooling,
normalisation, dimensions, Matryoshka, prompts, the int8 / uint8 ranges; a classifier's
labels), the routes it serves, and the server's limits."""

from __future__ import annotations

from typing import Any

from fastbert.embedding.model import pooling_name
from fastbert.model.sentence_folder import CLASSIFICATION, EMBEDDING, MULTI_VECTOR
from fastbert.serve.service import Server
from fastbert.version import __version__


def info_of(server: Server) -> dict[str, Any]:
    """The body of ``GET /info`` for ``server``."""
    model, options = server.model, server.options
    o = model.options
    return {
        "model_id": o.model,
        "served_model_name": server.name,
        "model_type": {_type_name(model.kind): kind_settings(server)},
        "model_kind": model.kind,
        "routes": list(server.routes),
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
        "accept_any_model": options.accept_any_model,
        "openai_token_ids": options.openai_token_ids,
        "version": __version__,
    }


def kind_settings(server: Server) -> dict[str, Any]:
    """The settings of the model's kind: a classifier's labels; else its prompts (and the
    default one), its pooling, normalisation and width; a dense model's Matryoshka flag,
    whether requests may cut any model and its int8 / uint8 ranges; a multi-vector model's
    query and document lengths."""
    model = server.model
    if model.kind == CLASSIFICATION:
        return {"id2label": dict(enumerate(model.labels))}
    spec, o = model.spec, model.options
    settings: dict[str, Any] = {
        "pooling": pooling_name(spec, o.pooling),
        "normalize": o.normalize,
        "dimensions": o.dimensions or model.dimensions,  # the width the routes give
        "prompts": model.prompts,
        "default_prompt_name": spec.default_prompt_name,
    }
    if model.kind == EMBEDDING:
        settings["matryoshka"] = spec.matryoshka
        settings["allow_any_dimensions"] = server.options.allow_any_dimensions
        calibration = server.calibration
        settings["quantization"] = {
            "embedding_types": ["float", "int8", "uint8", "binary", "ubinary"],
            "int8_uint8_calibration": None if calibration is None else calibration.describe(),
        }
    if model.kind == MULTI_VECTOR:
        settings["query_length"] = spec.transformer.query_length
        settings["document_length"] = spec.transformer.document_length
    return settings


def _type_name(kind: str) -> str:
    """TEI's name for a kind in ``model_type``: ``classifier`` for a cross-encoder."""
    return "classifier" if kind == CLASSIFICATION else kind
