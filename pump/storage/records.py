"""Named records the storage stages pass to each other (named tuples: one is built per binlog)."""
from __future__ import annotations

from typing import NamedTuple

from sluice.proto import sluice_pb2 as pb

from .sorter import Pending


class ProducerRecord(NamedTuple):
    """What the pump keeps per producer: its fencing epoch and last committed progress
    (serialized `Position` / `SnapshotProgress`, None when it never sent one)."""

    epoch: int = 0
    position: bytes | None = None
    snapshot: bytes | None = None


NO_PRODUCER = ProducerRecord()


class ProducerState(NamedTuple):
    """A producer's progress as the service answers it (`GetProducerPosition`)."""

    position: pb.Position | None
    snapshot: pb.SnapshotProgress | None
    epoch: int

    @classmethod
    def of(cls, rec: ProducerRecord) -> "ProducerState":
        return cls(pb.Position.FromString(rec.position) if rec.position is not None else None,
                   pb.SnapshotProgress.FromString(rec.snapshot)
                   if rec.snapshot is not None else None,
                   rec.epoch)


class TxnRecord(NamedTuple):
    """How a transaction ended (index `t` entry)."""

    state: int          # pb.TXN_COMMITTED or pb.TXN_ROLLED_BACK
    commit_ts: int      # 0 when rolled back
    hash: bytes         # content hash of the COMMIT / ROLLBACK binlog


class TxnOutcome(NamedTuple):
    """A transaction's state on this pump (`GetCommit`)."""

    state: int          # pb.TxnState
    commit_ts: int      # 0 unless committed


class RecordMeta(NamedTuple):
    """Index facts about one staged value-log record."""

    key: bytes          # its index entry key
    hash: bytes         # content hash (idempotent retries)
    aux: int            # start_ts a COMMIT belongs to; 0 otherwise
    ts: int             # ts for the segment summary (start_ts of prewrite/rollback, else commit)
    part_of: int        # start_ts when the record is a prewrite part; 0 otherwise


class StagedCommit(NamedTuple):
    """A COMMIT staged in a group."""

    start_ts: int
    commit_ts: int
    pending: Pending    # its prewrite's sorter state before the commit
    record: int         # index of the COMMIT record in the group


class SchemaPin(NamedTuple):
    """A schema-bearing transaction of one table, kept by GC (see gc.py)."""

    commit_ts: int
    segments: frozenset[int]


class PartLoc(NamedTuple):
    """Where a prewrite record lies in the value log."""

    segment: int
    offset: int
    length: int


class Stage:
    """Changes staged by one request (or merged for a whole group), not yet durable."""

    __slots__ = ("keys", "txn", "pending", "producers", "records", "crcs", "meta", "commits",
                 "max_ts")

    def __init__(self) -> None:
        self.keys: dict[bytes, bytes] = {}                   # new entry key -> payload hash
        self.txn: dict[int, TxnRecord] = {}                  # by start_ts
        self.pending: dict[int, Pending | None] = {}         # None: resolved in this group
        self.producers: dict[str, ProducerRecord] = {}
        self.records: list[bytes] = []
        self.crcs: list[int] = []
        self.meta: list[RecordMeta] = []                     # one per record
        self.commits: list[StagedCommit] = []
        self.max_ts = 0

    def add(self, payload: bytes, crc: int, meta: RecordMeta) -> None:
        self.keys[meta.key] = meta.hash
        self.records.append(payload)
        self.crcs.append(crc)
        self.meta.append(meta)

    def merge(self, req: "Stage") -> None:
        base = len(self.records)
        self.keys.update(req.keys)
        self.txn.update(req.txn)
        self.pending.update(req.pending)
        self.producers.update(req.producers)
        self.records.extend(req.records)
        self.crcs.extend(req.crcs)
        self.meta.extend(req.meta)
        if base:
            self.commits.extend(StagedCommit(s, c, p, base + i) for s, c, p, i in req.commits)
        else:
            self.commits.extend(req.commits)
        if req.max_ts > self.max_ts:
            self.max_ts = req.max_ts

    def record_of(self, key: bytes) -> bytes | None:
        """The staged payload stored under `key`, if any."""
        if key not in self.keys:
            return None
        for j, m in enumerate(self.meta):
            if m.key == key:
                return self.records[j]
        return None
