"""gRPC sink: the merged, commit-ordered stream served as `Drainer.PullBinlogs` to consumers.

Invariant: the sink's checkpoint is the lowest commit_ts every registered consumer acknowledged
(`Drainer.Ack`), and the sink keeps in memory every transaction above it, so a registered
consumer can always resume from its acknowledgement — across drainer restarts too, because the
drainer resumes from that checkpoint. Without a registered consumer the checkpoint stays where
it was (the pumps keep the binlogs for the consumer to come).

Consumers register by naming themselves (`consumer_id`) in a pull or an ack, or up front in the
sink's `consumers` option; registrations persist in the checkpoint's sink_state. Pulls without a
consumer_id are served but do not count for GC.

Replay below the buffer. Invariant: a pull from an `after_commit_ts` below what the buffer holds
is served whenever the pumps still hold it — the drainer re-reads the pumps from there through a
private merge (same merge rules, its own dedupe window; producer positions are filtered from
`after_commit_ts` on, as for a drainer started there) up to the buffer's start, then continues
from the buffer; it is OUT_OF_RANGE only when a pump no longer holds it (GC), with the pump's
reason. A consumer first registered by such a pull counts for GC from the buffer's start.

Back-pressure: when `buffer-txns` / `buffer-bytes` are reached the drainer stops merging
(`has_room`) until consumers acknowledge; nothing is dropped. Transactions travel as the pumps
stored them (PREWRITE part(s) then COMMIT, serialized `Binlog`s), several per response: each is
kept framed as DrainerPullResp field 1 (drainer.txn.frame), so a response is the concatenation
of its transactions' bytes plus the watermark, never re-encoded (`serve` yields serialized
DrainerPullResp bytes; drainer/service.py registers a pass-through serializer).

The buffer is a list of chunks, one per applied batch: its commit_ts, the byte offset of each
transaction in one contiguous buffer, and that buffer — a merged ColumnBatch's arrays as they
are (`apply_columns`, no object per transaction) or a RawTxn batch joined once (`apply_raw`).
A response is one slice of a chunk, found by bisection; acknowledgements drop whole chunks and
move a start index in the first.
"""
from __future__ import annotations

import asyncio
import bisect
import dataclasses
import logging
import operator
from collections.abc import AsyncIterator, Callable, Sequence
from itertools import accumulate
from typing import Any, NamedTuple, Protocol

from sluice.core.errors import ConfigError, InvalidArgument, OutOfRange
from sluice.drainer.sink import Capabilities, Checkpoint, ServingSink, SinkCheckpoint, sink_options
from sluice.drainer.txn import Txn, frame
from sluice.proto import sluice_pb2 as pb

log = logging.getLogger(__name__)

_commit_ts = operator.itemgetter(0)
_binlogs = operator.itemgetter(2)
_payload = operator.itemgetter(5)    # a merge item's framed binlogs


def _tail(watermark: int) -> bytes:
    """DrainerPullResp field 2 (watermark), wire-encoded."""
    return pb.DrainerPullResp(watermark=watermark).SerializeToString()


class Replay(Protocol):
    """A private merge of the pumps from some ts (drainer.reader.PrivateMerge)."""

    async def next_batch(self, timeout: float) -> tuple[list[tuple], int]:
        """(merged items, merge watermark); items empty when nothing came within timeout."""

    async def close(self) -> None: ...

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
    binlogs: bytes           # PREWRITE part(s), then the COMMIT, framed (drainer.txn.frame)


class _Chunk:
    """One applied batch: transactions lo.. of it are still buffered."""

    __slots__ = ("cts", "offs", "data", "lo")

    def __init__(self, cts: Sequence[int], offs: Sequence[int], data: Any) -> None:
        self.cts = cts          # commit_ts, ascending
        self.offs = offs        # len(cts) + 1 offsets: transaction k is data[offs[k]:offs[k+1]]
        self.data = data        # bytes-like
        self.lo = 0

    def live_bytes(self, lo: int, hi: int) -> int:
        return self.offs[hi] - self.offs[lo]


class GrpcSink(ServingSink):
    name = "grpc"
    # Raw batches or merged columns; the checkpoint is the consumers' acknowledgement.
    capabilities = Capabilities(raw=True, columns=True, follows_merge=False, serves_stream=True)

    def __init__(self, options: GrpcSinkConfig,
                 replay: Callable[[int], Replay] | None = None) -> None:
        """replay: how to re-read the pumps from a ts below the buffer (the drainer's pumps;
        without it, a pull below the buffer is OUT_OF_RANGE)."""
        self._cfg = options
        self._chunks: list[_Chunk] = []    # buffered transactions, commit order
        self._lasts: list[int] = []        # each chunk's last commit_ts (for bisection)
        self._n = 0                        # buffered transactions
        self._bytes = 0
        self._start = 0     # the buffer holds every transaction with commit_ts > _start
        self._top = 0       # every transaction with commit_ts <= _top has been appended
        self._acks: dict[str, int] = {}
        self._changed = asyncio.Event()
        self._room = asyncio.Event()
        self._closed = False
        self._replay = replay

    @classmethod
    def from_options(cls, options: Any, **context: Any) -> GrpcSink:
        return cls(sink_options(cls.name, options or {}), context.get("replay"))

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
                            prewrite_value=t.prewrite_bytes())
            com = pb.Binlog(tp=pb.COMMIT, start_ts=t.start_ts, commit_ts=t.commit_ts,
                            producer_id=t.producer_id)
            if t.position is not None:
                com.position.CopyFrom(t.position)
            if t.snapshot is not None:
                com.snapshot.CopyFrom(t.snapshot)
            raw.append(RawTxn(t.commit_ts, t.start_ts,
                              frame([pre.SerializeToString(), com.SerializeToString()])))
        self.apply_raw(raw)

    def apply_raw(self, batch: list[RawTxn] | list[tuple[int, int, bytes]]) -> None:
        """Commit-ordered (commit_ts, start_ts, framed binlogs) tuples (RawTxn or plain)."""
        if not batch:
            return
        binlogs = list(map(_binlogs, batch))
        self._append(_Chunk(list(map(_commit_ts, batch)), [0, *accumulate(map(len, binlogs))],
                            b"".join(binlogs)))

    def apply_columns(self, batch: Any) -> None:
        """A merged drainer.columnar.ColumnBatch, kept as its arrays' buffers."""
        if not len(batch):
            return
        self._append(_Chunk(*batch.views()))

    def _append(self, chunk: _Chunk) -> None:
        n = len(chunk.cts)
        if chunk.cts[0] <= self._top:
            raise InvalidArgument(f"grpc sink: commit_ts {chunk.cts[0]} is not above "
                                  f"{self._top}: batches must come in commit order")
        self._chunks.append(chunk)
        self._lasts.append(chunk.cts[n - 1])
        self._n += n
        self._bytes += chunk.live_bytes(0, n)
        self._top = chunk.cts[n - 1]
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
        return self._n < self._cfg.buffer_txns and self._bytes < self._cfg.buffer_bytes

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
        chunks = self._chunks
        while chunks and self._lasts[0] <= low:
            ch = chunks.pop(0)
            del self._lasts[0]
            self._n -= len(ch.cts) - ch.lo
            self._bytes -= ch.live_bytes(ch.lo, len(ch.cts))
        if chunks:
            ch = chunks[0]
            k = bisect.bisect_right(ch.cts, low, ch.lo)
            self._n -= k - ch.lo
            self._bytes -= ch.live_bytes(ch.lo, k)
            ch.lo = k
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

    async def serve(self, after: int, consumer_id: str = "") -> AsyncIterator[bytes]:
        """The merged stream strictly after `after`, then live; ends when the sink closes.
        Yields serialized DrainerPullResp messages."""
        if after < self._start and self._replay is None:
            raise OutOfRange(self._range_message(after))
        if consumer_id and consumer_id not in self._acks:
            # Below the buffer it is served by replay, but counts for GC from the buffer on.
            self._acks[consumer_id] = max(after, self._start)
            log.info("grpc sink: consumer %s registered at %d", consumer_id,
                     self._acks[consumer_id])
        limit = self._cfg.response_bytes
        sent_wm = -1
        while not self._closed:
            if after < self._start:
                replay = self._serve_replay(after, consumer_id)
                try:
                    async for resp, after in replay:
                        yield resp
                finally:
                    await replay.aclose()   # its pump streams end with this pull, not at GC
                sent_wm = after
                continue
            changed = self._changed
            c = bisect.bisect_right(self._lasts, after)
            if c < len(self._chunks):
                ch = self._chunks[c]
                offs, n = ch.offs, len(ch.cts)
                i = max(ch.lo, bisect.bisect_right(ch.cts, after, ch.lo))
                # Transactions i..j-1: the fewest that reach `limit` bytes (at least one).
                j = min(bisect.bisect_left(offs, offs[i] + limit, i + 1, n + 1), n)
                after = ch.cts[j - 1]
                wm = after if j < n or c + 1 < len(self._chunks) else max(after, self._top)
                yield b"".join((ch.data[offs[i]:offs[j]], _tail(wm)))
                sent_wm = wm
                after = wm
                continue
            if self._top > sent_wm:
                after = max(after, self._top)
                yield _tail(self._top)
                sent_wm = self._top
                continue
            try:
                await asyncio.wait_for(changed.wait(), 1.0)
            except asyncio.TimeoutError:
                pass

    async def _serve_replay(self, after: int, consumer_id: str
                            ) -> AsyncIterator[tuple[bytes, int]]:
        """(response, new after) from a private merge of the pumps, until `after` reaches the
        buffer's start (read afresh each round: acknowledgements move it)."""
        if self._replay is None:
            raise OutOfRange(self._range_message(after))
        log.info("grpc sink: consumer %r asks after %d, below the buffer (> %d): replaying from "
                 "the pumps", consumer_id, after, self._start)
        replay = self._replay(after)
        try:
            while not self._closed and after < self._start:
                items, wm = await replay.next_batch(1.0)
                bound = self._start
                # The buffer holds everything above its start: send only up to it.
                cut = bisect.bisect_right(items, bound, key=_commit_ts) if items else 0
                new_after = max(after, min(wm, bound))
                if cut:
                    new_after = max(new_after, items[cut - 1][0])
                if cut or new_after > after:
                    yield b"".join(map(_payload, items[:cut])) + _tail(new_after), new_after
                    after = new_after
        except OutOfRange as e:
            raise OutOfRange(f"after_commit_ts {after} is below this drainer's buffer (> "
                             f"{self._start}) and the pumps no longer hold it: {e}") from None
        finally:
            await replay.close()
        log.info("grpc sink: consumer %r replay reached the buffer at %d", consumer_id, after)
