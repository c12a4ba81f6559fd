"""Prepare and unprepare claims: the kubelet's two DRA calls, one claim at a time.

Both are idempotent and survive a restart: what a prepare decided is recorded in the state
file before the kubelet hears of it, and a prepare of a claim already recorded answers the
same (writing its CDI spec again if the file is gone), without asking the API server.
Unprepare deletes the claim's spec and record; one never prepared, or prepared by an
earlier process, is done by the same steps. Calls are serialized, as tiles are chosen
against every other claim's record.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gas.dra import cdi
from gas.dra.claims import ClaimError, check_devices, check_identity, results_for
from gas.dra.driver import DRIVER
from gas.dra.files import StateStore, remove, write_json
from gas.dra.state import PreparedClaim, PreparedDevice, pick_tiles, taken_tiles
from gas.node.cards import Card

log = logging.getLogger(__name__)

ClaimReader = Callable[[str, str], Mapping[str, Any]]
"""`read(namespace, name)`: the ResourceClaim as the API server sends it; ClaimError when
it cannot be read."""


class Preparer:
    def __init__(
        self,
        node: str,
        read_claim: ClaimReader,
        store: StateStore,
        cdi_dir: str,
        devfs_root: str,
    ) -> None:
        self.node = node
        self.read_claim = read_claim
        self.store = store
        self.cdi_dir = Path(cdi_dir)
        self.devfs_root = devfs_root
        self._lock = threading.Lock()
        self._cards: dict[str, Card] = {}
        self.state: dict[str, PreparedClaim] = store.load()

    def set_cards(self, cards: list[Card]) -> None:
        with self._lock:
            self._cards = {card.name: card for card in cards}

    def spec_path(self, claim_uid: str) -> Path:
        return self.cdi_dir / cdi.spec_file_name(claim_uid)

    def restore(self) -> None:
        """At start: the spec of every recorded claim is on disk, and no spec of this
        driver is left of a claim not recorded (a crash between the two writes)."""
        with self._lock:
            for claim in self.state.values():
                if claim.spec is not None and not self.spec_path(claim.uid).exists():
                    write_json(self.spec_path(claim.uid), claim.spec)
                    log.info("CDI spec of claim %s written again", claim.uid)
            try:
                names = sorted(p.name for p in self.cdi_dir.glob(f"{DRIVER}-*.json"))
            except OSError:
                names = []
            for name in names:
                uid = name.removeprefix(f"{DRIVER}-").removesuffix(".json")
                if uid not in self.state:
                    log.info("removing %s: no prepared claim %s is recorded", name, uid)
                    remove(self.cdi_dir / name)

    def prepare(self, namespace: str, name: str, uid: str) -> PreparedClaim:
        with self._lock:
            known = self.state.get(uid)
            if known is not None:
                if known.spec is not None and not self.spec_path(uid).exists():
                    self._write_spec(uid, known.spec)
                return known
            claim = self.read_claim(namespace, name)
            check_identity(claim, namespace, name, uid)
            prepared = self._plan(claim, namespace, name, uid)
            if prepared.spec is not None:
                self._write_spec(uid, prepared.spec)
            self._record({**self.state, uid: prepared}, uid)
            return prepared

    def _write_spec(self, uid: str, spec: Mapping[str, Any]) -> None:
        try:
            write_json(self.spec_path(uid), spec)
        except OSError as exc:
            raise ClaimError(f"cannot write the CDI spec {self.spec_path(uid)}: {exc}") from None

    def _record(self, state: dict[str, PreparedClaim], uid: str) -> None:
        try:
            self.store.save(state)
        except OSError as exc:
            if uid in state:  # a prepare: the kubelet will ask again, start clean
                remove(self.spec_path(uid))
            raise ClaimError(f"cannot record claim {uid} in {self.store.path}: {exc}") from None
        self.state = state

    def _plan(self, claim: Mapping[str, Any], namespace: str, name: str, uid: str) -> PreparedClaim:
        label = f"ResourceClaim {namespace}/{name}"
        results = results_for(claim, self.node)
        check_devices(results, self._cards.keys(), self.node, label)
        grants: list[cdi.Grant] = []
        devices: list[PreparedDevice] = []
        held: dict[str, set[int]] = {}
        for result in results:
            card = self._cards[result.device]
            tiles: tuple[int, ...] = ()
            if result.tiles:
                taken = taken_tiles(self.state, card.name) | held.setdefault(card.name, set())
                chosen = pick_tiles(card.tiles, taken, result.tiles)
                if chosen is None:
                    raise ClaimError(
                        f"{label}: request {result.request!r} wants {result.tiles} tile(s) of "
                        f"{card.name}, which has {card.tiles}, {len(taken)} held by other claims"
                    )
                held[card.name].update(chosen)
                tiles = chosen
            grants.append(cdi.Grant(card, tiles))
            devices.append(
                PreparedDevice(
                    request=result.base_request,
                    pool=result.pool,
                    device=card.name,
                    share_id=result.share_id,
                    cdi_id=cdi.qualified_name(uid, card.name),
                    tiles=tiles,
                )
            )
        spec = cdi.claim_spec(uid, grants, self.devfs_root) if grants else None
        return PreparedClaim(uid, namespace, name, tuple(devices), spec)

    def unprepare(self, namespace: str, name: str, uid: str) -> None:
        with self._lock:
            try:
                remove(self.spec_path(uid))
            except OSError as exc:
                raise ClaimError(
                    f"cannot remove the CDI spec {self.spec_path(uid)}: {exc}"
                ) from None
            if uid in self.state:
                self._record({k: v for k, v in self.state.items() if k != uid}, uid)
