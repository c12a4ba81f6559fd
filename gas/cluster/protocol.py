"""What the HTTP layer needs from a cluster, whether a real one or the built-in demo.

A cluster keeps the ledger fed (nodes and pods, from a list+watch or from memory) and
performs the one write gas makes: the Binding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class BindRejected(Exception):
    """The API server definitively refused the Binding; it was not written."""


class BindUncertain(Exception):
    """The Binding may or may not have been written (timeout, connection loss, 5xx)."""


class ClusterError(Exception):
    """The cluster could not be asked (connection refused, unexpected status)."""


class Cluster(Protocol):
    def start(self) -> None:
        """Begin syncing into the ledger; returns at once."""

    def stop(self) -> None:
        """Stop syncing; idempotent."""

    def synced(self) -> bool:
        """True once nodes and pods have been listed and the watches run."""

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The pod as the cluster has it now, or None if it does not exist."""

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> None:
        """Create the pod's Binding to `node` carrying `annotations`, in one API write.

        Raises BindRejected or BindUncertain.
        """

    def record_event(
        self, pod: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        """Post a Kubernetes Event about `pod` (`Normal` or `Warning`) without blocking:
        events are best effort and never delay a scheduling answer."""
