"""Reading the cluster (nodes and pods, a page at a time) and a running gas's ledger."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
from collections.abc import Mapping
from typing import Any

API_TIMEOUT = (5.0, 60.0)
EXTENDER_TIMEOUT = 10.0

log = logging.getLogger(__name__)


class InspectError(Exception):
    """The cluster or the extender could not be read; the message says what failed."""


def cluster_client(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import client, config

    from gas.cluster.kube import load_api_client

    try:
        if kubeconfig is None and context is None:
            with contextlib.suppress(config.ConfigException):
                return load_api_client(None)  # in a pod: its ServiceAccount
        configuration = client.Configuration()
        # Read now, not at import time as the client's own default is.
        path = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        load_kube_config: Any = config.load_kube_config  # untyped in the client
        load_kube_config(
            config_file=path,
            context=context,
            client_configuration=configuration,
            persist_config=False,
        )
    except config.ConfigException as exc:
        raise InspectError(
            f"no usable Kubernetes configuration ({exc}); "
            "give --kubeConfig, set KUBECONFIG, or run in a pod"
        ) from exc
    except OSError as exc:
        raise InspectError(f"cannot read the kubeconfig: {exc}") from exc
    return client.ApiClient(configuration)


def read_cluster(
    api_client: Any, only_node: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    from gas.kubeapi.core import RawCoreV1Api

    core = RawCoreV1Api(api_client)
    if only_node is None:
        nodes = _list_all(core.list_node, "nodes")
        pods = _list_all(core.list_pod_for_all_namespaces, "pods")
    else:
        nodes = _list_all(core.list_node, "nodes", field_selector=f"metadata.name={only_node}")
        pods = _list_all(
            core.list_pod_for_all_namespaces, "pods", field_selector=f"spec.nodeName={only_node}"
        )
    return nodes, pods


def read_dra(
    api_client: Any, only_node: str | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str | None]:
    """The ResourceSlices and ResourceClaims (the DRA nodes' books), and why they could not
    be read (None when they were). An API server without `resource.k8s.io/v1` (before
    1.34) has no DRA nodes: both lists are empty and nothing is wrong. Any other failure
    (a reader allowed nodes and pods but not these) is told, not fatal: the cards of
    `gas node`'s nodes are still worth showing."""
    from kubernetes.client.exceptions import ApiException

    from gas.core.dra_claims import DRIVER
    from gas.kubeapi.dra import RawResourceV1Api

    resources = RawResourceV1Api(api_client)
    # The API server filters the slices; a claim names no node it could filter on.
    selector = f"spec.driver={DRIVER}"
    if only_node is not None:
        selector += f",spec.nodeName={only_node}"
    try:
        slices = _list_all(resources.list_resource_slice, "resourceslices", selector)
        claims = _list_all(resources.list_resource_claim_for_all_namespaces, "resourceclaims")
    except InspectError as exc:
        cause = exc.__cause__
        if isinstance(cause, ApiException) and cause.status == 404:
            return [], [], None
        return [], [], str(exc)
    return slices, claims, None


def _list_all(call: Any, what: str, field_selector: str | None = None) -> list[dict[str, Any]]:
    """Every item, a page at a time (one huge list would be slow on the API server too),
    as gas's own reflector reads it: a list whose continue token expires mid-way is read
    again from the start, so the answer is always one snapshot of the cluster."""
    from gas.kubeapi.paging import ListRestart, list_pages

    def restarted(restart: ListRestart) -> None:
        log.warning("%s %s", what, restart)

    items: list[dict[str, Any]] = []
    try:
        # In pages of gas's reflector's size.
        for page in list_pages(
            call, field_selector=field_selector, timeout=API_TIMEOUT, on_restart=restarted
        ):
            if page.first:
                items = []  # the list started over: what an expired one gave goes
            items.extend(item for item in page.items if isinstance(item, dict))
    except Exception as exc:
        raise InspectError(f"cannot list {what}: {_api_error(exc)}") from exc
    return items


def _api_error(exc: Exception) -> str:
    from kubernetes.client.exceptions import ApiException

    from gas.kubeapi.core import status_message

    if isinstance(exc, ApiException):
        return status_message(exc.status, exc.reason, exc.body)
    return str(exc) or type(exc).__name__


def fetch_ledger(args: argparse.Namespace) -> Mapping[str, Any]:
    import requests
    import urllib3

    verify: bool | str = args.cacert or True
    if args.insecure:
        verify = False
        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    if bool(args.cert) != bool(args.key):
        raise InspectError("--cert and --key go together")
    url = args.extender.rstrip("/") + "/debug/ledger"
    try:
        response = requests.get(
            url,
            verify=verify,
            cert=(args.cert, args.key) if args.cert else None,
            timeout=EXTENDER_TIMEOUT,
        )
        response.raise_for_status()
        ledger = response.json()
    except (requests.RequestException, ValueError) as exc:
        raise InspectError(f"cannot read the ledger at {url}: {exc}") from exc
    if not isinstance(ledger, dict) or not isinstance(ledger.get("usage"), dict):
        raise InspectError(f"{url} did not answer a gas ledger")
    return ledger
