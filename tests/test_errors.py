"""The one table from ferryman's errors to the answers the service gives."""

from __future__ import annotations

import inspect

import grpc

from ferryman import errors
from ferryman.errors import STATUSES, FerrymanError, NotFoundError, RequestError, status_of


def error_classes() -> list[type[FerrymanError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, FerrymanError) and cls.__module__ == errors.__name__
    ]


def test_every_error_class_has_its_own_entry() -> None:
    """Each FerrymanError class of the errors module is mapped explicitly, none by accident."""
    classes = error_classes()
    assert len(classes) >= 10
    assert [c.__name__ for c in classes if c not in STATUSES] == []


def test_every_entry_names_a_real_grpc_status_and_an_http_error_code() -> None:
    """The table's names are grpc.StatusCode members; HTTP codes are 4xx or 5xx."""
    for cls, status in STATUSES.items():
        assert grpc.StatusCode[status.grpc] is not grpc.StatusCode.OK, cls
        assert 400 <= status.http < 600, cls
        assert status.counter in ("service_error", "redis_error"), cls


def test_an_unlisted_subclass_answers_as_its_nearest_listed_base() -> None:
    """A subclass defined elsewhere takes its base's entry: NOT_FOUND stays NOT_FOUND."""

    class MissingThing(NotFoundError):
        pass

    assert status_of(MissingThing("x", "gone")) is STATUSES[NotFoundError]
    assert status_of(RequestError("x", "bad")).grpc == "INVALID_ARGUMENT"
    assert status_of(errors.BackendTimeoutError("slow")).counter == "redis_error"
