"""The node side's Kubernetes client: loading it, reading this node, patching it,
describing failures.

`gas node` makes seven core/v1 calls, all through `gas.kubeapi.core.RawCoreV1Api`: the
official client's `ApiClient` (its configuration, kubeconfig and in-cluster loaders,
credentials, TLS and connection pool) without the generated `CoreV1Api` and its models,
which would add about 20 MiB to a process whose job needs none of them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from urllib3 import BaseHTTPResponse

from gas.host.errors import NodeError
from gas.kubeapi.core import MERGE_PATCH, RawCoreV1Api

API_TIMEOUT = (5.0, 30.0)
"""Connect and read timeouts of each API call."""


def core_api(kubeconfig: str | None) -> RawCoreV1Api:
    """The client from the kubeconfig when given, else in-cluster, else $KUBECONFIG or
    ~/.kube/config."""
    from kubernetes import client, config

    # The client's config loaders carry no annotations.
    from_file: Callable[..., Any] = config.new_client_from_config
    in_cluster: Callable[..., None] = config.load_incluster_config
    if kubeconfig and not os.path.isfile(kubeconfig):
        raise NodeError(f"kubeconfig {kubeconfig}: no such file")
    try:
        if kubeconfig:
            return RawCoreV1Api(from_file(config_file=kubeconfig))
        configuration = client.Configuration()
        try:
            in_cluster(client_configuration=configuration)
            return RawCoreV1Api(client.ApiClient(configuration))
        except config.ConfigException:
            return RawCoreV1Api(from_file())
    except (config.ConfigException, OSError) as exc:
        where = kubeconfig or "not in a cluster, and no --kubeConfig"
        raise NodeError(f"cannot load Kubernetes client configuration ({where}): {exc}") from exc


def read_node(api: RawCoreV1Api, node: str) -> dict[str, Any]:
    """The node object as JSON, as the API server sent it."""
    response = api.read_node(node, _request_timeout=API_TIMEOUT)
    obj = json.loads(response.data)
    if not isinstance(obj, dict):
        raise ValueError(f"node {node}: the API server sent no object")
    return obj


def merge_patch(call: Callable[..., BaseHTTPResponse], name: str, body: Mapping[str, Any]) -> None:
    """A JSON merge patch through a client method (`patch_node`, `patch_node_status`).

    The answer is not decoded: only the write matters.
    """
    response = call(name, dict(body), _content_type=MERGE_PATCH, _request_timeout=API_TIMEOUT)
    # Read to the end, so the connection goes back to the pool clean for the next call.
    response.drain_conn()
    response.release_conn()


def describe_api_error(exc: Exception, node: str) -> str:
    status = getattr(exc, "status", None)
    if status == 404:
        return f"node {node} not found"
    if status in (401, 403):
        return f"not allowed to read or patch node {node} (HTTP {status}): check the RBAC rules"
    if status is not None:
        return f"API error on node {node}: HTTP {status} {getattr(exc, 'reason', '')}".strip()
    return f"cannot reach the API server: {exc}"
