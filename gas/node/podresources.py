"""The kubelet's pod-resources API (`v1.PodResourcesLister/List`): which device IDs each
container of each pod the kubelet knows already holds."""

from __future__ import annotations

from collections.abc import Collection, Mapping

import grpc

from gas.node.api.podresources.v1 import api_pb2 as podresources
from gas.node.api.podresources.v1 import api_pb2_grpc as podresources_grpc
from gas.node.sockets import DEFAULT_POD_RESOURCES_SOCKET

TIMEOUT = 5.0

Listing = Mapping[tuple[str, str], Mapping[str, Mapping[str, Collection[str]]]]
"""(namespace, name) -> container name -> resource -> device IDs."""


class PodResourcesError(Exception):
    """The kubelet's pod-resources API did not answer."""


def listing_from(response: podresources.ListPodResourcesResponse) -> Listing:
    pods: dict[tuple[str, str], dict[str, dict[str, set[str]]]] = {}
    for pod in response.pod_resources:
        containers = pods.setdefault((pod.namespace, pod.name), {})
        for container in pod.containers:
            resources = containers.setdefault(container.name, {})
            for devices in container.devices:
                resources.setdefault(devices.resource_name, set()).update(devices.device_ids)
    return pods


def held_for(listing: Listing, resource: str) -> dict[tuple[str, str], dict[str, frozenset[str]]]:
    """One resource's view of a listing, in the shape `identify.Held` takes: every listed
    pod is a key, also those whose containers hold nothing."""
    return {
        key: {name: frozenset(res.get(resource, ())) for name, res in containers.items()}
        for key, containers in listing.items()
    }


class PodResourcesClient:
    def __init__(
        self, socket_path: str = DEFAULT_POD_RESOURCES_SOCKET, timeout: float = TIMEOUT
    ) -> None:
        self.socket_path = socket_path
        self._timeout = timeout
        self._channel = grpc.insecure_channel(f"unix://{socket_path}")
        self._stub = podresources_grpc.PodResourcesListerStub(self._channel)

    def list(self) -> Listing:
        try:
            response = self._stub.List(
                podresources.ListPodResourcesRequest(), timeout=self._timeout
            )
        except grpc.RpcError as exc:
            raise PodResourcesError(
                f"pod-resources List on {self.socket_path} failed: {exc.code().name}"
            ) from exc
        return listing_from(response)

    def close(self) -> None:
        self._channel.close()
