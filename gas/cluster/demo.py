"""The built-in demo cluster: nodes and pods held in memory, loaded from a YAML file.

It stands in for a real cluster under `gas serve --demo`, so a new user can send filter and
bind requests and watch cards being handed out. A bind stores the pod as bound, with its
annotations, and feeds it to the ledger as the watch would.
"""

from __future__ import annotations

import copy
import json
import pickle
import threading
from collections.abc import Mapping
from importlib import resources
from typing import Any

import yaml

from gas.cluster.protocol import BindRejected
from gas.core.holdings import observe_pod
from gas.core.ledger import Ledger
from gas.core.model import as_list, as_mapping, node_from_object

DEFAULT_DEMO_FILE = "demo-cluster.yaml"


def load_demo_file(path: str | None) -> dict[str, Any]:
    if path is None:
        text = resources.files("gas").joinpath("data", DEFAULT_DEMO_FILE).read_text()
    else:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    data = _parse(text)
    if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
        raise ValueError(f"demo cluster file {path or DEFAULT_DEMO_FILE} needs a 'nodes' list")
    return data


def _parse(text: str) -> Any:
    # JSON is YAML too, and a generated cluster of thousands of nodes and pods is usually
    # written as JSON: the json module reads it a hundred times faster than a YAML parser.
    if text.lstrip().startswith("{"):
        try:
            return json.loads(text)
        except ValueError:
            pass  # YAML flow style, such as {nodes: [...]}
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)


def _store(pod: Mapping[str, Any]) -> bytes:
    return pickle.dumps(pod, protocol=pickle.HIGHEST_PROTOCOL)


def _load(blob: bytes) -> dict[str, Any]:
    pod: dict[str, Any] = pickle.loads(blob)  # only ever our own `_store` output
    return pod


class DemoCluster:
    def __init__(self, ledger: Ledger, data: Mapping[str, Any]) -> None:
        self._ledger = ledger
        self._lock = threading.Lock()
        self._nodes = [as_mapping(n) for n in as_list(data.get("nodes"))]
        # Pods are kept pickled: a tenth of the memory of the objects (a generated cluster
        # may hold tens of thousands), and every read is then a private copy.
        self._pods: dict[tuple[str, str], bytes] = {}
        for index, pod in enumerate(as_list(data.get("pods"))):
            pod = dict(as_mapping(pod))
            metadata = pod["metadata"] = dict(as_mapping(pod.get("metadata")))
            metadata.setdefault("namespace", "default")
            metadata.setdefault("uid", f"demo-pod-{index}")
            self._pods[(metadata["namespace"], metadata.get("name", ""))] = _store(pod)
        self._started = False
        self.events: list[dict[str, str]] = []

    def start(self) -> None:
        self._ledger.replace_nodes(node_from_object(n) for n in self._nodes)
        with self._lock:
            stored = list(self._pods.values())
        observations = (observe_pod(_load(blob)) for blob in stored)
        self._ledger.replace_pods([o for o in observations if o is not None], 0.0)
        self._started = True

    def stop(self) -> None:
        self._started = False

    def synced(self) -> bool:
        return self._started

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            blob = self._pods.get((namespace, name))
        return _load(blob) if blob is not None else None

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> None:
        metadata = as_mapping(pod.get("metadata"))
        key = (str(metadata.get("namespace") or "default"), str(metadata.get("name") or ""))
        with self._lock:
            blob = self._pods.get(key)
            stored = _load(blob) if blob is not None else None
            if stored is not None and stored["metadata"].get("uid") != metadata.get("uid"):
                raise BindRejected(f"pod {key[0]}/{key[1]} has another UID")
            if stored is not None and stored.get("spec", {}).get("nodeName"):
                raise BindRejected(
                    f"pod {key[1]} is already assigned to node {stored['spec']['nodeName']!r}"
                )
            bound = stored if stored is not None else copy.deepcopy(dict(pod))
            bound_meta = bound.setdefault("metadata", {})
            bound_meta["namespace"] = key[0]
            bound_meta["annotations"] = {**(bound_meta.get("annotations") or {}), **annotations}
            bound.setdefault("spec", {})["nodeName"] = node
            self._pods[key] = _store(bound)
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
