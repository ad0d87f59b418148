"""Kill -9 the process driving the Spark sink at each step of its commit protocol; restart; compare.

Issue #19 acceptance. Six sinks, one per crash point, share one Iceberg catalog (the SQLite
file in the module's warehouse). Each is driven by its own child process
(tests/support/spark_sink_driver.py, its own Spark JVM) whose batches touch three tables, and
dies in batch 2 of 3:
- `spark-between-tables`     the first table's changelog published, its current table not;
- `spark-after-first-table`  the first table (changelog and current) published, the others not;
- `spark-before-marker`      every table published, the `_sluice_commits` marker not;
- `spark-after-marker`       the marker published, the drainer-style checkpoint not saved;
- mid-write: `spark-before-commit` sleeps, then the test sends SIGKILL while the batch's
  Iceberg commits run (`spark-after-marker` pauses the driver, so the kill never comes after
  it exits: the commits got fast enough to end inside the random delay);
- `spark-after-first-table` again for a sink with `current-state = equality-deletes` (its
  current tables take a batch's removed keys as equality-delete files, not a DELETE).
The crash children run at the same time; then this process's own session (another JVM on the
same catalog) restarts all six sinks from the checkpoint each persisted, each in its own mode.

Invariant (docs/spark.md, DESIGN §7): exactly once. After the restart every current table
equals the model, the changelogs hold every change once — no `(_commit_ts, _seq)` twice, none
missing — and the restarted sink's checkpoint is the last batch the marker table held.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.support.procs import PYTHON, REPO, wait_until
from tests.support.rows import history_of
from tests.support.spark import (SparkEnv, expected_changes, expected_rows, norm,  # noqa: F401
                                 run, spark_env)
from tests.support.spark_sink_driver import CHUNK, build, drive_one

pytestmark = [pytest.mark.spark]

EXITS = {  # sink name -> the failpoint whose exit(137) kills its driver, in batch 2
    "fbt": "spark-between-tables",
    "faf": "spark-after-first-table",
    "fbm": "spark-before-marker",
    "fam": "spark-after-marker",
    "fed": "spark-after-first-table",
}
# How each sink keeps its current tables (tests/support/spark_sink_driver.py --current-state);
# the others use the default, delete.
CURRENT_STATE = {"fed": "equality-deletes"}
MID = "fmw"        # SIGKILLed by the test while batch 2's commits run
MID_SLEEP_MS = 1000


def driver(env: SparkEnv, name: str, failpoints: str, log: Path) -> subprocess.Popen[str]:
    args = [PYTHON, "-m", "tests.support.spark_sink_driver", "--warehouse", env.warehouse,
            "--state-dir", str(env.workdir / "state"), "--name", name,
            "--current-state", CURRENT_STATE.get(name, "delete")]
    child_env = {**os.environ, "SLUICE_FAILPOINTS": failpoints, "PYTHONPATH": str(REPO),
                 "TZ": "UTC", "SPARK_LOCAL_IP": "127.0.0.1"}
    with log.open("w") as err:
        return subprocess.Popen(args, cwd=REPO, env=child_env, stdout=subprocess.PIPE,
                                stderr=err, text=True)


def failure_of(log: Path) -> str:
    """What a driver's log says went wrong: its exception lines (a Java stack hides the message
    far above the tail) and then its tail."""
    text = log.read_text(errors="replace")
    causes = [ln for ln in text.splitlines()
              if ("Exception" in ln or "Error" in ln) and not ln.lstrip().startswith("at ")]
    return "\n".join(causes[-15:]) + "\n--- tail ---\n" + text[-2000:]


def finish(p: subprocess.Popen[str], log: Path, timeout: float) -> int:
    try:
        p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()  # our own child, by its pid
        p.communicate()
        raise AssertionError(f"driver did not finish in {timeout}s:\n{failure_of(log)}") from None
    return p.returncode


def union_by_sink(env: SparkEnv, names: Iterable[str], select: str) -> dict[str, list[tuple]]:
    """`select` (with {n} for the sink's name) run for every sink in one UNION ALL query (one
    Spark job instead of one per sink: each costs seconds here); its rows per sink."""
    names = list(names)
    sql = " UNION ALL ".join(f"SELECT '{n}' AS _sink, * FROM ({select.format(n=n)})"
                             for n in names)
    out: dict[str, list[tuple]] = {n: [] for n in names}
    for r in env.rows(sql):
        out[r[0]].append(tuple(r[1:]))
    return out


def marker_rows(env: SparkEnv, names: Iterable[str]) -> dict[str, list[tuple[int, int]]]:
    """(batch, commit_ts) of every row of each sink's marker table, in batch order."""
    rows = union_by_sink(env, names, "SELECT batch, commit_ts FROM m_{n}._sluice_commits")
    return {n: sorted((int(b), int(c)) for b, c in rs) for n, rs in rows.items()}


def last_marker(marks: list[tuple[int, int]]) -> tuple[int, int]:
    """(batch, commit_ts) of the newest row of a sink's marker table."""
    return marks[-1] if marks else (0, 0)


async def restart_all(env: SparkEnv, names: list[str]) -> dict[str, dict]:
    """drive_one for every sink at once in env's session: each sink's summary line."""
    done = await asyncio.gather(*(drive_one(env.warehouse, env.workdir / "state", n, CHUNK,
                                            env.spark, CURRENT_STATE.get(n, "delete"))
                                  for n in names))
    return dict(zip(names, done))


@pytest.mark.timeout(1500)
def test_kill_at_every_commit_step_then_restart_lands_each_change_exactly_once(
        spark_env: SparkEnv) -> None:
    """Exactly once: a crash at any step of the commit protocol (between tables, after the
    first table, before or after the marker, or by SIGKILL mid-write; between tables with
    equality deletes too) leaves every table at a skip point its own snapshot summary names;
    the restart skips exactly what each table holds and lands the rest, so the current tables
    equal the model and each changelog holds every change once; the restarted sink's
    checkpoint is the marker table's last batch."""
    env = spark_env
    txns, wl = build()
    last_ts = txns[-1].commit_ts
    logs = env.workdir / "logs"
    logs.mkdir()
    t0 = time.monotonic()
    procs = {n: driver(env, n, f"{fp}=exit(137)@2", logs / f"{n}.log") for n, fp in EXITS.items()}
    # The pause after batch 2's marker keeps the driver alive until the SIGKILL, however fast
    # the commits run: the kill lands at a random point of them, at the latest after the marker.
    procs[MID] = driver(env, MID, f"spark-before-commit=1*sleep({MID_SLEEP_MS})@2;"
                        "spark-after-marker=1*pause@2", logs / f"{MID}.log")
    try:
        mid_log = logs / f"{MID}.log"

        def mid_fired_or_died() -> bool:
            return procs[MID].poll() is not None or \
                "failpoint spark-before-commit fired" in mid_log.read_text()
        wait_until(mid_fired_or_died, 900, 0.05, what="the mid-write driver to start batch 2")
        assert procs[MID].poll() is None, f"the mid-write driver died:\n{failure_of(mid_log)}"
        # After the sleep, inside the batch's table commits (each takes seconds here).
        time.sleep(MID_SLEEP_MS / 1000 + random.uniform(0.3, 2.0))
        procs[MID].send_signal(signal.SIGKILL)   # our own child, by its pid
        for n, p in procs.items():
            code = finish(p, logs / f"{n}.log", 600)
            assert code == (-signal.SIGKILL if n == MID else 137), failure_of(logs / f"{n}.log")
            state = json.loads((env.workdir / "state" / f"{n}.json").read_text())
            # Batch 1 committed and checkpointed (the SIGKILL may come after batch 2's too).
            assert state["sink_state"]["batch"] in ((1, 2) if n == MID else (1,)), (n, state)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()  # our own children, by pid (their JVMs exit with their stdin pipe)
                p.communicate()
    t1 = time.monotonic()

    markers = {n: last_marker(m) for n, m in marker_rows(env, procs).items()}
    for n in EXITS:
        assert markers[n][0] == (2 if n == "fam" else 1), (n, markers[n])
    assert markers[MID][0] in (1, 2), markers[MID]
    # The restart runs in this process's own session (a fresh sink incarnation per name, as a
    # restarted drainer makes): one JVM start fewer than a restart child. The five sinks restart
    # at once (each its own commit thread and namespaces; one at a time left a core idle).
    by_name = run(restart_all(env, list(procs)))
    t2 = time.monotonic()
    for n, r in by_name.items():
        batch, cts = markers[n]
        # The restarted sink's checkpoint is the marker table's last batch, not the drainer's.
        assert r["committed"] == cts and r["open_state"]["batch"] == batch, (n, r, markers[n])
        assert r["done"] == last_ts, r
        if r["committed"] > r["start"]:
            # The marker is the truth: batch 2 committed after the drainer's checkpoint, so the
            # restart is handed its transactions again and skips every one of them.
            assert batch == 2 and r["skipped"] == CHUNK, r
        else:
            assert r["committed"] == r["start"] and r["skipped"] == 0, r
    assert by_name["fam"]["committed"] > by_name["fam"]["start"]

    # Every sink's tables read in a few UNION ALL queries (one per table, one for the
    # changelogs, one for the markers), each sink's rows checked on its own.
    want_changes = sorted(expected_changes(txns, history_of(txns)))
    for t in wl.tables:
        cols = ", ".join(f"`{c.name}`" for c in t.visible)
        views = union_by_sink(env, procs, f"SELECT {cols} FROM {{n}}_shop.{t.name}")
        for n in procs:
            got_rows = sorted((tuple(norm(x) for x in r) for r in views[n]), key=repr)
            assert got_rows == expected_rows(wl, t), (n, t.name)
    logs = union_by_sink(env, procs, " UNION ALL ".join(
        f"SELECT _commit_ts, _seq, _op FROM {{n}}_shop.{t.name}_changelog" for t in wl.tables))
    all_marks = marker_rows(env, procs)
    for n in procs:
        got = [(r[0], r[1], r[2]) for r in logs[n]]
        assert len(got) == len({(c, s) for c, s, _ in got}), n  # no (_commit_ts, _seq) twice
        assert sorted(got) == want_changes, n                  # and none missing
        # One marker row per batch, in order; the last one is the sink's checkpoint.
        marks = all_marks[n]
        assert [b for b, _ in marks] == [1, 2, 3], (n, marks)
        assert marks[-1][1] == last_ts, n
    # Batch 2 touched every table (so the crash points between tables cut a real batch).
    n2 = dict(tuple(r) for r in env.rows(" UNION ALL ".join(
        f"SELECT '{t.name}', count(*) FROM {MID}_shop.{t.name}_changelog.snapshots "
        "WHERE summary['sluice.batch'] = '2'" for t in wl.tables)))
    for t in wl.tables:
        assert n2[t.name] >= 1, t.name
    # The equality-delete sink's current tables took their removed keys as equality-delete
    # files (content 2), never as a DELETE's position deletes (content 1).
    for eq in CURRENT_STATE:
        deletes = {(r[0], int(r[1])): int(r[2]) for r in env.rows(" UNION ALL ".join(
            f"SELECT '{t.name}', content, count(*) FROM {eq}_shop.{t.name}.all_delete_files "
            "GROUP BY content" for t in wl.tables))}
        for t in wl.tables:
            assert deletes.get((t.name, 2), 0) >= 1 and (t.name, 1) not in deletes, (eq, deletes)
    t3 = time.monotonic()
    print(f"crash children {t1 - t0:.0f}s, restart {t2 - t1:.0f}s, checks {t3 - t2:.0f}s")
