"""The prepared claims, as records and as the JSON of the state file: no I/O.

What unprepare needs, and what a prepare repeated after a restart must answer the same,
is kept per claim UID: the devices returned to the kubelet, the tiles each holds (so two
claims on one card never get the same tile), what each consumes and the environment its
CDI device gives (so that the containers of a later pod that also see it are checked
against it), and the CDI spec written for the claim (so a spec file lost with /var/run's
tmpfs is written again). Format 1, written before the consumption and the environment were
kept, is read as consuming nothing and giving no environment.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gas.core.shares import Share

FORMAT = 2
READABLE = (1, 2)


class StateError(Exception):
    """The state file cannot be read as gas dra wrote it."""


@dataclass(frozen=True)
class PreparedDevice:
    request: str
    pool: str
    device: str
    share_id: str | None
    cdi_id: str
    tiles: tuple[int, ...] = ()
    admin: bool = False
    share: Share = field(default_factory=Share)
    environment: tuple[tuple[str, str], ...] = ()
    """The environment of its CDI device, as (name, value) pairs."""


@dataclass(frozen=True)
class PreparedClaim:
    uid: str
    namespace: str
    name: str
    devices: tuple[PreparedDevice, ...]
    spec: Mapping[str, Any] | None = field(default=None, compare=False)
    """The claim's CDI spec; None when it has no device of this driver."""

    @property
    def key(self) -> str:
        """`namespace/name`, as the pods' containers name it."""
        return f"{self.namespace}/{self.name}"


State = Mapping[str, PreparedClaim]


def taken_tiles(state: State, card: str) -> set[int]:
    return {
        tile
        for claim in state.values()
        for dev in claim.devices
        if dev.device == card
        for tile in dev.tiles
    }


def pick_tiles(tiles: int, taken: Iterable[int], count: int) -> tuple[int, ...] | None:
    """The lowest `count` tiles of a card of `tiles` that are not `taken`; None when too
    few are free."""
    busy = set(taken)
    free = [t for t in range(tiles) if t not in busy]
    return tuple(free[:count]) if len(free) >= count else None


def encode(state: State) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "claims": {
            uid: {
                "namespace": claim.namespace,
                "name": claim.name,
                "devices": [
                    {
                        "request": d.request,
                        "pool": d.pool,
                        "device": d.device,
                        "shareID": d.share_id,
                        "cdiID": d.cdi_id,
                        "tiles": list(d.tiles),
                        "adminAccess": d.admin,
                        "share": {
                            "memory": d.share.memory,
                            "millicores": d.share.millicores,
                            "tiles": d.share.tiles,
                        },
                        "environment": dict(d.environment),
                    }
                    for d in claim.devices
                ],
                "cdiSpec": claim.spec,
            }
            for uid, claim in sorted(state.items())
        },
    }


def _device(raw: Any) -> PreparedDevice:
    if not isinstance(raw, Mapping):
        raise StateError("a device is not an object")
    tiles = raw.get("tiles") or []
    if not isinstance(tiles, list) or not all(isinstance(t, int) for t in tiles):
        raise StateError(f"tiles {tiles!r} are not a list of numbers")
    share_id = raw.get("shareID")
    environment = raw.get("environment") or {}
    if not isinstance(environment, Mapping):
        raise StateError(f"environment {environment!r} is not an object")
    share = raw.get("share") or {}
    if not isinstance(share, Mapping):
        raise StateError(f"share {share!r} is not an object")
    amounts = {}
    for name in ("memory", "millicores", "tiles"):
        amount = share.get(name, 0)
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise StateError(f"share {name} {amount!r} is not a number")
        amounts[name] = amount
    return PreparedDevice(
        request=str(raw["request"]),
        pool=str(raw["pool"]),
        device=str(raw["device"]),
        share_id=str(share_id) if share_id else None,
        cdi_id=str(raw["cdiID"]),
        tiles=tuple(tiles),
        admin=raw.get("adminAccess") is True,
        share=Share(amounts["memory"], amounts["millicores"], amounts["tiles"]),
        environment=tuple((str(k), str(v)) for k, v in environment.items()),
    )


def decode(raw: Any) -> dict[str, PreparedClaim]:
    if not isinstance(raw, Mapping) or raw.get("format") not in READABLE:
        raise StateError(f"not a state of format {' or '.join(map(str, READABLE))}")
    claims = raw.get("claims")
    if not isinstance(claims, Mapping):
        raise StateError("claims is not an object")
    state = {}
    try:
        for uid, entry in claims.items():
            spec = entry.get("cdiSpec")
            state[uid] = PreparedClaim(
                uid=uid,
                namespace=str(entry["namespace"]),
                name=str(entry["name"]),
                devices=tuple(_device(d) for d in entry["devices"]),
                spec=spec if isinstance(spec, Mapping) else None,
            )
    except (KeyError, TypeError, AttributeError) as exc:
        raise StateError(f"malformed claim entry: {exc!r}") from None
    return state
