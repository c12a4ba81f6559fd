"""The I/O shell around `identify`: gathers the pods on this node (API server), what the
kubelet says each container holds (pod-resources), and this agent's own memory of what it
refused and handed out, then asks the pure identification.

The kubelet calls `GetPreferredAllocation` and then `Allocate` for the same container, one
container at a time; what `GetPreferredAllocation` identified is kept for the `Allocate`
that follows, so both answers are about the same container even when the kubelet did not
follow the preference.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from gas.node.identify import (
    AMBIGUOUS,
    UNIDENTIFIED,
    Candidate,
    Decision,
    Held,
    PodRecord,
    candidates,
    check_allocate,
    for_allocate,
    for_preferred,
)
from gas.node.podcache import PodCache
from gas.node.podresources import Listing, PodResourcesClient, held_for

log = logging.getLogger(__name__)

MEMO_SECONDS = 30.0
"""How long what `GetPreferredAllocation` identified is trusted for the next `Allocate`."""
FETCH_AGAIN_SECONDS = 10.0
SYNC_WAIT_SECONDS = 10.0
SETTLE_DELAYS = (0.1, 0.2, 0.4, 0.8, 1.5)
"""Waits between fresh reads when candidates are ambiguous: the kubelet writes a refused
pod's Failed status at once, so the API server settles it within a second or two. The
kubelet waits for the answer (it admits one pod at a time): 3 s of waits in all, plus the
reads between them."""


@dataclass(frozen=True)
class _Memo:
    uid: str
    container: str
    size: int
    at: float


@dataclass(frozen=True)
class State:
    """What one request is decided on."""

    pods: list[PodRecord]
    listing: Listing
    found: list[Candidate]


class PodMatcher:
    def __init__(self, cache: PodCache, pod_resources: PodResourcesClient) -> None:
        self._cache = cache
        self._pod_resources = pod_resources
        self._lock = threading.Lock()
        self._refused: set[str] = set()
        # uid -> container name -> resource -> device IDs this agent handed out: covers
        # the moment between an answer and the kubelet's pod-resources showing it.
        self._served: dict[str, dict[str, dict[str, frozenset[str]]]] = {}
        self._memo: dict[str, _Memo] = {}
        self._fetched: dict[tuple[str, str], float] = {}
        # (namespace, name) -> (UID then, number of the listing that first showed it)
        self._first_listed: dict[tuple[str, str], tuple[str | None, int]] = {}
        self._listings = 0

    # ------------------------------------------------------------ memory

    def refused(self, uid: str) -> None:
        with self._lock:
            self._refused.add(uid)

    def served(self, uid: str, container: str, resource: str, ids: Collection[str]) -> None:
        with self._lock:
            self._served.setdefault(uid, {}).setdefault(container, {})[resource] = frozenset(ids)

    def forget(self, uid: str) -> None:
        """The pod left this node (deleted): nothing about it matters any more."""
        with self._lock:
            self._refused.discard(uid)
            self._served.pop(uid, None)

    # ------------------------------------------------------------ requests

    def preferred(
        self, resource: str, size: int, available: Sequence[str], must_include: Sequence[str]
    ) -> tuple[Decision, State]:
        def decide(state: State) -> Decision:
            return for_preferred(state.found, resource, size, available, must_include)

        decision, state = self._decide(resource, decide)
        with self._lock:
            if decision.candidate is not None:
                self._memo[resource] = _Memo(
                    decision.candidate.pod.uid,
                    decision.candidate.container.name,
                    size,
                    time.monotonic(),
                )
            else:
                self._memo.pop(resource, None)
        return decision, state

    def allocate(self, resource: str, ids: Sequence[str]) -> tuple[Decision, State]:
        with self._lock:
            memo = self._memo.pop(resource, None)

        def decide(state: State) -> Decision:
            fresh = memo is not None and time.monotonic() - memo.at < MEMO_SECONDS
            if memo is not None and fresh and memo.size == len(ids):
                for candidate in state.found:
                    same = candidate.pod.uid == memo.uid
                    if same and candidate.container.name == memo.container:
                        return check_allocate(candidate, ids)
            return for_allocate(state.found, resource, ids)

        return self._decide(resource, decide, ids)

    def state(self, resource: str, allocating: Collection[str] = ()) -> State:
        """`allocating`: the IDs of the `Allocate` being decided, which no container holds
        yet, whatever a kubelet that records them early already reports."""
        listing = self._pod_resources.list()
        self._fetch_unknown(listing)
        pods = self._cache.pods()
        listed = self.observe(listing, pods)
        held = self._held(pods, listing, resource)
        if allocating:
            # ...but an init container's devices, which the app containers after it reuse
            drop = frozenset(allocating)
            inits = {(pod.key, c.name) for pod in pods for c in pod.init_containers}
            held = {
                key: {
                    name: ids if (key, name) in inits else frozenset(ids) - drop
                    for name, ids in containers.items()
                }
                for key, containers in held.items()
            }
        with self._lock:
            refused = set(self._refused)
        return State(pods, listing, candidates(pods, resource, held, refused, listed))

    def observe(
        self, listing: Listing, pods: Sequence[PodRecord] | None = None
    ) -> dict[tuple[str, str], int]:
        """Note which listing first showed each pod the kubelet lists; returns the numbers.

        A name the kubelet stops listing is forgotten, and one that comes back as another
        pod (a new UID: deleted and made again) counts as first shown now."""
        uids = {pod.key: pod.uid for pod in (self._cache.pods() if pods is None else pods)}
        with self._lock:
            self._listings += 1
            number = self._listings
            first: dict[tuple[str, str], tuple[str | None, int]] = {}
            for key in listing:
                uid = uids.get(key)
                seen_uid, seen = self._first_listed.get(key, (uid, number))
                if seen_uid is not None and uid is not None and seen_uid != uid:
                    seen = number
                first[key] = (uid if uid is not None else seen_uid, seen)
            self._first_listed = first
        return {key: seen for key, (_, seen) in first.items()}

    # ------------------------------------------------------------ internals

    def _decide(
        self,
        resource: str,
        decide: Callable[[State], Decision],
        allocating: Collection[str] = (),
    ) -> tuple[Decision, State]:
        if not self._cache.synced:
            self._cache.wait_synced(SYNC_WAIT_SECONDS)
        state = self.state(resource, allocating)
        decision = decide(state)
        if decision.outcome == UNIDENTIFIED:
            # The watch may lag the kubelet's own: read the pods afresh once.
            log.info("%s: %s; reading this node's pods afresh", resource, decision.reason)
            decision, state = self._again(resource, decide, allocating, decision, state)
        for delay in SETTLE_DELAYS:
            if decision.outcome != AMBIGUOUS:
                break
            # A pod the kubelet refused is still Pending at the API server: wait for it.
            log.info("%s: %s; reading this node's pods again", resource, decision.reason)
            time.sleep(delay)
            decision, state = self._again(resource, decide, allocating, decision, state)
        return decision, state

    def _again(
        self,
        resource: str,
        decide: Callable[[State], Decision],
        allocating: Collection[str],
        decision: Decision,
        state: State,
    ) -> tuple[Decision, State]:
        try:
            self._cache.refresh()
        except Exception as exc:
            log.warning("cannot list this node's pods: %s", exc)
            return decision, state
        state = self.state(resource, allocating)
        return decide(state), state

    def _fetch_unknown(self, listing: Listing) -> None:
        """Read pods the kubelet lists but the cache lacks, when none of their containers
        holds anything yet (the only ones that can be waiting for devices)."""
        known = {pod.key for pod in self._cache.pods()}
        now = time.monotonic()
        wanted = []
        for key, containers in listing.items():
            if key in known or any(any(r.values()) for r in containers.values()):
                continue
            if now - self._fetched.get(key, -FETCH_AGAIN_SECONDS) >= FETCH_AGAIN_SECONDS:
                self._fetched[key] = now
                wanted.append(key)
        if len(self._fetched) > 4096:
            self._fetched = {k: t for k, t in self._fetched.items() if now - t < 60}
        if wanted:
            try:
                self._cache.fetch(wanted)
            except Exception as exc:
                log.warning("cannot read pods %s: %s", wanted, exc)

    def _held(self, pods: list[PodRecord], listing: Listing, resource: str) -> Held:
        held = held_for(listing, resource)
        with self._lock:
            served = {uid: dict(c) for uid, c in self._served.items()}
        for pod in pods:
            for container, resources in served.get(pod.uid, {}).items():
                ids = resources.get(resource)
                if ids:
                    containers = held.setdefault(pod.key, {})
                    containers[container] = frozenset(containers.get(container, ())) | ids
        return held
