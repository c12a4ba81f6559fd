"""Each container's real GPU use beside its share, as the node agents read it.

`gas node` and `gas dra` read it every `--usage-interval` and answer the latest round at
`/usage` on their metrics port; `gas inspect` asks each agent pod of gas's namespace for it
through the API server's proxy (`pods/proxy`: the agents' ports need not be reachable from
where `kubectl gas` runs). An agent that cannot be reached, or a reader without the right
to proxy, leaves its node's use out, and a line says why. Reading and rendering are
apart: `usage_rows` and `render_usage` are pure.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gas.core.quantity import format_quantity

AGENTS = {"gas-node": 9102, "gas-dra": 9103}
"""The agents' pod labels (`app.kubernetes.io/name`) and their default metrics ports, used
when the pod names no container port `metrics`."""
USAGE_PATH = "usage"
PROXY_TIMEOUT = (5.0, 15.0)


@dataclass(frozen=True)
class UsageRow:
    node: str
    card: str
    namespace: str
    pod: str
    container: str
    used: int | None
    share: int | None
    millicores: int | None
    engines: Mapping[str, float]

    @property
    def over(self) -> bool:
        return (
            self.used is not None
            and self.share is not None
            and self.share > 0
            and self.used > self.share
        )


def usage_rows(answers: Mapping[str, Mapping[str, Any]], only_node: str | None) -> list[UsageRow]:
    """The rows of the agents' answers (node -> `/usage` body), sorted by node, card, pod."""
    rows = []
    for node, answer in answers.items():
        if only_node is not None and node != only_node:
            continue
        for entry in answer.get("containers") or []:
            if not isinstance(entry, Mapping):
                continue
            rows.append(
                UsageRow(
                    node,
                    str(entry.get("card") or ""),
                    str(entry.get("namespace") or ""),
                    str(entry.get("pod") or ""),
                    str(entry.get("container") or ""),
                    _number(entry.get("memoryBytes")),
                    _number(entry.get("memoryShareBytes")),
                    _number(entry.get("millicoresShare")),
                    {
                        str(k): float(v)
                        for k, v in (entry.get("engines") or {}).items()
                        if isinstance(v, int | float)
                    },
                )
            )
    rows.sort(key=lambda r: (r.node, _card_order(r.card), r.namespace, r.pod, r.container))
    return rows


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _card_order(card: str) -> tuple[int, str]:
    digits = card.removeprefix("card")
    return (int(digits), card) if digits.isdigit() else (1 << 30, card)


def _amount(value: int | None) -> str:
    return "-" if value is None else format_quantity(value)


def render_usage(rows: Sequence[UsageRow], errors: Iterable[str]) -> list[str]:
    """The table of use beside share, over-use marked."""
    lines: list[str] = []
    if rows:
        table = [["NODE", "CARD", "POD", "CONTAINER", "MEMORY USED", "SHARE", "ENGINES", ""]]
        for row in rows:
            engines = ", ".join(f"{k} {v:.0%}" for k, v in sorted(row.engines.items()) if v)
            table.append(
                [
                    row.node,
                    row.card,
                    f"{row.namespace}/{row.pod}",
                    row.container,
                    _amount(row.used),
                    _amount(row.share) if row.share else "none",
                    engines or "-",
                    "OVER" if row.over else "",
                ]
            )
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
        lines = [
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table
        ]
        over = sum(r.over for r in rows)
        lines.append(f"GPU use: {len(rows)} container(s) on cards, {over} over their share")
    lines += [f"GPU use not shown: {error}" for error in errors]
    return lines


def usage_json(rows: Sequence[UsageRow], errors: Sequence[str]) -> dict[str, Any]:
    return {
        "containers": [
            {
                "node": r.node,
                "card": r.card,
                "namespace": r.namespace,
                "pod": r.pod,
                "container": r.container,
                "memoryBytes": r.used,
                "memoryShareBytes": r.share,
                "millicoresShare": r.millicores,
                "engines": dict(r.engines),
                "over": r.over,
            }
            for r in rows
        ],
        "errors": list(errors),
    }


def _metrics_port(spec: Mapping[str, Any]) -> int | None:
    """The container port named `metrics` (an agent started with another --metrics-port
    says so there)."""
    for container in spec.get("containers") or []:
        for port in (container or {}).get("ports") or []:
            number = (port or {}).get("containerPort")
            if (port or {}).get("name") == "metrics" and isinstance(number, int):
                return number
    return None


def read_usage(
    api_client: Any, namespace: str, only_node: str | None
) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """Node -> the `/usage` answer of its agent, and why any could not be read."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from gas.kubeapi.core import RawCoreV1Api, status_message

    core = RawCoreV1Api(api_client)
    selector = f"app.kubernetes.io/name in ({','.join(sorted(AGENTS))})"
    try:
        listed = json.loads(
            core.list_namespaced_pod(
                namespace, label_selector=selector, _request_timeout=PROXY_TIMEOUT
            ).data
        )
    except ApiException as exc:
        message = status_message(exc.status, exc.reason, exc.body)
        return {}, [f"cannot list the agents in {namespace}: {message}"]
    except (HTTPError, OSError) as exc:
        return {}, [f"cannot reach the API server: {exc}"]
    answers: dict[str, dict[str, Any]] = {}
    errors: list[str] = []
    for pod in listed.get("items") or []:
        metadata, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        node = str(spec.get("nodeName") or "")
        if not node or (only_node is not None and node != only_node):
            continue
        if (pod.get("status") or {}).get("phase") != "Running":
            continue
        port = _metrics_port(spec) or AGENTS.get(
            str((metadata.get("labels") or {}).get("app.kubernetes.io/name"))
        )
        name = f"{metadata.get('name')}:{port}"
        try:
            response = core.connect_get_namespaced_pod_proxy_with_path(
                name, namespace, USAGE_PATH, _request_timeout=PROXY_TIMEOUT
            )
            body = json.loads(response.data)
        except ApiException as exc:
            message = status_message(exc.status, exc.reason, exc.body)
            errors.append(f"node {node}: {message}")
            continue
        except (HTTPError, OSError, ValueError) as exc:
            errors.append(f"node {node}: {exc}")
            continue
        if isinstance(body, dict):
            answers[node] = body
    return answers, errors
