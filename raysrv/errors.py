"""Errors that cross the API: each carries its HTTP status and a reason a caller can act on.

Over HTTP an error is the body ``{"error", "message", "status"}`` with that status (and
``transit_ms`` for a query that sent ``sent_at``); handle callers get the same object as the
result of ``predict`` rather than an exception: an exception through a Serve handle is wrapped
with its traceback and pickled across processes, and refusals must stay cheap when a server is
overloaded. :func:`raise_for_error` turns such a result back into the exception, for callers
who prefer one.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BadRequest",
    "Conflict",
    "MethodNotAllowed",
    "ModelFailed",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "RaysrvError",
    "Rejected",
    "Unauthorized",
    "UnsupportedMediaType",
    "raise_for_error",
]


class RaysrvError(Exception):
    """Base class: ``status`` is the HTTP status, ``reason`` a short machine-readable tag."""

    status = 500
    reason = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.transit_ms: float | None = None  # a query's trip to the ingress, once known

    def headers(self) -> dict[str, str]:
        """The HTTP headers that go with this error beside its body."""
        return {}

    def to_json(self) -> dict[str, Any]:
        """The body; a query that said when it was sent (``sent_at``) also gets its trip to
        the ingress (``transit_ms``), as its answer would: the time lost before raysrv."""
        extra = {} if self.transit_ms is None else {"transit_ms": self.transit_ms}
        return {"error": self.reason, "message": self.message, "status": self.status, **extra}


class BadRequest(RaysrvError):
    status = 400
    reason = "bad_request"


class Unauthorized(RaysrvError):
    """A route that needs one of the ingress's API keys was called without a right one."""

    status = 401
    reason = "unauthorized"

    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class NotFound(RaysrvError):
    status = 404
    reason = "not_found"


class MethodNotAllowed(RaysrvError):
    """A route was called with a method it does not take; ``Allow`` lists those it does."""

    status = 405
    reason = "method_not_allowed"

    def __init__(self, message: str, allow: str = "POST") -> None:
        super().__init__(message)
        self.allow = allow

    def headers(self) -> dict[str, str]:
        return {"Allow": self.allow}


class Conflict(RaysrvError):
    """The request contradicts what is already recorded (a query's feedback, given twice)."""

    status = 409
    reason = "conflict"


class PayloadTooLarge(RaysrvError):
    status = 413
    reason = "payload_too_large"


class UnsupportedMediaType(RaysrvError):
    """A body of another content type than the route reads (a browser's form or plain text
    among them, which a web page may send to any address without asking)."""

    status = 415
    reason = "unsupported_media_type"


class Rejected(RaysrvError):
    """Refused before any work was spent on it (e.g. it cannot meet its deadline)."""

    status = 429
    reason = "rejected"


class Overloaded(RaysrvError):
    """A bounded queue is full: retry later."""

    status = 503
    reason = "overloaded"
    retry_after_s = 1

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after_s)}


class DeadlineExpired(RaysrvError):
    """Not answered by its deadline: the ingress drops it then rather than answer late."""

    status = 504
    reason = "deadline_expired"


class ModelFailed(RaysrvError):
    """The model raised while evaluating a batch."""

    status = 500
    reason = "model_failed"


def raise_for_error(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` if it is an answer; the matching :class:`RaysrvError` if it is an error."""
    if "error" not in result:
        return result
    classes = {cls.reason: cls for cls in RaysrvError.__subclasses__()}
    raise classes.get(result["error"], RaysrvError)(result.get("message", ""))
