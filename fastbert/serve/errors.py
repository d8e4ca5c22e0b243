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
    name for it; ``param`` the request field at fault (OpenAI's envelope), if one is.

    A kind of failure is a subclass that declares its ``status``, ``error_type`` and (where
    the status does not give it) ``openai_type`` as class keywords:
    ``class NotFound(ServeError, status=404, error_type="not_found")``; what it leaves out it
    inherits."""

    status = 500
    error_type = "internal"
    openai_type: str | None = None  # None: by status (_OPENAI_TYPES)

    def __init_subclass__(
        cls,
        *,
        status: int | None = None,
        error_type: str | None = None,
        openai_type: str | None = None,
    ) -> None:
        super().__init_subclass__()
        declared = {"status": status, "error_type": error_type, "openai_type": openai_type}
        for name, value in declared.items():
            if value is not None:
                setattr(cls, name, value)

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


class EmptyInput(ServeError, status=400, error_type="empty"): ...


class BadRequest(ServeError, status=400, error_type="invalid_json"):
    """Malformed JSON, invalid UTF-8."""


class Unauthorized(ServeError, status=401, error_type="unauthorized"): ...


class NotFound(ServeError, status=404, error_type="not_found"): ...


class ModelNotFound(
    ServeError, status=404, error_type="model_not_found", openai_type="invalid_request_error"
):
    """A request naming a model this server does not serve (OpenAI's ``model_not_found``)."""


class MethodNotAllowed(ServeError, status=405, error_type="method_not_allowed"): ...


class PayloadTooLarge(ServeError, status=413, error_type="payload_too_large"): ...


class UnsupportedMediaType(ServeError, status=415, error_type="unsupported_media_type"): ...


class ValidationFailed(ServeError, status=422, error_type="validation"):
    """Wrong types, too many inputs, an input over the limit without truncation, an unknown
    value, ids outside the vocabulary."""


class ModelFailed(ServeError, status=424, error_type="backend"):
    """The forward pass raised; or the route needs another kind of model."""


class Overloaded(ServeError, status=429, error_type="overloaded"): ...


class Unhealthy(ServeError, status=503, error_type="unhealthy"): ...


class ShuttingDown(Unhealthy):
    """A request that arrives after the server began to stop: answered as an unhealthy one."""
