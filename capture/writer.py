"""Exactly once into the pumps (DESIGN §8): source transactions in groups, a whole group to one pump.

Invariant: the committed set is always a prefix of the source order. A group's prewrites go to
one pump as one atomic write; its commit_ts range is fetched after that ack (and checked against
the ack's watermark); its commits go as one atomic write; group g+1's commits are written only
after group g's were acknowledged. Group g+1's start_ts range is fetched after group g's
commit_ts and its prewrites may be written while group g's commits are in flight (two groups in
flight at most, capture/streaming.py): a crash then leaves g+1 prewritten only, which the next
epoch finds committed on no pump and rolls back, and the recovered position is at most g's. A restart resumes strictly after the greatest position any
pump recorded, after fencing older epochs, so no source transaction is committed twice.

Recovery (`recover`): bump the producer epoch, call GetProducerPosition(producer_id, epoch) on
every non-offline pump (each records the epoch durably and refuses older epochs afterwards),
take the max position. TxnStatus (`decide`): the live capture's in-flight groups are UNKNOWN;
anything else is answered only after recovery fenced every pump, from the pumps themselves: a
commit found on a pump (GetCommit) -> COMMITTED with its commit_ts; none on any pump -> ROLLED_BACK
(its group was never committed, and the fenced old epoch cannot commit it any more); a pump that
cannot be asked -> UNKNOWN.

Fencing: a pump refuses this process's writes (FAILED_PRECONDITION) once another capture with the
same producer id bumped the epoch and fenced it. The writer then reads the producer's epoch back
from etcd and, if it moved on, raises `Fenced`: the process stops without writing anything more.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import NamedTuple

import grpc
import sluice_native

from sluice.capture.payload import RowsMutation
from sluice.capture.reader import SourceTxn
from sluice.client import binlogs
from sluice.client.commit import CommitCore, Prewritten, TxnAborted
from sluice.client.pumps import PumpsClient
from sluice.core import errors, grpcutil
from sluice.core.position import IncomparablePositions, compare, format_position, max_position
from sluice.core.registry import NodeKind, NodeState, Registry
from sluice.core.tls import SecurityConfig
from sluice.core.tso_client import TSOClient
from sluice.proto import sluice_pb2 as pb, sluice_pb2_grpc as pbg

log = logging.getLogger(__name__)

FAILPOINT = "capture-between-prewrite-and-commit"


class Fenced(errors.FailedPrecondition):
    """Another capture with this producer id took over (a newer epoch): this one must stop."""


class PrewrittenGroup(NamedTuple):
    """A group whose prewrites the pumps acknowledged (`written` None: nothing to write)."""

    group: list[SourceTxn]
    written: Prewritten | None


class PumpItem(NamedTuple):
    """One pump transaction as wire bytes: its serialized PrewriteValue, source position (with
    the writer's generation) and the snapshot progress it records (None: none)."""

    value: bytes
    position: bytes
    snapshot: bytes | None


def stamped(value: bytes, position: pb.Position, snapshot: pb.SnapshotProgress | None,
            generation: int) -> PumpItem:
    """A pump transaction with `generation` (a rewind's, core/rewind.py; 0: none) stamped on
    its position and on the position its snapshot progress was recorded at."""
    if snapshot is None:
        return PumpItem(value, binlogs.position_bytes(position, generation), None)
    if generation and snapshot.HasField("recorded_at"):
        snap = pb.SnapshotProgress()
        snap.CopyFrom(snapshot)
        snap.recorded_at.generation = generation
        snapshot = snap
    return PumpItem(value, binlogs.position_bytes(position, generation),
                    snapshot.SerializeToString())


def pump_txns(group: list[SourceTxn], source_name: str, generation: int = 0) -> list[PumpItem]:
    """The pump transactions of a group. Empty source transactions are dropped, except the
    group's last one, which still carries the position forward (so a restart does not re-read a
    long run of filtered transactions). Built natively (native/src/pumpwrite.rs); a transaction
    with several values or snapshot progress comes back here (`_several`)."""
    return sluice_native.pump_items(group, source_name, generation, RowsMutation, PumpItem,
                                     _several, binlogs.position_bytes)


def _several(st: SourceTxn, values: list[bytes], generation: int) -> list[PumpItem]:
    """The pump transactions of `st` when it is not one value without snapshot progress."""
    out: list[PumpItem] = []
    for j, v in enumerate(values):
        pos = st.position
        if j:
            # A statement acting on several tables (DROP TABLE a, b) is several pump
            # transactions at one source position, ordered by sub_seq; a snapshot chunk's
            # position already carries its own sub_seq (2^32 + n), which is kept.
            pos = pb.Position()
            pos.CopyFrom(st.position)
            pos.sub_seq = st.position.sub_seq + j
        snap = st.snapshot
        if snap is not None:
            # recorded at the position of the transaction that carries it
            snap = pb.SnapshotProgress()
            snap.CopyFrom(st.snapshot)
            snap.recorded_at.CopyFrom(pos)
        out.append(stamped(v, pos, snap, generation))
    return out


def group_prewrites(items: list[PumpItem], ident: bytes, first_start: int,
                    now_ms: int) -> list[binlogs.Encoded]:
    """The group's PREWRITE binlogs, start_ts consecutive from `first_start`; `ident` is
    `binlogs.identity(producer_id, epoch)`. The bytes of `binlogs.prewrite` with
    `binlogs.tail`, built natively (native/src/pumpwrite.rs)."""
    return sluice_native.prewrite_binlogs(items, ident, first_start, now_ms, pb.PREWRITE,
                                          binlogs.Encoded)


def _how_far(p: pb.SnapshotProgress) -> tuple[bool, int, int]:
    table = list(p.tables).index(p.current_table) if p.current_table in p.tables else -1
    return p.finished, table, p.chunks_done


def latest_progress(progress: list[pb.SnapshotProgress]) -> pb.SnapshotProgress:
    """The progress recorded at the greatest source position: each pump keeps the last one it
    committed, and committed transactions are a prefix of the source order. Progress written
    without `recorded_at` (older captures) falls back to how far it got."""
    def newer(a: pb.SnapshotProgress, b: pb.SnapshotProgress) -> bool:
        if a.HasField("recorded_at") and b.HasField("recorded_at"):
            try:
                c = compare(a.recorded_at, b.recorded_at)
            except IncomparablePositions:
                c = 0
            if c:
                return c > 0
        return _how_far(a) > _how_far(b)
    best = progress[0]
    for p in progress[1:]:
        if newer(p, best):
            best = p
    return best


class GroupWriter:
    def __init__(self, pumps: PumpsClient, tso: TSOClient, registry: Registry, producer_id: str,
                 cluster_id: int, source_name: str, security: SecurityConfig | None = None) -> None:
        self.pumps, self.tso, self.registry = pumps, tso, registry
        self.producer_id, self.cluster_id, self.source_name = producer_id, cluster_id, source_name
        self.security = security
        self.epoch = 0
        self.generation = 0     # stamped on every position written (a rewind's, core/rewind.py)
        # Called (blocking, once) after the first group is committed: the pumps then hold the
        # generation, so a pending rewind has been taken.
        self.after_first_commit: Callable[[], None] | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}   # TxnStatus lookups, by pump address
        self.inflight: set[int] = set()
        self.recovered = False
        self.snapshot: pb.SnapshotProgress | None = None   # recovered snapshot progress
        self.groups = 0
        self.txns = 0
        self._core: CommitCore | None = None
        self._identity: tuple[int, bytes] | None = None   # (epoch, Binlog fields 7 and 8)

    # -- recovery -----------------------------------------------------------------------------

    def _live_pumps(self) -> list[tuple[str, str]]:
        nodes, _ = self.registry.list(NodeKind.PUMP)
        return [(n.node_id, n.status.addr) for n in nodes if n.state != NodeState.OFFLINE]

    async def recover(self, epoch: int) -> pb.Position:
        """Fence older epochs on every non-offline pump; the greatest recorded position."""
        self.epoch = epoch
        pumps = await asyncio.to_thread(self._live_pumps)
        if not pumps:
            raise errors.NoPumpAvailable("no pump is registered: start a pump before the capture")
        positions = []
        progress: list[pb.SnapshotProgress] = []
        for node_id, addr in pumps:
            async with grpcutil.aio_channel(addr, self.security) as ch:
                try:
                    resp = await pbg.PumpStub(ch).GetProducerPosition(pb.GetProducerPositionReq(
                        cluster_id=self.cluster_id, producer_id=self.producer_id, epoch=epoch),
                        timeout=10)
                except grpc.RpcError as e:
                    raise errors.Unavailable(
                        f"pump {node_id} ({addr}) did not answer GetProducerPosition: "
                        f"{grpcutil.to_sluice_error(e)}; the capture cannot prove where to resume "
                        "until every non-offline pump answers") from None
            if resp.has_position:
                positions.append(resp.position)
            if resp.HasField("snapshot"):
                progress.append(resp.snapshot)
        pos = max_position(positions)
        self.snapshot = latest_progress(progress) if progress else None
        self.recovered = True
        log.info("recovered position %s from %d pump(s) at epoch %d", format_position(pos),
                 len(pumps), epoch)
        return pos

    async def decide(self, start_ts: int) -> tuple[int, int]:
        if start_ts in self.inflight or not self.recovered:
            return pb.TXN_UNKNOWN, 0
        try:
            pumps = await asyncio.to_thread(self._live_pumps)
            for _, addr in pumps:
                ch = self._channels.get(addr)
                if ch is None:
                    # Kept open: after a crash a pump asks about every prewrite of the lost group.
                    ch = self._channels[addr] = grpcutil.aio_channel(addr, self.security)
                resp = await pbg.PumpStub(ch).GetCommit(
                    pb.GetCommitReq(cluster_id=self.cluster_id, start_ts=start_ts), timeout=5)
                if resp.state == pb.TXN_COMMITTED:
                    return pb.TXN_COMMITTED, resp.commit_ts
            if start_ts in self.inflight:   # became in-flight while we asked
                return pb.TXN_UNKNOWN, 0
            return pb.TXN_ROLLED_BACK, 0
        except (grpc.RpcError, errors.SluiceError) as e:
            log.warning("TxnStatus start_ts=%d undecided: %s", start_ts, e)
            return pb.TXN_UNKNOWN, 0

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for ch in channels:
            await ch.close()

    # -- groups -------------------------------------------------------------------------------

    async def write_group(self, group: list[SourceTxn]) -> None:
        """Commit these source transactions (in source order) as one group; returns after the
        commits were acknowledged, i.e. after the pumps recorded the group's last position."""
        await self.commit_group(await self.prewrite_group(group))

    async def prewrite_group(self, group: list[SourceTxn],
                             after: asyncio.Event | None = None) -> PrewrittenGroup:
        """The first half of write_group: the group's prewrites, acknowledged. `after`: the
        previous group's commit_ts was fetched (set by its commit_group), so every start_ts of
        this group is above it and the pumps serve the previous group's commits without
        waiting for this one. May run while the previous group's commit_group is in flight;
        its commit_group must not start before that one returned (the invariant above)."""
        items = pump_txns(group, self.source_name, self.generation)
        written = await self.prewrite_items(items, after) if items else None
        return PrewrittenGroup(group, written)

    async def commit_group(self, p: PrewrittenGroup,
                           commit_ts_taken: Callable[[], None] | None = None) -> None:
        """The second half of write_group: commit_ts, the watermark check and the commits."""
        if p.written is not None:
            await self.commit_prewritten(p.written, commit_ts_taken)
        elif commit_ts_taken is not None:
            commit_ts_taken()
        self.groups += 1
        self.txns += len(p.group)

    async def write_items(self, items: list[PumpItem]) -> None:
        """One group of pump transactions, in the given (source) order, to one pump, through the
        commit protocol (client/commit.py) with the pumps as the truth: the acknowledged Commit
        write is the point of no return. Snapshot progress goes on the COMMIT (the binlog the
        pump records producer positions from) and, for readers of prewrites, on the PREWRITE."""
        await self.commit_prewritten(await self.prewrite_items(items))

    async def prewrite_items(self, items: list[PumpItem],
                             after: asyncio.Event | None = None) -> Prewritten:
        n = len(items)
        if after is not None:
            await after.wait()
        first_start, _ = await self.tso.get_ts_range(n)
        now_ms = int(time.time() * 1000)
        ident = self._identity
        if ident is None or ident[0] != self.epoch:
            ident = self._identity = (self.epoch, binlogs.identity(self.producer_id, self.epoch))
        prewrites = group_prewrites(items, ident[1], first_start, now_ms)
        # In-flight start_ts stay UNKNOWN to TxnStatus unless this group provably ended here
        # (committed, or rolled back before the point of no return). On any other failure the
        # process restarts and a new epoch decides them from the pumps.
        self.inflight.update(b.start_ts for b in prewrites)
        return await self._core_now().write_prewrites(prewrites, _GroupSteps(self))

    async def commit_prewritten(self, written: Prewritten,
                                commit_ts_taken: Callable[[], None] | None = None) -> None:
        try:
            await self._core_now().finish(written, _GroupSteps(self), commit_ts_taken)
        except TxnAborted:
            self.inflight.difference_update(written.starts)   # rolled back: the pumps hold a Rollback
            raise
        self.inflight.difference_update(written.starts)
        if self.after_first_commit is not None:
            done, self.after_first_commit = self.after_first_commit, None
            await asyncio.to_thread(done)

    def _core_now(self) -> CommitCore:
        core = self._core
        if core is None or core.pumps is not self.pumps or core.tso is not self.tso:
            core = self._core = CommitCore(self.pumps, self.tso, self.producer_id,
                                           lambda: self.epoch)
        return core

    async def _raise_if_fenced(self, cause: errors.SluiceError) -> None:
        try:
            info = await asyncio.to_thread(self.registry.get, NodeKind.PRODUCER, self.producer_id)
        except errors.SluiceError:
            return
        if info is not None and info.status.epoch > self.epoch:
            raise Fenced(
                f"capture fenced: producer {self.producer_id} is now at epoch {info.status.epoch} "
                f"(another capture with this producer id took over; this one has epoch "
                f"{self.epoch}); the pumps refused its write ({cause}); stopping without writing "
                "more") from None


class _GroupSteps:
    """The commit steps of a capture group. Only a commit_ts at or below an acked watermark rolls
    back; any other failure leaves the group in flight for the next epoch to decide."""

    after_prewrite_failpoint = FAILPOINT
    # After commit_ts, before the Commit write (the next group's prewrites may be in flight).
    before_commit_failpoint = "capture-before-commit-write"
    rollback_on = (TxnAborted,)
    pumps_decide = True

    def __init__(self, writer: GroupWriter) -> None:
        self.w = writer

    async def prewrite_failed(self, e: BaseException) -> None:
        if isinstance(e, errors.FailedPrecondition):
            await self.w._raise_if_fenced(e)

    async def point_of_no_return(self, commit_ts: int) -> None:
        raise AssertionError("the capture's point of no return is its Commit write")

    async def abort(self) -> None:
        pass

    async def decide(self, start_ts: int) -> tuple[int, int]:
        raise AssertionError("the capture's point of no return is never ambiguous here")

    async def committed(self, commit_ts: int) -> None:
        pass

    async def commit_failed(self, e: BaseException) -> None:
        if isinstance(e, errors.FailedPrecondition):
            await self.w._raise_if_fenced(e)
