"""Comparing gas's API calls (gas/kubeapi/) with the generated client's against the
API-server double: the request each sent, and the JSON each got back."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.support.apiserver import ApiServerDouble


def last_request(apiserver: ApiServerDouble) -> tuple[str, str, dict[str, list[str]]]:
    """The method, path and query of the last request the double received."""
    method, target = apiserver.request_targets[-1]
    parts = urlsplit(target)
    return method, parts.path, parse_qs(parts.query)


def json_body(response: Any) -> Any:
    """An unread response's JSON, its connection back in the pool."""
    data = response.data
    response.release_conn()
    return json.loads(data)


def both(
    apiserver: ApiServerDouble, ours: Callable[[], Any], theirs: Callable[[], Any]
) -> tuple[Any, Any]:
    """Both calls' answers (JSON); asserts that they sent the same request."""
    first = json_body(ours())
    sent = last_request(apiserver)
    second = json_body(theirs())
    assert last_request(apiserver) == sent
    return first, second
