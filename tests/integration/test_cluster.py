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
from sluice.ctl import config_reference as cref
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


def cli(*args: str, timeout: float = 90,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sluice_argv("cluster", *args), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    d = tmp_path / "cluster"
    yield d
    # Whatever the test did, nothing it started survives it.
    state = read_state(cc.Layout(d))
    if state is not None:
        if state.supervisor is not None and running(state.supervisor):
            os.kill(state.supervisor.pid, signal.SIGKILL)     # first: it would restart the rest
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

    # Quiet logs: a normal start writes no warning or error line, and a few lines per
    # process (etcd: its one unavoidable warning, not its raft chatter).
    for r in state.processes:
        lines = [line for line in Path(r.log).read_text().splitlines()
                 if not line.startswith("---- ")]
        if r.kind == "etcd":
            assert len(lines) <= 2 and not any('"level":"error"' in line for line in lines), lines
            continue
        loud = [line for line in lines if line.split()[1:2] in (["WARNING"], ["ERROR"],
                                                                ["CRITICAL"])]
        assert not loud and len(lines) <= 12, (r.name, lines)

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
    start, end = text.find(cref.BEGIN), text.find(cref.END)
    assert 0 <= start < end, "docs/config.md lost its generated-region markers"
    generated = text[start:end]
    missing = []
    for title, cls, prefix in cref.reference_sections():
        section = generated.split(f"### {title}\n", 1)
        if len(section) < 2:
            missing.append(f"section {title!r}")
            continue
        body = section[1].split("\n### ", 1)[0]
        missing += [f"{title}: {d.key}" for d in cref.key_docs(cls, prefix) if f"`{d.key}`" not in body]
    assert not missing, ("docs/config.md is out of date; run `.venv/bin/python -m "
                         f"sluice.ctl.config_reference --write`. Missing: {missing[:10]}")
    # Descriptions and defaults too (a dataclass comment changed, the doc kept the old one).
    assert generated == cref.generated_region(), (
        "docs/config.md is out of date (a description or default changed); run `.venv/bin/python "
        "-m sluice.ctl.config_reference --write`")


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


def test_a_partial_to_keeps_the_default_warehouse(tmp_path: Path) -> None:
    """A drainer's `to` that gives only some of the sink's keys keeps the defaults of the
    others (a Spark drainer choosing its current-state still gets its warehouse)."""
    spec = cc.load_spec(None, ['drainers=[{name = "spark", sink = "spark", '
                               'to = {current-state = "equality-deletes"}}]'])
    ports = iter(range(31000, 32000))
    layout = cc.Layout(tmp_path)
    drainer = cc.plan(spec, layout, lambda _key: next(ports))[-1]
    assert drainer.config["to"] == {"warehouse": str(layout.data("spark") / "warehouse"),
                                    "current-state": "equality-deletes"}
    given = cc.load_spec(None, ['drainers=[{name = "s", sink = "spark", to = {warehouse = "/w"}}]'])
    assert cc.plan(given, layout, lambda _key: next(ports))[-1].config["to"] == {"warehouse": "/w"}


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
    # restart = "no": the story is the standby's takeover, not the supervisor's restart of the
    # killed instance (which could win the leader key back first).
    conf.write_text(SMALL_CLUSTER.replace("count = 2\nconfig", "count = 1\nconfig")
                    .replace('sink = "file"\n', 'sink = "file"\nstandby = true\nrestart = "no"\n'))
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


# ---------------------------------------------------------------------------------------------
# Supervision (issue 21 item 1)
# ---------------------------------------------------------------------------------------------

def status_json(cluster_dir: Path) -> tuple[int, dict[str, dict]]:
    st = cli("status", "--dir", str(cluster_dir), "--json")
    return st.returncode, {r["process"]: r for r in json.loads(st.stdout)["processes"]}


def pids(cluster_dir: Path) -> dict[str, int]:
    state = read_state(cc.Layout(cluster_dir))
    assert state is not None
    return {r.name: r.pid for r in state.processes}


@pytest.mark.timeout(180)
def test_stop_start_restart_and_up_on_a_partly_running_cluster(
        cluster_dir: Path, tmp_path: Path) -> None:
    """`stop NAME` keeps a process down (status: stopped, with its exit); a process killed under
    restart = "no" shows as dead with SIGKILL, never the registry's stale `online`; `up` on a
    partly running cluster (its supervisor killed too) starts a new supervisor and only the
    missing processes, leaving the running ones alone; `restart NAME` gives it a new pid."""
    conf = tmp_path / "cluster.toml"
    conf.write_text(SMALL_CLUSTER.replace("[pump]\ncount = 2\n", '[pump]\ncount = 2\nrestart = "no"\n'))
    up = cli("up", "--dir", str(cluster_dir), "--config", str(conf))
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        before = pids(cluster_dir)

        stop = cli("stop", "--dir", str(cluster_dir), "pump-2")
        assert stop.returncode == 0, stop.stdout + stop.stderr
        time.sleep(2.5)                     # longer than the first restart delay (1 s)
        rc, rows = status_json(cluster_dir)
        assert rows["pump-2"]["running"] is False and rows["pump-2"]["state"] == "stopped"
        assert rows["pump-2"]["exit"] in ("0", "SIGTERM"), rows["pump-2"]
        assert rc == 0, "a process stopped on purpose is not a failure"

        start = cli("start", "--dir", str(cluster_dir), "pump-2")
        assert start.returncode == 0, start.stdout + start.stderr
        rc, rows = status_json(cluster_dir)
        assert rows["pump-2"]["running"] and rows["pump-2"]["state"] == "online", rows["pump-2"]
        assert rows["pump-2"]["pid"] != before["pump-2"]
        assert cli("stop", "--dir", str(cluster_dir), "pump-2").returncode == 0

        os.kill(before["pump-1"], signal.SIGKILL)

        def pump1_dead() -> bool:
            return status_json(cluster_dir)[1]["pump-1"]["state"] == "dead"
        wait_until(pump1_dead, 10, 0.3, what="pump-1 shown dead")
        table = cli("status", "--dir", str(cluster_dir))
        assert table.returncode == 1, "a process that should run and does not fails status"
        assert re.search(r"^pump-1\s+\d+\s+no\s+dead\s+SIGKILL", table.stdout, re.M), table.stdout
        assert re.search(r"^pump-2\s+\d+\s+no\s+stopped", table.stdout, re.M), table.stdout

        state = read_state(cc.Layout(cluster_dir))
        assert state is not None and state.supervisor is not None
        old_supervisor = state.supervisor.pid
        os.kill(old_supervisor, signal.SIGKILL)

        again = cli("up", "--dir", str(cluster_dir), "--config", str(conf))
        assert again.returncode == 0, again.stdout + again.stderr
        assert "partly running; starting pump-1, pump-2" in again.stdout, again.stdout
        after = pids(cluster_dir)
        for name in ("etcd", "tso-1", "tso-2", "drainer-file"):
            assert after[name] == before[name], f"{name} was restarted by `up`"
        assert after["pump-1"] != before["pump-1"]
        state = read_state(cc.Layout(cluster_dir))
        assert state is not None and state.supervisor is not None
        assert state.supervisor.pid != old_supervisor and running(state.supervisor)
        rc, rows = status_json(cluster_dir)
        assert rc == 0 and all(r["running"] for r in rows.values()), rows
        assert {rows[n]["state"] for n in ("pump-1", "pump-2")} == {"online"}

        rs = cli("restart", "--dir", str(cluster_dir), "tso-2")
        assert rs.returncode == 0, rs.stdout + rs.stderr
        assert pids(cluster_dir)["tso-2"] != before["tso-2"]
        assert status_json(cluster_dir)[1]["tso-2"]["state"] in ("leader", "standby")
    finally:
        down = cli("down", "--dir", str(cluster_dir))
        assert down.returncode == 0, down.stdout + down.stderr
    state = read_state(cc.Layout(cluster_dir))
    assert state is not None and state.supervisor is None and state.processes == []


def inserted_ids(out: Path, table: str) -> list[int]:
    """Ids of the insert row events of `table` in a file sink's output, in file order."""
    ids = []
    for path in sorted(out.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            if ev.get("op") == "c" and ev["source"]["table"] == table:
                ids.append(ev["after"]["id"])
    return ids


@pytest.mark.mariadb
@pytest.mark.timeout(150)
def test_kill_9_of_the_pump_under_on_failure_restarts_it_and_rows_still_flow(
        cluster_dir: Path, tmp_path: Path) -> None:
    """Under the default restart policy (on-failure) a pump killed by kill -9 is started again by
    the supervisor on its own, status counts the restart and shows SIGKILL as its last exit, and
    rows written before and after the kill reach the file sink exactly once each."""
    import pymysql
    conf = tmp_path / "cluster.toml"
    conf.write_text(SMALL_CLUSTER.replace("count = 2\nconfig", "count = 1\nconfig")
                    + "\n[mariadb]\nenabled = true\n\n[capture]\nenabled = true\n")
    up = cli("up", "--dir", str(cluster_dir), "--config", str(conf), timeout=110)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        state = read_state(cc.Layout(cluster_dir))
        assert state is not None
        host, _, port = state.find("mariadb").addr.rpartition(":")
        conn = pymysql.connect(host=host, port=int(port), user="root", password="sluice-root",
                               autocommit=True)
        out = Path(state.find("drainer-file").data_dir) / "out"

        def insert(ids: range) -> None:
            with conn.cursor() as cur:
                for i in ids:
                    cur.execute("INSERT INTO shop.t VALUES (%s, %s)", (i, f"v{i}"))

        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE shop")
            cur.execute("CREATE TABLE shop.t (id INT PRIMARY KEY, v VARCHAR(10))")
        insert(range(1, 11))
        wait_until(lambda: len(inserted_ids(out, "t")) >= 10, 40, 0.3, what="rows 1-10 delivered")

        pump = state.find("pump-1")
        os.kill(pump.pid, signal.SIGKILL)

        def back() -> dict:
            rc, rows = status_json(cluster_dir)
            row = rows["pump-1"]
            return row if row["running"] and row["state"] == "online" and row["pid"] != pump.pid \
                else {}
        row = wait_until(back, 40, 0.5, what="pump-1 restarted and online")
        assert row["restarts"] == 1 and row["exit"] == "SIGKILL", row   # type: ignore[index]

        insert(range(11, 21))
        wait_until(lambda: len(inserted_ids(out, "t")) >= 20, 40, 0.3,
                   what="rows 11-20 delivered after the restart")
        time.sleep(1)                       # anything doubled would show up by now
        assert sorted(inserted_ids(out, "t")) == list(range(1, 21))
        conn.close()
    finally:
        down = cli("down", "--dir", str(cluster_dir))
        assert down.returncode == 0, down.stdout + down.stderr


# ---------------------------------------------------------------------------------------------
# Sources as config (issue 21 item 2) and the quick start of docs/cluster.md
# ---------------------------------------------------------------------------------------------

QUICK_START = "## Quick start: my own MariaDB -> my own MariaDB (+ Spark)"


def doc_toml_blocks(section: str | None = None) -> list[str]:
    """The ```toml blocks of docs/cluster.md (of one `## ` section when given)."""
    text = (REPO / "docs" / "cluster.md").read_text()
    if section is not None:
        assert section in text, f"docs/cluster.md lost its section {section!r}"
        text = text.split(section, 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```toml\n(.*?)^```", text, re.M | re.S)


def test_every_cluster_toml_in_docs_cluster_md_loads_through_the_config_classes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each TOML example of docs/cluster.md is a cluster.toml `up` accepts: it loads through
    ClusterSpec and every process config it plans loads through its process's config class."""
    blocks = doc_toml_blocks()
    assert len(blocks) >= 4
    monkeypatch.setenv("DOWNSTREAM_PASSWORD", "pw")     # the quick start's env:NAME secret
    (tmp_path / "source.pw").write_text("secret\n")
    for i, block in enumerate(blocks):
        conf = tmp_path / f"example-{i}.toml"
        conf.write_text(block)
        spec = cc.load_spec(conf)
        ports = iter(range(30000, 31000))
        cc.plan(spec, cc.Layout(tmp_path / f"c{i}"), lambda _key: next(ports))


def test_quick_start_with_spark_plans_captures_of_the_sources_without_a_local_mariadb(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quick start's TOML (with its Spark addition) plans one capture per [[sources]]
    entry, mapped onto the capture's own keys, and no local MariaDB; two sources (the
    shard-merge case) give two captures with their own producer and server ids."""
    main, spark = doc_toml_blocks(QUICK_START)
    monkeypatch.setenv("DOWNSTREAM_PASSWORD", "pw")
    (tmp_path / "source.pw").write_text("s3cret\n")
    conf = tmp_path / "cluster.toml"
    conf.write_text(main + "\n" + spark)
    spec = cc.load_spec(conf)
    ports = iter(range(30000, 31000))
    plans = {p.name: p for p in cc.plan(spec, cc.Layout(tmp_path / "c"), lambda _k: next(ports))}
    assert "mariadb" not in plans and "capture" not in plans
    assert {"drainer-mysql", "drainer-spark", "capture-shop"} <= set(plans)
    cap = plans["capture-shop"].config
    assert cap["source"] == {"host": "127.0.0.1", "port": 3306, "user": "sluice",
                             "server-id": 10001, "password": f"file:{tmp_path / 'source.pw'}"}
    assert cap["filter"] == {"include-databases": ["shop"]}
    assert (cap["snapshot-mode"], cap["snapshot-read-only"]) == ("initial", True)
    assert cap["producer-id"] == "capture-shop"
    assert "s3cret" not in cc.to_toml(cap), "the secret is referenced, never copied"

    shards = tmp_path / "shards.toml"
    shards.write_text('[[sources]]\nname = "eu"\nport = 3306\n\n'
                      '[[sources]]\nname = "us"\nport = 3307\nrestart = "always"\n')
    spec = cc.load_spec(shards)
    plans = {p.name: p for p in cc.plan(spec, cc.Layout(tmp_path / "s"), lambda _k: next(ports))}
    eu, us = plans["capture-eu"], plans["capture-us"]
    assert (eu.node_id, us.node_id) == ("capture-eu", "capture-us")
    assert (eu.config["source"]["server-id"], us.config["source"]["server-id"]) == (10001, 10002)
    assert (cc.restart_policy(spec, eu), cc.restart_policy(spec, us)) == ("on-failure", "always")

    with pytest.raises(cc.ConfigError, match="password-file"):
        shards.write_text('[[sources]]\nname = "eu"\npassword-file = "missing.pw"\n')
        cc.load_spec(shards)
    with pytest.raises(cc.ConfigError, match="'restart' is 'sometimes'"):
        cc.load_spec(None, ["restart=sometimes"])


@pytest.mark.mariadb
@pytest.mark.timeout(180)
def test_quick_start_runs_as_written_from_an_external_mariadb_to_another(
        cluster_dir: Path, tmp_path: Path) -> None:
    """docs/cluster.md's quick start, run as written (ports replaced by the test servers'):
    a source MariaDB the test runs (no `mariadb.enabled`), captured by its [[sources]] entry
    with a password file and a least-privilege user, an initial snapshot and the stream after
    it applied by a MySQL drainer; the downstream ends equal to the source."""
    from tests.support.mariadb import ROOT_PASSWORD, MariaDBServer
    main, _spark = doc_toml_blocks(QUICK_START)
    source = MariaDBServer(tmp_path / "source", server_id=1).start()
    downstream = MariaDBServer(tmp_path / "downstream", server_id=2).start()
    try:
        table = "CREATE TABLE shop.items (id INT PRIMARY KEY, name VARCHAR(20), qty INT)"
        source.execute("CREATE USER 'sluice'@'127.0.0.1' IDENTIFIED BY 'capture-pw'")
        source.execute("GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* "
                       "TO 'sluice'@'127.0.0.1'")
        for server in (source, downstream):
            server.execute("CREATE DATABASE shop")
            server.execute(table)
        for i in range(1, 6):                   # rows already there: the initial snapshot's
            source.execute("INSERT INTO shop.items VALUES (%s, %s, %s)", (i, f"item{i}", i))

        for doc_port, port in (("3306", source.port), ("3307", downstream.port)):
            assert main.count(f"port = {doc_port}") == 1, main
            main = main.replace(f"port = {doc_port}", f"port = {port}")
        conf = tmp_path / "cluster.toml"
        conf.write_text(main)
        (tmp_path / "source.pw").write_text("capture-pw\n")
        up = cli("up", "--dir", str(cluster_dir), "--config", str(conf), timeout=150,
                 env={"DOWNSTREAM_PASSWORD": ROOT_PASSWORD})
        assert up.returncode == 0, up.stdout + up.stderr
        state = read_state(cc.Layout(cluster_dir))
        assert state is not None
        assert "capture-shop" in [r.name for r in state.processes]
        assert not any(r.kind == "mariadb" for r in state.processes)

        for i in range(6, 11):                  # and the stream after it
            source.execute("INSERT INTO shop.items VALUES (%s, %s, %s)", (i, f"item{i}", i))
        source.execute("UPDATE shop.items SET qty = qty + 100 WHERE id IN (1, 7)")
        source.execute("DELETE FROM shop.items WHERE id = 2")
        want = source.execute("SELECT * FROM shop.items ORDER BY id")

        def equal() -> bool:
            return downstream.execute("SELECT * FROM shop.items ORDER BY id") == want
        wait_until(equal, 60, 0.5, what="the downstream equal to the source")
    finally:
        down = cli("down", "--dir", str(cluster_dir))
        source.stop()
        downstream.stop()
    assert down.returncode == 0, down.stdout + down.stderr
