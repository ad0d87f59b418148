"""Which pumps the drainer's merge waits on, and how it learns of them (DESIGN §2.4, §4).

Invariant: a pump leaves the merge only by state — `mark-lost` (offline with labels lost=true)
at once; offline or paused once the drainer's durable checkpoint >= the pump's final
max_commit_ts — never because its heartbeat stopped (a crashed pump stalls the merge and loses
nothing).

And none is missed: the drainer registers online+alive first, then lists pumps at revision R and
watches from R+1 (`Discovery.start`), while `Cistern.Notify` adds a pump before the pump takes
writes. A pump that comes online between the register and the list either sees the drainer
online (and notifies it) or is in the list.

A removal is decided on a fresh read of the pump's status, never on a delivered view alone: a
watcher that lags could otherwise remove a pump that has already been resumed.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sluice.core.registry import NodeInfo, NodeKind, NodeState, NodeStatus, Registry, Watcher

log = logging.getLogger(__name__)

__all__ = ["Discovery", "wants_merge", "is_lost"]

_ACTIVE = frozenset({NodeState.ONLINE, NodeState.PAUSING, NodeState.CLOSING})


def is_lost(status: NodeStatus) -> bool:
    return status.labels.get("lost") == "true"


def wants_merge(status: NodeStatus, durable_checkpoint: int) -> bool:
    """Whether the merge must (still) wait on this pump, given the drainer's durable checkpoint."""
    if is_lost(status):
        return False
    if status.state in _ACTIVE:
        return True
    # paused / offline: until everything up to its final ts is durable in our sink.
    return status.max_commit_ts > durable_checkpoint


class Discovery:
    """Lists pumps, then watches them; hands every change to `on_change` on the event loop."""

    def __init__(self, registry: Registry, loop: asyncio.AbstractEventLoop,
                 on_change: Callable[[str, NodeInfo | None], None]) -> None:
        self.registry = registry
        self.loop = loop
        self.on_change = on_change
        self.watcher: Watcher | None = None

    def start(self) -> list[NodeInfo]:
        """List at revision R, watch from R+1 (blocking; call in a thread). Returns the list."""
        nodes, revision = self.registry.list(NodeKind.PUMP)
        self.watcher = self.registry.watch(NodeKind.PUMP, self._deliver, since=(nodes, revision))
        log.info("discovery: %d pump(s) at revision %d: %s", len(nodes), revision,
                 ", ".join(f"{n.node_id}={n.state.value}{'' if n.alive else ' (not alive)'}"
                           for n in nodes) or "none")
        return nodes

    def _deliver(self, kind: NodeKind, node_id: str, info: NodeInfo | None) -> None:
        # Watcher thread -> event loop; the drainer's state is touched only on the loop.
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.on_change, node_id, info)

    def current(self) -> dict[str, NodeInfo]:
        return self.watcher.nodes() if self.watcher is not None else {}

    def fresh(self, pump_id: str) -> NodeInfo | None:
        """A fresh read of one pump (blocking)."""
        return self.registry.get(NodeKind.PUMP, pump_id)

    def stop(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
