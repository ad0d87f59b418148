"""The etcd registry against a real etcd: states, compare-and-swap, heartbeats, watchers."""
from __future__ import annotations

import dataclasses
import signal
import subprocess
import threading
import time

import pytest

from sluice.core import failpoint
from sluice.core.errors import IllegalTransition, InvalidArgument, NotFound
from sluice.core.etcd import Etcd
from sluice.core.registry import (
    LEGAL_TRANSITIONS,
    Heartbeat,
    NodeInfo,
    NodeKind,
    NodeState,
    NodeStatus,
    Registry,
    check_transition,
)
from tests.support.procs import PYTHON, Proc, wait_until

ON, PAUSING, PAUSED = NodeState.ONLINE, NodeState.PAUSING, NodeState.PAUSED
CLOSING, OFFLINE = NodeState.CLOSING, NodeState.OFFLINE
PUMP = NodeKind.PUMP


def pump(node_id: str, state: NodeState = ON, **kw: object) -> NodeStatus:
    return NodeStatus(node_id, PUMP, f"127.0.0.1:{abs(hash(node_id)) % 60000 + 1}", state, **kw)  # type: ignore[arg-type]


@pytest.fixture
def client(etcd):  # noqa: ANN001 - pytest fixture
    c = Etcd(etcd.endpoint, timeout=2)
    yield c
    c.close()


class Recorder:
    """Collects on_change calls; optionally blocks the watcher thread while `gate` is clear."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, NodeInfo | None]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()

    def __call__(self, kind: NodeKind, node_id: str, info: NodeInfo | None) -> None:
        assert kind == PUMP
        with self.lock:
            self.calls.append((node_id, info))
        self.gate.wait(30)

    def states(self, node_id: str) -> list[str | None]:
        with self.lock:
            return [i.state.value if i else None for n, i in self.calls if n == node_id]

    def last(self, node_id: str) -> NodeInfo | None:
        with self.lock:
            return [i for n, i in self.calls if n == node_id][-1]


def assert_legal_sequence(states: list[str | None]) -> None:
    for a, b in zip(states, states[1:]):
        if a is not None and b is not None:
            check_transition("seq", NodeState(a), NodeState(b))


# -- pure values ---------------------------------------------------------------------------
def test_status_json_round_trip_ignores_unknown_fields() -> None:
    s = pump("p1", PAUSED, max_commit_ts=42, score=3, epoch=2, labels={"zone": "a"})
    assert NodeStatus.from_json(s.to_json()) == s
    newer = s.to_json()[:-1] + ',"field-from-a-newer-version":1}'
    assert NodeStatus.from_json(newer) == s


def test_transition_table() -> None:
    """States change only along legal transitions; offline is final unless forced."""
    legal = {(ON, PAUSING), (PAUSING, PAUSED), (PAUSED, ON), (ON, CLOSING), (CLOSING, OFFLINE),
             (PAUSED, CLOSING), (PAUSING, CLOSING)}
    for old in NodeState:
        for new in NodeState:
            if old == new or (old, new) in legal:
                check_transition("n", old, new)
            else:
                with pytest.raises(IllegalTransition):
                    check_transition("n", old, new)
            check_transition("n", old, new, force=True)
    assert LEGAL_TRANSITIONS[OFFLINE] == frozenset()


# -- registry ------------------------------------------------------------------------------
def test_key_layout(client: Etcd) -> None:
    reg = Registry(client, 11)
    reg.register(pump("p1"))
    assert reg.key(PUMP, "p1") == "/sluice/11/pumps/p1/status"
    assert reg.key(NodeKind.DRAINER, "d1", "alive") == "/sluice/11/drainers/d1/alive"
    raw, _ = client.get("/sluice/11/pumps/p1/status")
    assert NodeStatus.from_json(raw).state == ON
    with pytest.raises(InvalidArgument):
        reg.key(PUMP, "a/b")
    with pytest.raises(InvalidArgument):
        reg.register(pump("bad/id"))


def test_every_key_name_keeps_the_documented_layout() -> None:
    """The key names of core/registry.py spell the layout existing clusters hold in etcd
    (docs/architecture.md): renaming one would orphan what a running cluster stored."""
    from sluice.core import registry as r
    reg = Registry(None, 11)  # type: ignore[arg-type]  # naming keys needs no etcd
    assert r.tso_leader_key(11) == "/sluice/11/tso/leader"
    assert r.tso_window_key(11) == "/sluice/11/tso/window"
    assert reg.drainer_leader_key("d1") == "/sluice/11/drainers/d1/leader"
    assert reg.drainer_checkpoint_key("d1") == "/sluice/11/drainers/d1/checkpoint"
    assert reg.drainer_standby_prefix("d1") == "/sluice/11/drainers/d1/standby/"
    assert reg.drainer_epoch_key("d1") == "/sluice/11/drainer-epochs/d1"
    assert reg.cluster_key(r.CONFIG_PATH) == "/sluice/11/config"
    assert reg.cluster_key(r.rewind_path("c1")) == "/sluice/11/producers/c1/rewind"
    assert reg.signals_prefix("c1") == "/sluice/11/producers/c1/signals/"
    assert reg.cluster_key(r.snapshot_progress_path("c1")) == "/sluice/11/producers/c1/snapshot"
    assert reg.cluster_key(r.captured_tables_path("c1")) == "/sluice/11/capture-tables/c1"
    with pytest.raises(InvalidArgument):
        r.rewind_path("a/b")


def test_alive_vanishes_on_lease_expiry_status_stays(etcd, client: Etcd, tmp_path) -> None:  # noqa: ANN001
    """Alive is not gone: a node leaves only by state."""
    script = (
        "import sys, time\n"
        "from sluice.core.etcd import Etcd\n"
        "from sluice.core.registry import *\n"
        "r = Registry(Etcd(sys.argv[1], timeout=2), 3)\n"
        "r.register(NodeStatus('p1', NodeKind.PUMP, '127.0.0.1:9', NodeState.ONLINE))\n"
        "r.heartbeat(NodeKind.PUMP, 'p1', 1).start()\n"
        "time.sleep(600)\n")
    child = Proc("pump-like", [PYTHON, "-c", script, etcd.endpoint], tmp_path / "child.log").start()
    reg = Registry(client, 3)
    try:
        wait_until(lambda: (n := reg.get(PUMP, "p1")) and n.alive, 15, what="child alive")
        child.kill9()
        wait_until(lambda: not reg.get(PUMP, "p1").alive, 8, what="alive key to expire")  # type: ignore[union-attr]
    finally:
        child.stop()
    info = reg.get(PUMP, "p1")
    assert info is not None and info.state == ON and not info.alive
    nodes, _ = reg.list(PUMP)
    assert [n.node_id for n in nodes] == ["p1"]


def test_illegal_transitions_refused_and_write_nothing(client: Etcd) -> None:
    """States change only along legal transitions; an illegal one writes nothing."""
    reg = Registry(client, 4)
    reg.register(pump("p1"))
    for state in (PAUSING, PAUSED, ON, CLOSING, OFFLINE):
        assert reg.set_state(PUMP, "p1", state).state == state
    before = reg.get(PUMP, "p1")
    for state in (ON, PAUSING, PAUSED, CLOSING):
        with pytest.raises(IllegalTransition):
            reg.set_state(PUMP, "p1", state)
    with pytest.raises(IllegalTransition):
        reg.register(pump("p1", ON))  # an offline node cannot come back by re-registering
    assert reg.get(PUMP, "p1") == before
    assert reg.set_state(PUMP, "p1", ON, force=True).state == ON
    # same state is allowed (a restarting node re-registers), a write that changes nothing is skipped
    rev = reg.get(PUMP, "p1").mod_revision  # type: ignore[union-attr]
    reg.register(pump("p1", ON))
    assert reg.get(PUMP, "p1").mod_revision == rev  # type: ignore[union-attr]
    with pytest.raises(NotFound):
        reg.set_state(PUMP, "nope", PAUSING)
    with pytest.raises(InvalidArgument):
        reg.update(PUMP, "p1", lambda s: dataclasses.replace(s, node_id="other"))


def test_concurrent_cas_updates_lose_nothing(client: Etcd) -> None:
    """Status writes lose nothing under concurrency."""
    reg = Registry(client, 5)
    reg.register(pump("p1"))
    threads, per_thread = 6, 20

    def work(i: int) -> None:
        own = Registry(Etcd(client.endpoints_text, timeout=5), 5)
        for _ in range(per_thread):
            own.update(PUMP, "p1", lambda s: dataclasses.replace(
                s, score=s.score + 1, labels={**s.labels, f"t{i}": str(int(s.labels.get(f"t{i}", "0")) + 1)}))
        own.etcd.close()

    ts = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    final = reg.get(PUMP, "p1").status  # type: ignore[union-attr]
    assert final.score == threads * per_thread
    assert final.labels == {f"t{i}": str(per_thread) for i in range(threads)}


def test_cluster_json_values(client: Etcd) -> None:
    reg = Registry(client, 6)
    assert reg.get_json("config") is None
    assert reg.cas_json("config", 0, {"replicas": 1})
    assert not reg.cas_json("config", 0, {"replicas": 2})  # already exists
    value, rev = reg.get_json_rev("config")
    assert value == {"replicas": 1}
    assert reg.cas_json("config", rev, {"replicas": 2})
    assert not reg.cas_json("config", rev, {"replicas": 3})  # stale revision
    reg.put_json("producers/cap1/epoch", 1)
    bumped: list[int] = []

    def bump() -> None:
        bumped.append(reg.update_json("producers/cap1/epoch", lambda e: (e or 0) + 1))

    ts = [threading.Thread(target=bump) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert sorted(bumped) == list(range(2, 10))
    assert reg.get_json("/producers/cap1/epoch") == 9
    raw, _ = client.get("/sluice/6/config")
    assert raw == b'{"replicas": 2}'


def test_delete_is_admin_removal(client: Etcd) -> None:
    reg = Registry(client, 7)
    reg.register(pump("p1"))
    reg.register(pump("p10"))
    hb = reg.heartbeat(PUMP, "p1", 5).start()
    try:
        assert reg.delete(PUMP, "p1")
        assert reg.get(PUMP, "p1") is None
        assert reg.get(PUMP, "p10") is not None  # a sibling whose id shares the prefix
        assert not reg.delete(PUMP, "p1")
    finally:
        hb.stop()


# -- heartbeat -----------------------------------------------------------------------------
def test_heartbeat_keeps_alive_and_stop_revokes(client: Etcd) -> None:
    reg = Registry(client, 8)
    reg.register(pump("p1"))
    hb = reg.heartbeat(PUMP, "p1", 2).start()
    first = hb.alive_until_monotonic()
    assert first > time.monotonic()
    wait_until(lambda: hb.alive_until_monotonic() > first, 3, what="an acknowledged keepalive")
    time.sleep(2.5)  # longer than the TTL: only keepalives keep the key
    assert reg.get(PUMP, "p1").alive  # type: ignore[union-attr]
    hb.stop()
    assert not reg.get(PUMP, "p1").alive  # type: ignore[union-attr]
    assert hb.alive_until_monotonic() == 0.0


def test_heartbeat_reregisters_after_etcd_was_down_longer_than_ttl(etcd, client: Etcd) -> None:  # noqa: ANN001
    """A heartbeat whose lease expired while etcd was unreachable grants a new one and puts alive again."""
    reg = Registry(client, 9)
    reg.register(pump("p1"))
    hb = reg.heartbeat(PUMP, "p1", 2).start()
    old_lease = hb.lease_id
    try:
        etcd.proc.signal(signal.SIGSTOP)  # etcd unreachable, its clock keeps running
        try:
            time.sleep(3.5)
            # the last acknowledged keepalive + TTL has passed: a leader would stop serving here
            assert hb.alive_until_monotonic() < time.monotonic()
        finally:
            etcd.proc.signal(signal.SIGCONT)
        wait_until(lambda: hb.reacquired >= 1, 10, what="heartbeat to reacquire its lease")
        wait_until(lambda: reg.get(PUMP, "p1").alive, 5, what="alive key back")  # type: ignore[union-attr]
        assert hb.lease_id != old_lease
        assert hb.alive_until_monotonic() > time.monotonic()
        _, meta = client.get(reg.key(PUMP, "p1", "alive"))
        assert meta.lease_id == hb.lease_id
    finally:
        hb.stop()


def test_heartbeat_stalled_process_reacquires_or_reports_lost(client: Etcd) -> None:
    reg = Registry(client, 10)
    reg.register(pump("p1"))
    hb = reg.heartbeat(PUMP, "p1", 1)
    hb.start()
    failpoint.enable(Heartbeat.FAILPOINT, "1*sleep(3500)")  # the process stalls past the TTL
    try:
        wait_until(lambda: hb.reacquired == 1, 10, what="reacquire after a stall")
        assert reg.get(PUMP, "p1").alive  # type: ignore[union-attr]
    finally:
        failpoint.disable(Heartbeat.FAILPOINT)
        hb.stop()
    # a leader-style heartbeat must not take the key back once its lease is gone
    leader = Heartbeat(client, "/sluice/10/leader", "me", 2, reacquire=False).start()
    client.revoke(leader.lease_id)  # type: ignore[arg-type]
    wait_until(lambda: leader.lost, 5, what="lost lease noticed")
    assert client.get("/sluice/10/leader")[0] is None
    assert leader.alive_until_monotonic() == 0.0
    leader.stop()


# -- watcher -------------------------------------------------------------------------------
def test_watcher_sees_every_change(client: Etcd, etcd) -> None:  # noqa: ANN001
    """A watcher sees every change: status and alive, in order."""
    reg = Registry(client, 12)
    reg.register(pump("p0"))
    rec = Recorder()
    writer = Registry(Etcd(etcd.endpoint, timeout=2), 12)
    w = Registry(Etcd(etcd.endpoint, timeout=2), 12).watch(PUMP, rec, resync_s=60)
    try:
        wait_until(lambda: rec.states("p0") == ["online"], 5, what="initial list delivered")
        writer.register(pump("p1"))
        hb = writer.heartbeat(PUMP, "p1", 2).start()
        for s in (PAUSING, PAUSED, ON, CLOSING, OFFLINE):
            writer.set_state(PUMP, "p1", s)
        writer.update(PUMP, "p1", lambda s: dataclasses.replace(s, max_commit_ts=77))
        hb.stop()
        writer.delete(PUMP, "p0")
        wait_until(lambda: rec.states("p0")[-1:] == [None], 5, what="delete delivered")
        with rec.lock:
            p1 = [(i.state.value, i.alive, i.status.max_commit_ts) for n, i in rec.calls if n == "p1" and i]
        assert p1 == [("online", False, 0), ("online", True, 0), ("pausing", True, 0),
                      ("paused", True, 0), ("online", True, 0), ("closing", True, 0),
                      ("offline", True, 0), ("offline", True, 77), ("offline", False, 77)]
        assert set(w.nodes()) == {"p1"} and w.resyncs == 0
    finally:
        w.stop()
        w.registry.etcd.close()
        writer.etcd.close()


def test_watcher_never_misses_a_final_state_across_etcd_restart(etcd, client: Etcd) -> None:  # noqa: ANN001
    """A watcher never misses a final state: after an etcd restart it re-lists and delivers the differences."""
    reg = Registry(client, 13)
    reg.register(pump("p1"))
    reg.register(pump("p2"))
    rec = Recorder()
    # resync_s is long so only the failure path can bring the changes below
    w = Registry(Etcd(etcd.endpoint, timeout=2), 13).watch(PUMP, rec, resync_s=60)
    try:
        wait_until(lambda: len(rec.calls) == 2, 5, what="initial list delivered")
        rec.gate.clear()  # the watcher thread blocks in its next callback
        reg.set_state(PUMP, "p1", PAUSING)
        wait_until(lambda: rec.states("p1") == ["online", "pausing"], 5, what="pausing delivered")
        etcd.kill9()
        etcd.start()
        client.wait_ready(10)
        # made while the watcher was cut off: no stream it had will ever carry these
        reg.set_state(PUMP, "p1", PAUSED)
        reg.set_state(PUMP, "p1", CLOSING)
        reg.set_state(PUMP, "p2", PAUSING)
        reg.register(pump("p3"))
        reg.delete(PUMP, "p2")
        rec.gate.set()
        wait_until(lambda: rec.states("p3") == ["online"], 15, what="re-list after restart")
        wait_until(lambda: rec.states("p1")[-1] == "closing", 5, what="p1 final state")
        assert rec.states("p2")[-1] is None
        assert w.resyncs >= 1
        assert_legal_sequence(rec.states("p1"))
        # and the watch works again afterwards
        reg.set_state(PUMP, "p1", OFFLINE)
        wait_until(lambda: rec.states("p1")[-1] == "offline", 5, what="watch resumed")
        nodes, _ = reg.list(PUMP)
        assert {n.node_id: n for n in nodes} == w.nodes()
    finally:
        rec.gate.set()
        w.stop()
        w.registry.etcd.close()


def test_watcher_relists_after_compaction(client: Etcd) -> None:
    """A watcher never misses a final state: a compacted start revision leads to a re-list."""
    reg = Registry(client, 14)
    reg.register(pump("p1"))
    reg.register(pump("p2"))
    nodes, rev = reg.list(PUMP)
    reg.set_state(PUMP, "p1", PAUSING)
    reg.set_state(PUMP, "p1", PAUSED)
    reg.delete(PUMP, "p2")
    reg.register(pump("p3"))
    client.client.compact(client.revision(), physical=True)
    rec = Recorder()
    w = reg.watch(PUMP, rec, since=(nodes, rev), resync_s=60)
    try:
        wait_until(lambda: rec.states("p3") == ["online"], 10, what="re-list after compaction")
        assert rec.states("p1") == ["paused"] and rec.states("p2") == [None]
        assert w.resyncs == 1
        reg.set_state(PUMP, "p3", CLOSING)
        wait_until(lambda: rec.states("p3") == ["online", "closing"], 5, what="watch resumed")
    finally:
        w.stop()


def test_watcher_periodic_relist_catches_a_silent_stream(client: Etcd) -> None:
    """A stream that stalls without an error is caught by the periodic re-list."""
    reg = Registry(client, 15)
    reg.register(pump("p1"))
    rec = Recorder()
    w = reg.watch(PUMP, rec, resync_s=0.5)
    try:
        wait_until(lambda: rec.states("p1") == ["online"], 5, what="initial list")
        w._cancel()  # the stream goes quiet, as a half-dead connection would
        reg.set_state(PUMP, "p1", PAUSING)
        wait_until(lambda: rec.states("p1") == ["online", "pausing"], 5, what="periodic re-list")
        reg.set_state(PUMP, "p1", PAUSED)  # and it watches again
        wait_until(lambda: rec.states("p1")[-1] == "paused", 5, what="watch resumed")
    finally:
        w.stop()


def test_etcdctl_compaction_is_reported_like_the_client_api(etcd, client: Etcd) -> None:  # noqa: ANN001
    """Compaction by an operator (etcdctl) leads to the same re-list."""
    reg = Registry(client, 16)
    reg.register(pump("p1"))
    nodes, rev = reg.list(PUMP)
    reg.set_state(PUMP, "p1", PAUSING)
    reg.set_state(PUMP, "p1", CLOSING)  # compacting at this revision drops the one after R
    subprocess.run(["etcdctl", "--endpoints", etcd.endpoint, "compact", str(client.revision())],
                   check=True, capture_output=True, env={"ETCDCTL_API": "3", "PATH": "/usr/bin:/bin"},
                   timeout=20)
    rec = Recorder()
    w = reg.watch(PUMP, rec, since=(nodes, rev), resync_s=60)
    try:
        wait_until(lambda: rec.states("p1") == ["closing"], 10, what="re-list after etcdctl compact")
        assert w.resyncs == 1
    finally:
        w.stop()
