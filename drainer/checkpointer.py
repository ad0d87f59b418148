"""The running drainer's checkpoint: where it resumes, saved only with what the sink made durable.

Invariant: the saved checkpoint never runs ahead of the sink — it is written only after
`sink.flush()`, with the sink's durable commit_ts (or the merge watermark read before that
flush, when everything emitted up to it had been applied and the sink follows the merge), and
the producer positions saved with it are those of the transactions at or below it. The
reasoning is in docs/drainer.md ("Checkpoints").
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
from collections.abc import Callable

from sluice.core import failpoint
from sluice.core import ts as tsmod
from sluice.core.etcd import Etcd
from sluice.core.log import kv
from sluice.core.tso_client import TSOClient
from sluice.drainer.checkpoint import decode_positions, encode_positions
from sluice.drainer.config import DrainerConfig
from sluice.drainer.ha import FencedCheckpointStore
from sluice.drainer.metrics import DrainerMetrics
from sluice.drainer.sink import BackgroundSink, Checkpoint, Sink
from sluice.drainer.txn import SchemaHistory
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

# How far ahead of the batch being dispatched dispatched_upper is raised, in physical ms: one
# checkpoint write per this much ts instead of one per batch (DESIGN §6 safe mode).
DISPATCH_AHEAD_MS = 10_000


class Checkpointer:
    """Holds the last saved checkpoint and the producer positions applied since; saves."""

    def __init__(self, store: FencedCheckpointStore, guard: Callable[[], None],
                 metrics: DrainerMetrics) -> None:
        self.store = store
        self._guard = guard
        self.metrics = metrics
        self.cp = Checkpoint(0)             # last saved checkpoint
        self.durable_ts = 0
        self._txns_at_save = 0
        self._applied_positions: dict[str, pb.Position] = {}
        self._position_log: collections.deque[tuple[int, str, pb.Position]] = collections.deque()

    async def initial(self, config: DrainerConfig, etcd: Etcd, name: str) -> Checkpoint:
        """The saved checkpoint, or one at `initial-commit-ts` (-1: a fresh TSO ts)."""
        cp = await asyncio.to_thread(self.store.load)
        if cp is not None:
            log.info("drainer %s resumes from its checkpoint %d (%s)", name, cp.commit_ts,
                     tsmod.to_datetime(cp.commit_ts).isoformat() if cp.commit_ts else "start",
                     extra=kv(checkpoint=cp.commit_ts))
        else:
            start = config.initial_commit_ts
            if start == -1:
                tso = TSOClient(config.tso or None, config.cluster_id, etcd=etcd,
                                security=config.security)
                try:
                    start = await tso.get_ts()
                finally:
                    await tso.close()
            log.info("drainer %s has no checkpoint: starting after ts %d", name, start,
                     extra=kv(checkpoint=start))
            cp = Checkpoint(start)
        self.cp, self.durable_ts = cp, cp.commit_ts
        return cp

    async def save_opened(self, sink: Sink) -> None:
        """Right after the sink opened: the checkpoint with the sink's state, saved at once."""
        self.cp = dataclasses.replace(self.cp, sink_state=sink.checkpoint().sink_state)
        await asyncio.to_thread(self.store.save, self.cp)

    def reset_positions(self) -> dict[str, pb.Position]:
        """The saved producer positions, which a new merge starts from."""
        positions = decode_positions(self.cp.positions)
        self._applied_positions = dict(positions)
        self._position_log.clear()
        return positions

    def applied_position(self, commit_ts: int, producer: str, pos: pb.Position) -> None:
        """A transaction with a producer position went to the sink (commit order)."""
        self._position_log.append((commit_ts, producer, pos))

    def _positions_at(self, ts: int) -> dict[str, pb.Position]:
        plog, base = self._position_log, self._applied_positions
        while plog and plog[0][0] <= ts:
            _, producer, pos = plog.popleft()
            base[producer] = pos
        return base

    async def raise_dispatched(self, commit_ts: int) -> None:
        """Persist dispatched_upper >= commit_ts before the sink sees it (DESIGN §6 safe mode)."""
        if commit_ts <= self.cp.dispatched_upper:
            return
        upper = tsmod.compose(tsmod.physical_ms(commit_ts) + DISPATCH_AHEAD_MS)
        cp = dataclasses.replace(self.cp, dispatched_upper=upper)
        await asyncio.to_thread(self.store.save, cp)
        self.cp = cp

    async def save(self, sink: Sink, watermark: int, txns_out: int, schema: SchemaHistory,
                   follow_merge: bool = True, final: bool = True, commit: bool = True) -> None:
        """Flush the sink and save its durable position (final: at stop, pause, close, a bad
        transaction). watermark: the merge watermark read before this call. A periodic save of
        a sink that commits in the background does not wait: it starts a commit of what is
        buffered (commit=True) and saves what is durable now; the merge follows only when the
        sink holds nothing uncommitted. A raw sink's checkpoint holds no schema (it records none)."""
        self._guard()
        bg = sink if isinstance(sink, BackgroundSink) else None
        background = bg is not None and not final
        if bg is None or final:
            await sink.flush()
        elif commit:
            await bg.commit_soon()
        if txns_out != self._txns_at_save:
            # Between the sink write and the checkpoint, when there is something to lose.
            await failpoint.ainject("drainer-before-checkpoint-save")
        self._txns_at_save = txns_out
        sc = sink.checkpoint()
        commit_ts = sc.commit_ts
        if follow_merge and sink.capabilities.follows_merge and (bg is None or final or bg.idle):
            commit_ts = max(commit_ts, watermark)
        if commit_ts < self.durable_ts:
            if not background:   # (a background sink's last batch may predate a merge-following save)
                log.warning("sink reported checkpoint %d below the saved %d; keeping the saved "
                            "one", commit_ts, self.durable_ts,
                            extra=kv(sink=commit_ts, saved=self.durable_ts))
            commit_ts = self.durable_ts
        positions = self._positions_at(commit_ts)
        schema.prune(commit_ts)
        cp = Checkpoint(commit_ts=commit_ts, positions=encode_positions(positions),
                        sink_state=sc.sink_state,
                        schema=None if sink.capabilities.raw else schema.to_bytes(),
                        dispatched_upper=max(self.cp.dispatched_upper, commit_ts))
        if cp != self.cp:
            await asyncio.to_thread(self.store.save, cp)
            self.metrics.on_checkpoint(commit_ts)
        self.cp, self.durable_ts = cp, commit_ts
