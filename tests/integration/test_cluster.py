"""`sluice cluster up|status|logs|down` run as the user runs them: subprocesses of the CLI."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sluice.ctl import cluster_config as cc
from sluice.ctl.cluster import Recorded, read_state, running, write_state
from tests.support.procs import REPO, sluice_argv, wait_until

# Short TTLs and intervals: the machine is shared and slow, the story stays the same.
SMALL_CLUSTER = """
cluster-id = 11
start-timeout = 40.0
stop-timeout = 10.0

[tso]
count = 2
lease-ttl = 2

[pump]
count = 2
config = { alive-ttl = 2, heartbeat-interval = 0.5, pull-heartbeat-interval = 0.3, storage = { stop-write-at-available-space = 0 } }

[[drainers]]
name = "drainer-file"
sink = "file"
config = { alive-ttl = 2, checkpoint-interval = 0.5, status-poll-interval = 0.2 }
"""


def cli(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sluice_argv("cluster", *args), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "cluster"
    yield d
    # Whatever the test did, nothing it started survives it.
    state = read_state(cc.Layout(d))
    if state is not None:
        for r in state.processes:
            if running(r):
                os.kill(r.pid, signal.SIGKILL)


def test_up_status_logs_down_leaves_no_process(cluster_dir: Path, tmp_path: Path) -> None:
    """`down` stops every process `up` started, by its recorded pid: none is left behind."""
    conf = tmp_path / "cluster.toml"
    conf.write_text(SMALL_CLUSTER)
    t0 = time.monotonic()
    up = cli("up", "--dir", str(cluster_dir), "--config", str(conf))
    assert up.returncode == 0, up.stdout + up.stderr
    assert "cluster up" in up.stdout

    state = read_state(cc.Layout(cluster_dir))
    assert state is not None
    names = [r.name for r in state.processes]
    assert names == ["etcd", "tso-1", "tso-2", "pump-1", "pump-2", "drainer-file"]
    assert all(running(r) for r in state.processes)
    # Each process got its own config (loadable by its real config class), data dir and log.
    for r in state.processes:
        assert Path(r.log).exists(), r.name
        if r.config_path:
            import tomllib
            kind = r.kind
            cc.validate(kind, tomllib.loads(Path(r.config_path).read_text()), r.config_path)

    st = cli("status", "--dir", str(cluster_dir), "--json")
    assert st.returncode == 0, st.stdout + st.stderr
    rows = {row["process"]: row for row in json.loads(st.stdout)["processes"]}
    assert {rows[n]["state"] for n in ("tso-1", "tso-2")} == {"leader", "standby"}
    for n in ("pump-1", "pump-2", "drainer-file"):
        assert rows[n]["state"] == "online" and rows[n]["alive"] is True, rows[n]
    assert isinstance(rows["drainer-file"]["lag"], float)

    table = cli("status", "--dir", str(cluster_dir))
    assert table.returncode == 0
    assert re.search(r"^pump-2\s+\d+\s+yes\s+online\s+yes", table.stdout, re.M), table.stdout

    logs = cli("logs", "--dir", str(cluster_dir), "pump-1", "-n", "5")
    assert logs.returncode == 0 and "pump pump-1" in logs.stdout, logs.stdout + logs.stderr

    down = cli("down", "--dir", str(cluster_dir))
    assert down.returncode == 0, down.stdout + down.stderr
    for r in state.processes:
        gone = not psutil.pid_exists(r.pid) or not running(r)
        assert gone, f"{r.name} (pid {r.pid}) survived `down`"
    assert read_state(cc.Layout(cluster_dir)).processes == []  # type: ignore[union-attr]
    assert time.monotonic() - t0 < 90


def test_down_never_signals_a_pid_that_is_no_longer_ours(cluster_dir: Path) -> None:
    """A recorded pid now running another command line is left alone (pid reuse)."""
    layout = cc.Layout(cluster_dir)
    cluster_dir.mkdir(parents=True)
    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        from sluice.ctl.cluster import State
        created = psutil.Process(stranger.pid).create_time()
        # Same pid and start time, but not the command line we recorded: not ours.
        fake = Recorded("pump-1", "pump", stranger.pid, created,
                        [sys.executable, "-m", "sluice.ctl.main", "pump"], "127.0.0.1:1", "", "")
        write_state(layout, State(1, "127.0.0.1:1", processes=[fake]))
        assert not running(fake)
        down = cli("down", "--dir", str(cluster_dir))
        assert down.returncode == 0, down.stdout + down.stderr
        assert "not running" in down.stdout
        assert stranger.poll() is None, "down killed a process it did not start"
        # And with the right command line but another start time (a reused pid): still not ours.
        same_argv = dataclasses.replace(fake, argv=["sleep", "30"], create_time=created - 100)
        assert not running(same_argv)
        assert running(dataclasses.replace(same_argv, create_time=created))
    finally:
        stranger.kill()
        stranger.wait(5)


def test_a_bad_key_fails_up_before_anything_starts(cluster_dir: Path) -> None:
    """Every config is loaded through its process's config class before any process starts."""
    up = cli("up", "--dir", str(cluster_dir), "--set", "pump.config={max-binlog-sise=1}")
    assert up.returncode == 2, up.stdout + up.stderr
    assert "unknown key 'max-binlog-sise'" in up.stderr
    state = read_state(cc.Layout(cluster_dir))
    assert state is None or state.processes == []


def test_docs_config_md_names_every_key_of_every_config() -> None:
    """docs/config.md cannot drift: it names every key of every config class in this build."""
    text = (REPO / "docs" / "config.md").read_text()
    start, end = text.find(cc.BEGIN), text.find(cc.END)
    assert 0 <= start < end, "docs/config.md lost its generated-region markers"
    generated = text[start:end]
    missing = []
    for title, cls, prefix in cc.reference_sections():
        section = generated.split(f"### {title}\n", 1)
        if len(section) < 2:
            missing.append(f"section {title!r}")
            continue
        body = section[1].split("\n### ", 1)[0]
        missing += [f"{title}: {d.key}" for d in cc.key_docs(cls, prefix) if f"`{d.key}`" not in body]
    assert not missing, ("docs/config.md is out of date; run `.venv/bin/python -m "
                         f"sluice.ctl.cluster_config --write`. Missing: {missing[:10]}")


def test_generated_configs_round_trip_through_toml(tmp_path: Path) -> None:
    """What `up` writes is what the processes read: TOML out, TOML in, same dict."""
    import tomllib
    spec = cc.load_spec(None, ["mariadb.enabled=true", "capture.enabled=true"])
    ports = iter(range(30000, 31000))
    plans = cc.plan(spec, cc.Layout(tmp_path), lambda _key: next(ports))
    kinds = [p.kind for p in plans]
    assert kinds[:6] == ["etcd", "tso", "tso", "pump", "pump", "mariadb"]
    for p in plans:
        if p.config_path:
            assert tomllib.loads(cc.to_toml(p.config)) == p.config
    mariadb = next(p for p in plans if p.kind == "mariadb")
    for flag in ("--no-defaults", "--binlog-format=ROW", "--binlog-row-image=FULL",
                 "--binlog-row-metadata=FULL", "--character-set-server=utf8mb4"):
        assert flag in mariadb.argv


def test_a_spark_drainer_and_its_standby_share_one_warehouse_and_no_catalog_server(
        tmp_path: Path) -> None:
    """A Spark drainer needs no catalog server: the plan starts no metastore, and the drainer
    and its standby get the same `[to]` whose warehouse (with the embedded SQLite catalog)
    lies in their shared data dir, valid for the sink's own config class."""
    from sluice.spark_sink.config import SparkSinkConfig
    spec = cc.load_spec(None, ['drainers=[{name = "spark", sink = "spark", standby = true}]'])
    ports = iter(range(31000, 32000))
    layout = cc.Layout(tmp_path)
    plans = cc.plan(spec, layout, lambda _key: next(ports))
    assert [p.kind for p in plans] == ["etcd", "tso", "tso", "pump", "pump", "drainer", "drainer"]
    active, standby = plans[-2:]
    assert standby.standby and active.data_dir == standby.data_dir
    assert active.config["to"] == standby.config["to"] == {
        "warehouse": str(layout.data("spark") / "warehouse")}
    cfg = SparkSinkConfig(**{k.replace("-", "_"): v for k, v in active.config["to"].items()})
    assert cfg.sqlite_path == str(layout.data("spark") / "warehouse" / "catalog.db")


@pytest.mark.mariadb
def test_a_cluster_with_mariadb_and_capture_carries_a_row_to_the_file_sink(
        cluster_dir: Path, tmp_path: Path) -> None:
    """The whole local pipeline: a row inserted in the cluster's MariaDB reaches the file sink."""
    import pymysql
    conf = tmp_path / "cluster.toml"
    conf.write_text(SMALL_CLUSTER.replace("count = 2\nconfig", "count = 1\nconfig")
                    + "\n[mariadb]\nenabled = true\n\n[capture]\nenabled = true\n")
    up = cli("up", "--dir", str(cluster_dir), "--config", str(conf), timeout=110)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = read_state(cc.Layout(cluster_dir))
        assert state is not None
        db = state.find("mariadb")
        host, _, port = db.addr.rpartition(":")
        conn = pymysql.connect(host=host, port=int(port), user="root", password="sluice-root",
                               autocommit=True)
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
            cur.execute("CREATE TABLE shop.t (id INT PRIMARY KEY, v VARCHAR(10))")
            cur.execute("INSERT INTO shop.t VALUES (1, 'first')")
        conn.close()
        out = Path(state.find("drainer-file").data_dir) / "out"

        def delivered() -> bool:
            return any('"first"' in p.read_text() for p in out.glob("*.jsonl"))
        wait_until(delivered, 40, 0.2, what="the row in the file sink")
    finally:
        down = cli("down", "--dir", str(cluster_dir))
        assert down.returncode == 0, down.stdout + down.stderr


def test_standby_drainer_runs_as_ha_pair_and_takes_over(cluster_dir: Path, tmp_path: Path) -> None:
    """`standby = true` runs two HA instances of one drainer: `status` shows the active one and
    the standby, and after kill -9 of the active one the standby becomes active."""
    conf = tmp_path / "cluster.toml"
    conf.write_text(SMALL_CLUSTER.replace("count = 2\nconfig", "count = 1\nconfig")
                    .replace('sink = "file"\n', 'sink = "file"\nstandby = true\n'))
    up = cli("up", "--dir", str(cluster_dir), "--config", str(conf))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert re.search(r"^drainer-file\s+\d+\s+yes\s+online \(active\)\s+yes", up.stdout,
                         re.M), up.stdout
        assert re.search(r"^drainer-file-standby\s+\d+\s+yes\s+standby", up.stdout, re.M), up.stdout
        state = read_state(cc.Layout(cluster_dir))
        assert state is not None
        import tomllib
        for name in ("drainer-file", "drainer-file-standby"):
            conf_of = tomllib.loads(Path(state.find(name).config_path).read_text())
            assert conf_of["ha"] is True and conf_of["name"] == "drainer-file"

        def roles() -> dict[str, tuple[str, str]]:
            st = cli("status", "--dir", str(cluster_dir), "--json")
            rows = json.loads(st.stdout)["processes"]
            return {r["process"]: (r.get("role", ""), r["state"]) for r in rows
                    if r["process"].startswith("drainer-file")}
        assert roles() == {"drainer-file": ("active", "online"),
                           "drainer-file-standby": ("standby", "standby")}

        os.kill(state.find("drainer-file").pid, signal.SIGKILL)
        wait_until(lambda: roles().get("drainer-file-standby") == ("active", "online"), 40, 0.5,
                   what="the standby to take over")
    finally:
        down = cli("down", "--dir", str(cluster_dir))
        assert down.returncode == 0, down.stdout + down.stderr
