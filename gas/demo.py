"""The built-in demo cluster: nodes and pods held in memory, loaded from a YAML file.

It stands in for a real cluster when gas runs without a kubeconfig, so a new user can
send filter and bind requests and watch cards being handed out. A bind stores the pod as
bound, with its annotations, and feeds it to the ledger as the watch would.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml

from gas.cluster import BindRejected
from gas.ledger import Ledger, observe_pod
from gas.model import as_list, as_mapping, node_from_object

DEFAULT_DEMO_FILE = "demo-cluster.yaml"


def load_demo_file(path: str | None) -> dict[str, Any]:
    if path is None:
        text = resources.files("gas").joinpath("data", DEFAULT_DEMO_FILE).read_text()
    else:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ValueError(f"demo cluster file {path or DEFAULT_DEMO_FILE} needs a 'nodes' list")
    return data


class DemoCluster:
    def __init__(self, ledger: Ledger, data: Mapping[str, Any]) -> None:
        self._ledger = ledger
        self._lock = threading.Lock()
        self._nodes = [as_mapping(n) for n in as_list(data.get("nodes"))]
        self._pods: dict[tuple[str, str], dict[str, Any]] = {}
        for index, pod in enumerate(as_list(data.get("pods"))):
            pod = copy.deepcopy(dict(as_mapping(pod)))
            metadata = pod.setdefault("metadata", {})
            metadata.setdefault("namespace", "default")
            metadata.setdefault("uid", f"demo-pod-{index}")
            self._pods[(metadata["namespace"], metadata.get("name", ""))] = pod
        self._started = False
        self.events: list[dict[str, str]] = []

    def start(self) -> None:
        self._ledger.replace_nodes(node_from_object(n) for n in self._nodes)
        with self._lock:
            pods = [copy.deepcopy(p) for p in self._pods.values()]
        self._ledger.replace_pods([o for o in map(observe_pod, pods) if o is not None], 0.0)
        self._started = True

    def stop(self) -> None:
        self._started = False

    def synced(self) -> bool:
        return self._started

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            pod = self._pods.get((namespace, name))
            return copy.deepcopy(pod) if pod is not None else None

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> None:
        metadata = as_mapping(pod.get("metadata"))
        key = (str(metadata.get("namespace") or "default"), str(metadata.get("name") or ""))
        with self._lock:
            stored = self._pods.get(key)
            if stored is not None and stored["metadata"].get("uid") != metadata.get("uid"):
                raise BindRejected(f"pod {key[0]}/{key[1]} has another UID")
            if stored is not None and stored.get("spec", {}).get("nodeName"):
                raise BindRejected(
                    f"pod {key[1]} is already assigned to node {stored['spec']['nodeName']!r}"
                )
            bound = copy.deepcopy(dict(stored if stored is not None else pod))
            bound_meta = bound.setdefault("metadata", {})
            bound_meta["namespace"] = key[0]
            bound_meta["annotations"] = {**(bound_meta.get("annotations") or {}), **annotations}
            bound.setdefault("spec", {})["nodeName"] = node
            self._pods[key] = bound
        observation = observe_pod(bound)
        if observation is not None:
            self._ledger.observe(observation)

    def record_event(
        self, pod: Mapping[str, Any], event_type: str, reason: str, message: str
    ) -> None:
        metadata = as_mapping(pod.get("metadata"))
        with self._lock:
            self.events.append(
                {
                    "pod": f"{metadata.get('namespace')}/{metadata.get('name')}",
                    "type": event_type,
                    "reason": reason,
                    "message": message,
                }
            )
            del self.events[:-1000]
