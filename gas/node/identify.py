"""Which pod and container a device-plugin request is for.

The device-plugin API never says: `GetPreferredAllocation` and `Allocate` carry only device
IDs. What is known around a request:

- the kubelet admits pods one at a time (`HandlePodAdditions`: a batch sorted by
  creation time, then pod after pod), and within a pod allocates container by container
  in `spec.containers` order (init containers first), calling the plugin once per
  container;
- just before admitting a pod the kubelet adds it to the pods it knows, and its
  pod-resources `List` reports every pod it knows, admitted or refused, with the device
  IDs each container already holds; a pod of a later batch, or later in the same batch,
  is not listed yet;
- pods bound to this node (from the API server) carry gas's card choice per container;
- the request asks for as many devices as the container asks for (one share per device)
  and offers the available ones (`GetPreferredAllocation`), or names those chosen
  (`Allocate`).

So a pending pod is a candidate while one of its GPU containers holds no device yet; its
next GPU container is the one asking. Only candidates the kubelet lists can be the one it
is admitting, and of those only the one it listed last: since the kubelet adds a pod just
before admitting it and admits one pod at a time, every candidate it listed earlier has
finished its admission without devices (refused by the kubelet for another reason, say
`OutOfcpu` or an eviction threshold, whose Failed status has not reached the API server
yet). `listed` numbers the pod-resources listings in which a pod was first seen; the
candidates first seen in the newest listing are the pool. The pool must hold exactly one
candidate whose next container asks for the request's device count: two (a refused pod
and the one being admitted first seen in the same listing) are ambiguous, and the
request is refused rather than guessed at. Then, in `GetPreferredAllocation` its cards must
all be among the devices offered, and in `Allocate` they must be those chosen. Everything
here is pure, over plain records.
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

GAS, UNMANAGED, PROBLEM, MISMATCH, UNIDENTIFIED, AMBIGUOUS = (
    "gas",
    "unmanaged",
    "problem",
    "mismatch",
    "unidentified",
    "ambiguous",
)
PENDING_PHASES = frozenset({"", "Pending"})

Held = Mapping[tuple[str, str], Mapping[str, Collection[str]]]
"""Pod-resources, for one resource: (namespace, name) -> container name -> device IDs held.
Every pod the kubelet lists is a key, with or without devices."""


@dataclass(frozen=True)
class ContainerRecord:
    """One container: what it asks of the device plugins and what gas gave it. `index`
    counts in `spec.containers`, or in `spec.initContainers` for an `init` one."""

    index: int
    name: str
    devices: Mapping[str, int]
    """Device-plugin resource (i915/xe) -> count."""
    cards: tuple[str, ...] = ()
    tiles: tuple[tuple[str, tuple[int, ...]], ...] = ()
    composite: bool = False
    init: bool = False


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
    init_containers: tuple[ContainerRecord, ...] = ()
    """The init containers asking for GPUs: the kubelet allocates theirs first."""

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
    for index, container in enumerate(as_list(spec.get("containers"))):
        record, trouble = _container_record(index, as_mapping(container), init=False)
        containers.append(record)
        problem = problem or trouble
    inits = []
    for index, container in enumerate(as_list(spec.get("initContainers"))):
        record, trouble = _container_record(index, as_mapping(container), init=True)
        if record.devices:
            inits.append(record)
        problem = problem or trouble
    cards_value = annotations.get(ANNOTATION_CARDS)
    annotated = isinstance(cards_value, str)
    if annotated and problem is None and inits:
        problem = (
            f"init container {inits[0].name!r} asks for GPUs, and gas places the GPUs of "
            "app containers only: it cannot say which cards an init container gets"
        )
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
        init_containers=tuple(inits),
    )


def _container_record(
    index: int, container: Mapping[str, Any], init: bool
) -> tuple[ContainerRecord, str | None]:
    """The container's record, and why its requests cannot be read (if so)."""
    problem = None
    try:
        requests = container_requests(container, "init container" if init else "container")
    except SpecError as exc:
        requests, problem = {}, str(exc)
    devices = {r: requests[r] for r in GPU_COUNT_RESOURCES if requests.get(r, 0) > 0}
    name = container.get("name")
    record = ContainerRecord(
        index=index,
        name=name if isinstance(name, str) else "",
        devices=devices,
        composite=composite_hierarchy(_env(container)),
        init=init,
    )
    return record, problem


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
    listed: int = 0
    """The number of the pod-resources listing that first showed the pod (higher: later)."""


def next_container(
    pod: PodRecord, resource: str, held: Mapping[str, Collection[str]]
) -> ContainerRecord | None:
    """The pod's first container asking for `resource` that holds none of it yet, init
    containers first (pod-resources lists app containers only: what an init container
    holds is known from this agent's own answers)."""
    for container in (*pod.init_containers, *pod.containers):
        if container.devices.get(resource, 0) > 0 and not held.get(container.name):
            return container
    return None


def candidates(
    pods: Iterable[PodRecord],
    resource: str,
    held: Held,
    refused: Collection[str] = (),
    listed: Mapping[tuple[str, str], int] | None = None,
) -> list[Candidate]:
    """Pending pods with a container still waiting for `resource`, the kubelet's latest
    first (`listed`: pod key -> number of the listing that first showed it), then oldest
    first. `refused` are UIDs whose admission the plugin already failed: the kubelet does
    not retry a pod it rejected."""
    found = []
    for pod in pods:
        if not pod.pending or pod.uid in refused:
            continue
        container = next_container(pod, resource, held.get(pod.key, {}))
        if container is not None:
            order = (listed or {}).get(pod.key, 0)
            found.append(Candidate(pod, container, pod.key in held, order))
    found.sort(key=lambda c: (-c.listed, c.pod.created, c.pod.namespace, c.pod.name))
    return found


@dataclass(frozen=True)
class Decision:
    """`outcome`: GAS (serve `candidate` with gas's cards), UNMANAGED (a pod gas did not
    place: the kubelet's choice, reported), PROBLEM (gas's annotations cannot be used),
    MISMATCH (the pod is known but cannot get gas's cards), UNIDENTIFIED (no candidate)
    or AMBIGUOUS (more than one, which the API server may settle soon)."""

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


def _name(candidate: Candidate) -> str:
    pod = candidate.pod
    return f"{pod.namespace}/{pod.name} container {candidate.container.name!r}"


def _one(found: list[Candidate], resource: str, size: int) -> Candidate | Decision:
    """The one candidate the request can be for, or the decision saying why there is none.

    A pod the kubelet does not list cannot be the one it is admitting (it adds a pod to
    its pods before admitting it), nor can one it listed before another candidate (that
    one's admission has ended)."""
    pool = [c for c in found if c.known]
    if not pool:
        if found:
            oldest = min(found, key=lambda c: c.pod.created).pod
            reason = (
                f"the kubelet lists none of the {len(found)} pending pod(s) waiting for "
                f"{resource} (the first: {oldest.namespace}/{oldest.name})"
            )
        else:
            reason = f"no pending pod on this node has a container waiting for {resource}"
        return Decision(UNIDENTIFIED, reason=reason)
    newest = max(c.listed for c in pool)
    latest = [c for c in pool if c.listed == newest]
    sized = [c for c in latest if c.container.devices.get(resource) == size]
    if not sized:
        first = latest[0]
        return Decision(
            UNIDENTIFIED,
            reason=f"no pending pod's next container asks for {size} {resource}: the "
            f"kubelet's latest candidate, {_name(first)}, asks for "
            f"{first.container.devices.get(resource)}",
        )
    if len(sized) > 1:
        names = ", ".join(_name(c) for c in sized[:4])
        return Decision(
            AMBIGUOUS,
            reason=f"{len(sized)} pending pods the kubelet listed at once each wait for "
            f"{size} {resource} ({names}): all but one were refused by the kubelet, and "
            "the API server does not say which yet",
        )
    return sized[0]


def for_preferred(
    found: list[Candidate],
    resource: str,
    size: int,
    available: Collection[str],
    must_include: Collection[str] = (),
) -> Decision:
    """Identify a `GetPreferredAllocation` request and choose its device IDs."""
    candidate = _one(found, resource, size)
    if isinstance(candidate, Decision):
        return candidate
    chosen = _fits(candidate, size, available, must_include)
    if chosen is not None:
        return _served(candidate, chosen)
    return Decision(
        MISMATCH,
        candidate,
        f"its cards {', '.join(candidate.container.cards)} do not have {size} free healthy "
        f"shares among the {len(available)} devices the kubelet offers",
    )


def for_allocate(found: list[Candidate], resource: str, ids: Collection[str]) -> Decision:
    """Identify an `Allocate` request; a GAS decision means the IDs are gas's cards."""
    candidate = _one(found, resource, len(ids))
    if isinstance(candidate, Decision):
        return candidate
    return check_allocate(candidate, ids)


def check_allocate(candidate: Candidate, ids: Collection[str]) -> Decision:
    """The decision for `Allocate` when `GetPreferredAllocation` already identified the
    container: the IDs must be its cards."""
    decision = _served(candidate)
    if decision.outcome != GAS:
        return decision
    why = mismatch(candidate.container.cards, ids)
    return decision if why is None else Decision(MISMATCH, candidate, why)
