"""A joined transaction's PrewriteValue is parsed on demand (drainer/txn.py, Txn.prewrite); the
native join checks it whole and reads the hot paths' facts in the same walk
(native/src/prewrite.rs, `prewrite_facts`).

Rules:
- the join refuses a prewrite value exactly when upb's parse does (the same CorruptTxn naming
  pump, start_ts and commit_ts, at the join: before any reader of the transaction runs);
- every fact a Txn answers without parsing (is_ddl, has_schema_snapshots, changes_schema, source,
  mutation_versions, the spans of `mutations`) equals what the parsed message says, and the
  lazily parsed `prewrite` equals upb's parse of the bytes.
"""
from __future__ import annotations

import random

import pytest
from google.protobuf.message import DecodeError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sluice_native
from sluice.core.rowcodec import python_to_datum
from sluice.drainer.txn import CorruptTxn, SchemaHistory, Txn
from sluice.proto import sluice_pb2 as pb

COLUMNS = [pb.ColumnInfo(name=n, data_type=t, column_type=t, charset="utf8mb4", elements=["a", "b"])
           for n, t in (("id", "bigint"), ("name", "varchar"), ("price", "decimal"), ("at", "datetime"),
                        ("d", "time"), ("doc", "json"), ("blob", "blob"))]
INFO = pb.TableInfo(table_id=10, schema_name="shop", table_name="orders", version=3, columns=COLUMNS,
                    indexes=[pb.IndexInfo(name="PRIMARY", columns=["id"], primary=True)],
                    charset="utf8mb4", source="src", collation="utf8mb4_bin")
OTHER = pb.TableInfo(table_id=11, schema_name="shop", table_name="lines", version=1,
                     columns=COLUMNS[:2])


def row(i: int) -> pb.Row:
    return pb.Row(columns=[python_to_datum(i), python_to_datum(f"näme {i}"),
                           pb.Datum(decimal="12.50"),
                           pb.Datum(datetime=pb.DateTimeValue(year=2026, month=11, day=28, hour=i % 24)),
                           pb.Datum(time=pb.TimeValue(negative=True, hours=30, minutes=1)),
                           pb.Datum(json='{"k": "ü"}'), pb.Datum(bytes=b"\xff\x00")])


def values() -> list[pb.PrewriteValue]:
    """Every message of a PrewriteValue: rows of every Datum kind on two tables (one of them
    twice), a DDL with its table shape, schema snapshots, the source, snapshot chunks, empty."""
    rows = pb.TableMutation(table_id=10, schema_name="shop", table_name="orders", table_version=3,
                            changes=[pb.RowChange(tp=pb.INSERT, after=row(1)),
                                     pb.RowChange(tp=pb.UPDATE, before=row(1), after=row(2)),
                                     pb.RowChange(tp=pb.DELETE, before=row(2))])
    other = pb.TableMutation(table_id=11, schema_name="shop", table_name="lines", table_version=1,
                             changes=[pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=row(5).columns[:2]))])
    source = pb.SourceInfo(name="src", server_id=1, gtid="0-1-42", file="mariadb-bin.000003", pos=120,
                           ts_ms=1764300000123)
    return [
        pb.PrewriteValue(schema_version=4, source=source, mutations=[rows, other, rows]),
        pb.PrewriteValue(ddl=pb.DDL(tp=pb.ALTER_TABLE, schema_name="shop", table_name="orders",
                                    query="ALTER TABLE orders ADD doc JSON", table_info=INFO,
                                    table_id=10), source=source),
        pb.PrewriteValue(schema_snapshots=[INFO, OTHER], mutations=[other]),
        pb.PrewriteValue(snapshot_chunk=True,
                         mutations=[pb.TableMutation(table_id=10, schema_name="shop", table_name="orders",
                                                     changes=[pb.RowChange(tp=pb.READ, after=row(7))])]),
        pb.PrewriteValue(),
    ]


def join(raw: bytes, pump: str = "pump-a") -> Txn:
    prewrite = pb.Binlog(tp=pb.PREWRITE, start_ts=7, prewrite_value=raw, producer_id="cap")
    commit = pb.Binlog(tp=pb.COMMIT, start_ts=7, commit_ts=9, producer_id="cap")
    return Txn.from_binlogs([prewrite.SerializeToString()], commit.SerializeToString(), pump)


def history() -> SchemaHistory:
    h = SchemaHistory()
    h.record(10, 1, INFO)
    h.record(11, 1, OTHER)
    return h


def assert_facts_match(txn: Txn, value: pb.PrewriteValue) -> None:
    parsed = Txn(txn.commit_ts, txn.start_ts, txn.producer_id, None, value, None, txn.pump_id)
    assert txn.is_ddl == value.HasField("ddl") == parsed.is_ddl
    assert txn.has_schema_snapshots == bool(value.schema_snapshots) == parsed.has_schema_snapshots
    assert txn.changes_schema == parsed.changes_schema
    assert txn.source == (value.source if value.HasField("source") else None) == parsed.source
    assert txn.mutation_versions() == [(m.table_id, m.table_version) for m in value.mutations]
    assert txn.mutation_versions() == parsed.mutation_versions()
    assert txn.ddl == parsed.ddl
    h = history()
    try:
        want = ("ok", parsed.mutations(h))
    except Exception as e:   # noqa: BLE001 - compared: both must refuse alike
        want = ("err", type(e), str(e))
    try:
        got = ("ok", txn.mutations(h))
    except Exception as e:   # noqa: BLE001
        got = ("err", type(e), str(e))
    if want[0] == "ok" and got[0] == "ok":
        # the spans are into each Txn's own bytes (the parsed one's re-serialized): compare the
        # TableMutation each covers
        (wc, ws), (gc, gs) = want[1], got[1]
        assert wc == gc

        def covered(spans: list) -> list:
            return [(m.info, m.schema, m.table, pb.TableMutation.FromString(m.payload[m.start:m.end]))
                    for m in spans]
        assert covered(gs) == covered(ws)
    else:
        assert got == want
    assert txn.prewrite == value
    assert txn == parsed


def test_every_fact_equals_the_parsed_message():
    """Each fact read with the join equals the parsed message's, and `prewrite` parsed on
    demand equals upb's parse; a source occurring twice merges as the parser merges it."""
    for value in values():
        raw = value.SerializeToString()
        txn = join(raw)
        assert txn._value is None   # not parsed by the join
        assert_facts_match(txn, value)
        assert txn.prewrite_bytes() is not None and txn.prewrite_bytes() == raw
    twice = values()[0].SerializeToString() + pb.PrewriteValue(
        source=pb.SourceInfo(gtid="0-1-43", pos=7)).SerializeToString()
    txn = join(twice)
    assert txn.source == pb.PrewriteValue.FromString(twice).source
    assert txn.source.gtid == "0-1-43" and txn.source.name == "src"


def test_a_filtered_transaction_answers_from_its_new_message():
    """with_prewrite (the table filter's) answers from the new message, not the joined bytes."""
    txn = join(values()[0].SerializeToString())
    kept = pb.PrewriteValue(mutations=[values()[0].mutations[1]])
    out = txn.with_prewrite(kept)
    assert (out.commit_ts, out.start_ts, out.producer_id, out.pump_id) == (9, 7, "cap", "pump-a")
    assert out.prewrite is kept and out.source is None
    assert out.mutation_versions() == [(11, 1)]
    assert out.prewrite_bytes() == kept.SerializeToString()
    snapshot_chunk, spans = out.mutations(history())
    assert not snapshot_chunk and [m.table for m in spans] == ["lines"]


def upb(raw: bytes) -> str:
    try:
        pb.PrewriteValue.FromString(raw)
        return "ok"
    except DecodeError:
        return "corrupt"


def lazy(raw: bytes) -> str:
    try:
        txn = join(raw, "pump-z")
    except CorruptTxn as e:
        assert (e.pump_id, e.start_ts, e.commit_ts) == ("pump-z", 7, 9)
        assert e.reason.startswith("undecodable prewrite value (1 part(s)): "), e.reason
        return "corrupt"
    assert_facts_match(txn, pb.PrewriteValue.FromString(raw))
    return "ok"


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        x, n = n & 0x7F, n >> 7
        if not n:
            return bytes(out + bytes([x]))
        out.append(x | 0x80)


def field(number: int, body: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(body)) + body


def groups(n: int, first: int = 100) -> bytes:
    return (b"".join(varint((first + i) << 3 | 3) for i in range(n))
            + b"".join(varint((first + i) << 3 | 4) for i in reversed(range(n))))


def test_the_join_refuses_what_upb_refuses_at_every_depth():
    """Malformed bytes deep inside (bad UTF-8 in each kind of string field, a truncated
    row, tags beyond 32 bits or 5 bytes, nested groups at upb's depth limit, a stray end
    group) are CorruptTxn at the join exactly when upb's parse refuses them."""
    bad = b"\xff\xfe"
    datum_str = field(1, field(7, bad))
    cases = {
        "table name": field(2, field(3, bad)),
        "datum str": field(2, field(5, varint(1 << 3) + b"\x01" + field(3, datum_str))),
        "datum decimal": field(2, field(5, field(2, field(1, field(5, bad))))),
        "datum json": field(2, field(5, field(3, field(1, field(10, bad))))),
        "datum bytes (not a string)": field(2, field(5, field(3, field(1, field(6, bad))))),
        "column name": field(4, field(5, field(1, bad))),
        "enum element": field(4, field(5, field(10, bad))),
        "index column": field(3, field(5, field(6, field(2, bad)))),
        "ddl query": field(3, field(4, bad)),
        "source gtid": field(5, field(3, bad)),
        "unknown field's bytes": field(40, bad),
        "truncated row": field(2, field(5, field(3, b"\x0a\x05ab"))),
        "known field, other wire type": b"\x10\x05" + field(2, b"\x10\x01"),
        "tag of 5 bytes": b"\x88\x80\x80\x80\x00\x01",
        "tag of 6 bytes": b"\x88\x80\x80\x80\x80\x00\x01",
        "field 2^29 - 1": varint(((1 << 29) - 1) << 3) + b"\x01",
        "field 2^29": varint((1 << 29) << 3) + b"\x01",
        "stray end group": b"\x0c",
        "end group in a mutation": field(2, b"\x0c"),
        "wire type 6": b"\x0e",
        "varint of 11 bytes": b"\x08" + b"\xff" * 10 + b"\x01",
    }
    for depth in (97, 98, 99, 100, 101):
        cases[f"{depth} groups"] = groups(depth)
        cases[f"{depth} groups in a mutation"] = field(2, groups(depth))
        cases[f"{depth} groups in a datum"] = field(2, field(5, field(3, field(1, groups(depth)))))
    verdicts = {}
    for name, raw in cases.items():
        assert lazy(raw) == upb(raw), name
        verdicts[name] = upb(raw)
    # the cases cover both answers
    assert verdicts["datum str"] == "corrupt" and verdicts["datum bytes (not a string)"] == "ok"
    assert verdicts["97 groups"] == "ok" and verdicts["101 groups"] == "corrupt"


def mutate(data: bytes, rnd: random.Random) -> bytes:
    b = bytearray(data)
    for _ in range(rnd.randrange(1, 3)):
        what = rnd.randrange(5)
        if what == 0 and b:
            b[rnd.randrange(len(b))] ^= 1 << rnd.randrange(8)
        elif what == 1:
            del b[rnd.randrange(len(b) + 1):]
        elif what == 2 and b:
            b[rnd.randrange(len(b))] = rnd.choice([0x80, 0xff, 0xc3, 0x0c, 0x0b, rnd.randrange(256)])
        elif what == 3:
            at = rnd.randrange(len(b) + 1)
            b[at:at] = rnd.randbytes(rnd.randrange(1, 6))
        elif b:
            at = rnd.randrange(len(b))
            del b[at:at + rnd.randrange(1, 4)]
    return bytes(b)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**32 - 1))
def test_mutated_values_are_refused_exactly_when_upb_refuses_them(seed):
    """Bit flips, overwritten, inserted, deleted and truncated bytes anywhere in a rich
    PrewriteValue: the join refuses exactly what upb's parse refuses, and whatever it accepts
    answers every fact as the parsed message does."""
    rnd = random.Random(seed)
    choices = values()
    raw = mutate(choices[rnd.randrange(len(choices))].SerializeToString(), rnd)
    assert lazy(raw) == upb(raw)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=120))
def test_random_values_are_refused_exactly_when_upb_refuses_them(raw):
    assert lazy(raw) == upb(raw)


def test_an_unjoinable_value_is_never_parsed_later_instead():
    """The check lives at the join: a value with a bad string in its last row is CorruptTxn from
    from_framed, before any reader (schema history, filter, sink) could see the transaction."""
    value = values()[0]
    value.mutations[-1].changes[-1].before.columns[1].str = "x"
    raw = value.SerializeToString()
    at = raw.rindex(b"\x3a\x01x")   # Datum.str = "x" of the last row
    broken = raw[:at + 2] + b"\xff" + raw[at + 3:]
    from sluice.drainer.txn import frame
    prewrite = pb.Binlog(tp=pb.PREWRITE, start_ts=7, prewrite_value=broken).SerializeToString()
    commit = pb.Binlog(tp=pb.COMMIT, start_ts=7, commit_ts=9).SerializeToString()
    with pytest.raises(CorruptTxn, match=r"pump p \(start_ts 7, commit_ts 9\): undecodable prewrite "
                                         r"value \(1 part\(s\)\): string field 7 at byte \d+ is not UTF-8"):
        Txn.from_framed(frame([prewrite, commit]), "p", 9)
    assert upb(broken) == "corrupt" and upb(raw) == "ok"
    assert sluice_native.prewrite_mutations(broken)   # the walk alone would not have seen it
