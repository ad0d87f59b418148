"""Iceberg maintenance while the sink commits, read by a second JVM and by pyiceberg.

The sink (this process's Spark session) commits many small batches with `maintenance-every = 2`
and `snapshot-retention = 0`, so `rewrite_data_files`, `expire_snapshots` and
`remove_orphan_files` run every second batch. Meanwhile a reader in a second JVM
(tests/support/spark.py's reader loop, its own SparkSession on the same catalog) and pyiceberg
(no JVM, on a thread here) read the current table and its changelog round after round.

The table is a bank: transaction i moves money between two accounts and opens account 1000+i
with balance 0, stamping `ver = i` on the rows it touches. So in any committed state the total
balance is constant, no id appears twice, and `count(*) = ACCOUNTS + max(ver)`; and batches
end at known transactions, so `max(ver)` names the batch a read is as of.

Invariant (spark_sink/maintenance.py): a reader sees one committed snapshot or the next, never a
mix: every answer is the table exactly as of a batch boundary. With snapshot-retention 0 a read
that spans an expiry may find its files deleted (outside the guarantee: retention is the bound
for running readers); such a failure must say so, never return a wrong answer. After maintenance
the small files are compacted, old snapshots expired, and pyiceberg reads what Spark reads.
"""
from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sluice.drainer.sink import Checkpoint
from sluice.drainer.txn import SchemaHistory, Txn
from tests.support.procs import REPO, wait_until
from tests.support.rows import Table, col, prewrite_value, schema_txn, txn
from tests.support.spark import (SparkEnv, child_env, drive, make_sink, pyiceberg_catalog,  # noqa: F401
                                 reader_argv, run, spark_env)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1500)]

T0 = 1 << 40
ACCT = Table(451, "bank", "acct", [col("id", "int(11)", nullable=False), col("bal", "int(11)"),
                                   col("ver", "int(11)")], primary=["id"])
ACCOUNTS, START = 20, 100
BATCHES, PER_BATCH = 7, 6      # + the opening batch: 8 batches, maintenance after 2, 4, 6, 8
TOTAL = ACCOUNTS * START
TABLE_Q = "SELECT count(*), sum(bal), max(ver), count(DISTINCT id) FROM mt_bank.acct"
LOG_Q = "SELECT count(*), count(DISTINCT _commit_ts, _seq), max(_commit_ts) FROM mt_bank.acct_changelog"
# Errors a read may meet when an expiry deletes the files of the snapshot it planned on.
GONE = ("FileNotFound", "NotFoundException", "No such file", "does not exist")


def workload() -> tuple[list[list[Txn]], dict[int, int]]:
    """The batches, and for each batch's last transaction i (its `max(ver)`): the changelog's
    row count as of that batch."""
    import random
    rng = random.Random(7)
    bal = {k: START for k in range(1, ACCOUNTS + 1)}
    first = [ACCT.insert(id=k, bal=START, ver=0) for k in bal]
    batches = [[schema_txn(T0, ACCT), txn(prewrite_value(ACCT.mutation(*first)), T0 + 1)]]
    changes = len(first)
    log_at = {0: changes}
    i = 0
    for _ in range(BATCHES):
        chunk = []
        for _ in range(PER_BATCH):
            i += 1
            a, b = rng.sample(range(1, ACCOUNTS + 1), 2)
            x = rng.randint(1, 10)
            ch = [ACCT.update({"id": a, "bal": bal[a], "ver": 0}, {"bal": bal[a] - x, "ver": i}),
                  ACCT.update({"id": b, "bal": bal[b], "ver": 0}, {"bal": bal[b] + x, "ver": i}),
                  ACCT.insert(id=1000 + i, bal=0, ver=i)]
            bal[a] -= x
            bal[b] += x
            changes += len(ch)
            chunk.append(txn(prewrite_value(ACCT.mutation(*ch)), T0 + 1 + i))
        batches.append(chunk)
        log_at[i] = changes
    return batches, log_at


def check_table(row: list[Any], log_at: dict[int, int]) -> int:
    """A current-table answer is a batch boundary's state; returns its max(ver)."""
    n, total, ver, distinct = row[0], int(row[1]), int(row[2]), row[3]
    assert n == distinct, row                  # no id twice
    assert total == TOTAL, row                 # no transfer half-applied
    assert ver in log_at, row                  # as of a batch boundary, not inside one
    assert n == ACCOUNTS + ver, row            # and every row of that batch
    return ver


def check_log(row: list[Any], log_at: dict[int, int]) -> None:
    n, distinct, max_ts = row[0], row[1], int(row[2])
    assert n == distinct, row                  # no change twice
    last = max_ts - T0 - 1
    assert last in log_at and n == log_at[last], row


def failed_on_gone_files(err: str) -> bool:
    return any(m in err for m in GONE)


class PyIcebergReader(threading.Thread):
    """Reads the current table and the changelog with pyiceberg, round after round."""

    def __init__(self, warehouse: str) -> None:
        super().__init__(name="pyiceberg-reader", daemon=True)
        self.warehouse = warehouse
        self.stop = threading.Event()
        self.answers: list[tuple[str, list[Any]]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        cat = pyiceberg_catalog(self.warehouse)
        while not self.stop.is_set():
            try:
                cur = cat.load_table("mt_bank.acct").scan(
                    selected_fields=("id", "bal", "ver")).to_arrow().to_pylist()
                ids = {r["id"] for r in cur}
                self.answers.append(("t", [len(cur), sum(r["bal"] for r in cur),
                                           max((r["ver"] for r in cur), default=0), len(ids)]))
                log = cat.load_table("mt_bank.acct_changelog").scan(
                    selected_fields=("_commit_ts", "_seq")).to_arrow().to_pylist()
                keys = {(r["_commit_ts"], r["_seq"]) for r in log}
                self.answers.append(("l", [len(log), len(keys),
                                           max(r["_commit_ts"] for r in log)]))
            except Exception as e:  # noqa: BLE001 - every failure is the test's finding
                self.errors.append(f"{type(e).__name__}: {e}"[:2000])
            time.sleep(0.05)


def test_readers_see_consistent_snapshots_while_maintenance_compacts_and_expires(
        spark_env: SparkEnv, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """While the sink commits batches and runs Iceberg maintenance every second batch, every
    answer of a reader in another JVM and of pyiceberg is the table exactly as of a batch
    boundary (constant total, no id twice, all rows of that batch); maintenance itself never
    fails; afterwards the changelog's small files are compacted, the expired snapshots are gone
    and pyiceberg reads the same rows as Spark."""
    env = spark_env
    batches, log_at = workload()
    schema = SchemaHistory()
    sink = make_sink(env, "mt", schema, maintenance_every=2, snapshot_retention=0.0,
                     retain_snapshots=1)
    # The catalog's own tables exist before a second JVM opens it (two JVMs creating them at
    # once race); then the reader's JVM starts while the sink opens and commits the opening
    # batch, and its rounds begin once both tables hold that batch.
    env.rows("SHOW NAMESPACES")
    out, stop = tmp_path / "reader.jsonl", tmp_path / "stop"
    logf = (tmp_path / "reader.log").open("w")
    reader = subprocess.Popen(
        reader_argv(env.warehouse, out, stop, TABLE_Q, LOG_Q,
                    ready=("SELECT count(*) > 0 FROM mt_bank.acct",
                           "SELECT count(*) > 0 FROM mt_bank.acct_changelog")),
        cwd=REPO, env=child_env(), stdout=logf, stderr=subprocess.STDOUT)
    caplog.set_level(logging.INFO, logger="sluice.spark_sink")
    py = None
    try:
        run(sink.open(Checkpoint(0)))
        run(drive(sink, batches[0], schema))
        py = PyIcebergReader(env.warehouse)
        py.start()
        # Wait for the reader JVM's first answers, so its rounds run across the commits and
        # maintenance passes.
        wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 2, 700, 0.5,
                   what="the reader JVM's first answers")
        for chunk in batches[1:]:
            run(drive(sink, chunk, schema))
        stop.touch()
        reader.wait(400)
    finally:
        if py is not None:
            py.stop.set()
            py.join(60)
        if reader.poll() is None:
            reader.kill()  # our own child, by pid
            reader.wait()
        logf.close()
    assert reader.returncode == 0, (tmp_path / "reader.log").read_text()[-3000:]
    assert py is not None
    failed = [r.getMessage() for r in caplog.records if "maintenance failed" in r.getMessage()]
    assert not failed, [r.__dict__.get("fields") for r in caplog.records
                        if "maintenance failed" in r.getMessage()]
    assert sum("spark maintenance done" in r.getMessage() for r in caplog.records) == 4

    # Every answer of the second JVM is a batch boundary's state; a failure only from files an
    # expiry deleted under a running read (retention 0), never a wrong answer.
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    errors = [a["error"] for a in answers if "error" in a]
    assert all(failed_on_gone_files(e) for e in errors), errors[:3]
    good = [a for a in answers if "error" not in a]
    seen = {check_table(a["rows"][0], log_at) for a in good if a["q"] == 0}
    for a in good:
        if a["q"] == 1:
            check_log(a["rows"][0], log_at)
    assert len(good) >= 6 and len(seen) >= 3, (len(good), seen)
    assert [a for a in good if a["q"] == 0][-1]["rows"][0][2] == max(log_at)  # the last batch
    # pyiceberg: the same.
    assert all(failed_on_gone_files(e) for e in py.errors), py.errors[:3]
    py_seen = {check_table(v, log_at) for k, v in py.answers if k == "t"}
    for k, v in py.answers:
        if k == "l":
            check_log(v, log_at)
    assert len(py_seen) >= 3, py_seen

    # Compacted: the append-only changelog got at least one file per batch, and now holds fewer
    # than there were batches; a rewrite ('replace') happened on it.
    files = env.rows("SELECT count(*) FROM mt_bank.acct_changelog.files")[0][0]
    assert files < len(batches), files
    # Expired: with retention 0 and retain-snapshots 1, the last pass left the head only (and
    # the fence snapshot of the sink's epoch is long gone).
    for t in ("mt_bank.acct", "mt_bank.acct_changelog", "m_mt._sluice_commits"):
        snaps = env.rows(f"SELECT snapshot_id FROM {t}.snapshots")
        head = env.rows(f"SELECT snapshot_id FROM {t}.refs WHERE name = 'main'")
        assert len(snaps) == 1 and snaps == head, (t, snaps, head)
    # pyiceberg reads the same rows as Spark at the end.
    cat = pyiceberg_catalog(env.warehouse)
    spark_rows = sorted(tuple(r) for r in env.rows("SELECT id, bal, ver FROM mt_bank.acct"))
    py_rows = sorted((r["id"], r["bal"], r["ver"]) for r in cat.load_table("mt_bank.acct").scan(
        selected_fields=("id", "bal", "ver")).to_arrow().to_pylist())
    assert py_rows == spark_rows and len(spark_rows) == ACCOUNTS + max(log_at)
    spark_log = sorted(tuple(r) for r in env.rows(
        "SELECT _commit_ts, _seq, _op, id, bal FROM mt_bank.acct_changelog"))
    py_log = sorted((r["_commit_ts"], r["_seq"], r["_op"], r["id"], r["bal"]) for r in
                    cat.load_table("mt_bank.acct_changelog").scan(
                        selected_fields=("_commit_ts", "_seq", "_op", "id", "bal")).to_arrow().to_pylist())
    assert py_log == spark_log and len(spark_log) == log_at[max(log_at)]
    run(sink.close())


def test_a_database_named_like_the_catalog_commits_and_maintains(
        spark_env: SparkEnv, caplog: pytest.LogCaptureFixture) -> None:
    """The defaults name the meta database like the catalog ("sluice"): the marker table's
    publish (fast_forward) and its maintenance procedures must name it fully qualified, or
    `sluice._sluice_commits` resolves to catalog `sluice`, table `_sluice_commits` (not found)
    and every batch fails at its marker."""
    from sluice.drainer.sink import load_sink
    from sluice.spark_sink.config import SparkSinkConfig
    env = spark_env
    cfg = SparkSinkConfig(master=env.session_cfg.master, warehouse=env.warehouse,
                          shuffle_partitions=2, meta_database=env.session_cfg.catalog,
                          database="cn_{schema}", batch_rows=100_000, batch_interval=3600.0,
                          maintenance_every=1, snapshot_retention=0.0, retain_snapshots=1)
    schema = SchemaHistory()
    sink = load_sink("spark", cfg, schema=schema, source_name="src", spark=env.spark)
    batches, _ = workload()
    caplog.set_level(logging.INFO, logger="sluice.spark_sink")
    run(sink.open(Checkpoint(0)))
    for chunk in batches[:3]:
        run(drive(sink, chunk, schema))
    assert sink.checkpoint().sink_state["batch"] == 3
    marks = env.rows(f"SELECT batch FROM {cfg.catalog}.{cfg.meta_database}._sluice_commits ORDER BY batch")
    assert [r[0] for r in marks] == [1, 2, 3]
    assert not [r for r in caplog.records if "maintenance failed" in r.getMessage()]
    assert env.rows("SELECT count(*), sum(bal) FROM cn_bank.acct")[0] == (ACCOUNTS + 2 * PER_BATCH, TOTAL)
    run(sink.close())


def test_old_orphan_files_are_removed_young_ones_kept_and_needless_procedures_skipped(
        spark_env: SparkEnv, caplog: pytest.LogCaptureFixture) -> None:
    """Maintenance skips a procedure only when it provably has nothing to do: while no file
    under a table's location is older than the orphan cutoff (24 h) and a table has fewer than
    min-input-files small files, the scan and the rewrite are skipped; a file older than the
    cutoff that no snapshot references is still removed, a younger one kept, and the
    referenced files and rows are untouched."""
    import os
    from urllib.parse import urlparse
    env = spark_env
    batches, _ = workload()
    schema = SchemaHistory()
    sink = make_sink(env, "mo", schema)
    caplog.set_level(logging.INFO, logger="sluice.spark_sink")
    run(sink.open(Checkpoint(0)))
    for chunk in batches[:2]:
        run(drive(sink, chunk, schema))
    before = sorted(tuple(r) for r in env.rows("SELECT id, bal, ver FROM mo_bank.acct"))

    def done_fields() -> dict[str, Any]:
        recs = [r for r in caplog.records if r.getMessage() == "spark maintenance done"]
        return recs[-1].__dict__["fields"]

    # Young tables: nothing old under any location, two batches' files in each.
    sink.maintain()
    f = done_fields()
    assert f["tables"] == 3 and f["orphan_scans_skipped"] == 3, f
    assert f["rewrites_skipped"] >= 2, f   # the changelog and the marker: 2 data files, no deletes

    # A crashed write's leftovers in the changelog's data folder: one from two days ago, one
    # from now.
    assert sink.catalog is not None
    location = sink.catalog.iceberg_table("mo_bank", "acct_changelog").location()
    data = Path(urlparse(location).path) / "data"
    old, young = data / "leftover-old.parquet", data / "leftover-young.parquet"
    for p in (old, young):
        p.write_bytes(b"not referenced by any snapshot")
    two_days_ago = time.time() - 2 * 86_400
    os.utime(old, (two_days_ago, two_days_ago))
    sink.maintain()
    f = done_fields()
    assert f["tables"] == 3 and f["orphan_scans_skipped"] == 2, f
    assert not old.exists() and young.exists()
    assert not [r for r in caplog.records if "maintenance failed" in r.getMessage()]
    assert sorted(tuple(r) for r in env.rows("SELECT id, bal, ver FROM mo_bank.acct")) == before
    assert env.rows("SELECT count(*) FROM mo_bank.acct_changelog")[0][0] == ACCOUNTS + 3 * PER_BATCH
    run(sink.close())


def test_a_table_created_under_a_renamed_tables_old_name_shares_no_files_with_it(
        spark_env: SparkEnv, caplog: pytest.LogCaptureFixture) -> None:
    """Every table the sink creates has a location of its own: after `RENAME TABLE a TO b` and
    a new `CREATE TABLE a`, orphan removal on either table (every file backdated past the 24 h
    cutoff, so nothing is skipped as young) deletes none of the other's files, and both read
    back every row. With Iceberg's default `<warehouse>/<db>/<table>` the two would share a
    directory and each scan would take the other's data files for orphans."""
    import os
    from urllib.parse import urlparse

    from tests.support.rows import ddl_txn
    env = spark_env
    a = Table(461, "ren", "a", [col("id", "int(11)", nullable=False), col("v", "int(11)")],
              primary=["id"])
    ts = iter(range(T0, T0 + 1000))

    def ins(t: Table, *ids: int) -> Txn:
        return txn(prewrite_value(t.mutation(*(t.insert(id=i, v=i * 10) for i in ids))), next(ts))

    schema = SchemaHistory()
    sink = make_sink(env, "rl", schema)
    caplog.set_level(logging.INFO, logger="sluice.spark_sink")
    run(sink.open(Checkpoint(0)))
    b = a.rename("ren", "b")
    a2 = Table(462, "ren", "a", [col("id", "int(11)", nullable=False), col("w", "varchar(8)")],
               primary=["id"])
    new_a = txn(prewrite_value(a2.mutation(a2.insert(id=7, w="new"))), T0 + 900)
    run(drive(sink, [schema_txn(next(ts), a), ins(a, 1, 2)], schema))
    run(drive(sink, [ddl_txn(next(ts), b.rename_ddl(a, "RENAME TABLE a TO b")), ins(b, 3)], schema))
    run(drive(sink, [schema_txn(next(ts), a2), new_a], schema))
    assert sink.catalog is not None
    where = {t: urlparse(sink.catalog.iceberg_table("rl_ren", t).location()).path.rstrip("/") + "/"
             for t in ("a", "a_changelog", "b", "b_changelog")}
    assert len(set(where.values())) == 4, where
    for t, loc in where.items():
        assert not [o for o, other in where.items() if o != t and other.startswith(loc)], where

    # Everything under the namespace two days old: orphan removal scans every table.
    two_days_ago = time.time() - 2 * 86_400
    root = Path(urlparse(sink.catalog.iceberg_table("rl_ren", "a").location()).path).parent
    for p in root.rglob("*"):
        os.utime(p, (two_days_ago, two_days_ago))
    sink.maintain()
    assert not [r for r in caplog.records if "maintenance failed" in r.getMessage()]
    assert sorted(tuple(r) for r in env.rows("SELECT id, v FROM rl_ren.b")) == [(1, 10), (2, 20), (3, 30)]
    assert [tuple(r) for r in env.rows("SELECT id, w FROM rl_ren.a")] == [(7, "new")]
    assert env.rows("SELECT count(*) FROM rl_ren.b_changelog")[0][0] == 3
    assert env.rows("SELECT count(*) FROM rl_ren.a_changelog")[0][0] == 1

    # A warehouse from before per-table locations: a table in another's directory. Maintenance
    # names both and never scans them for orphans.
    from sluice.spark_sink.maintenance import _shared_locations
    env.spark.sql(f"CREATE TABLE {sink.cfg.catalog}.rl_ren.c (id INT) USING iceberg "
                  f"LOCATION '{sink.catalog.iceberg_table('rl_ren', 'b').location()}'")
    ices = {("rl_ren", t): sink.catalog.iceberg_table("rl_ren", t)
            for t in ("a", "a_changelog", "b", "b_changelog", "c")}
    assert _shared_locations(ices) == {("rl_ren", "b"), ("rl_ren", "c")}
    run(sink.close())
