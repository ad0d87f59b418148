"""The client's view of one pump (registry status plus health bookkeeping), its metrics and
the small helpers PumpsClient uses around channels."""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass

from sluice.core import errors
from sluice.core.metrics import Metrics
from sluice.core.registry import NodeInfo, NodeState

from .batcher import WriteBatcher


class Failover(Exception):
    """This pump cannot take the write now (it is, or just became, unavailable)."""


class PumpState:
    """The client's view of one pump: registry status plus its own health bookkeeping."""

    def __init__(self, info: NodeInfo) -> None:
        st = info.status
        self.node_id = st.node_id
        self.addr = st.addr
        self.state = NodeState(st.state)
        self.alive = info.alive
        self.score = st.score
        self.labels = dict(st.labels)
        self.batcher: WriteBatcher | None = None
        self.channel = None
        self.failures = 0                    # consecutive failed writes
        self.available = True
        self.last_error = ""
        self.next_probe = 0.0                # monotonic time of the next probe while unavailable
        self.redeliver: OrderedDict[int, list[bytes]] = OrderedDict()

    @property
    def takes_prewrites(self) -> bool:
        return (self.state == NodeState.ONLINE and self.alive and self.available
                and self.batcher is not None)

    def why_not(self) -> str:
        if self.state != NodeState.ONLINE:
            lost = " (marked lost)" if self.labels.get("lost") == "true" else ""
            return f"state {self.state.value}{lost}"
        if not self.alive:
            return "not alive (no heartbeat in etcd)"
        if not self.available:
            return (f"unavailable after {self.failures} consecutive failed writes "
                    f"(last: {self.last_error})")
        return "ok"


class ClientMetrics:
    def __init__(self) -> None:
        m = self.m = Metrics("sluice_client")
        self.writes = m.counter("writes_total", "write requests acknowledged", ("kind",))
        self.prewrites, self.commits = self.writes.labels("prewrite"), self.writes.labels("commit")
        self.binlogs = m.counter("binlogs_written_total", "binlogs acknowledged")
        self.failures = m.counter("write_failures_total", "failed write attempts", ("pump",))
        self.failovers = m.counter("failovers_total", "prewrites moved to another pump")
        self.available = m.gauge("available_pumps", "pumps that take new prewrites")
        self.redelivery = m.gauge("redelivery_pending", "commits/rollbacks waiting for a pump")


async def gather_results(coros: Iterable[Awaitable[int]]) -> list[int | BaseException]:
    """Results or exceptions of the coroutines, run concurrently; the usual single write is
    awaited directly (a Task per write costs more CPU than the write's own bookkeeping)."""
    coros = list(coros)
    if len(coros) == 1:
        try:
            return [await coros[0]]
        except Exception as e:  # noqa: BLE001 - returned like gather(return_exceptions=True)
            return [e]
    return await asyncio.gather(*coros, return_exceptions=True)


@dataclass(frozen=True)
class ChannelRef:
    channel: object = None
    batcher: WriteBatcher | None = None


async def close_ref(ref: ChannelRef) -> None:
    if ref.batcher is not None:
        await ref.batcher.close()
    if ref.channel is not None:
        await ref.channel.close()  # type: ignore[attr-defined]


def replicas_of(config: object, key: str) -> int:
    if config is None:
        return 1
    replicas = config.get("replicas", 1) if isinstance(config, dict) else None
    if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
        raise errors.ConfigError(f"{key}: replicas must be a positive integer, got {config!r}")
    return replicas
