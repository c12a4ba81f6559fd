"""Which pod and container a device-plugin request is for.

The device-plugin API never says: `GetPreferredAllocation` and `Allocate` carry only device
IDs. What is known around a request:

- the kubelet admits pods one at a time, and within a pod allocates container by
  container in `spec.containers` order, calling the plugin once per container;
- just before admitting a pod the kubelet adds it to the pods it knows, and its
  pod-resources `List` reports every pod it knows with the device IDs each container
  already holds; a pod of a later batch, or later in the same batch, is not listed yet;
- pods bound to this node (from the API server) carry gas's card choice per container;
- pods reaching the kubelet together are admitted oldest first (`creationTimestamp`);
- the request asks for as many devices as the container asks for (one share per device)
  and offers the available ones (`GetPreferredAllocation`), or names those chosen
  (`Allocate`).

So a pending pod is a candidate while one of its GPU containers holds no device yet; its
next GPU container is the one asking. Only candidates the kubelet lists are considered,
oldest first (creation time, then namespace and name). A candidate
must ask for the request's device count, and in `GetPreferredAllocation` its cards must all
be among the available devices; in `Allocate`, a candidate whose cards are those chosen is
taken before one whose are not. Everything here is pure, over plain records.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gas.core.model import (
    ANNOTATION_CARDS,
    ANNOTATION_NODE_CARDS,
    ANNOTATION_TILES,
    GPU_COUNT_RESOURCES,
    SpecError,
    as_list,
    as_mapping,
    container_requests,
    parse_cards,
    parse_tiles,
)
from gas.node.allocation import AllocationError, composite_hierarchy, mismatch, preferred_ids

GAS, UNMANAGED, PROBLEM, MISMATCH, UNIDENTIFIED = (
    "gas",
    "unmanaged",
    "problem",
    "mismatch",
    "unidentified",
)
PENDING_PHASES = frozenset({"", "Pending"})

Held = Mapping[tuple[str, str], Mapping[str, Collection[str]]]
"""Pod-resources, for one resource: (namespace, name) -> container name -> device IDs held.
Every pod the kubelet lists is a key, with or without devices."""


@dataclass(frozen=True)
class ContainerRecord:
    """One app container: what it asks of the device plugins and what gas gave it."""

    index: int
    name: str
    devices: Mapping[str, int]
    """Device-plugin resource (i915/xe) -> count."""
    cards: tuple[str, ...] = ()
    tiles: tuple[tuple[str, tuple[int, ...]], ...] = ()
    composite: bool = False


@dataclass(frozen=True)
class PodRecord:
    uid: str
    namespace: str
    name: str
    created: str
    phase: str
    deleting: bool
    containers: tuple[ContainerRecord, ...]
    annotated: bool
    """The pod carries `gas-container-cards`: gas placed it."""
    problem: str | None = None
    """Why gas's annotations cannot be used; such a pod is refused, never guessed at."""
    node_cards: str | None = None
    """The pod's `gas-node-cards`: what the node agent already recorded handing out."""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)

    @property
    def pending(self) -> bool:
        return self.phase in PENDING_PHASES and not self.deleting


def _env(container: Mapping[str, Any]) -> dict[str, str]:
    env = {}
    for item in as_list(container.get("env")):
        item = as_mapping(item)
        name, value = item.get("name"), item.get("value")
        if isinstance(name, str) and isinstance(value, str):
            env[name] = value
    return env


def pod_record(obj: Mapping[str, Any]) -> PodRecord | None:
    """Read a v1.Pod (JSON dict); None when it has no UID or name. Never raises: an
    unreadable request or annotation becomes the record's `problem`."""
    metadata = as_mapping(obj.get("metadata"))
    uid, name = metadata.get("uid"), metadata.get("name")
    if not (isinstance(uid, str) and uid and isinstance(name, str) and name):
        return None
    spec = as_mapping(obj.get("spec"))
    annotations = as_mapping(metadata.get("annotations"))
    problem = None
    containers = []
    raw = [as_mapping(c) for c in as_list(spec.get("containers"))]
    for index, container in enumerate(raw):
        try:
            requests = container_requests(container)
        except SpecError as exc:
            requests, problem = {}, str(exc)
        devices = {r: requests[r] for r in GPU_COUNT_RESOURCES if requests.get(r, 0) > 0}
        cname = container.get("name")
        containers.append(
            ContainerRecord(
                index=index,
                name=cname if isinstance(cname, str) else "",
                devices=devices,
                composite=composite_hierarchy(_env(container)),
            )
        )
    cards_value = annotations.get(ANNOTATION_CARDS)
    annotated = isinstance(cards_value, str)
    if annotated and problem is None:
        try:
            containers = _with_cards(containers, str(cards_value), annotations)
        except SpecError as exc:
            problem = str(exc)
    status = as_mapping(obj.get("status"))
    phase, created = status.get("phase"), metadata.get("creationTimestamp")
    namespace = metadata.get("namespace")
    node_cards = annotations.get(ANNOTATION_NODE_CARDS)
    return PodRecord(
        uid=uid,
        namespace=namespace if isinstance(namespace, str) else "default",
        name=name,
        created=created if isinstance(created, str) else "",
        phase=phase if isinstance(phase, str) else "",
        deleting=metadata.get("deletionTimestamp") is not None,
        containers=tuple(containers),
        annotated=annotated,
        problem=problem,
        node_cards=node_cards if isinstance(node_cards, str) else None,
    )


def _with_cards(
    containers: list[ContainerRecord], value: str, annotations: Mapping[str, Any]
) -> list[ContainerRecord]:
    allocation = parse_cards(value, len(containers))
    tiles_value = annotations.get(ANNOTATION_TILES)
    tiles = (
        parse_tiles(tiles_value, allocation)
        if isinstance(tiles_value, str)
        else tuple(() for _ in allocation)
    )
    result = []
    for container, cards, entries in zip(containers, allocation, tiles, strict=True):
        for resource, count in container.devices.items():
            if not cards:
                raise SpecError(
                    f"{ANNOTATION_CARDS} gives container {container.name!r} no card, "
                    f"but it asks for {count} {resource}"
                )
            if count % len(cards):
                raise SpecError(
                    f"{ANNOTATION_CARDS} gives container {container.name!r} {len(cards)} "
                    f"card(s) for {count} {resource}"
                )
        result.append(
            ContainerRecord(
                index=container.index,
                name=container.name,
                devices=container.devices,
                cards=cards,
                tiles=entries,
                composite=container.composite,
            )
        )
    return result


@dataclass(frozen=True)
class Candidate:
    pod: PodRecord
    container: ContainerRecord
    known: bool
    """The kubelet's pod-resources lists the pod."""


def next_container(
    pod: PodRecord, resource: str, held: Mapping[str, Collection[str]]
) -> ContainerRecord | None:
    """The pod's first container asking for `resource` that holds none of it yet."""
    for container in pod.containers:
        if container.devices.get(resource, 0) > 0 and not held.get(container.name):
            return container
    return None


def candidates(
    pods: Iterable[PodRecord], resource: str, held: Held, refused: Collection[str] = ()
) -> list[Candidate]:
    """Pending pods with a container still waiting for `resource`, in the order the
    kubelet would reach them. `refused` are UIDs whose admission the plugin already
    failed: the kubelet does not retry a pod it rejected."""
    found = []
    for pod in pods:
        if not pod.pending or pod.uid in refused:
            continue
        container = next_container(pod, resource, held.get(pod.key, {}))
        if container is not None:
            found.append(Candidate(pod, container, pod.key in held))
    found.sort(key=lambda c: (c.pod.created, c.pod.namespace, c.pod.name))
    return found


@dataclass(frozen=True)
class Decision:
    """`outcome`: GAS (serve `candidate` with gas's cards), UNMANAGED (a pod gas did not
    place: the kubelet's choice, reported), PROBLEM (gas's annotations cannot be used),
    MISMATCH (the pod is known but cannot get gas's cards) or UNIDENTIFIED."""

    outcome: str
    candidate: Candidate | None = None
    reason: str = ""
    preferred: tuple[str, ...] = ()


def _fits(
    candidate: Candidate, size: int, available: Collection[str], must_include: Collection[str]
) -> tuple[str, ...] | None:
    if not candidate.pod.annotated or candidate.pod.problem:
        return ()
    try:
        chosen = preferred_ids(candidate.container.cards, size, available, must_include)
    except AllocationError:
        return None
    return None if chosen is None else tuple(chosen)


def _served(candidate: Candidate, preferred: tuple[str, ...] = ()) -> Decision:
    pod = candidate.pod
    if pod.problem:
        return Decision(PROBLEM, candidate, pod.problem)
    if not pod.annotated:
        return Decision(
            UNMANAGED, candidate, f"pod has no {ANNOTATION_CARDS}: gas did not place it"
        )
    return Decision(GAS, candidate, preferred=preferred)


def _pool(found: list[Candidate], resource: str, size: int) -> tuple[list[Candidate], str]:
    """Candidates the kubelet knows, asking for `size`. A pod the kubelet does not list
    cannot be the one it is admitting: it adds a pod to its pods before admitting it."""
    pool = [c for c in found if c.known]
    if found and not pool:
        oldest = found[0].pod
        return [], (
            f"the kubelet lists none of the {len(found)} pending pod(s) waiting for "
            f"{resource} (the first: {oldest.namespace}/{oldest.name})"
        )
    sized = [c for c in pool if c.container.devices.get(resource) == size]
    if pool and not sized:
        first = pool[0]
        asks = first.container.devices.get(resource)
        return [], (
            f"no pending pod's next container asks for {size} {resource}: the first "
            f"candidate, {first.pod.namespace}/{first.pod.name} container "
            f"{first.container.name!r}, asks for {asks}"
        )
    if not pool:
        return [], f"no pending pod on this node has a container waiting for {resource}"
    return sized, ""


def for_preferred(
    found: list[Candidate],
    resource: str,
    size: int,
    available: Collection[str],
    must_include: Collection[str] = (),
) -> Decision:
    """Identify a `GetPreferredAllocation` request and choose its device IDs."""
    sized, reason = _pool(found, resource, size)
    if not sized:
        return Decision(UNIDENTIFIED, reason=reason)
    for candidate in sized:
        chosen = _fits(candidate, size, available, must_include)
        if chosen is not None:
            return _served(candidate, chosen)
    first = sized[0]
    return Decision(
        MISMATCH,
        first,
        f"its cards {', '.join(first.container.cards)} do not have {size} free healthy "
        f"shares among the {len(available)} devices the kubelet offers",
    )


def for_allocate(found: list[Candidate], resource: str, ids: Collection[str]) -> Decision:
    """Identify an `Allocate` request; a GAS decision means the IDs are gas's cards."""
    sized, reason = _pool(found, resource, len(ids))
    if not sized:
        return Decision(UNIDENTIFIED, reason=reason)
    for candidate in sized:
        if not candidate.pod.annotated or candidate.pod.problem:
            return _served(candidate)
        if mismatch(candidate.container.cards, ids) is None:
            return _served(candidate)
    first = sized[0]
    return Decision(MISMATCH, first, mismatch(first.container.cards, ids) or "")


def check_allocate(candidate: Candidate, ids: Collection[str]) -> Decision:
    """The decision for `Allocate` when `GetPreferredAllocation` already identified the
    container: the IDs must be its cards."""
    decision = _served(candidate)
    if decision.outcome != GAS:
        return decision
    why = mismatch(candidate.container.cards, ids)
    return decision if why is None else Decision(MISMATCH, candidate, why)
