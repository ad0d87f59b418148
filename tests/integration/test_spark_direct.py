"""Direct writes (spark_sink/datafiles.py, docs/spark.md "Direct writes"): the sink's appends
are parquet files the driver writes and commits through the Iceberg API, no Spark job. Each
test compares with the same transactions written through Spark (`direct_writes = False`, the
path partitioned tables still take), which earlier tests proved equal to the source."""
from __future__ import annotations

import datetime as _dt
import decimal
import os
from typing import Any

import pytest

from sluice.core.rowcodec import MySQLDateTime
from sluice.drainer.sink import Checkpoint
from sluice.drainer.txn import SchemaHistory
from sluice.spark_sink import positions
from sluice.spark_sink import writer as W
from sluice.spark_sink.catalog import Summary
from sluice.spark_sink.commit import LostRace
from tests.support.rows import Table, col, prewrite_value, schema_txn, txn
from tests.support.spark import (SparkEnv, drive, make_sink, norm, pyiceberg_catalog,  # noqa: F401
                                 run, spark_env)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

T0 = 1 << 41
UTC = _dt.timezone.utc

# Every column type of docs/types.md (each Spark type the sink writes: INT, BIGINT,
# DECIMAL(p,s) of every physical width, DOUBLE, STRING, BINARY, DATE, TIMESTAMP,
# ARRAY<STRING>), keyed by an INT.
ALL = Table(401, "ty", "every", [
    col("id", "int(11)", nullable=False), col("ti", "tinyint(4)"), col("tu", "tinyint(3) unsigned"),
    col("si", "smallint(6)"), col("mi", "mediumint(9)"), col("iu", "int(10) unsigned"),
    col("bi", "bigint(20)"), col("bu", "bigint(20) unsigned"), col("yr", "year(4)"),
    col("b8", "bit(8)"), col("b64", "bit(64)"), col("fl", "float"), col("db", "double"),
    col("d9", "decimal(9,4)"), col("d18", "decimal(18,6)"), col("d38", "decimal(38,10)"),
    col("d65", "decimal(65,30)"), col("dt", "datetime(6)"), col("ts", "timestamp"),
    col("da", "date"), col("tm", "time(6)"), col("js", "json"), col("vc", "varchar(32)"),
    col("en", "enum('a','b')"), col("st", "set('a','b','c')"), col("vb", "varbinary(8)"),
    col("bl", "blob"), col("uu", "uuid"), col("i4", "inet4"), col("i6", "inet6"),
    col("pt", "point"), col("ge", "geometry")], primary=["id"])

WKB = bytes.fromhex("0101000000000000000000f03f0000000000000040")   # POINT(1 2)


def _row(i: int) -> dict[str, Any]:
    """Row i: torture values (extremes, signs, unicode, empty, NULL, zero dates) by i."""
    lo = i % 2 == 0
    return {
        "id": i, "ti": -128 if lo else 127, "tu": 255 if lo else 0,
        "si": -32768 if lo else 32767, "mi": -8388608 if lo else 8388607,
        "iu": 4294967295 if lo else 0, "bi": -(2 ** 63) if lo else 2 ** 63 - 1,
        "bu": 2 ** 64 - 1 if lo else 0, "yr": 1901 if lo else 2155, "b8": 255 if lo else 0,
        "b64": 2 ** 64 - 1 if lo else 1, "fl": -1.5 if lo else 3.25, "db": 1e300 if lo else -0.0,
        "d9": decimal.Decimal("-99999.9999") if lo else decimal.Decimal("0.0001"),
        "d18": decimal.Decimal("-999999999999.999999") if lo else decimal.Decimal(i),
        "d38": decimal.Decimal("-" + "9" * 28 + "." + "9" * 10) if lo else decimal.Decimal("1e-10"),
        "d65": decimal.Decimal("-" + "9" * 35 + "." + "1" * 30) if lo else decimal.Decimal(i),
        "dt": (_dt.datetime(1000, 1, 1, 0, 0, 0, tzinfo=UTC) if lo
               else _dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)),
        "ts": MySQLDateTime() if i % 3 == 0 else _dt.datetime(2024, 2, 29, 12, 0, 0, i, tzinfo=UTC),
        "da": MySQLDateTime() if i % 4 == 1 else _dt.date(2024, 2, 29),
        "tm": -_dt.timedelta(hours=838, minutes=59, seconds=59) if lo else _dt.timedelta(microseconds=i),
        "js": '{"a": [1, 2], "ü": null}', "vc": "ünï 🚀" if lo else "",
        "en": "a" if lo else "b", "st": "a,c" if lo else "",
        "vb": b"\x00\xff" if lo else b"", "bl": bytes(range(256)) * 3 if lo else b"\x00",
        "uu": bytes.fromhex("123e4567e89b12d3a456426655440000"),
        "i4": bytes([10, 0, 0, i % 256]), "i6": bytes(15) + bytes([i % 256]),
        "pt": b"\x00\x00\x00\x00" + WKB, "ge": b"\xe6\x10\x00\x00" + WKB,
    }


def _null_row(i: int) -> dict[str, Any]:
    return {"id": i}


def _txns() -> list[list[Any]]:
    """Two batches: inserts of every value (and an all-NULL row); then updates, deletes, a key
    change and a re-insert."""
    first = [txn(prewrite_value(ALL.mutation(*[ALL.insert(**_row(i)) for i in range(1, 9)],
                                             ALL.insert(**_null_row(100)))), T0 + 1)]
    second = [
        txn(prewrite_value(ALL.mutation(ALL.update(_row(1), {**_row(1), "vc": "upd", "d9": None}),
                                        ALL.delete(**_row(2)))), T0 + 2),
        txn(prewrite_value(ALL.mutation(ALL.update(_row(3), {**_row(3), "id": 30}),
                                        ALL.insert(**_row(2)),
                                        ALL.read(**{**_row(4), "bl": b"r"}))), T0 + 3),
    ]
    return [first, second]


def _rows(env: SparkEnv, table: str) -> list[tuple[Any, ...]]:
    return sorted((tuple(norm(x) for x in r) for r in env.rows(f"SELECT * FROM {table}")),
                  key=repr)


def _land(env: SparkEnv, name: str, direct: bool, table: Table,
          batches: list[list[Any]], **kw: Any) -> Any:
    schema = SchemaHistory()
    sink = make_sink(env, name, schema, **kw)
    sink.direct_writes = direct
    run(sink.open(Checkpoint(0)))
    run(drive(sink, [schema_txn(T0, table)], schema))
    paths = []
    for b in batches:
        run(drive(sink, b, schema))
        paths.append(dict(sink.paths))
    run(sink.close())
    return paths


def test_every_type_round_trips_equal_through_the_direct_path_and_pyiceberg_reads_it(
        spark_env: SparkEnv) -> None:
    """Every Spark type of docs/types.md, with extreme, empty, NULL and zero-date values,
    lands through the direct path (files committed through the Iceberg API) in the changelog
    and the current table exactly as the Spark path lands it: same schema, same rows; the
    marker row too; pyiceberg (no JVM) reads the same rows as Spark."""
    env = spark_env
    paths = _land(env, "dty", True, ALL, _txns())
    _land(env, "sty", False, ALL, _txns())
    for p in paths:
        assert p == {("dty_ty", "every_changelog"): "direct", ("dty_ty", "every"): "direct"}
    for table in ("every_changelog", "every"):
        d, s = f"dty_ty.{table}", f"sty_ty.{table}"
        assert env.spark.table(d).schema == env.spark.table(s).schema
        got, want = _rows(env, d), _rows(env, s)
        # 9 inserts; then 2 updates (a key change is a d and a c), a delete, an insert, a read
        assert len(got) == (15 if table == "every_changelog" else 9)
        assert got == want
        # pyiceberg reads the files the driver wrote (field ids, physical types) as Spark does.
        py = pyiceberg_catalog(env.warehouse).load_table(d).scan().to_arrow()
        cols = [f.name for f in env.spark.table(d).schema.fields]
        spark_rows = sorted((tuple(norm(x) for x in r) for r in env.rows(
            f"SELECT {', '.join(f'`{c}`' for c in cols)} FROM {d}")), key=repr)
        py_rows = sorted((tuple(norm(_py(x)) for x in r)
                          for r in zip(*(py.column(c).to_pylist() for c in cols))), key=repr)
        assert py_rows == spark_rows
        _assert_metrics_are_icebergs(env, "dty_ty", table)
        # A local warehouse: pyarrow wrote the files (no FileIO stream, so no Hadoop checksum).
        for f in _data_files(env, d):
            assert not os.path.exists(os.path.join(os.path.dirname(f),
                                                   f".{os.path.basename(f)}.crc")), f
    # The marker rows: same columns and values but the time of the commit and the heads.
    cols = "batch, epoch, drainer, commit_ts, rows, array_sort(map_keys(tables))"

    def marker(name: str) -> list[Any]:
        return [(*r[:-1], sorted(k.replace(name, "") for k in r[-1])) for r in env.rows(
            f"SELECT {cols} FROM m_{name}._sluice_commits ORDER BY batch")]
    assert marker("dty") == marker("sty") and len(marker("dty")) >= 2


def _assert_metrics_are_icebergs(env: SparkEnv, db: str, table: str) -> None:
    """Readers prune files by their metrics, so the metrics the sink commits with a file
    (read from its footer with options made once: JavaClasses.parquet_metrics) are exactly
    Iceberg's own `ParquetUtil.fileMetrics`, for every type, under the table's metrics config
    and the position-delete one."""
    from sluice.spark_sink.catalog import Catalog
    cat = Catalog(env.spark, env.session_cfg.catalog)
    j, ice = cat.java, cat.iceberg_table(db, table)
    tasks = ice.newScan().includeColumnStats().planFiles().iterator()
    files = 0
    while tasks.hasNext():
        f = tasks.next().file()
        inp = ice.io().newInputFile(str(f.location()))
        for config in (j.MetricsConfig.forTable(ice), j.MetricsConfig.forPositionDelete()):
            got, want = j.parquet_metrics(inp, config), j.ParquetUtil.fileMetrics(inp, config)
            assert got.recordCount() == want.recordCount() > 0
            for part in ("columnSizes", "valueCounts", "nullValueCounts", "nanValueCounts",
                         "lowerBounds", "upperBounds"):
                a, b = getattr(got, part)(), getattr(want, part)()
                assert (a is None and b is None) or (a is not None and a.equals(b)), (table, part)
        # ... and what the committed file carries (its bounds as Iceberg computes them)
        want = j.ParquetUtil.fileMetrics(inp, j.MetricsConfig.forTable(ice))
        assert f.lowerBounds().equals(want.lowerBounds()) and f.upperBounds().equals(want.upperBounds())
        files += 1
    assert files > 0


def _py(v: Any) -> Any:
    """pyiceberg's value as PySpark returns it (timestamps naive UTC, decimals as they are)."""
    if isinstance(v, _dt.datetime) and v.tzinfo is not None:
        return v.astimezone(UTC).replace(tzinfo=None)
    return v


KV = Table(402, "kv", "kv", [col("id", "int(11)", nullable=False), col("v", "varchar(8)")],
           primary=["id"])


def _kv_batches() -> list[list[Any]]:
    return [
        [txn(prewrite_value(KV.mutation(*[KV.insert(id=i, v=f"a{i}") for i in range(10)])), T0 + 1)],
        [txn(prewrite_value(KV.mutation(KV.update({"id": 1, "v": "a1"}, {"id": 1, "v": "b1"}),
                                        KV.delete(id=2, v="a2"), KV.insert(id=20, v="c"))), T0 + 2),
         txn(prewrite_value(KV.mutation(KV.update({"id": 3, "v": "a3"}, {"id": 3, "v": "b3"}))),
             T0 + 3)],
    ]


def _snapshots(env: SparkEnv, table: str) -> list[tuple[str, dict[str, str]]]:
    return [(r[0], dict(r[1])) for r in env.rows(
        f"SELECT operation, summary FROM {table}.snapshots ORDER BY committed_at, snapshot_id")]


def test_equality_deletes_and_the_last_images_are_one_commit(spark_env: SparkEnv) -> None:
    """With `current-state = "equality-deletes"` a keyed current table takes a batch as ONE
    row-delta commit (the last images and the delete file of the keys they replace: same
    sequence number, so the deletes do not hit the new images), carrying the batch's summary;
    the rows equal the Spark path's."""
    env = spark_env
    _land(env, "deq", True, KV, _kv_batches(), current_state=W.EQUALITY_DELETES)
    _land(env, "seq", False, KV, _kv_batches(), current_state=W.EQUALITY_DELETES)
    snaps = _snapshots(env, "deq_kv.kv")
    data = [(op, s) for op, s in snaps if "sluice.commit-ts" in s]
    assert [s["sluice.commit-ts"] for _, s in data] == [str(T0 + 1), str(T0 + 3)]
    op, last = data[-1]
    # keys 1, 2 (deleted) and 3 removed; images of 1, 3 and 20 (inserted first) added
    assert op == "overwrite" and last["added-equality-deletes"] == "3", data
    assert last["added-records"] == "3" and last["sluice.batch"] == "2"
    assert last["added-data-files"] == "1" and last["added-equality-delete-files"] == "1"
    assert _rows(env, "deq_kv.kv") == _rows(env, "seq_kv.kv")
    assert sorted(r[1] for r in env.rows("SELECT id, v FROM deq_kv.kv")) == sorted(
        ["a0", "b1", "b3", *[f"a{i}" for i in range(4, 10)], "c"])


@pytest.mark.parametrize("current_state", [W.DELETE_KEYS, W.EQUALITY_DELETES])
def test_a_warehouse_that_is_no_local_directory_gets_its_files_through_the_fileio(
        spark_env: SparkEnv, monkeypatch: pytest.MonkeyPatch, current_state: str) -> None:
    """A warehouse the driver cannot reach as local files (an object store: `local_path` is
    None) gets every file through the table's FileIO, and the keys a batch changes are removed
    by a DELETE job with `delete`: the same rows land as through a local warehouse, where
    pyarrow writes the files itself."""
    env = spark_env
    monkeypatch.setattr(positions, "local_path", lambda location: None)
    name = "nl" + current_state[0]
    paths = _land(env, name, True, KV, _kv_batches(), current_state=current_state)
    assert paths[0][(f"{name}_kv", "kv")] == "direct"
    assert sorted(r[1] for r in env.rows(f"SELECT id, v FROM {name}_kv.kv")) == sorted(
        ["a0", "b1", "b3", *[f"a{i}" for i in range(4, 10)], "c"])
    assert len(env.rows(f"SELECT * FROM {name}_kv.kv_changelog")) == 14
    # Hadoop's local FileSystem leaves a checksum file beside each file it writes; pyarrow none.
    for f in _data_files(env, f"{name}_kv.kv") + _data_files(env, f"{name}_kv.kv_changelog"):
        assert os.path.exists(os.path.join(os.path.dirname(f), f".{os.path.basename(f)}.crc")), f


def _data_files(env: SparkEnv, table: str) -> list[str]:
    """Local paths of the table's live data and delete files."""
    paths = [r[0] for r in env.rows(f"SELECT file_path FROM {table}.all_files")]
    return [p.removeprefix("file://").removeprefix("file:") for p in paths]


def test_a_partial_write_after_a_skip_point_lands_only_the_rows_above_it(
        spark_env: SparkEnv) -> None:
    """A table whose skip point is inside the batch (its head moved after the batch was cut: a
    lost race, a replay) gets, through the direct path, only the rows with commit_ts above its
    skip point, and its current table removes every key those rows change (the first change
    of each key is then unknown): the result equals writing the rows above the skip point
    alone."""
    env = spark_env
    schema = SchemaHistory()
    sink = make_sink(env, "dsk", schema)
    run(sink.open(Checkpoint(0)))
    run(drive(sink, [schema_txn(T0, KV)], schema))
    b1, b2 = _kv_batches()
    run(drive(sink, b1, schema))
    pub = sink.publisher
    # Land the second batch's first transaction alone (another writer, as far as the next
    # write knows), then write the whole second batch with a frame cut below it.
    run(drive(sink, b2[:1], schema))
    st = next(iter(sink._states.values()))
    skip = pub.heads[(st.db, st.name)].commit_ts
    assert skip == T0 + 2
    buf_rows = _buffered(sink, b2, schema)
    frame = W.BatchFrame(env.spark, st, buf_rows, T0 + 1, W.DELETE_KEYS)
    assert frame.delete_mask(skip) == W.LATEST
    assert frame.changelog_arrow(skip).column("_commit_ts").to_pylist() == [T0 + 3]
    summary = Summary("", 0, 99, T0 + 3)
    for table, write in ((st.changelog, frame.write_changelog), (st.name, frame.write_current)):
        direct = sink._direct(st.db, table, summary)
        pub.publish(st.db, table, summary, lambda b, w=write, d=direct: w(b, skip, d))
    assert frame.paths == {"changelog": "direct", "current": "direct"}
    assert frame.removed == (W.DELETE_KEYS, 1)    # key 3, the only key changed above the skip
    got = sorted((r[0], r[1]) for r in env.rows(f"SELECT id, v FROM {st.db}.{st.name}"))
    assert got == sorted([(0, "a0"), (1, "b1"), (3, "b3"), (20, "c"),
                          *[(i, f"a{i}") for i in range(4, 10)]])
    cl = env.rows(f"SELECT _commit_ts, count(*) FROM {st.db}.{st.changelog} GROUP BY 1 ORDER BY 1")
    assert [tuple(r) for r in cl] == [(T0 + 1, 10), (T0 + 2, 3), (T0 + 3, 1)]
    run(sink.close())


def _buffered(sink: Any, txns: list[Any], schema: SchemaHistory) -> list[tuple[Any, ...]]:
    """The rows the sink buffers for txns (its own buffering, then taken back)."""
    for t in txns:
        sink._buffer_txn(t)
    buf, sink._buf = sink._buf, type(sink._buf)()
    return [r for rows in buf.rows.values() for r in rows]


def test_a_partitioned_table_falls_back_to_spark_writes(spark_env: SparkEnv) -> None:
    """A table someone partitioned (a file would need partition values) is written through
    Spark, and lands the same rows as the direct path on an unpartitioned table."""
    env = spark_env
    schema = SchemaHistory()
    sink = make_sink(env, "dpa", schema)
    run(sink.open(Checkpoint(0)))
    run(drive(sink, [schema_txn(T0, KV)], schema))
    env.spark.sql("ALTER TABLE dpa_kv.kv ADD PARTITION FIELD bucket(4, id)")
    env.spark.sql("ALTER TABLE dpa_kv.kv_changelog ADD PARTITION FIELD _op")
    for b in _kv_batches():
        run(drive(sink, b, schema))
        assert sink.paths == {("dpa_kv", "kv_changelog"): "spark", ("dpa_kv", "kv"): "spark"}
    run(sink.close())
    _land(env, "dup", True, KV, _kv_batches())
    for table in ("kv", "kv_changelog"):
        assert _rows(env, f"dpa_kv.{table}") == _rows(env, f"dup_kv.{table}")


def test_lost_race_is_still_raised_by_a_direct_write(spark_env: SparkEnv) -> None:
    """A direct write is on the sink's branch like a Spark write: when main moved under it,
    the publish is a LostRace and nothing of the write reaches main."""
    env = spark_env
    schema = SchemaHistory()
    sink = make_sink(env, "dlr", schema)
    run(sink.open(Checkpoint(0)))
    run(drive(sink, [schema_txn(T0, KV)], schema))
    run(drive(sink, _kv_batches()[0], schema))
    st = next(iter(sink._states.values()))
    env.spark.sql(f"INSERT INTO {st.db}.{st.name} VALUES (99, 'x', 1, NULL)")   # main moves
    before = sorted(tuple(r) for r in env.rows(f"SELECT id, v FROM {st.db}.{st.name}"))
    summary = Summary("", 0, 9, T0 + 5)
    frame = W.BatchFrame(env.spark, st, _buffered(sink, _kv_batches()[1], schema), T0 + 1)
    with pytest.raises(LostRace):
        sink.publisher.publish(st.db, st.name, summary, lambda b: frame.write_current(
            b, T0 + 1, sink._direct(st.db, st.name, summary)))
    assert frame.paths["current"] == "direct"
    assert sorted(tuple(r) for r in env.rows(f"SELECT id, v FROM {st.db}.{st.name}")) == before
    run(sink.close())


def _reaped_children_cpu(pid: int) -> float:
    """CPU seconds of the children pid has waited for (cutime + cstime)."""
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    return (int(rest[13]) + int(rest[14])) / os.sysconf("SC_CLK_TCK")


def test_local_files_get_hadoops_permissions_without_a_process_per_file(
        spark_env: SparkEnv, tmp_path: Any) -> None:
    """The session's `file:` filesystem is sluice.hadoop.LocalFileSystem (docs/spark.md, "JVM
    settings"): what Iceberg's HadoopFileIO creates gets Hadoop's permissions (0644 files and
    0755 directories under Hadoop's default umask) and checksum files, and no child process:
    Hadoop's own ran `chmod` for every file and directory (~9 ms of CPU each), whose CPU shows
    in the JVM's reaped-children time."""
    from pyspark import SparkContext
    spark = spark_env.spark
    jvm = spark._jvm
    conf = spark._jsc.hadoopConfiguration()
    fs = jvm.org.apache.hadoop.fs.FileSystem.getLocal(conf)
    assert fs.getClass().getName() == "sluice.hadoop.LocalFileSystem"
    io = jvm.org.apache.iceberg.hadoop.HadoopFileIO(conf)
    jpid = SparkContext._gateway.proc.pid  # type: ignore[attr-defined]
    before = _reaped_children_cpu(jpid)
    for i in range(40):
        out = io.newOutputFile(f"file:{tmp_path}/d{i}/f.bin").create()
        out.write(bytearray(b"x" * 100))
        out.close()
    assert _reaped_children_cpu(jpid) - before < 0.02
    for i in range(40):
        assert os.stat(tmp_path / f"d{i}" / "f.bin").st_mode & 0o7777 == 0o644
        assert os.stat(tmp_path / f"d{i}").st_mode & 0o7777 == 0o755
        assert (tmp_path / f"d{i}" / ".f.bin.crc").exists()
