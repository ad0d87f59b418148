"""`sluice ctl` against a live cluster: real etcd, TSO and pump processes, a real producer endpoint.

Most commands run as a subprocess (`sluice ctl ...`, checking exit codes and output); a few run
in-process through the same parser for speed. The cluster is shared by the module; tests that
take a pump out of service start their own pump.
"""
from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sluice.client.producer import ProducerServer
from sluice.core.etcd import Etcd
from sluice.core.registry import Heartbeat, NodeKind, NodeState, NodeStatus, Registry
from sluice.ctl import admin
from sluice.ctl import main as cli
from sluice.drainer.checkpoint import read_checkpoint, write_checkpoint
from sluice.drainer.sink import Checkpoint
from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import TS, decode, prewrite
from tests.support.cluster import CLUSTER_ID, Cluster, PumpHandle
from tests.support.ctl import Result, ctl_in
from tests.support.procs import REPO, free_port, sluice_argv, wait_until

pytestmark = pytest.mark.timeout(120)

# Pumps must not resolve our prewrites by themselves while a test looks at them.
PUMP_SETTINGS = {"txn-timeout": 120.0}


@dataclasses.dataclass
class Live:
    cluster: Cluster
    etcd_endpoint: str
    registry: Registry
    ts: TS

    def ctl(self, *args: str) -> Result:
        """`sluice ctl` as a subprocess."""
        r = subprocess.run(sluice_argv("ctl", "--etcd", self.etcd_endpoint, "--cluster-id",
                                       str(CLUSTER_ID), *args),
                           capture_output=True, text=True, timeout=60, cwd=REPO)
        return Result(r.returncode, r.stdout, r.stderr)

    def ctl_in(self, *args: str) -> Result:
        """The same command in-process (same parser, same code path minus logging setup)."""
        return ctl_in(self.etcd_endpoint, CLUSTER_ID, *args)

    def node(self, kind: NodeKind, node_id: str):  # type: ignore[no-untyped-def]
        return self.registry.get(kind, node_id)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Live]:  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path_factory.mktemp("ctl"), etcd_module.endpoint)
    etcd = Etcd(etcd_module.endpoint)
    ts = None
    try:
        c.start_tso()
        c.start_pump("pump-1", **PUMP_SETTINGS)
        c.start_pump("pump-2", **PUMP_SETTINGS)
        c.register_producer("ctl-manual")
        ts = TS(c.tso_addrs, CLUSTER_ID)
        yield Live(c, etcd_module.endpoint, Registry(etcd, CLUSTER_ID), ts)
    finally:
        if ts is not None:
            ts.close()
        c.stop()
        etcd.close()


def write(pump: PumpHandle, *payloads: bytes) -> None:
    ch, stub = pump.stub()
    try:
        stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=CLUSTER_ID, payloads=list(payloads)),
                          timeout=10)
    finally:
        ch.close()


def get_commit(pump: PumpHandle, start_ts: int) -> tuple[int, int]:
    ch, stub = pump.stub()
    try:
        r = stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=start_ts), timeout=5)
        return r.state, r.commit_ts
    finally:
        ch.close()


def pull_until(pump: PumpHandle, after: int, pred, timeout: float = 15.0) -> list[pb.Binlog]:  # type: ignore[no-untyped-def]
    """Pull from `after` until pred(binlogs seen, fakes included) holds."""
    ch, stub = pump.stub()
    seen: list[pb.Binlog] = []
    stream = stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=after),
                              timeout=timeout)
    try:
        for resp in stream:
            seen.extend(map(decode, resp.binlogs))
            if pred(seen):
                return seen
    finally:
        stream.cancel()
        ch.close()
    raise AssertionError(f"stream ended before the condition held; saw {len(seen)}")


def by_id(nodes: list[dict]) -> dict[str, dict]:  # type: ignore[type-arg]
    return {n["node_id"]: n for n in nodes}


# -- listing and usage errors ------------------------------------------------------------------

def test_pumps_table_and_json_show_both_pumps_online_and_alive(live: Live) -> None:
    r = live.ctl("pumps")
    assert r.code == 0, r.err
    lines = {line.split()[0]: line for line in r.out.splitlines()[1:]}
    for pump in ("pump-1", "pump-2"):
        assert pump in lines
        cols = lines[pump].split()
        assert cols[1] == live.cluster.pumps[pump].addr and cols[2] == "online" and cols[3] == "yes"
    r = live.ctl_in("pumps", "--json")    # common options also after the command
    assert r.code == 0, r.err
    nodes = by_id(r.json())
    for pump in ("pump-1", "pump-2"):
        n = nodes[pump]
        assert (n["state"], n["alive"], n["kind"]) == ("online", True, "pumps")
        assert n["addr"] == live.cluster.pumps[pump].addr
        assert n["update_ts"] > 0 and n["update_time"].endswith("Z")


def test_unknown_node_id_is_exit_2_naming_the_known_ones(live: Live) -> None:
    """Every expected failure ends in one line on stderr and exit code 2 for bad usage or input
    (here: an unknown node id, named with the ids the cluster does know) — never a traceback."""
    r = live.ctl("pause-pump", "nope")
    assert r.code == 2
    assert r.err.strip().splitlines() == [
        "sluice ctl: no pump 'nope' in cluster 7 (known: pump-1, pump-2)"]
    r = live.ctl_in("checkpoint", "show", "no-such-drainer")
    assert r.code == 2 and "no drainer 'no-such-drainer' in cluster 7" in r.err


def test_bad_ts_is_exit_2_with_usage(live: Live) -> None:
    r = live.ctl("txn-status", "12abc")
    assert r.code == 2 and "bad ts '12abc'" in r.err and "Traceback" not in r.err
    r = live.ctl_in("resolve-txn", "100", "--commit-ts", "50")
    assert r.code == 2
    assert r.err.strip() == "sluice ctl: commit ts 50 must be greater than start ts 100"


def test_etcd_down_is_exit_1_with_one_line(tmp_path: Path) -> None:
    """Every expected failure ends in one line on stderr and exit code 1 for a runtime failure
    (here: etcd unreachable) — never a traceback."""
    port = free_port()   # nothing listens there
    for args in (["pumps"], ["tso"]):
        r = subprocess.run(sluice_argv("ctl", "--etcd", f"127.0.0.1:{port}", "--timeout", "2",
                                       *args), capture_output=True, text=True, timeout=60,
                           cwd=REPO)
        assert r.returncode == 1, r.stderr
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1, r.stderr
        assert lines[0].startswith("sluice ctl: ") and f"127.0.0.1:{port}" in lines[0]


def test_malformed_etcd_address_is_one_line_exit_2() -> None:
    """A malformed address is bad usage: one line naming the flag and the value, exit 2 —
    not a traceback."""
    r = subprocess.run(sluice_argv("ctl", "--etcd", "garbage", "pumps"), capture_output=True,
                       text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        "sluice ctl: --etcd: etcd endpoint 'garbage' is not host:port (e.g. 127.0.0.1:2379; "
        "several separated by commas)"]


def test_unknown_cluster_id_is_exit_2_not_an_empty_listing(live: Live) -> None:
    """A cluster id etcd holds nothing of is an unknown cluster (exit 2, one line saying so),
    not "no pumps registered" with exit 0; the real cluster id still lists its pumps."""
    r = subprocess.run(sluice_argv("ctl", "--etcd", live.etcd_endpoint, "--cluster-id", "99",
                                   "pumps"), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"sluice ctl: no cluster with id 99 in etcd at {live.etcd_endpoint}: check --cluster-id"]
    assert r.stdout == ""
    for args in (["drainers", "--json"], ["checkpoint", "show", "d1"], ["pause-pump", "pump-1"]):
        r2 = ctl_in(live.etcd_endpoint, 99, *args)
        assert r2.code == 2 and "no cluster with id 99" in r2.err, (args, r2)
    assert live.ctl_in("pumps", "--json").code == 0


@pytest.mark.parametrize("args,usage", [
    (["pause-pump"], "usage: sluice ctl pause-pump [options] [-h] [--wait] "
                     "[--wait-timeout SECONDS] ID"),
    ([], "usage: sluice ctl [options] [-h] COMMAND ..."),
    (["pumps", "--bogus"], "usage: sluice ctl pumps [options] [-h]"),
    (["checkpoint", "set", "d1"], "usage: sluice ctl checkpoint set [options] [-h] --commit-ts TS "
                                  "[--position PRODUCER=POS] NAME"),
])
def test_usage_error_shows_the_commands_usage_only(args: list[str], usage: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A usage error shows the command's own usage in one line and the error — the cluster and
    output options every command takes are `[options]` there (listed by --help)."""
    parser, _ = cli.command_parser("ctl")
    with pytest.raises(SystemExit) as e:
        parser.parse_args(args)
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[0] == usage and len(lines) == 2, lines
    assert "error:" in lines[1]
    parser, _ = cli.command_parser("ctl")
    with pytest.raises(SystemExit):
        parser.parse_args([*args[:2], "--help"] if args else ["--help"])
    assert "--ssl-ca" in capsys.readouterr().out     # --help still lists every option


def test_settings_from_env_and_config_file(live: Live, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "drainer.toml"   # any process's file: only etcd / cluster-id are read
    conf.write_text(f'etcd = "{live.etcd_endpoint}"\ncluster-id = {CLUSTER_ID}\n'
                    'data-dir = "ignored"\n')
    r = subprocess.run(sluice_argv("ctl", "--config", str(conf), "pumps", "--json"),
                       capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert {"pump-1", "pump-2"} <= set(by_id(json.loads(r.stdout)))
    monkeypatch.setenv("SLUICE_ETCD", live.etcd_endpoint)
    monkeypatch.setenv("SLUICE_CLUSTER_ID", str(CLUSTER_ID))
    parser, _ = cli.command_parser("ctl")
    out = io.StringIO()
    assert admin.execute(parser.parse_args(["--json", "pumps"]), out=out) == 0
    assert {"pump-1", "pump-2"} <= set(by_id(json.loads(out.getvalue())))
    err = io.StringIO()   # flags beat the environment
    assert admin.execute(parser.parse_args(["--cluster-id", "99", "pumps", "--json"]),
                         err=err) == 2
    assert "no cluster with id 99" in err.getvalue()


# -- pump states -------------------------------------------------------------------------------

def test_pause_pump_reaches_paused_and_update_to_online_resumes_it(live: Live) -> None:
    pump = live.cluster.pumps["pump-1"]
    r = live.ctl_in("pause-pump", "pump-1", "--wait", "--wait-timeout", "20")
    assert r.code == 0, r.err
    assert "pump pump-1: online -> pausing" in r.out and "pump pump-1: paused" in r.out
    n = by_id(live.ctl_in("pumps", "--json").json())["pump-1"]
    assert n["state"] == "paused" and n["max_commit_ts"] > 0
    again = live.ctl_in("pause-pump", "pump-1")
    assert again.code == 0 and again.out.strip() == "pump pump-1: already paused"
    with pytest.raises(grpc.RpcError) as e:
        write(pump, prewrite(live.ts.get(), producer="ctl-paused"))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE
    r = live.ctl_in("update-pump", "pump-1", "--state", "online")
    assert r.code == 0 and "paused -> online" in r.out, r.err
    live.cluster.wait_pump_writable(pump, timeout=20)
    assert live.node(NodeKind.PUMP, "pump-1").state == NodeState.ONLINE


def test_update_pump_illegal_transition_is_exit_2_and_changes_nothing(live: Live) -> None:
    """ctl changes a node's state only along a legal transition unless `--force` is given."""
    r = live.ctl("update-pump", "pump-2", "--state", "paused")
    assert r.code == 2
    assert ("pump pump-2: illegal state transition online -> paused (legal from online: "
            "closing, pausing; --force overrides)") in r.err
    assert live.node(NodeKind.PUMP, "pump-2").state == NodeState.ONLINE


def test_offline_pump_reaches_offline(live: Live) -> None:
    live.cluster.start_pump("pump-3", **PUMP_SETTINGS)
    r = live.ctl_in("offline-pump", "pump-3", "--wait", "--wait-timeout", "20", "--json")
    assert r.code == 0, r.err
    doc = json.loads(r.out)
    assert doc["state"] == "offline" and doc["previous_state"] == "online"
    assert by_id(live.ctl_in("pumps", "--json").json())["pump-3"]["state"] == "offline"
    assert live.ctl_in("offline-pump", "pump-3").out.strip() == "pump pump-3: already offline"
    r = live.ctl_in("update-pump", "pump-3", "--state", "online")
    assert r.code == 2 and "none, offline is final" in r.err


# -- timestamps ----------------------------------------------------------------------------------

def test_tso_and_generate_meta_give_fresh_leader_timestamps(live: Live, tmp_path: Path) -> None:
    """The ts printed or written is a fresh one from the current TSO leader, never a local clock
    reading."""
    before = live.ts.get()
    r = live.ctl_in("tso", "--json")
    assert r.code == 0, r.err
    doc = r.json()
    assert doc["ts"] > before and doc["physical_ms"] == doc["ts"] >> 18
    text = live.ctl("tso")
    assert text.code == 0 and int(text.out.split()[0]) > doc["ts"]
    r = live.ctl_in("generate-meta", "--data-dir", str(tmp_path / "meta"))
    assert r.code == 0, r.err
    saved = (tmp_path / "meta" / "savepoint").read_text()
    import tomllib
    initial = tomllib.loads(saved)["initial-commit-ts"]
    assert initial > int(text.out.split()[0])
    assert f"initial-commit-ts = {initial}" in r.out
    after = live.ts.get()
    assert initial < after


# -- transactions --------------------------------------------------------------------------------

def test_txn_status_then_resolve_with_commit_ts(live: Live) -> None:
    """One transaction, one commit_ts: resolve-txn writes a decision only on pumps where the
    prewrite is still unresolved, and refuses (changing nothing) when any reachable pump already
    holds a different decision for that start_ts."""
    p1 = live.cluster.pumps["pump-1"]
    s = live.ts.get()
    write(p1, prewrite(s, producer="ctl-manual"))
    r = live.ctl_in("txn-status", str(s), "--pumps-only", "--json")
    assert r.code == 0, r.err
    pumps = {p["pump"]: p for p in r.json()["pumps"]}
    assert pumps["pump-1"]["state"] == "unknown" and pumps["pump-2"]["state"] == "not found"
    c = live.ts.get()
    r = live.ctl_in("resolve-txn", str(s), "--commit-ts", str(c))
    assert r.code == 0, r.err
    assert get_commit(p1, s) == (pb.TXN_COMMITTED, c)
    got = pull_until(p1, s - 1, lambda seen: any(b.tp == pb.COMMIT and b.start_ts == s
                                                 for b in seen))
    mine = [(b.tp, b.commit_ts) for b in got if b.start_ts == s]
    assert mine == [(pb.PREWRITE, 0), (pb.COMMIT, c)]
    again = live.ctl_in("resolve-txn", str(s), "--commit-ts", str(c))
    assert again.code == 0 and "already committed" in again.out
    r = live.ctl_in("resolve-txn", str(s), "--rollback")
    assert r.code == 2 and "pump pump-1 already has it committed" in r.err
    assert get_commit(p1, s) == (pb.TXN_COMMITTED, c)


def test_resolve_with_rollback_drops_the_prewrite(live: Live) -> None:
    p2 = live.cluster.pumps["pump-2"]
    s = live.ts.get()
    write(p2, prewrite(s, producer="ctl-manual"))
    r = live.ctl_in("resolve-txn", "--start-ts", str(s), "--rollback", "--json")  # pump logs' spelling
    assert r.code == 0, r.err
    assert r.json()["resolved"] == ["pump-2"]
    assert get_commit(p2, s)[0] == pb.TXN_ROLLED_BACK
    # The pump serves past s (its watermark no longer waits for it) and never serves s itself.
    got = pull_until(p2, s - 1, lambda seen: any(b.tp == pb.FAKE and b.commit_ts > s
                                                 for b in seen))
    assert all(b.start_ts != s for b in got)
    r = live.ctl_in("resolve-txn", str(live.ts.get()), "--rollback")
    assert r.code == 2 and "no pump holds a prewrite with start_ts" in r.err


def _run_producer(live: Live, answers: dict[int, tuple[int, int]]) -> tuple[ProducerServer, asyncio.AbstractEventLoop, threading.Thread]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def decide(start_ts: int) -> tuple[int, int]:
        return answers.get(start_ts, (pb.TXN_UNKNOWN, 0))
    server = ProducerServer(live.etcd_endpoint, CLUSTER_ID, "ctl-producer", decide, alive_ttl_s=2,
                            labels={"outbox-dsn": "mysql://app:s3cret@127.0.0.1:3306/shop"})
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(20)
    return server, loop, thread


def test_resolve_without_decision_asks_the_producer_and_refuses_unknown(live: Live) -> None:
    """Without an explicit decision resolve-txn takes the producer's answer and refuses when the
    producer says unknown: ctl never guesses. Nothing ctl prints reveals a secret (the outbox DSN's
    password is masked)."""
    p1 = live.cluster.pumps["pump-1"]
    answers: dict[int, tuple[int, int]] = {}
    server, loop, thread = _run_producer(live, answers)
    s_committed = s_unknown = 0
    try:
        r = live.ctl_in("producers")
        assert r.code == 0 and "ctl-producer" in r.out
        assert "s3cret" not in r.out and "app:***@127.0.0.1" in r.out
        nodes = by_id(live.ctl_in("producers", "--json").json())
        assert nodes["ctl-producer"]["labels"]["outbox-dsn"] == "mysql://app:***@127.0.0.1:3306/shop"
        s_committed, s_unknown = live.ts.get(), live.ts.get()
        write(p1, prewrite(s_committed, producer="ctl-producer"),
              prewrite(s_unknown, producer="ctl-producer"))
        c = live.ts.get()   # after the prewrite ack (DESIGN §2.2)
        answers[s_committed] = (pb.TXN_COMMITTED, c)
        r = live.ctl_in("txn-status", str(s_committed))
        assert r.code == 0, r.err
        assert f"producer ctl-producer at {server.addr}: committed at {c}" in r.out
        r = live.ctl_in("resolve-txn", str(s_committed))
        assert r.code == 0, r.err
        assert "from producer ctl-producer" in r.out
        assert get_commit(p1, s_committed) == (pb.TXN_COMMITTED, c)
        r = live.ctl("resolve-txn", str(s_unknown))
        assert r.code == 2
        assert "producer ctl-producer says start_ts" in r.err and "refusing to guess" in r.err
        assert get_commit(p1, s_unknown)[0] == pb.TXN_UNKNOWN
    finally:
        if s_unknown:
            live.ctl_in("resolve-txn", str(s_unknown), "--rollback")
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        forced = live.ctl_in("update-producer", "ctl-producer", "--state", "offline", "--force")
    assert forced.code == 0 and "online -> offline" in forced.out
    assert "not a legal transition" in forced.err   # --force says what it overrides
    assert live.node(NodeKind.PRODUCER, "ctl-producer").state == NodeState.OFFLINE
    assert get_commit(p1, s_unknown)[0] == pb.TXN_ROLLED_BACK


# -- drainers and checkpoints --------------------------------------------------------------------

def test_drainer_states_and_checkpoint_show_and_set(live: Live) -> None:
    """ctl writes a drainer's checkpoint only while that drainer is not alive; a set resets the
    per-producer positions unless given, keeps the sink state and raises dispatched_upper to the
    old checkpoint."""
    reg = live.registry
    name = "ctl-drainer"
    cp_ts = live.ts.get()
    reg.register(NodeStatus(node_id=name, kind=NodeKind.DRAINER, addr="127.0.0.1:1",
                            state=NodeState.ONLINE, checkpoint=cp_ts, epoch=3))
    hb: Heartbeat = reg.heartbeat(NodeKind.DRAINER, name, 5).start()
    try:
        write_checkpoint(reg, name, Checkpoint(commit_ts=cp_ts, positions={"cap": "mysql-bin.000003:120#0"},
                                               sink_state={"file": "out.jsonl", "offset": 42}))
        r = live.ctl_in("drainers")
        assert r.code == 0, r.err
        row = next(line for line in r.out.splitlines() if line.startswith(name)).split()
        assert row[2:4] == ["online", "yes"] and row[4] == str(cp_ts)
        doc = by_id(live.ctl_in("drainers", "--json").json())[name]
        assert doc["checkpoint"] == cp_ts and doc["lag_seconds"] >= 0 and doc["epoch"] == 3

        r = live.ctl_in("checkpoint", "show", name, "--json")
        assert r.code == 0, r.err
        shown = r.json()
        assert shown["commit_ts"] == cp_ts and shown["positions"] == {"cap": "mysql-bin.000003:120#0"}
        assert shown["sink_state"] == {"file": "out.jsonl", "offset": 42} and shown["alive"]

        new_ts = live.ts.get()
        r = live.ctl_in("checkpoint", "set", name, "--commit-ts", str(new_ts))
        assert r.code == 2 and f"drainer {name} is alive" in r.err and "pause it" in r.err
        assert read_checkpoint(reg, name).commit_ts == cp_ts   # type: ignore[union-attr]

        r = live.ctl_in("pause-drainer", name)
        assert r.code == 0 and f"drainer {name}: online -> pausing" in r.out, r.err
        # No drainer process acts on it here: --wait gives up with exit 1 and says so.
        r = live.ctl_in("pause-drainer", name, "--wait", "--wait-timeout", "0.5")
        assert r.code == 1 and f"drainer {name} is still pausing after 0.5s" in r.err
        hb.stop()

        rewind = cp_ts - 1000
        r = live.ctl_in("checkpoint", "set", name, "--commit-ts", str(rewind),
                     "--position", "cap=mysql-bin.000003:4")
        assert r.code == 0, r.err
        cp = read_checkpoint(reg, name)
        assert cp is not None and cp.commit_ts == rewind
        assert cp.positions == {"cap": "mysql-bin.000003:4#0"}
        assert cp.sink_state == {"file": "out.jsonl", "offset": 42}
        assert cp.dispatched_upper == cp_ts    # a rewound drainer replays in safe mode up to here
        assert reg.get(NodeKind.DRAINER, name).status.checkpoint == rewind  # type: ignore[union-attr]
        r = live.ctl_in("checkpoint", "set", name, "--commit-ts", str(new_ts))
        assert r.code == 0 and "positions reset" in r.out
        assert read_checkpoint(reg, name).positions == {}   # type: ignore[union-attr]
        r = live.ctl_in("checkpoint", "set", name, "--commit-ts", "5", "--position", "cap=nonsense")
        assert r.code == 2 and "bad token 'nonsense'" in r.err

        r = live.ctl_in("offline-drainer", name)
        assert r.code == 0 and "pausing -> closing" in r.out, r.err
        r = live.ctl_in("update-drainer", name, "--state", "offline")
        assert r.code == 0 and "closing -> offline" in r.out, r.err
    finally:
        hb.stop()
        # An online drainer that is not alive makes every starting pump wait (DESIGN §4).
        reg.set_state(NodeKind.DRAINER, name, NodeState.OFFLINE, force=True)


def test_drainers_lists_live_standbys_even_without_an_active_instance(live: Live) -> None:
    """`ctl drainers` shows the standbys from their lease-backed keys, not from the label the
    active instance writes: after the active one died (its label stale) and before any instance
    was ever active (no status at all)."""
    reg = live.registry
    gone, fresh = "ctl-ha-gone", "ctl-ha-fresh"
    reg.register(NodeStatus(node_id=gone, kind=NodeKind.DRAINER, addr="127.0.0.1:2",
                            state=NodeState.ONLINE, labels={"standby": "127.0.0.1:9"}))
    beats = [Heartbeat(reg.etcd, reg.drainer_standby_prefix(gone) + "127.0.0.1:3", "", 5).start(),
             Heartbeat(reg.etcd, reg.drainer_standby_prefix(fresh) + "127.0.0.1:4", "", 5).start()]
    try:
        r = live.ctl_in("drainers")
        assert r.code == 0, r.err
        row = next(line for line in r.out.splitlines() if line.startswith(gone))
        assert "standby=127.0.0.1:3" in row and "127.0.0.1:9" not in row
        assert f"drainer {fresh}: no active instance yet; standbys waiting at 127.0.0.1:4" in r.out
        docs = by_id(live.ctl_in("drainers", "--json").json())
        assert docs[gone]["labels"]["standby"] == "127.0.0.1:3"
        assert docs[fresh]["standbys"] == ["127.0.0.1:4"] and docs[fresh]["state"] is None
    finally:
        for b in beats:
            b.stop()
        reg.set_state(NodeKind.DRAINER, gone, NodeState.OFFLINE, force=True)


def test_real_drainer_pauses_resumes_goes_offline_and_then_takes_a_checkpoint_set(live: Live) -> None:
    """A real drainer finishes what ctl asks (paused, online again, offline and exit); only then,
    not alive, does it take a checkpoint set."""
    name = "ctl-real-drainer"
    drainer = live.cluster.start_drainer(name, sink="file")
    try:
        doc = by_id(live.ctl_in("drainers", "--json").json())[name]
        assert doc["state"] == "online" and doc["alive"] and doc["checkpoint"] > 0
        wait_until(lambda: live.ctl_in("checkpoint", "show", name).code == 0, 15,
                   what="the drainer's first checkpoint")
        r = live.ctl_in("checkpoint", "set", name, "--commit-ts", str(live.ts.get()))
        assert r.code == 2 and "is alive" in r.err
        r = live.ctl_in("pause-drainer", name, "--wait", "--wait-timeout", "20")
        assert r.code == 0 and f"drainer {name}: paused" in r.out, r.err
        assert drainer.proc.alive()   # paused: stays up, stops pulling
        r = live.ctl_in("update-drainer", name, "--state", "online")
        assert r.code == 0 and "paused -> online" in r.out, r.err
        wait_until(lambda: "resumed after ts" in drainer.proc.log_text(), 20,
                   what="the drainer to resume")
        r = live.ctl_in("offline-drainer", name, "--wait", "--wait-timeout", "20")
        assert r.code == 0 and f"drainer {name}: offline" in r.out, r.err
        assert drainer.proc.popen.wait(20) == 0   # type: ignore[union-attr]
        wait_until(lambda: not live.node(NodeKind.DRAINER, name).alive, 10,
                   what="the drainer's alive key to go")
        before = read_checkpoint(live.registry, name)
        assert before is not None
        target = before.commit_ts - 1
        r = live.ctl_in("checkpoint", "set", name, "--commit-ts", str(target))
        assert r.code == 0, r.err
        assert read_checkpoint(live.registry, name).commit_ts == target   # type: ignore[union-attr]
        assert live.node(NodeKind.DRAINER, name).status.checkpoint == target
    finally:
        drainer.proc.stop()


# -- lost pumps ----------------------------------------------------------------------------------

def test_mark_lost_needs_force_with_one_replica_and_then_takes_the_pump_out(live: Live) -> None:
    """ctl never takes a pump out of the merge silently: `mark-lost` on a cluster with replicas=1
    requires `--force` and says that the binlogs not yet drained from that pump are lost."""
    r = live.ctl_in("mark-lost", "pump-2")
    assert r.code == 2 and "pump pump-2 is alive" in r.err
    # A pump that died: its status says online, its alive key is gone (registered here directly
    # rather than by killing a process: ctl sees exactly the same etcd state, seconds faster).
    live.registry.register(NodeStatus(node_id="pump-dead", kind=NodeKind.PUMP,
                                      addr=f"127.0.0.1:{free_port()}", state=NodeState.ONLINE))
    try:
        # While it is online, it may hold prewrites: txn-status says it could not ask (exit 1).
        r = live.ctl_in("txn-status", str(live.ts.get()), "--pumps-only")
        assert r.code == 1 and "pump-dead" in r.out
        assert r.err.startswith("sluice ctl: pump pump-dead at 127.0.0.1:") and "UNAVAILABLE" in r.err
        r = live.ctl("mark-lost", "pump-dead")
        assert r.code == 2
        assert len(r.err.strip().splitlines()) == 1
        assert "replicas=1" in r.err and "LOST" in r.err and "--force" in r.err
        assert live.node(NodeKind.PUMP, "pump-dead").state == NodeState.ONLINE
        r = live.ctl_in("mark-lost", "pump-dead", "--force")
        assert r.code == 0, r.err
        assert "lost" in r.err   # the data-loss warning
        st = live.node(NodeKind.PUMP, "pump-dead").status
        assert st.state == NodeState.OFFLINE and st.labels.get("lost") == "true"
        # With two replicas the other copy survives: no --force needed.
        live.registry.put_json("config", {"replicas": 2})
        live.registry.register(NodeStatus(node_id="pump-dead-2", kind=NodeKind.PUMP,
                                          addr="127.0.0.1:1", state=NodeState.ONLINE))
        r = live.ctl_in("mark-lost", "pump-dead-2", "--json")
        assert r.code == 0 and r.err == "", r.err
        assert r.json()["state"] == "offline" and r.json()["labels"] == {"lost": "true"}
    finally:
        live.registry.put_json("config", {"replicas": 1})
        for dead in ("pump-dead", "pump-dead-2"):
            if live.node(NodeKind.PUMP, dead) is not None:
                live.registry.set_state(NodeKind.PUMP, dead, NodeState.OFFLINE, force=True)


def test_mask_dsn_hides_every_password_form() -> None:
    """Nothing ctl prints reveals a secret: every DSN form loses its password, nothing else."""
    from sluice.ctl.render import mask_dsn
    assert mask_dsn("mysql://app:s3cret@127.0.0.1:3306/shop") == "mysql://app:***@127.0.0.1:3306/shop"
    assert mask_dsn("mysql://app:p@ss@db-host/shop?x=1") == "mysql://app:***@db-host/shop?x=1"
    assert mask_dsn("mysql://app@db-host/shop") == "mysql://app@db-host/shop"
    assert mask_dsn("host=h user=u password=s3cret;db=x") == "host=h user=u password=***;db=x"
    # ctl verify's former redaction kept the host beside an '@' in the query, and showed the
    # password of a netloc urllib cannot parse
    assert mask_dsn("mysql://u:pw@h?email=a@b") == "mysql://u:***@h?email=a@b"
    assert mask_dsn("mysql://u:pw@[::1:3306/db") == "mysql://u:***@[::1:3306/db"
    # and what neither did: a password holding '/', '?' or '#', a password= query parameter
    assert mask_dsn("mysql://u:pa/s@s@h/db") == "mysql://u:***@h/db"
    assert mask_dsn("mysql://u:p?w#x@h:1/db") == "mysql://u:***@h:1/db"
    assert mask_dsn("mysql://u@h/db?password=sec&x=1") == "mysql://u@h/db?password=***&x=1"


def test_snapshot_signal_table_channel_refuses_incomplete_or_bad_requests(live: Live) -> None:
    """`ctl snapshot ... --signal-table` needs --source, has no --wait, and a signal the capture
    would refuse is refused here (exit 2) before anything is written."""
    r = live.ctl_in("snapshot", "execute", "--producer", "cap-x", "--tables", "a\\.b",
                    "--signal-table", "sluice.signals")
    assert r.code == 2 and "--signal-table and --source go together" in r.err, r
    r = live.ctl_in("snapshot", "pause", "--producer", "cap-x", "--signal-table", "sluice.signals",
                    "--source", "mysql://u:p@127.0.0.1:1", "--wait", "5")
    assert r.code == 2 and "--wait needs the etcd channel" in r.err, r
    r = live.ctl_in("snapshot", "execute", "--producer", "cap-x", "--tables", "a\\.(b",
                    "--signal-table", "sluice.signals", "--source", "mysql://u:p@127.0.0.1:1")
    assert r.code == 2 and "regex" in r.err.lower(), r
