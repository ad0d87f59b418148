"""Node kinds, states and their legal transitions, and the status records kept in etcd.

Invariant: states change only along LEGAL_TRANSITIONS. docs/registry.md.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import IllegalTransition, InvalidArgument


class NodeKind(enum.StrEnum):
    PUMP = "pumps"
    DRAINER = "drainers"
    PRODUCER = "producers"


class NodeState(enum.StrEnum):
    ONLINE = "online"
    PAUSING = "pausing"
    PAUSED = "paused"
    CLOSING = "closing"
    OFFLINE = "offline"


# TiDB-Binlog's state machine. Staying in the same state is always allowed (a restarting node
# re-registers its state). `pausing -> closing` lets an admin take a pausing node offline;
# `pausing -> online` is not allowed because a pausing node has not finished draining.
LEGAL_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    NodeState.ONLINE: frozenset({NodeState.PAUSING, NodeState.CLOSING}),
    NodeState.PAUSING: frozenset({NodeState.PAUSED, NodeState.CLOSING}),
    NodeState.PAUSED: frozenset({NodeState.ONLINE, NodeState.CLOSING}),
    NodeState.CLOSING: frozenset({NodeState.OFFLINE}),
    NodeState.OFFLINE: frozenset(),
}


def check_transition(node_id: str, old: NodeState, new: NodeState, force: bool = False) -> None:
    """Raise IllegalTransition unless old -> new is legal (or forced)."""
    if force or old == new or new in LEGAL_TRANSITIONS[old]:
        return
    raise IllegalTransition(node_id, old.value, new.value)


def check_node_id(node_id: str) -> None:
    if not node_id or "/" in node_id or node_id.strip() != node_id:
        raise InvalidArgument(f"invalid node id {node_id!r}: must be non-empty, without '/' "
                              "or surrounding spaces")


@dataclass(frozen=True)
class NodeStatus:
    """The persistent status of one node (the `status` key)."""

    node_id: str
    kind: NodeKind
    addr: str
    state: NodeState
    max_commit_ts: int = 0   # pump: the final max commit ts it published
    checkpoint: int = 0      # drainer: its durable checkpoint (inclusive)
    score: int = 0
    epoch: int = 0
    update_ts: int = 0       # stamped by the registry on every write (local clock ts)
    labels: dict[str, str] = field(default_factory=dict)
    # pump: prewrites it could not resolve past txn-timeout, each {pump, start_ts, producer,
    # since_ms, reason, command} (pump/loops.py); empty when nothing is stuck
    alerts: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d["kind"], d["state"] = self.kind.value, self.state.value
        return json.dumps(d, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: bytes | str) -> NodeStatus:
        d = json.loads(data)
        known = {f.name for f in dataclasses.fields(cls)}
        # Unknown fields come from a newer version of Sluice: ignore them rather than fail.
        d = {k: v for k, v in d.items() if k in known}
        d["kind"], d["state"] = NodeKind(d["kind"]), NodeState(d["state"])
        d["labels"] = dict(d.get("labels") or {})
        d["alerts"] = [dict(a) for a in d.get("alerts") or [] if isinstance(a, dict)]
        return cls(**d)

    def same_content(self, other: NodeStatus) -> bool:
        """Equal apart from update_ts (a write that changes nothing is skipped)."""
        return dataclasses.replace(self, update_ts=0) == dataclasses.replace(other, update_ts=0)


@dataclass(frozen=True)
class NodeInfo:
    """A node as seen in etcd: its status, whether its alive key exists, the status revision."""

    status: NodeStatus
    alive: bool
    mod_revision: int = 0

    @property
    def node_id(self) -> str:
        return self.status.node_id

    @property
    def state(self) -> NodeState:
        return self.status.state


OnChange = Callable[[NodeKind, str, "NodeInfo | None"], None]
