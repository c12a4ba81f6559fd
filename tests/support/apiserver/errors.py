"""``kind: Status`` errors with the real kube-apiserver's codes, reasons and messages."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

JSONDict = dict[str, Any]


class ApiError(Exception):
    """An API failure rendered as a ``kind: Status`` body, exactly like the real server.

    ``reason`` may be ``""`` (real server's StatusReasonUnknown: the key is omitted) and
    ``details`` may be ``None`` (omitted, as for BadRequest). ``metadata`` is the Status's
    ListMeta: a 410 for an expired ``continue`` token carries the token to go on with.
    """

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        details: JSONDict | None = None,
        headers: Mapping[str, str] | None = None,
        *,
        metadata: JSONDict | None = None,
    ) -> None:
        super().__init__(message)
        self.metadata: JSONDict = dict(metadata or {})
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details
        self.headers: dict[str, str] = dict(headers or {})

    def status(self) -> JSONDict:
        body: JSONDict = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": dict(self.metadata),
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:
            body["reason"] = self.reason
        if self.details is not None:
            body["details"] = self.details
        body["code"] = self.code
        return body

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.reason!r}, {self.message!r})"


def not_found(resource: str, name: str) -> ApiError:
    return ApiError(
        404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource}
    )


def already_exists(resource: str, name: str) -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{resource} "{name}" already exists',
        {"name": name, "kind": resource},
    )


def conflict(resource: str, name: str, cause: str) -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {resource} "{name}": {cause}',
        {"name": name, "kind": resource},
    )


def modified_conflict(resource: str, name: str) -> ApiError:
    return conflict(
        resource,
        name,
        "the object has been modified; please apply your changes to the latest version "
        "and try again",
    )


def precondition_conflict(resource: str, name: str, storage_key: str, detail: str) -> ApiError:
    # storage.NewInvalidObjError(...) wrapped by storeerr.InterpretUpdateError.
    cause = (
        f"StorageError: invalid object, Code: 4, Key: {storage_key}, ResourceVersion: 0, "
        f"AdditionalErrorMsg: Precondition failed: {detail}"
    )
    return conflict(resource, name, cause)


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def invalid(kind: str, name: str, field_path: str, cause_reason: str, detail: str) -> ApiError:
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {field_path}: {detail}',
        {
            "name": name,
            "kind": kind,
            "causes": [{"reason": cause_reason, "message": detail, "field": field_path}],
        },
    )


def unprocessable(message: str) -> ApiError:
    # apierrors.NewGenericServerResponse(422, ...) as used for failed JSON patches.
    return ApiError(
        422,
        "Invalid",
        "the server rejected our request due to an error in our request",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": message}]},
    )


def route_not_found() -> ApiError:
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def method_not_allowed() -> ApiError:
    return ApiError(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        {},
    )


def error_event(code: int, reason: str, message: str, details: JSONDict | None = None) -> JSONDict:
    return {"type": "ERROR", "object": ApiError(code, reason, message, details).status()}
