"""gRPC sink: the merged, commit-ordered stream served as `Drainer.PullBinlogs` to consumers.

Invariant: the sink's checkpoint is the lowest commit_ts every registered consumer acknowledged
(`Drainer.Ack`), and the sink keeps in memory every transaction above it, so a registered
consumer can always resume from its acknowledgement — across drainer restarts too, because the
drainer resumes from that checkpoint. Without a registered consumer the checkpoint stays where
it was (the pumps keep the binlogs for the consumer to come).

Consumers register by naming themselves (`consumer_id`) in a pull or an ack, or up front in the
sink's `consumers` option; registrations persist in the checkpoint's sink_state. Pulls without a
consumer_id are served but do not count for GC. An `after_commit_ts` below what the sink still
holds is OUT_OF_RANGE: the message says how far back it can serve.

Back-pressure: when `buffer-txns` / `buffer-bytes` are reached the drainer stops merging
(`has_room`) until consumers acknowledge; nothing is dropped. Transactions travel as the pumps
stored them (PREWRITE part(s) then COMMIT, serialized `Binlog`s), several per response.
"""
from __future__ import annotations

import asyncio
import bisect
import dataclasses
import logging
import operator
from collections.abc import AsyncIterator
from itertools import chain
from typing import Any, NamedTuple

from sluice.core.errors import ConfigError, InvalidArgument, OutOfRange
from sluice.drainer.sink import Checkpoint, Sink, SinkCheckpoint, options_to_config
from sluice.drainer.txn import Txn
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

_commit_ts = operator.itemgetter(0)
_binlogs = operator.itemgetter(2)

__all__ = ["GrpcSink", "GrpcSinkConfig", "RawTxn"]


@dataclasses.dataclass(frozen=True)
class GrpcSinkConfig:
    consumers: list[str] = dataclasses.field(default_factory=list)  # registered from the start
    buffer_txns: int = 200_000
    buffer_bytes: int = 256 << 20
    response_bytes: int = 1 << 20      # payload bytes per DrainerPullResp

    def __post_init__(self) -> None:
        if self.buffer_txns < 1 or self.buffer_bytes < 1 or self.response_bytes < 1:
            raise ConfigError("grpc sink: buffer-txns, buffer-bytes and response-bytes must be >= 1")


class RawTxn(NamedTuple):
    """A merged transaction as its stored binlogs (what the drainer hands a raw sink)."""

    commit_ts: int
    start_ts: int
    binlogs: list[bytes]     # PREWRITE part(s), then the COMMIT


class GrpcSink(Sink):
    name = "grpc"
    accepts_raw = True               # the drainer hands RawTxn batches to apply_raw
    checkpoint_follows_merge = False  # the checkpoint is the consumers' acknowledgement

    def __init__(self, options: GrpcSinkConfig) -> None:
        self._cfg = options
        self._cts: list[int] = []          # commit_ts of buffered transactions, ascending
        self._txns: list[list[bytes]] = []  # their binlogs
        self._sizes: list[int] = []
        self._bytes = 0
        self._start = 0     # the buffer holds every transaction with commit_ts > _start
        self._top = 0       # every transaction with commit_ts <= _top has been appended
        self._acks: dict[str, int] = {}
        self._changed = asyncio.Event()
        self._room = asyncio.Event()
        self._closed = False

    @classmethod
    def from_options(cls, options: Any, **context: Any) -> GrpcSink:
        return cls(options_to_config(GrpcSinkConfig, options or {}, "[to] grpc sink"))

    # -- Sink --------------------------------------------------------------------------------

    async def open(self, checkpoint: Checkpoint) -> None:
        self._start = self._top = checkpoint.commit_ts
        saved = checkpoint.sink_state.get("consumers") if checkpoint.sink_state else None
        for cid, ack in dict(saved or {}).items():
            self._acks[str(cid)] = max(int(ack), checkpoint.commit_ts)
        for cid in self._cfg.consumers:
            self._acks.setdefault(cid, checkpoint.commit_ts)
        self._room.set()
        log.info("grpc sink open after ts %d; registered consumers %s", self._start,
                 dict(self._acks) or "none")

    async def apply(self, batch: list[Txn]) -> None:
        """Txn batches are re-encoded as one PREWRITE and one COMMIT each (raw is the fast path)."""
        raw = []
        for t in batch:
            pre = pb.Binlog(tp=pb.PREWRITE, start_ts=t.start_ts, producer_id=t.producer_id,
                            prewrite_value=t.prewrite.SerializeToString())
            com = pb.Binlog(tp=pb.COMMIT, start_ts=t.start_ts, commit_ts=t.commit_ts,
                            producer_id=t.producer_id)
            if t.position is not None:
                com.position.CopyFrom(t.position)
            if t.snapshot is not None:
                com.snapshot.CopyFrom(t.snapshot)
            raw.append(RawTxn(t.commit_ts, t.start_ts,
                              [pre.SerializeToString(), com.SerializeToString()]))
        self.apply_raw(raw)

    def apply_raw(self, batch: list[RawTxn] | list[tuple[int, int, list[bytes]]]) -> None:
        """Commit-ordered (commit_ts, start_ts, binlogs) tuples (RawTxn or plain)."""
        if not batch:
            return
        if batch[0][0] <= self._top:
            raise InvalidArgument(f"grpc sink: commit_ts {batch[0][0]} is not above "
                                  f"{self._top}: batches must come in commit order")
        binlogs = list(map(_binlogs, batch))
        sizes = [sum(map(len, b)) for b in binlogs]
        self._cts.extend(map(_commit_ts, batch))
        self._txns.extend(binlogs)
        self._sizes.extend(sizes)
        self._bytes += sum(sizes)
        self._top = batch[-1][0]
        self._wake()
        if not self.has_room():
            self._room.clear()

    def advance(self, watermark: int) -> None:
        """Everything <= watermark has been applied (the merge moved on without transactions)."""
        if watermark > self._top:
            self._top = watermark
            self._wake()

    async def flush(self) -> None:
        return None  # the buffer is memory; durability is the consumers' acknowledgement

    def checkpoint(self) -> SinkCheckpoint:
        ts = min(self._acks.values()) if self._acks else self._start
        return SinkCheckpoint(ts, {"consumers": dict(sorted(self._acks.items()))})

    async def close(self) -> None:
        self._closed = True
        self._wake()

    # -- back-pressure -------------------------------------------------------------------------

    def has_room(self) -> bool:
        return len(self._cts) < self._cfg.buffer_txns and self._bytes < self._cfg.buffer_bytes

    async def wait_room(self, timeout: float) -> bool:
        if self.has_room():
            return True
        self._room.clear()
        try:
            await asyncio.wait_for(self._room.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self.has_room()

    # -- consumers -----------------------------------------------------------------------------

    def consumers(self) -> dict[str, int]:
        return dict(self._acks)

    def ack(self, consumer_id: str, commit_ts: int) -> None:
        if not consumer_id:
            raise InvalidArgument("Ack needs a consumer_id")
        if commit_ts > self._top:
            raise InvalidArgument(f"consumer {consumer_id} acknowledged commit_ts {commit_ts}, "
                                  f"beyond what this drainer has sent (<= {self._top})")
        old = self._acks.get(consumer_id)
        if old is None:
            if commit_ts < self._start:
                raise OutOfRange(self._range_message(commit_ts))
            log.info("grpc sink: consumer %s registered by Ack at %d", consumer_id, commit_ts)
            self._acks[consumer_id] = commit_ts
        elif commit_ts > old:
            self._acks[consumer_id] = commit_ts
        self._trim()

    def _trim(self) -> None:
        if not self._acks:
            return
        low = min(self._acks.values())
        if low <= self._start:
            return
        n = bisect.bisect_right(self._cts, low)
        if n:
            self._bytes -= sum(self._sizes[:n])
            del self._cts[:n], self._txns[:n], self._sizes[:n]
        self._start = low
        if self.has_room():
            self._room.set()

    def _range_message(self, after: int) -> str:
        return (f"after_commit_ts {after} is older than this drainer can serve: it holds only "
                f"transactions with commit_ts > {self._start} (every registered consumer "
                f"acknowledged up to there). Resume at or after {self._start}, or list the "
                f"consumer in the grpc sink's `consumers` so the drainer keeps its data")

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def serve(self, after: int, consumer_id: str = "") -> AsyncIterator[pb.DrainerPullResp]:
        """The merged stream strictly after `after`, then live; ends when the sink closes."""
        if after < self._start:
            raise OutOfRange(self._range_message(after))
        if consumer_id and consumer_id not in self._acks:
            self._acks[consumer_id] = after
            log.info("grpc sink: consumer %s registered at %d", consumer_id, after)
        limit = self._cfg.response_bytes
        sent_wm = -1
        while not self._closed:
            changed = self._changed
            if after < self._start:
                raise OutOfRange(self._range_message(after))
            i = bisect.bisect_right(self._cts, after)
            cts, txns, sizes = self._cts, self._txns, self._sizes
            n = len(cts)
            if i < n:
                j, size = i, 0
                while j < n and size < limit:
                    size += sizes[j]
                    j += 1
                out = list(chain.from_iterable(txns[i:j]))
                i = j
                after = cts[i - 1]
                wm = after if i < n else max(after, self._top)
                yield pb.DrainerPullResp(binlogs=out, watermark=wm)
                sent_wm = wm
                after = wm
                continue
            if self._top > sent_wm:
                after = max(after, self._top)
                yield pb.DrainerPullResp(watermark=self._top)
                sent_wm = self._top
                continue
            try:
                await asyncio.wait_for(changed.wait(), 1.0)
            except asyncio.TimeoutError:
                pass
