"""What the ledger hands out, copied under its lock: entry states, a node with what is held
on it, a stale uncertain bind, and the figures the metrics read."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gas.core.holdings import PodHolding
from gas.core.model import NodeGpu


class State(enum.Enum):
    RESERVED = "reserved"
    PENDING = "pending"
    BOUND = "bound"


@dataclass(frozen=True)
class NodeState:
    """One node and what is held on it, copied under the lock for work done off it.

    Blocked cards and tiles are those of the holdings: the node's book is their sum."""

    node: NodeGpu
    # Every holding counted on the node: BOUND, PENDING and RESERVED entries, and the
    # uncertain earlier bind a reservation took over.
    holdings: tuple[PodHolding, ...]
    # The asking pod's own uncertain earlier bind here: not counted against the pod (as in
    # `Ledger.check`), though its blocked cards would be.
    own: PodHolding | None = None
    # The entry state of each holding, in the order of `holdings` (the uncertain earlier
    # bind a reservation took over is PENDING). Preemption may add only BOUND pods as
    # victims: the others may not be in kube-scheduler's cache yet. Empty: not known, and
    # then none counts as BOUND.
    states: tuple[State, ...] = ()


@dataclass(frozen=True)
class StalePending:
    """A PENDING entry older than the grace: its pod must be read afresh to settle it."""

    uid: str
    namespace: str
    name: str
    node: str
    since: float


@dataclass(frozen=True)
class LedgerFigures:
    """The nodes and their books as `Ledger.figures` copies them for the metrics."""

    nodes: dict[str, NodeGpu]  # by name, in name order
    usage: dict[str, dict[str, dict[str, int]]]  # known nodes with usage: card -> resource
    # Cards blocked, and nodes blocked whole, by the entries' own holdings (as listed by
    # `snapshot`).
    blocked: dict[str, frozenset[str]]
    blocking: frozenset[str]
    pods: dict[str, int]  # entry state value -> entries
