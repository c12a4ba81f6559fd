"""Prepare and unprepare claims: the kubelet's two DRA calls.

Both are idempotent and survive a restart: what a prepare decided is recorded in the state
file before the kubelet hears of it, and a prepare of a claim already recorded answers the
same (writing its CDI spec again if the file is gone), without asking the API server.
Unprepare deletes the claim's spec and record; one never prepared, or prepared by an
earlier process, is done by the same steps.

The kubelet prepares all of a pod's claims of this driver in one call, and the claims of
one call are planned together: their tiles are chosen against every other claim's record,
and each CDI device's environment (`gas.dra.environment`) against the containers of the
pods the claims are reserved for (read from the API server) and the devices they already
get. Calls are serialized, within the process and with another `gas dra` of the node
(`StateStore.locked`), and each reads the state afresh.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gas.core.dra_claims import MILLICORES_PER_CARD
from gas.core.model import as_mapping
from gas.core.shares import Share
from gas.dra import cdi
from gas.dra.claims import (
    ClaimError,
    Result,
    check_devices,
    check_identity,
    reserved_pods,
    results_for,
)
from gas.dra.consumers import Consumer, consumers
from gas.dra.driver import DRIVER
from gas.dra.environment import Carried, Held, plan
from gas.dra.files import StateStore, remove, write_json
from gas.dra.state import PreparedClaim, PreparedDevice, StateError, pick_tiles, taken_tiles
from gas.host.cards import Card

log = logging.getLogger(__name__)

ObjectReader = Callable[[str, str], Mapping[str, Any]]
"""`read(namespace, name)`: the object as the API server sends it; ClaimError when it
cannot be read."""


@dataclass(frozen=True)
class ClaimKey:
    """A claim as the kubelet names it."""

    namespace: str
    name: str
    uid: str

    @property
    def label(self) -> str:
        return f"ResourceClaim {self.namespace}/{self.name}"


def _share(result: Result, card: Card, tiles: tuple[int, ...]) -> Share:
    """What the result holds of its card: what it consumes of a shared card; all of a card
    given whole (no shareID: published exclusive)."""
    if result.share_id is None and not result.admin:
        return Share(card.memory, MILLICORES_PER_CARD, 0)
    return Share(result.memory, result.millicores, len(tiles))


@dataclass
class _Pending:
    """A claim of this call read from the API server and not recorded yet."""

    key: ClaimKey
    claim: Mapping[str, Any]
    results: list[Result]
    tiles: list[tuple[int, ...]]

    def held(self, cards: Mapping[str, Card]) -> list[Held]:
        qualified = f"{self.key.namespace}/{self.key.name}"
        return [
            Held(
                qualified,
                r.base_request,
                r.device,
                chosen,
                r.admin,
                _share(r, cards[r.device], chosen),
            )
            for r, chosen in zip(self.results, self.tiles, strict=True)
        ]


def _carried(claim: PreparedClaim) -> list[Carried]:
    """The claim's devices as prepared: per card, its results and the environment its CDI
    device gives."""
    by_card: dict[str, list[PreparedDevice]] = {}
    for device in claim.devices:
        by_card.setdefault(device.device, []).append(device)
    return [
        Carried(
            tuple(Held(claim.key, d.request, d.device, d.tiles, d.admin, d.share) for d in devices),
            dict(devices[0].environment),
        )
        for devices in by_card.values()
    ]


PreparedHook = Callable[[Mapping[str, Any], PreparedClaim], None]


class Preparer:
    def __init__(
        self,
        node: str,
        read_claim: ObjectReader,
        read_pod: ObjectReader,
        store: StateStore,
        cdi_dir: str,
        devfs_root: str,
        on_prepared: PreparedHook = lambda claim, prepared: None,
    ) -> None:
        self.node = node
        self.read_claim = read_claim
        self.read_pod = read_pod
        self.store = store
        self.cdi_dir = Path(cdi_dir)
        self.devfs_root = devfs_root
        self.on_prepared = on_prepared
        """Told of each claim prepared afresh, with the claim as read (its status)."""
        self._lock = threading.Lock()
        self._cards: dict[str, Card] = {}
        self._unusable: dict[str, str] = {}

    @property
    def state(self) -> dict[str, PreparedClaim]:
        with self._lock, self.store.locked():
            return self.store.load()

    def set_cards(self, cards: Sequence[Card], unusable: Mapping[str, str] | None = None) -> None:
        """The cards claims may be prepared on; `unusable`: cards known but gone now, and
        why (a claim on one is refused with that reason)."""
        with self._lock:
            self._cards = {card.name: card for card in cards}
            self._unusable = dict(unusable or {})

    def held_cards(self) -> tuple[set[str], set[str]]:
        """The cards prepared claims hold, and those they share (a share, not an
        administrator's access or a card given whole)."""
        with self._lock, self.store.locked():
            state = self.store.load()
        held = {d.device for c in state.values() for d in c.devices}
        shared = {d.device for c in state.values() for d in c.devices if d.share_id and not d.admin}
        return held, shared

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / cdi.spec_file_name(claim_uid)

    def restore(self) -> None:
        """At start: the spec of every recorded claim is on disk, and no spec of this
        driver is left of a claim not recorded (a crash between the two writes)."""
        with self._lock, self.store.locked():
            state = self.store.load()
            for claim in state.values():
                if claim.spec is not None and not self.spec_path(claim.uid).exists():
                    write_json(self.spec_path(claim.uid), claim.spec)
                    log.info("CDI spec of claim %s written again", claim.uid)
            try:
                names = sorted(p.name for p in self.cdi_dir.glob(f"{DRIVER}-*.json"))
            except OSError:
                names = []
            for name in names:
                uid = name.removeprefix(f"{DRIVER}-").removesuffix(".json")
                if uid not in state:
                    log.info("removing %s: no prepared claim %s is recorded", name, uid)
                    remove(self.cdi_dir / name)

    def prepare(self, namespace: str, name: str, uid: str) -> PreparedClaim:
        """One claim alone; ClaimError when it cannot be prepared."""
        outcome = self.prepare_all([ClaimKey(namespace, name, uid)])[uid]
        if isinstance(outcome, ClaimError):
            raise outcome
        return outcome

    def prepare_all(self, keys: Sequence[ClaimKey]) -> dict[str, PreparedClaim | ClaimError]:
        """Each claim of one call, prepared or refused on its own. The API server is read
        outside the lock (the claims not recorded yet, the pods they are reserved for); what
        is decided from it, against the state read afresh, under it."""
        outcome: dict[str, PreparedClaim | ClaimError] = {}
        fresh: list[tuple[Mapping[str, Any], PreparedClaim]] = []
        try:
            with self._lock, self.store.locked():
                recorded = set(self.store.load())
            pending = []
            for key in keys:
                if key.uid not in recorded:
                    try:
                        pending.append(self._read(key))
                    except ClaimError as exc:
                        outcome[key.uid] = exc
            found = self._consumers(pending, outcome)
            with self._lock, self.store.locked():
                fresh = self._prepare_locked(keys, self.store.load(), pending, found, outcome)
        except (OSError, StateError) as exc:  # the state cannot be locked or read
            for key in keys:
                if key.uid not in outcome or not isinstance(outcome[key.uid], ClaimError):
                    outcome[key.uid] = ClaimError(
                        f"cannot record claim {key.uid} in {self.store.path}: {exc}"
                    )
            return outcome
        for claim, prepared in fresh:
            self.on_prepared(claim, prepared)
        return outcome

    def _prepare_locked(
        self,
        keys: Sequence[ClaimKey],
        state: dict[str, PreparedClaim],
        read: Sequence[_Pending],
        consumers_found: Sequence[Consumer],
        outcome: dict[str, PreparedClaim | ClaimError],
    ) -> list[tuple[Mapping[str, Any], PreparedClaim]]:
        by_uid = {item.key.uid: item for item in read}
        pending: list[_Pending] = []
        for key in keys:
            known = state.get(key.uid)
            if known is not None:  # recorded, perhaps by the other instance meanwhile
                try:
                    if known.spec is not None and not self.spec_path(key.uid).exists():
                        self._write_spec(key.uid, known.spec)
                    outcome[key.uid] = known
                except ClaimError as exc:
                    outcome[key.uid] = exc
                continue
            item = by_uid.get(key.uid)
            if item is None or key.uid in outcome:
                continue
            try:
                check_devices(
                    item.results, self._cards.keys(), self.node, key.label, self._unusable
                )
            except ClaimError as exc:
                outcome[key.uid] = exc
                continue
            pending.append(item)
        self._choose_tiles(pending, state, outcome)
        pending = [p for p in pending if p.key.uid not in outcome]
        planned = self._plan(pending, state, consumers_found, outcome)
        recorded = dict(state)
        written: list[PreparedClaim] = []
        for prepared in planned:
            try:
                if prepared.spec is not None:
                    self._write_spec(prepared.uid, prepared.spec)
            except ClaimError as exc:
                outcome[prepared.uid] = exc
                continue
            recorded[prepared.uid] = prepared
            written.append(prepared)
        if written:
            try:
                self.store.save(recorded)
            except OSError as exc:
                for prepared in written:  # the kubelet will ask again: start clean
                    remove(self.spec_path(prepared.uid))
                    outcome[prepared.uid] = ClaimError(
                        f"cannot record claim {prepared.uid} in {self.store.path}: {exc}"
                    )
                return []
        claims = {p.key.uid: p.claim for p in pending}
        for prepared in written:
            outcome[prepared.uid] = prepared
        return [(claims[p.uid], p) for p in written]

    def _read(self, key: ClaimKey) -> _Pending:
        claim = self.read_claim(key.namespace, key.name)
        check_identity(claim, key.namespace, key.name, key.uid)
        return _Pending(key, claim, results_for(claim, self.node), [])

    def _choose_tiles(
        self,
        pending: Sequence[_Pending],
        state: Mapping[str, PreparedClaim],
        outcome: dict[str, PreparedClaim | ClaimError],
    ) -> None:
        """The lowest free tiles for each result that consumes tiles, claim by claim: a
        claim refused leaves its choices to the next."""
        held: dict[str, set[int]] = {}
        for item in pending:
            mine: dict[str, set[int]] = {}
            chosen: list[tuple[int, ...]] = []
            try:
                for result in item.results:
                    card = self._cards[result.device]
                    if not result.tiles or result.admin:
                        chosen.append(())
                        continue
                    taken = (
                        taken_tiles(state, card.name)
                        | held.get(card.name, set())
                        | mine.get(card.name, set())
                    )
                    picked = pick_tiles(card.tiles, taken, result.tiles)
                    if picked is None:
                        raise ClaimError(
                            f"{item.key.label}: request {result.request!r} wants {result.tiles} "
                            f"tile(s) of {card.name}, which has {card.tiles}, {len(taken)} held "
                            "by other claims"
                        )
                    mine.setdefault(card.name, set()).update(picked)
                    chosen.append(picked)
            except ClaimError as exc:
                outcome[item.key.uid] = exc
                continue
            item.tiles = chosen
            for card_name, tiles in mine.items():
                held.setdefault(card_name, set()).update(tiles)

    def _consumers(
        self, pending: Sequence[_Pending], outcome: dict[str, PreparedClaim | ClaimError]
    ) -> list[Consumer]:
        """The containers of the pods the claims are reserved for, each pod read once and
        checked to be the one reserved (its UID). A pod that cannot be read fails every
        claim reserved for it: their containers' view would not be known."""
        pods: dict[tuple[str, str, str], list[_Pending]] = {}
        for item in pending:
            for pod_name, pod_uid in reserved_pods(item.claim):
                pods.setdefault((item.key.namespace, pod_name, pod_uid), []).append(item)
        found: list[Consumer] = []
        for (namespace, pod_name, pod_uid), items in pods.items():
            try:
                pod = self.read_pod(namespace, pod_name)
            except ClaimError as exc:
                for item in items:
                    outcome[item.key.uid] = ClaimError(
                        f"{item.key.label} is reserved for pod {pod_name}, which cannot be "
                        f"read to learn what its containers see: {exc}"
                    )
                continue
            if as_mapping(pod.get("metadata")).get("uid") == pod_uid:
                found.extend(consumers(pod))
            # else: deleted and made again under the name, not the pod the claims are for
        return found

    def _plan(
        self,
        pending: Sequence[_Pending],
        state: Mapping[str, PreparedClaim],
        found: Sequence[Consumer],
        outcome: dict[str, PreparedClaim | ClaimError],
    ) -> list[PreparedClaim]:
        if not pending:
            return []
        tiles_of = {name: card.tiles for name, card in self._cards.items()}
        devices = plan(
            [h for p in pending for h in p.held(self._cards)],
            [carried for c in state.values() for carried in _carried(c)],
            found,
            tiles_of,
        )
        for warning in devices.warnings:
            log.warning("%s", warning)
        planned = []
        for item in pending:
            qualified = f"{item.key.namespace}/{item.key.name}"
            if qualified in devices.errors:
                outcome[item.key.uid] = ClaimError(devices.errors[qualified])
                continue
            planned.append(self._prepared(item, devices.environment))
        return planned

    def _prepared(
        self, item: _Pending, environment: Mapping[tuple[str, str], Mapping[str, str]]
    ) -> PreparedClaim:
        key = item.key
        qualified = f"{key.namespace}/{key.name}"
        devices = []
        specs: dict[str, tuple[Card, Mapping[str, str]]] = {}
        for result, tiles in zip(item.results, item.tiles, strict=True):
            card = self._cards[result.device]
            env = environment.get((qualified, card.name), {})
            specs[card.name] = (card, env)
            devices.append(
                PreparedDevice(
                    request=result.base_request,
                    pool=result.pool,
                    device=card.name,
                    share_id=result.share_id,
                    cdi_id=cdi.qualified_name(key.uid, card.name),
                    tiles=tiles,
                    admin=result.admin,
                    share=_share(result, card, tiles),
                    environment=tuple(sorted(env.items())),
                )
            )
        spec = cdi.claim_spec(key.uid, list(specs.values()), self.devfs_root) if specs else None
        return PreparedClaim(key.uid, key.namespace, key.name, tuple(devices), spec)

    def _write_spec(self, uid: str, spec: Mapping[str, Any]) -> None:
        try:
            write_json(self.spec_path(uid), spec)
        except OSError as exc:
            raise ClaimError(f"cannot write the CDI spec {self.spec_path(uid)}: {exc}") from None

    def unprepare(self, namespace: str, name: str, uid: str) -> PreparedClaim | None:
        """The claim's spec and record removed; the record it had, if any."""
        try:
            with self._lock, self.store.locked():
                try:
                    remove(self.spec_path(uid))
                except OSError as exc:
                    raise ClaimError(
                        f"cannot remove the CDI spec {self.spec_path(uid)}: {exc}"
                    ) from None
                state = self.store.load()
                known = state.pop(uid, None)
                if known is not None:
                    self.store.save(state)
                return known
        except (OSError, StateError) as exc:
            raise ClaimError(f"cannot record claim {uid} in {self.store.path}: {exc}") from None
