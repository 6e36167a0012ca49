"""Errors as objects (what handle callers get) and back to exceptions."""

from __future__ import annotations

import pickle

import pytest

from raysrv.errors import BadRequest, Overloaded, RaysrvError, Rejected, raise_for_error


def test_error_objects_round_trip_to_the_matching_exception() -> None:
    body = Rejected("model 'a': deadline passed while queued").to_json()
    assert body == {
        "error": "rejected",
        "message": "model 'a': deadline passed while queued",
        "status": 429,
    }
    with pytest.raises(Rejected, match="deadline passed"):
        raise_for_error(body)
    with pytest.raises(Overloaded):
        raise_for_error(Overloaded("full").to_json())
    with pytest.raises(RaysrvError, match="odd"):
        raise_for_error({"error": "something_new", "message": "odd"})
    answer = {"output": 1, "models": ["a"]}
    assert raise_for_error(answer) is answer


def test_errors_keep_type_and_message_through_pickling() -> None:
    restored = pickle.loads(pickle.dumps(BadRequest("input has shape [2]")))
    assert isinstance(restored, BadRequest)
    assert restored.message == "input has shape [2]"
    assert restored.status == 400
