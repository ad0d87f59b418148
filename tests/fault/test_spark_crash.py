"""Kill -9 the process driving the Spark sink at each step of its commit protocol; restart; compare.

Issue #8 acceptance. Four sinks (one per failpoint) share one Derby metastore. Each is driven by
its own child process (tests/support/spark_sink_driver.py, its own Spark JVM) that dies with
exit(137) in batch 2 of 3 at:
- `spark-after-files`            every table's parquet written, no partition registered;
- `spark-after-some-partitions`  one table's raw partition registered, the others not;
- `spark-before-commit`          every raw partition and the commit record written, no commit point;
- `spark-after-commit`           the commit point passed, the drainer-style checkpoint not saved.
The four crash children run at the same time (the module's metastore was warmed first, see
tests/support/spark.py); then this process's own session (another JVM on the same catalog)
restarts all four sinks from the checkpoint each persisted — a JVM start costs 20-35 s here,
so not one more child — and checks the user-facing views.

Invariant (docs/spark.md, DESIGN §7): exactly once. After the restart every current-state view
equals the model, the changelogs hold every change once — no `(_commit_ts, _seq)` twice, none
missing — and no raw partition or batch directory without a commit record remains.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.procs import PYTHON, REPO
from tests.support.rows import history_of
from tests.support.spark import (SparkEnv, expected_changes, expected_rows, run,  # noqa: F401
                                 spark_env, view_rows)
from tests.support.spark_sink_driver import CHUNK, build, drive_one

pytestmark = [pytest.mark.spark]

FAILPOINTS = {  # sink name -> the failpoint that kills its driver, in batch 2
    "fa": "spark-after-files",
    "fp": "spark-after-some-partitions",
    "fb": "spark-before-commit",
    "fc": "spark-after-commit",
}


def driver(env: SparkEnv, names: list[str], failpoints: str, log: Path) -> subprocess.Popen[str]:
    args = [PYTHON, "-m", "tests.support.spark_sink_driver",
            "--metastore-port", str(env.derby.port), "--workdir", str(env.workdir),
            "--state-dir", str(env.workdir / "state")]
    for n in names:
        args += ["--name", n]
    child_env = {**os.environ, "SLUICE_FAILPOINTS": failpoints, "PYTHONPATH": str(REPO),
                 "TZ": "UTC", "SPARK_LOCAL_IP": "127.0.0.1"}
    with log.open("w") as err:
        return subprocess.Popen(args, cwd=REPO, env=child_env, stdout=subprocess.PIPE,
                                stderr=err, text=True)


def finish(p: subprocess.Popen[str], log: Path, timeout: float) -> tuple[int, list[dict]]:
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()  # our own child, by its pid
        p.communicate()
        raise AssertionError(f"driver did not finish in {timeout}s:\n{log.read_text()[-3000:]}") from None
    return p.returncode, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.timeout(600)
def test_kill_at_every_commit_step_then_restart_lands_each_change_exactly_once(
        spark_env: SparkEnv) -> None:
    """Exactly once: a crash at any step of the commit protocol leaves the batch either wholly
    committed or wholly invisible; the restart removes the torn attempt, skips what the commit
    table already holds and lands the rest, so the views equal the model, nothing doubled."""
    env = spark_env
    txns, wl = build()
    last_ts = txns[-1].commit_ts
    logs = env.workdir / "logs"
    logs.mkdir()
    t0 = time.monotonic()

    # All four at once: the module fixture created every metastore id sequence first
    # (tests/support/spark.py warm_metastore), so concurrent opens no longer collide on
    # DataNucleus' SEQUENCE_TABLE, and the JVM start-ups overlap instead of adding up.
    procs = {n: driver(env, [n], f"{fp}=exit(137)@2", logs / f"{n}-crash.log")
             for n, fp in FAILPOINTS.items()}
    try:
        for n, p in procs.items():
            code, _ = finish(p, logs / f"{n}-crash.log", 360)
            assert code == 137, (logs / f"{n}-crash.log").read_text()[-3000:]
            state = json.loads((env.workdir / "state" / f"{n}.json").read_text())
            assert state["sink_state"]["batch"] == 1, n  # batch 1 committed and checkpointed
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()  # our own children, by pid (their JVMs exit with their stdin pipe)
                p.communicate()
    t1 = time.monotonic()

    # The restart runs in this process's own session (a fresh sink incarnation per name, as a
    # restarted drainer makes): one JVM start fewer than a restart child.
    by_name = {n: run(drive_one(env.workdir, env.derby.port, env.workdir / "state", n, CHUNK,
                                   env.spark))
               for n in FAILPOINTS}
    t2 = time.monotonic()
    for n in FAILPOINTS:
        r = by_name[n]
        assert r["done"] == last_ts, r
        if n == "fc":
            # The commit table is the truth: batch 2 committed after the drainer's checkpoint,
            # so the restart is handed its transactions again and skips every one of them.
            assert r["committed"] > r["start"] and r["skipped"] > 0, r
        else:
            assert r["committed"] == r["start"] and r["skipped"] == 0, r

    want_changes = sorted(expected_changes(txns, history_of(txns)))
    for n in FAILPOINTS:
        for t in wl.tables:
            assert view_rows(env, f"{n}_shop.{t.name}", t) == expected_rows(wl, t), (n, t.name)
        got = []
        for t in wl.tables:
            got += [(r[0], r[1], r[2]) for r in env.rows(
                f"SELECT _commit_ts, _seq, _op FROM {n}_shop.{t.name}_changelog")]
        assert len(got) == len({(c, s) for c, s, _ in got}), n  # no (_commit_ts, _seq) twice
        assert sorted(got) == want_changes, n                  # and none missing
        # Recovery left nothing uncommitted behind: every raw partition and batch directory
        # belongs to a commit record (3 data batches, epoch 1).
        batches = {r[0] for r in env.rows(f"SELECT batch FROM m_{n}._sluice_commits")}
        assert batches == {1, 2, 3}, n
        for t in wl.tables:
            parts = {r[0] for r in env.rows(f"SHOW PARTITIONS m_{n}.t{t.table_id}_raw")}
            assert parts == {f"_batch={b}/_epoch=1" for b in batches}, (n, t.name, parts)
            dirs = {p.name for p in (env.workdir / n / "data" / f"t{t.table_id}" / "raw" / "e1").iterdir()}
            assert dirs == {f"b{b}" for b in batches}, (n, t.name, dirs)
    t3 = time.monotonic()
    print(f"crash children {t1 - t0:.0f}s, restart {t2 - t1:.0f}s, checks {t3 - t2:.0f}s")
