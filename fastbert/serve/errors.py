"""What a bad request gets back: one exception type per failure, each with its HTTP status and
its body in Hugging Face text-embeddings-inference's shape (``{"error", "error_type"}``) or, on
the OpenAI and Cohere routes, OpenAI's envelope (``{"error": {message, type, param,
code}}``), so that each client raises its usual exception."""

from __future__ import annotations

from typing import Any

# TEI's error_type -> OpenAI's error type, by status.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    424: "server_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ServeError(Exception):
    """A request the server answers with ``status`` and a message; ``error_type`` is TEI's
    name for it; ``param`` the request field at fault (OpenAI's envelope), if one is."""

    status = 500
    error_type = "internal"
    openai_type: str | None = None  # None: by status (_OPENAI_TYPES)

    def __init__(self, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.message, self.param, self.headers = message, param, headers or {}

    def tei_body(self) -> dict[str, Any]:
        return {"error": self.message, "error_type": self.error_type}

    def openai_body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.openai_type or _OPENAI_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.error_type,
            }
        }


class EmptyInput(ServeError):
    status, error_type = 400, "empty"


class BadRequest(ServeError):
    """Malformed JSON, invalid UTF-8."""

    status, error_type = 400, "invalid_json"


class Unauthorized(ServeError):
    status, error_type = 401, "unauthorized"


class NotFound(ServeError):
    status, error_type = 404, "not_found"


class ModelNotFound(ServeError):
    """A request naming a model this server does not serve (OpenAI's ``model_not_found``)."""

    status, error_type, openai_type = 404, "model_not_found", "invalid_request_error"


class MethodNotAllowed(ServeError):
    status, error_type = 405, "method_not_allowed"


class PayloadTooLarge(ServeError):
    status, error_type = 413, "payload_too_large"


class UnsupportedMediaType(ServeError):
    status, error_type = 415, "unsupported_media_type"


class ValidationFailed(ServeError):
    """Wrong types, too many inputs, an input over the limit without truncation, an unknown
    value, ids outside the vocabulary."""

    status, error_type = 422, "validation"


class ModelFailed(ServeError):
    """The forward pass raised; or the route needs another kind of model."""

    status, error_type = 424, "backend"


class Overloaded(ServeError):
    status, error_type = 429, "overloaded"


class Unhealthy(ServeError):
    status, error_type = 503, "unhealthy"


class ShuttingDown(Unhealthy):
    """A request that arrives after the server began to stop: answered as an unhealthy one."""
