"""Compaction, small-file merging and retention while the sink writes, read from other JVMs.

A writer (this process's Spark session) commits micro-batches and compacts + merges every two
of them, with a short gc-grace so replaced files are really deleted while readers run. A reader
in a second JVM (tests/support/spark.py's reader loop, its own SparkSession on the same Derby
metastore) queries the current-state view and the changelog round after round, and a
`sluice spark-sql` process (a third JVM) queries the changelog in the middle of it.

Invariant (spark_sink/compaction.py): a reader of `<table>` never sees a torn or missing table.
Every answer any reader got is exactly the table as of some committed batch — never an error
(no FileNotFound while files are retired), never a row twice, never part of a batch — and the
views return the same rows before and after each compaction and merge.
"""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from sluice.drainer.sink import Checkpoint
from sluice.drainer.txn import SchemaHistory, Txn
from sluice.spark_sink import tables as T
from tests.support.procs import REPO, wait_until
from tests.support.rows import Table, col, prewrite_value, schema_txn, txn
from tests.support.spark import (SparkEnv, child_env, drive, make_sink, reader_argv, run,  # noqa: F401
                                 spark_env, spark_sql_argv)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

T0 = 1 << 40
ITEMS = Table(401, "cmp", "items", [col("id", "int(11)", nullable=False), col("qty", "int(11)"),
                                    col("note", "varchar(20)")], primary=["id"])
BATCHES, PER_BATCH = 8, 12
# gc-grace: replaced files are deleted mid-run. The guarantee holds for queries shorter than it
# (like a lakehouse's retention); 6 s was shorter than some queries on a loaded CI machine.
GRACE = 12.0


def workload() -> tuple[list[list[Txn]], dict[int, tuple[int, int]], dict[int, tuple[int, int]]]:
    """Batches of transactions. Transaction i inserts id=i, deletes id=i-2 when i % 3 == 0 and
    sets the counter row id=0 to qty=i, so a view's counter names the transaction it is as of.
    Returns the batches, then for each batch's last transaction i: the view's expected
    (rows, sum(qty)) and the changelog's expected (rows, max commit_ts)."""
    batches: list[list[Txn]] = [[schema_txn(T0, ITEMS),
                                 txn(prewrite_value(ITEMS.mutation(ITEMS.insert(id=0, qty=0, note="c"))), T0 + 1)]]
    state = {0: 0}
    changes = 1
    view_at: dict[int, tuple[int, int]] = {0: (1, 0)}
    log_at: dict[int, tuple[int, int]] = {0: (1, T0 + 1)}
    i = 0
    for _ in range(BATCHES):
        chunk = []
        for _ in range(PER_BATCH):
            i += 1
            ch = [ITEMS.insert(id=i, qty=i, note=f"n{i}")]
            state[i] = i
            if i % 3 == 0 and i - 2 in state:
                ch.append(ITEMS.delete(id=i - 2, qty=state.pop(i - 2), note=f"n{i - 2}"))
            ch.append(ITEMS.update({"id": 0, "qty": state[0], "note": "c"}, {"qty": i}))
            state[0] = i
            changes += len(ch)
            chunk.append(txn(prewrite_value(ITEMS.mutation(*ch)), T0 + 1 + i))
        batches.append(chunk)
        view_at[i] = (len(state), sum(state.values()))
        log_at[i] = (changes, T0 + 1 + i)
    return batches, view_at, log_at


VIEW_Q = ("SELECT count(*), sum(qty), max(CASE WHEN id = 0 THEN qty END), count(DISTINCT id) "
          "FROM cx_cmp.items")
LOG_Q = "SELECT count(*), count(DISTINCT _commit_ts, _seq), max(_commit_ts) FROM cx_cmp.items_changelog"


def check_answer(rec: dict, view_at: dict[int, tuple[int, int]], log_at: dict[int, tuple[int, int]]) -> bool:
    """Whether `rec` is an exact answer as of a committed batch; False only for a query that
    failed after running longer than gc-grace (outside the guarantee); anything else raises."""
    if "error" in rec:
        took = rec["end"] - rec["t"] if "end" in rec else 0.0
        assert took > GRACE, f"a {took:.1f} s query (gc-grace {GRACE} s) failed: {rec['error']}"
        return False
    row = rec["rows"][0]
    if rec["q"] == 0:
        n, total, counter, distinct = row[0], int(row[1]), row[2], row[3]
        assert n == distinct, rec                        # no key twice
        assert counter in view_at, rec                   # as of a batch boundary, not inside one
        assert (n, total) == view_at[counter], rec       # and exactly that batch's table
    else:
        n, distinct, max_ts = row
        assert n == distinct, rec                        # no change twice
        last = max_ts - T0 - 1
        assert last in log_at, rec
        assert (n, max_ts) == log_at[last], rec          # every change up to that batch
    return True


def test_readers_in_other_jvms_never_see_a_torn_or_missing_table(spark_env: SparkEnv, tmp_path: Path) -> None:
    """A reader of `<table>` never sees a torn or missing table: while batches commit and each
    second one is followed by compaction, small-file merging and deletion of replaced files,
    every answer of a reader in another JVM is the table as of some committed batch (no error,
    no duplicate, no partial batch), and the views give the same rows before and after each
    compaction and merge."""
    env = spark_env
    batches, view_at, log_at = workload()
    schema = SchemaHistory()
    sink = make_sink(env, "cx", schema, gc_grace=GRACE, compact_every=0)
    run(sink.open(Checkpoint(0)))
    run(drive(sink, batches[0], schema))
    out, stop = tmp_path / "reader.jsonl", tmp_path / "stop"
    logf = (tmp_path / "reader.log").open("w")
    reader = subprocess.Popen(reader_argv(env.derby.address, out, stop, VIEW_Q, LOG_Q), cwd=REPO,
                              env=child_env(), stdout=logf, stderr=subprocess.STDOUT)
    sql_proc = None
    try:
        state_q = "SELECT id, qty, note FROM cx_cmp.items ORDER BY id"
        log_q = "SELECT _commit_ts, _seq, _op, id, qty FROM cx_cmp.items_changelog ORDER BY _commit_ts, _seq"
        for b, chunk in enumerate(batches[1:], start=1):
            run(drive(sink, chunk, schema))
            if b == 2:
                # The first compaction waits for the reader JVM (its start overlapped batches).
                wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 2, 240,
                           0.5, what="the reader JVM's first answers")
            if b == 3:
                # A third JVM, `sluice spark-sql`, starts while merges and retention go on.
                sql_proc = subprocess.Popen(spark_sql_argv(env.derby.address, LOG_Q), cwd=tmp_path,
                                            env=child_env(), stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, text=True)
            if b % 2 == 0:
                before, before_log = env.rows(state_q), env.rows(log_q)
                st = sink.compact_table(ITEMS.table_id)
                assert st.base_upto == sink.checkpoint().sink_state["batch"] and st.hist
                assert env.rows(state_q) == before and env.rows(log_q) == before_log
        # Let the last retirements pass gc-grace, then empty the trash while the reader reads.
        time.sleep(GRACE + 0.5)
        sink.compact_table(ITEMS.table_id)
        stop.touch()
        reader.wait(180)
        assert sql_proc is not None
        sql_out, sql_err = sql_proc.communicate(timeout=240)
    finally:
        for p in (reader, sql_proc):
            if p is not None and p.poll() is None:
                p.kill()  # our own children, by pid
                p.wait()
        logf.close()
    assert reader.returncode == 0, (tmp_path / "reader.log").read_text()[-3000:]
    answers = [json.loads(line) for line in out.read_text().splitlines()]
    answers = [rec for rec in answers if check_answer(rec, view_at, log_at)]
    assert len(answers) >= 8, "most of the reader's queries must succeed"
    # The reader saw several different batches (it ran across the merges, not after them).
    counters = {rec["rows"][0][2] for rec in answers if rec["q"] == 0}
    assert len(counters) >= 3, counters
    last_view = [rec for rec in answers if rec["q"] == 0][-1]
    assert last_view["rows"][0][2] == max(view_at)  # its last round saw the last batch
    assert sql_proc.returncode == 0, sql_err[-3000:]
    row = [json.loads(line) for line in sql_out.splitlines() if line.startswith("{")][0]
    vals = list(row.values())
    check_answer({"q": 1, "rows": [vals]}, view_at, log_at)

    # The small files are gone: raw partitions up to the base's batch are retired, their
    # directories and the replaced merged files deleted; the changelog still holds every change.
    st = sink._states[ITEMS.table_id]
    parts = [r[0] for r in env.rows("SHOW PARTITIONS m_cx.t401_raw")]
    assert all(int(p.split("/")[0].split("=")[1]) > st.base_upto for p in parts), parts
    raw_dirs = list((env.workdir / "cx" / "data" / "t401" / "raw" / "e0").iterdir())
    assert len(raw_dirs) == len(parts), (raw_dirs, parts)
    hist_dirs = [p.name for p in (env.workdir / "cx" / "data" / "t401" / "hist").iterdir()
                 if p.name != "_table"]
    assert len(hist_dirs) == 1, hist_dirs
    n, total, counter, _ = env.rows(VIEW_Q)[0]
    assert (n, total) == view_at[counter] and counter == max(view_at)
    assert tuple(env.rows(LOG_Q)[0]) == (log_at[max(log_at)][0], log_at[max(log_at)][0], log_at[max(log_at)][1])
    # "As of" reads the merged changelog too.
    as_of = T.as_of_sql(st, sink.layout, T0 + 1 + PER_BATCH)
    assert env.rows(f"SELECT count(*), sum(qty) FROM ({as_of}) a")[0] == tuple(view_at[PER_BATCH])
    # ... and so does `sluice spark-sql --as-of` (time travel from a second JVM).
    r = subprocess.run(spark_sql_argv(env.derby.address, "SELECT count(*) AS n, sum(qty) AS s FROM items")
                       + ["--as-of", str(T0 + 1 + PER_BATCH), "--meta-database", "m_cx"],
                       cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    got = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [(g["n"], g["s"]) for g in got] == [tuple(view_at[PER_BATCH])]
    run(sink.close())

