"""Errors that cross the API: each carries its HTTP status and a reason a caller can act on.

They pickle by their message alone, so they keep their type through Ray handle calls.
"""

from __future__ import annotations

__all__ = [
    "BadRequest",
    "ModelFailed",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "RaysrvError",
    "Rejected",
]


class RaysrvError(Exception):
    """Base class: ``status`` is the HTTP status, ``reason`` a short machine-readable tag."""

    status = 500
    reason = "internal_error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def to_json(self) -> dict[str, str]:
        return {"error": self.reason, "message": self.message}


class BadRequest(RaysrvError):
    status = 400
    reason = "bad_request"


class NotFound(RaysrvError):
    status = 404
    reason = "not_found"


class PayloadTooLarge(RaysrvError):
    status = 413
    reason = "payload_too_large"


class Rejected(RaysrvError):
    """Refused before any work was spent on it (e.g. it cannot meet its deadline)."""

    status = 429
    reason = "rejected"


class Overloaded(RaysrvError):
    """A bounded queue is full: retry later."""

    status = 503
    reason = "overloaded"
    retry_after_s = 1


class ModelFailed(RaysrvError):
    """The model raised while evaluating a batch."""

    status = 500
    reason = "model_failed"
