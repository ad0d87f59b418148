"""Kill -9 the process driving the MySQL sink at chosen points; restart; compare with the model."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.support.mysql_sink_driver import build
from tests.support.procs import PYTHON, REPO
from tests.support.rows import create_sql, fetch_rows

SEED, TXNS, KEYS = 5, 600, 100


def drive(server, workdir, db: str, failpoints: str = "") -> tuple[int, list[dict]]:
    env = {"SLUICE_FAILPOINTS": failpoints, "PYTHONPATH": str(REPO), "TZ": "UTC"}
    out = subprocess.run(
        [PYTHON, "-m", "tests.support.mysql_sink_driver", "--port", str(server.port),
         "--password", server.password, "--db", db, "--cp-schema", f"{db}_cp",
         "--state", str(workdir / "state.json"), "--seed", str(SEED), "--txns", str(TXNS),
         "--keys", str(KEYS)],
        cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=100)
    (workdir / "driver.log").open("a").write(out.stdout + out.stderr)
    lines = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return out.returncode, lines


@pytest.mark.parametrize("failpoints", [
    "mysql-sink-after-commit=exit(137)@25",        # a worker batch committed, checkpoint not
    "mysql-sink-before-checkpoint=exit(137)@3",    # all workers flushed, checkpoint not written
    "mysql-sink-after-ddl=exit(137)@2",            # ALTER ran downstream, its checkpoint not
], ids=["after-worker-commit", "before-checkpoint", "after-ddl"])
def test_crash_then_restart_in_safe_mode_converges_to_the_model(mariadb_module, tmp_path, failpoints):
    """After a restart every transaction at or below the stored dispatched_upper is applied in
    safe mode, so whatever a crash left half-applied converges: the downstream equals the model,
    nothing lost, nothing doubled."""
    db = f"crash_{failpoints.split('=')[0].replace('-', '_')}"
    mariadb_module.execute(f"DROP DATABASE IF EXISTS `{db}`")
    mariadb_module.execute(f"DROP DATABASE IF EXISTS `{db}_cp`")
    mariadb_module.execute(f"CREATE DATABASE `{db}`")
    txns, wl, extra, extra_rows = build(SEED, db, TXNS, KEYS)
    for t in wl.tables:
        mariadb_module.execute(create_sql(t))

    code, lines = drive(mariadb_module, tmp_path, db, failpoints)
    assert code == 137, (tmp_path / "driver.log").read_text()[-3000:]
    state = json.loads((tmp_path / "state.json").read_text()) if (tmp_path / "state.json").exists() \
        else {"commit_ts": 0}
    assert state["commit_ts"] < txns[-1].commit_ts

    code, lines = drive(mariadb_module, tmp_path, db)
    assert code == 0, (tmp_path / "driver.log").read_text()[-3000:]
    start = lines[0]
    # The restart replays what the crash may have half-applied in safe mode.
    assert start["safe_until"] > start["start"]
    assert lines[-1] == {"done": txns[-1].commit_ts}

    conn = mariadb_module.connect()
    try:
        for t in wl.tables:
            assert fetch_rows(conn, t) == wl.expected(t), t.qualified
        assert fetch_rows(conn, extra) == extra_rows
    finally:
        conn.close()
