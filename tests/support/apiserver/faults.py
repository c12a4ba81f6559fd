"""Injected failures and delays, consulted for every HTTP request the double receives."""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from tests.support.apiserver.errors import ApiError, JSONDict

_REASONS: Final[Mapping[int, str]] = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

_FAULT_MESSAGES: Final[Mapping[int, str]] = {
    429: "the server has received too many requests and has asked us to try again later",
    500: "Internal error occurred: injected fault",
    503: "the server is currently unable to handle the request",
    504: (
        "the server was unable to return a response in the time allotted, "
        "but may still be processing the request"
    ),
}


def fault_error(code: int) -> ApiError:
    reason = _REASONS.get(code, "")
    message = _FAULT_MESSAGES.get(code, f"injected fault: HTTP {code}")
    details: JSONDict = {}
    headers: dict[str, str] = {}
    if code == 429:
        details["retryAfterSeconds"] = 1
        headers["Retry-After"] = "1"
    return ApiError(code, reason, message, details, headers)


_ACTIONS: Final = frozenset(
    {"status", "delay", "after_write_status", "after_write_delay", "drop_watch", "close", "hold"}
)
HOLD_SECONDS: Final = 30.0
"""How long a held request waits for ``release`` at most, when the rule names no time."""


@dataclass
class FaultRule:
    """One registered fault.  ``remaining`` is ``None`` for an unlimited rule."""

    method: str
    path_regex: re.Pattern[str]
    action: str
    arg: float | None
    remaining: int | None
    query_regex: re.Pattern[str] | None = None
    hits: int = 0
    released: threading.Event = field(default_factory=threading.Event)

    def release(self) -> None:
        """Let the requests this ``hold`` rule holds (and any it would hold later) go on."""
        self.released.set()

    def applies(self, method: str, path: str, is_watch: bool, query: str = "") -> bool:
        if self.remaining is not None and self.remaining <= 0:
            return False
        if self.method not in {"*", method}:
            return False
        if self.query_regex is not None and self.query_regex.search(query) is None:
            return False
        if self.action == "drop_watch" and not is_watch:
            return False
        if self.action in {"after_write_status", "after_write_delay"} and is_watch:
            return False
        return self.path_regex.search(path) is not None


class FaultInjector:
    """Registry of fault rules consulted for every HTTP request (first match wins).

    Actions:

    * ``("status", code)`` answer ``code`` with a Status body; the store is untouched.
    * ``("delay", seconds)`` sleep, then handle normally.
    * ``("after_write_status", code)`` handle normally (the write happens), then answer
      ``code`` instead of the real response.
    * ``("after_write_delay", seconds)`` handle normally (the write happens), then sleep
      before answering: a client timeout after the write.
    * ``("drop_watch", None)`` close a watch stream abruptly after its first event.
    * ``("close", None)`` close the connection without answering.
    * ``("hold", seconds)`` wait until the rule's ``release()`` (at most ``seconds``, or
      HOLD_SECONDS when None), then handle normally: the test acts while the client waits,
      say between two pages of a list.

    ``path_regex`` is searched in the request path; ``query_regex``, when given, in the
    query string (say ``"continue="`` for the pages of a list after the first); ``method``
    may be ``"*"``.  ``times=None`` keeps the rule forever.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[FaultRule] = []

    def add(
        self,
        method: str,
        path_regex: str,
        action: tuple[str, float | None],
        times: int | None = 1,
        query_regex: str | None = None,
    ) -> FaultRule:
        name, arg = action
        if name not in _ACTIONS:
            raise ValueError(f"unknown fault action {name!r}; expected one of {sorted(_ACTIONS)}")
        if name in {"status", "after_write_status", "after_write_delay", "delay"} and arg is None:
            raise ValueError(f"fault action {name!r} needs an argument")
        query = re.compile(query_regex) if query_regex is not None else None
        rule = FaultRule(method.upper(), re.compile(path_regex), name, arg, times, query)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            for rule in self._rules:
                rule.release()
            self._rules.clear()

    @property
    def rules(self) -> list[FaultRule]:
        with self._lock:
            return list(self._rules)

    def take(self, method: str, path: str, is_watch: bool, query: str = "") -> FaultRule | None:
        """Consume and return the first rule matching this request, if any."""
        with self._lock:
            for rule in self._rules:
                if rule.applies(method, path, is_watch, query):
                    rule.hits += 1
                    if rule.remaining is not None:
                        rule.remaining -= 1
                    return rule
        return None
