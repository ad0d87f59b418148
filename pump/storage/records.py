"""Records the storage stages pass to each other.

The ones built for every binlog on the write path (`RecordMeta`, `StagedCommit`, `TxnRecord`,
`PartLoc`) are plain tuples, described here by type aliases: building a named tuple calls a
Python-level `__new__`, and `_replace` goes through `_make` (in issue 23's profile `_replace`
was 9% of a pump's Python CPU, `__new__` another 4-5%); a tuple display costs next to nothing.
Code that reads them unpacks them by position right where they are used, in the field order
given here.
The records built once per producer or per schema change stay named tuples.
"""
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


# How a transaction ended (index `t` entry): (state, commit_ts, hash) —
#   state      pb.TXN_COMMITTED or pb.TXN_ROLLED_BACK
#   commit_ts  0 when rolled back
#   hash       content hash of the COMMIT / ROLLBACK binlog
TxnRecord = tuple[int, int, bytes]


class TxnOutcome(NamedTuple):
    """A transaction's state on this pump (`GetCommit`)."""

    state: int          # pb.TxnState
    commit_ts: int      # 0 unless committed


# Index facts about one staged value-log record: (key, hash, aux, ts, part_of) —
#   key      its index entry key
#   hash     content hash (idempotent retries)
#   aux      start_ts a COMMIT belongs to; 0 otherwise
#   ts       ts for the segment summary (start_ts of prewrite/rollback, else commit_ts)
#   part_of  start_ts when the record is a prewrite part; 0 otherwise
RecordMeta = tuple[bytes, bytes, int, int, int]

# A COMMIT staged in a group: (start_ts, commit_ts, pending, record) —
#   pending  its prewrite's sorter state before the commit
#   record   index of the COMMIT record in the group
StagedCommit = tuple[int, int, Pending, int]


class SchemaPin(NamedTuple):
    """A schema-bearing transaction of one table, kept by GC (see gc.py)."""

    commit_ts: int
    segments: frozenset[int]


# Where a prewrite record lies in the value log: (segment, offset, length)
PartLoc = tuple[int, int, int]


class Stage:
    """Changes staged by one request (or merged for a whole group), not yet durable."""

    __slots__ = ("keys", "txn", "pending", "producers", "records", "crcs", "meta", "commits",
                 "max_ts", "progress")

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
        # (producer_id, True: position / False: snapshot) -> the last staged COMMIT carrying
        # it; folded into `producers` at the end of the request (Stager._record_progress)
        self.progress: dict[tuple[str, bool], pb.Binlog] = {}

    def add(self, payload: bytes, crc: int, meta: RecordMeta) -> None:
        self.keys[meta[0]] = meta[1]
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
            self.commits.extend([(s, c, p, base + i) for s, c, p, i in req.commits])
        else:
            self.commits.extend(req.commits)
        if req.max_ts > self.max_ts:
            self.max_ts = req.max_ts

    def record_of(self, key: bytes) -> bytes | None:
        """The staged payload stored under `key`, if any."""
        if key not in self.keys:
            return None
        for j, m in enumerate(self.meta):
            if m[0] == key:
                return self.records[j]
        return None
