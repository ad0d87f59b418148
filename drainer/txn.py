"""What moves inside the drainer: a joined transaction (Txn), its row events, and schema history.

Invariants kept here:
- A Txn is built only from a COMMIT and every part of its PREWRITE, joined in part order;
  anything else is CorruptTxn naming pump, start_ts and commit_ts. (Same start_ts, parts
  0..part_count-1: a transaction is never decoded from a partial or mismatched prewrite.)
- A PrewriteValue that protobuf's parser would refuse is CorruptTxn at the join, though the
  message itself is parsed only on demand (Txn.prewrite): the native join checks it whole.
- SchemaHistory answers with the table shape in force at commit_ts: the latest version with
  commit_ts <= the given commit_ts. So rows are decoded with the shape they were written with,
  even after later DDL and after a restart from an old checkpoint.
"""
from __future__ import annotations

import base64
import bisect
import dataclasses
import json
import logging
from typing import Any, NamedTuple, Protocol

import sluice_native
from google.protobuf.message import DecodeError

from sluice.core.errors import SluiceError
from sluice.proto import sluice_pb2 as pb
from sluice.core.log import kv

log = logging.getLogger(__name__)


class CorruptTxn(SluiceError):
    """A transaction whose binlogs cannot be joined or decoded. Never skipped silently."""

    def __init__(self, pump_id: str, start_ts: int | None, commit_ts: int | None, reason: str) -> None:
        super().__init__(f"corrupt transaction from pump {pump_id} (start_ts {_fmt(start_ts)}, "
                         f"commit_ts {_fmt(commit_ts)}): {reason}")
        self.pump_id, self.start_ts, self.commit_ts, self.reason = pump_id, start_ts, commit_ts, reason


_FRAMES = pb.DrainerPullResp


def frame(binlogs: list[bytes]) -> bytes:
    """A transaction's binlogs framed as repeated field 1 (`binlogs`) — the bytes that make up
    its part of a PullBinlogsResp / DrainerPullResp, which the drainer carries through the merge
    and the grpc sink forwards without re-encoding."""
    return _FRAMES(binlogs=binlogs).SerializeToString()


def unframe(framed: bytes, pump_id: str = "", commit_ts: int | None = None) -> list[bytes]:
    """The binlogs of `frame`'s output (prewrite part(s), then the COMMIT)."""
    try:
        binlogs = sluice_native.unframe(framed)
    except ValueError as e:
        raise CorruptTxn(pump_id, None, commit_ts, f"unframable binlogs: {e}") from None
    if not binlogs:
        raise CorruptTxn(pump_id, None, commit_ts, "a transaction without binlogs")
    return binlogs


class MissingSchema(SluiceError):
    """Rows for a table whose shape is unknown at their commit_ts: they cannot be decoded."""

    def __init__(self, table_id: int, schema_name: str, table_name: str, commit_ts: int) -> None:
        super().__init__(f"no schema for table id {table_id} ({schema_name}.{table_name}) at "
                         f"commit_ts {commit_ts}: no schema snapshot or DDL for it at or before "
                         f"that commit_ts")
        self.table_id, self.commit_ts = table_id, commit_ts
        self.schema_name, self.table_name = schema_name, table_name


class CorruptSchemaHistory(SluiceError):
    """Persisted schema history (with a checkpoint) that cannot be read back."""


def _fmt(ts: int | None) -> str:
    return "?" if ts is None else str(ts)


_OPS = {pb.INSERT: "c", pb.UPDATE: "u", pb.DELETE: "d", pb.READ: "r"}
_INSERT, _UPDATE, _DELETE, _READ = pb.INSERT, pb.UPDATE, pb.DELETE, pb.READ


# Not frozen: a frozen dataclass's __init__ costs ~0.7 us more per row, and nothing mutates these.
@dataclasses.dataclass(slots=True)
class RowEvent:
    op: str                       # 'c' | 'u' | 'd' | 'r'
    schema: str
    table: str
    table_id: int
    before: pb.Row | None         # u, d
    after: pb.Row | None          # c, u, r
    table_info: pb.TableInfo      # the shape in force at the transaction's commit_ts
    seq: int                      # 0-based order of the row within its transaction


class MutationSpan(NamedTuple):
    """One TableMutation of a transaction: its table shape at commit_ts, its names, and where
    its bytes are (`payload[start:end]`, the TableMutation body) for the native decoder, and
    its number of row changes."""

    info: pb.TableInfo
    schema: str
    table: str
    payload: bytes
    start: int
    end: int
    count: int


_span = tuple.__new__


class SchemaLookup(Protocol):
    def table_at(self, table_id: int, commit_ts: int) -> pb.TableInfo | None: ...

    def find(self, schema_name: str, table_name: str, commit_ts: int) -> pb.TableInfo | None: ...


_UNSET: object = object()


class Txn:
    """One joined transaction. Treated as immutable (nothing assigns its fields after it is
    built); not a frozen dataclass because `prewrite` is parsed on first use and kept.

    Joined from the wire (from_framed / from_binlogs), the PrewriteValue stays bytes
    (`prewrite_bytes()`): the native join checks it whole, as upb's parse would, and reads what
    the hot paths ask (is_ddl, has_schema_snapshots, source, the mutations' spans) in the same
    walk (native/src/prewrite.rs `prewrite_facts`), so an undecodable value is still CorruptTxn
    where the transaction is joined and `prewrite` (the message) is parsed only when a reader
    needs it (DDL, schema snapshots, the file sink's rows, the table filter)."""

    __slots__ = ("commit_ts", "start_ts", "producer_id", "position", "snapshot", "pump_id",
                 "_value", "_payload", "_facts", "_source")

    commit_ts: int
    start_ts: int
    producer_id: str
    position: pb.Position | None
    snapshot: pb.SnapshotProgress | None
    pump_id: str

    def __init__(self, commit_ts: int, start_ts: int, producer_id: str,
                 position: pb.Position | None, prewrite: pb.PrewriteValue,
                 snapshot: pb.SnapshotProgress | None, pump_id: str) -> None:
        self.commit_ts, self.start_ts, self.producer_id = commit_ts, start_ts, producer_id
        self.position, self.snapshot, self.pump_id = position, snapshot, pump_id
        self._value: pb.PrewriteValue | None = prewrite
        self._payload: bytes | None = None      # set: the serialized `_value` (or its source)
        self._facts: tuple | None = None        # prewrite_facts' answer for `_payload`
        self._source: Any = _UNSET

    def with_prewrite(self, value: pb.PrewriteValue) -> Txn:
        """The same transaction carrying another PrewriteValue (the table filter's)."""
        return Txn(self.commit_ts, self.start_ts, self.producer_id, self.position, value,
                   self.snapshot, self.pump_id)

    @property
    def prewrite(self) -> pb.PrewriteValue:
        value = self._value
        if value is None:
            try:
                value = _prewrite_from(self._payload)
            except DecodeError as e:     # the join checked it: a disagreement with upb
                raise CorruptTxn(self.pump_id, self.start_ts, self.commit_ts,
                                 f"undecodable prewrite value: {e}") from None
            self._value = value
        return value

    @property
    def ddl(self) -> pb.DDL | None:
        return self.prewrite.ddl if self.is_ddl else None

    @property
    def is_ddl(self) -> bool:
        f = self._facts
        return f[0] if f is not None else self.prewrite.HasField("ddl")

    @property
    def has_schema_snapshots(self) -> bool:
        f = self._facts
        return f[1] if f is not None else bool(self.prewrite.schema_snapshots)

    @property
    def changes_schema(self) -> bool:
        """Whether SchemaHistory.apply has anything to record (schema snapshots or a DDL)."""
        return self.is_ddl or self.has_schema_snapshots

    @property
    def source(self) -> pb.SourceInfo | None:
        src = self._source
        if src is _UNSET:
            f = self._facts
            if f is None:
                v = self.prewrite
                src = v.source if v.HasField("source") else None
            else:
                # checked with the value: parses (occurrences concatenated parse as the merge)
                src = None if f[2] is None else _source_from(f[2])
            self._source = src
        return src

    def mutation_versions(self) -> list[tuple[int, int]]:
        """(table_id, table_version) of each TableMutation, in order."""
        f = self._facts
        if f is not None:
            return [(m[0], m[3]) for m in f[4]]
        return [(m.table_id, m.table_version) for m in self.prewrite.mutations]

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Txn:
            return NotImplemented
        o: Txn = other  # type: ignore[assignment]
        return (self.commit_ts, self.start_ts, self.producer_id, self.position, self.prewrite,
                self.snapshot, self.pump_id) == (o.commit_ts, o.start_ts, o.producer_id,
                                                 o.position, o.prewrite, o.snapshot, o.pump_id)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Txn(commit_ts={self.commit_ts}, start_ts={self.start_ts}, "
                f"producer_id={self.producer_id!r}, pump_id={self.pump_id!r}, "
                f"prewrite_bytes={len(self.prewrite_bytes())})")

    def rows(self, schema: SchemaLookup) -> list[RowEvent]:
        """Row events in source order; raises MissingSchema for a table unknown at commit_ts."""
        # The sinks' hot path: one branch per op, each image looked up only where the op has it.
        out: list[RowEvent] = []
        append = out.append
        snapshot_chunk = self.prewrite.snapshot_chunk
        commit_ts = self.commit_ts
        seq = 0
        for m in self.prewrite.mutations:
            table_id = m.table_id
            info = schema.table_at(table_id, commit_ts)
            if info is None:
                raise MissingSchema(table_id, m.schema_name, m.table_name, commit_ts)
            if m.table_version and info.version and m.table_version != info.version:
                # Rows are decoded by commit_ts; a differing version stamp means the producer and
                # the schema history disagree — worth a trace when a decode later fails.
                log.warning("table version mismatch", extra=kv(table_id=table_id, rows_version=m.table_version, schema_version=info.version, commit_ts=commit_ts))
            schema_name = info.schema_name or m.schema_name
            table_name = info.table_name or m.table_name
            for ch in m.changes:
                tp = ch.tp
                if tp == _INSERT or tp == _READ:
                    if not ch.HasField("after"):
                        raise self._lacks(seq, table_id, "r" if snapshot_chunk else _OPS[tp], "after")
                    append(RowEvent("r" if snapshot_chunk or tp == _READ else "c", schema_name,
                                    table_name, table_id, None, ch.after, info, seq))
                elif tp == _UPDATE:
                    if not ch.HasField("before") or not ch.HasField("after"):
                        raise self._lacks(seq, table_id, "u",
                                          "after" if ch.HasField("before") else "before")
                    append(RowEvent("u", schema_name, table_name, table_id, ch.before, ch.after,
                                    info, seq))
                elif tp == _DELETE:
                    if not ch.HasField("before"):
                        raise self._lacks(seq, table_id, "d", "before")
                    append(RowEvent("d", schema_name, table_name, table_id, ch.before, None,
                                    info, seq))
                else:
                    raise CorruptTxn(self.pump_id, self.start_ts, commit_ts,
                                     f"row change of unknown type {tp} for table id {table_id}")
                seq += 1
        return out

    def prewrite_bytes(self) -> bytes:
        """The serialized PrewriteValue: the joined bytes as received, else the message's."""
        payload = self._payload
        if payload is None:
            assert self._value is not None
            payload = self._payload = self._value.SerializeToString()
        return payload

    def mutations(self, schema: SchemaLookup) -> tuple[bool, list[MutationSpan]]:
        """(snapshot_chunk, the mutations in source order with the byte span of each in
        `prewrite_bytes()`), checked like `rows`: MissingSchema for a table unknown at commit_ts,
        CorruptTxn for a change lacking its image or of unknown type, in the same order."""
        payload = self.prewrite_bytes()
        commit_ts = self.commit_ts
        facts = self._facts
        if facts is not None:   # walked with the join
            snapshot_chunk, walked = facts[3], facts[4]
        else:
            try:
                snapshot_chunk, walked = sluice_native.prewrite_mutations(payload)
            except sluice_native.DecodeError as e:
                raise CorruptTxn(self.pump_id, self.start_ts, commit_ts, str(e)) from None
        out: list[MutationSpan] = []
        append = out.append
        table_at = schema.table_at
        # One lookup per table of the transaction: its statements often touch a table again
        # (sysbench: 4 statements over 1-2 tables), and the answer is the same at one commit_ts.
        seen: dict[int, pb.TableInfo] = {}
        seq = 0
        for table_id, schema_name, table_name, version, start, end, count, problem in walked:
            info = seen.get(table_id)
            if info is None:
                info = table_at(table_id, commit_ts)
                if info is None:
                    raise MissingSchema(table_id, schema_name, table_name, commit_ts)
                seen[table_id] = info
            if version and version != info.version and info.version:
                log.warning("table version mismatch", extra=kv(table_id=table_id, rows_version=version, schema_version=info.version, commit_ts=commit_ts))
            if problem is not None:
                index, tp, image = problem
                if image is None:
                    raise CorruptTxn(self.pump_id, self.start_ts, commit_ts,
                                     f"row change of unknown type {tp} for table id {table_id}")
                op = "r" if snapshot_chunk and tp in (_INSERT, _READ) else _OPS[tp]
                raise self._lacks(seq + index, table_id, op, image)
            # tuple.__new__ directly: the NamedTuple's own __new__ is a Python frame per mutation.
            append(_span(MutationSpan, (info, info.schema_name or schema_name,
                                        info.table_name or table_name, payload, start, end,
                                        count)))
            seq += count
        return snapshot_chunk, out

    def _lacks(self, seq: int, table_id: int, op: str, image: str) -> CorruptTxn:
        return CorruptTxn(self.pump_id, self.start_ts, self.commit_ts,
                          f"op {op} row #{seq} of table id {table_id} lacks its {image} image")

    @classmethod
    def from_binlogs(cls, prewrite_parts: list[bytes], commit: bytes, pump_id: str) -> Txn:
        """Join a COMMIT binlog with its PREWRITE part(s) (any order) into one transaction."""
        try:
            joined = sluice_native.join_binlogs(prewrite_parts, commit)
        except sluice_native.TxnError as e:
            raise CorruptTxn(pump_id, *e.args) from None
        return cls._joined(joined, pump_id)

    @classmethod
    def from_framed(cls, framed: bytes, pump_id: str, commit_ts: int | None = None
                    ) -> tuple[Txn, int]:
        """(the transaction, its number of binlogs) from `frame`'s output as the merge carries
        it (prewrite part(s), then the COMMIT): `unframe` and `from_binlogs` in one native pass
        (native/src/txnjoin.rs: the envelopes are read from the wire, no message per binlog).
        commit_ts (the merge's) names a transaction whose frame cannot be read."""
        try:
            joined = sluice_native.join_framed(framed, commit_ts)
        except sluice_native.TxnError as e:
            raise CorruptTxn(pump_id, *e.args) from None
        return cls._joined(joined, pump_id), joined[7]

    @classmethod
    def _joined(cls, joined: tuple, pump_id: str) -> Txn:
        """A Txn from join_binlogs/join_framed's fields: the position/snapshot sub-messages are
        parsed here (upb); the prewrite value was checked by the join (its facts, or why it is
        undecodable: CorruptTxn) and is parsed only on demand."""
        start_ts, commit_ts, producer_id, pos, snap, payload, count, _, facts = joined
        if facts.__class__ is str:
            raise CorruptTxn(pump_id, start_ts, commit_ts,
                             f"undecodable prewrite value ({count} part(s)): {facts}")
        try:
            position = None if pos is None else _position_from(pos)
            snapshot = None if snap is None else _snapshot_from(snap)
        except DecodeError as e:
            raise CorruptTxn(pump_id, start_ts, commit_ts,
                             f"undecodable position or snapshot of a binlog: {e}") from None
        txn = _new_txn(cls)
        txn.commit_ts, txn.start_ts, txn.producer_id = commit_ts, start_ts, producer_id
        txn.position, txn.snapshot, txn.pump_id = position, snapshot, pump_id
        txn._value, txn._payload, txn._facts, txn._source = None, payload, facts, _UNSET
        return txn


_new_txn = object.__new__
_prewrite_from = pb.PrewriteValue.FromString
_source_from = pb.SourceInfo.FromString
_position_from = pb.Position.FromString
_snapshot_from = pb.SnapshotProgress.FromString


# --------------------------------------------------------------------------------------------
# Schema history
# --------------------------------------------------------------------------------------------

_SHAPED_DDL = (pb.CREATE_TABLE, pb.ALTER_TABLE, pb.RENAME_TABLE, pb.TRUNCATE_TABLE)
_FORMAT = 1


class SchemaHistory:
    """Table shapes per table_id, versioned by the commit_ts of the DDL or snapshot that set them.

    A version of None means the table is dropped from that commit_ts on.
    """

    def __init__(self) -> None:
        self._ts: dict[int, list[int]] = {}
        self._infos: dict[int, list[pb.TableInfo | None]] = {}

    # -- lookup -------------------------------------------------------------------------------

    def table_at(self, table_id: int, commit_ts: int) -> pb.TableInfo | None:
        ts = self._ts.get(table_id)
        if not ts:
            return None
        i = bisect.bisect_right(ts, commit_ts) - 1
        return self._infos[table_id][i] if i >= 0 else None

    def table_ids(self) -> list[int]:
        return sorted(self._ts)

    def find(self, schema_name: str, table_name: str, commit_ts: int) -> pb.TableInfo | None:
        """The table named schema.table at commit_ts (names move with RENAME), if any."""
        for table_id in self._ts:
            info = self.table_at(table_id, commit_ts)
            if info is not None and info.schema_name == schema_name and info.table_name == table_name:
                return info
        return None

    def __len__(self) -> int:
        return sum(len(v) for v in self._ts.values())

    # -- recording ----------------------------------------------------------------------------

    def record(self, table_id: int, commit_ts: int, info: pb.TableInfo | None) -> None:
        """Set the version of table_id from commit_ts on; re-recording the same ts replaces it."""
        ts = self._ts.setdefault(table_id, [])
        infos = self._infos.setdefault(table_id, [])
        i = bisect.bisect_left(ts, commit_ts)
        if i < len(ts) and ts[i] == commit_ts:
            infos[i] = info
        else:
            ts.insert(i, commit_ts)
            infos.insert(i, info)

    def apply(self, txn: Txn) -> None:
        """Record the schema effects of a transaction: its schema snapshots, then its DDL."""
        cts = txn.commit_ts
        for info in txn.prewrite.schema_snapshots:
            self.record(info.table_id, cts, info)
        ddl = txn.ddl
        if ddl is None:
            return
        if ddl.tp in _SHAPED_DDL:
            if ddl.HasField("table_info"):
                info = ddl.table_info
                if ddl.table_id and info.table_id and ddl.table_id != info.table_id:
                    log.warning("ddl table_id differs from its table_info; using table_info's",
                                extra=kv(ddl_table_id=ddl.table_id, info_table_id=info.table_id, commit_ts=cts))
                self.record(info.table_id or ddl.table_id, cts, info)
                return
            prev = self._ddl_target(ddl, cts)
            if prev is None:
                log.warning("ddl without table_info for an unknown table; shape not recorded",
                            extra=kv(type=pb.DDLType.Name(ddl.tp), commit_ts=cts, table=f"{ddl.schema_name}.{ddl.table_name}"))
                return
            if ddl.tp == pb.RENAME_TABLE:
                renamed = pb.TableInfo()
                renamed.CopyFrom(prev)
                renamed.schema_name, renamed.table_name = ddl.schema_name, ddl.table_name
                self.record(prev.table_id, cts, renamed)
            # TRUNCATE without table_info keeps the shape; CREATE/ALTER without it cannot be known.
            return
        if ddl.tp == pb.DROP_TABLE:
            prev = self._ddl_target(ddl, cts)
            if prev is not None:
                self.record(prev.table_id, cts, None)
            elif ddl.table_id:
                self.record(ddl.table_id, cts, None)
            return
        if ddl.tp == pb.DROP_DATABASE:
            for table_id in list(self._ts):
                info = self.table_at(table_id, cts)
                if info is not None and info.schema_name == ddl.schema_name:
                    self.record(table_id, cts, None)

    def _ddl_target(self, ddl: pb.DDL, commit_ts: int) -> pb.TableInfo | None:
        """The table a DDL acts on, as it was just before commit_ts."""
        before = commit_ts - 1
        if ddl.table_id:
            info = self.table_at(ddl.table_id, before)
            if info is not None:
                return info
        if ddl.tp == pb.RENAME_TABLE:
            return self.find(ddl.old_schema_name, ddl.old_table_name, before)
        return self.find(ddl.schema_name, ddl.table_name, before)

    def prune(self, before_commit_ts: int) -> None:
        """Forget versions older than the one in force at before_commit_ts (lookups >= it unchanged)."""
        for table_id in list(self._ts):
            ts, infos = self._ts[table_id], self._infos[table_id]
            i = max(0, bisect.bisect_right(ts, before_commit_ts) - 1)
            # A leading drop marker answers None, exactly like having no version at all.
            while i < len(infos) and infos[i] is None:
                i += 1
            if i >= len(ts):
                del self._ts[table_id], self._infos[table_id]
            elif i:
                del ts[:i], infos[:i]

    # -- persistence --------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        tables = {
            str(table_id): [[t, None if info is None
                             else base64.b64encode(info.SerializeToString()).decode("ascii")]
                            for t, info in zip(self._ts[table_id], self._infos[table_id])]
            for table_id in sorted(self._ts)
        }
        return json.dumps({"format": _FORMAT, "tables": tables}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> SchemaHistory:
        h = cls()
        try:
            doc = json.loads(data)
            if doc.get("format") != _FORMAT:
                raise ValueError(f"unsupported format {doc.get('format')!r}")
            for key, versions in doc["tables"].items():
                table_id = int(key)
                for t, b64 in versions:
                    info = None
                    if b64 is not None:
                        info = pb.TableInfo()
                        info.ParseFromString(base64.b64decode(b64, validate=True))
                    h.record(table_id, int(t), info)
        except (ValueError, KeyError, TypeError, AttributeError, DecodeError) as e:
            raise CorruptSchemaHistory(f"cannot read schema history: {e}") from None
        return h
