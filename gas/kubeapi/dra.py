"""The resource.k8s.io/v1 calls of `gas dra` and of `gas webhook --draClaims`:
`RawResourceV1Api`, each method named and called as its namesake in the generated
client's `ResourceV1Api`, made as `gas.kubeapi.core` makes the core/v1 ones (the response
returned unread, a status outside 2xx raised as `ApiException`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

from urllib3 import BaseHTTPResponse

from gas.kubeapi.core import JSON, ListOptions, Timeout, _Calls

GROUP = "/apis/resource.k8s.io/v1"
SLICES_PATH = GROUP + "/resourceslices"
SLICE_PATH = SLICES_PATH + "/{name}"
CLAIM_PATH = GROUP + "/namespaces/{namespace}/resourceclaims/{name}"
CLAIM_STATUS_PATH = CLAIM_PATH + "/status"
CLAIMS_PATH = GROUP + "/resourceclaims"
TEMPLATES_PATH = GROUP + "/namespaces/{namespace}/resourceclaimtemplates"
TEMPLATE_PATH = TEMPLATES_PATH + "/{name}"


class RawResourceV1Api(_Calls):
    def read_namespaced_resource_claim(
        self, name: str, namespace: str, *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        where = {"name": name, "namespace": namespace}
        return self._call("GET", CLAIM_PATH, where, timeout=_request_timeout)

    def replace_namespaced_resource_claim_status(
        self,
        name: str,
        namespace: str,
        body: Mapping[str, Any],
        *,
        _request_timeout: Timeout = None,
    ) -> BaseHTTPResponse:
        return self._call(
            "PUT",
            CLAIM_STATUS_PATH,
            {"name": name, "namespace": namespace},
            body=body,
            content_type=JSON,
            timeout=_request_timeout,
        )

    def read_namespaced_resource_claim_template(
        self, name: str, namespace: str, *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        where = {"name": name, "namespace": namespace}
        return self._call("GET", TEMPLATE_PATH, where, timeout=_request_timeout)

    def create_namespaced_resource_claim_template(
        self, namespace: str, body: Mapping[str, Any], *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        return self._call(
            "POST",
            TEMPLATES_PATH,
            {"namespace": namespace},
            body=body,
            content_type=JSON,
            timeout=_request_timeout,
        )

    def list_resource_slice(self, **options: Unpack[ListOptions]) -> BaseHTTPResponse:
        return self._list(SLICES_PATH, options)

    def list_resource_claim_for_all_namespaces(
        self, **options: Unpack[ListOptions]
    ) -> BaseHTTPResponse:
        return self._list(CLAIMS_PATH, options)

    def create_resource_slice(
        self, body: Mapping[str, Any], *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        return self._call(
            "POST", SLICES_PATH, {}, body=body, content_type=JSON, timeout=_request_timeout
        )

    def replace_resource_slice(
        self, name: str, body: Mapping[str, Any], *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        return self._call(
            "PUT",
            SLICE_PATH,
            {"name": name},
            body=body,
            content_type=JSON,
            timeout=_request_timeout,
        )

    def delete_resource_slice(
        self, name: str, *, _request_timeout: Timeout = None
    ) -> BaseHTTPResponse:
        return self._call("DELETE", SLICE_PATH, {"name": name}, timeout=_request_timeout)
