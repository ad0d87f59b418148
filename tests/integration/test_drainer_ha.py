"""Drainer HA election and fencing against a real etcd (in process), and `[filter]` wiring with
real pumps and a real drainer process.

The process-level HA stories (kill -9 / SIGSTOP of the active drainer) are in
tests/fault/test_drainer_ha.py.
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Iterator

import pytest

from sluice.core.errors import ConfigError
from sluice.core.etcd import Etcd
from sluice.core.lease import LeaseKeeper
from sluice.core.registry import NodeKind, NodeState, NodeStatus, Registry
from sluice.drainer.checkpoint import read_checkpoint
from sluice.drainer.ha import (DrainerFenced, Election, FencedCheckpointStore, LeadershipLost,
                               list_standbys, read_epoch, read_leader)
from sluice.drainer.sink import Checkpoint
from tests.support.binlogs import TS
from tests.support.cluster import CLUSTER_ID, Cluster, TxnWriter, check_exactly_once, \
    read_file_sink, table_info
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(90)

TTL = 2
MARGIN = 0.5


@pytest.fixture
def registry(etcd_module, request: pytest.FixtureRequest) -> Iterator[Registry]:  # type: ignore[no-untyped-def]
    etcd = Etcd(etcd_module.endpoint, timeout=3)
    # One cluster id per test: tests share the module's etcd.
    yield Registry(etcd, 9000 + abs(hash(request.node.name)) % 1000)
    etcd.close()


def election(registry: Registry, name: str, addr: str, ha: bool = True,
             lost: list[str] | None = None) -> Election:
    return Election(registry, name, addr, ha=ha, ttl=TTL, margin_s=MARGIN,
                    on_lost=(lost.append if lost is not None else None))


def campaign_in_thread(el: Election) -> tuple[threading.Thread, threading.Event, list]:
    stop = threading.Event()
    out: list = []
    t = threading.Thread(target=lambda: out.append(el.campaign(stop)), daemon=True)
    t.start()
    return t, stop, out


def test_epochs_strictly_increase_across_takeovers(registry: Registry) -> None:
    """Epochs strictly increase across takeovers: the counter is bumped in the transaction that
    takes the leader key; a standby waits while the key is held, takes over at once after a
    release, and only TTL + margin after a crashed active's lease is gone."""
    name = "ha-epochs"
    a = election(registry, name, "127.0.0.1:1")
    ta = a.campaign(threading.Event())
    assert ta is not None and read_leader(registry, name).addr == "127.0.0.1:1"
    b = election(registry, name, "127.0.0.1:2")
    t, stop_b, out = campaign_in_thread(b)
    wait_until(lambda: list_standbys(registry, name) == ["127.0.0.1:2"], 5, what="standby key")
    time.sleep(0.3)
    assert not out and read_epoch(registry, name).epoch == ta.epoch   # B waits, touches nothing
    released = time.monotonic()
    a.release()
    t.join(5)
    tb = out[0]
    assert tb is not None and tb.epoch == ta.epoch + 1
    assert time.monotonic() - released < TTL, "a released epoch needs no wait"
    assert list_standbys(registry, name) == []

    # B "crashes": its keepalives stop, its lease expires in etcd on its own.
    b.keeper.stop(revoke=False)
    c = election(registry, name, "127.0.0.1:3")
    t, _, out = campaign_in_thread(c)
    wait_until(lambda: read_leader(registry, name) is None, TTL + 5, 0.05, what="B's lease to expire")
    gone = time.monotonic()
    t.join(TTL + MARGIN + 5)
    tc = out[0]
    assert tc is not None and tc.epoch == tb.epoch + 1
    assert time.monotonic() - gone >= TTL + MARGIN - 0.2, "the standby waits TTL + margin"
    c.release()

    # ha = false takes an epoch too (sinks always fence), without a leader key.
    d = election(registry, name, "127.0.0.1:4", ha=False)
    assert d.take_without_ha().epoch == tc.epoch + 1 and read_leader(registry, name) is None


class CountingEtcd:
    """The registry's client, counting the Range requests per key that go through `get`."""

    def __init__(self, etcd: Etcd) -> None:
        self._etcd = etcd
        self.gets: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> object:
        return getattr(self._etcd, name)

    def get(self, key: str, *args: object, **kwargs: object) -> object:
        self.gets[key] += 1
        return self._etcd.get(key, *args, **kwargs)


def test_a_standby_follows_the_leader_key_by_a_watch_not_a_poll(registry: Registry) -> None:
    """A waiting standby reads the leader key when it changes (and every few seconds in case
    the watch died), not every poll: it made ten Range requests a second before (issue #23); a
    release is still seen at once."""
    name = "ha-watch"
    a = election(registry, name, "127.0.0.1:1")
    ta = a.campaign(threading.Event())
    assert ta is not None
    b = election(registry, name, "127.0.0.1:2")
    counting = CountingEtcd(registry.etcd)
    b.etcd = counting   # type: ignore[assignment]
    t, _, out = campaign_in_thread(b)
    wait_until(lambda: list_standbys(registry, name) == ["127.0.0.1:2"], 5, what="standby key")
    time.sleep(2.0)     # 20 polls at the standby's poll_s of 0.1 s
    reads = counting.gets[b.leader_key]
    assert 1 <= reads <= 3, f"the standby read the leader key {reads} times in 2 s"
    released = time.monotonic()
    a.release()
    t.join(5)
    assert out and out[0] is not None and out[0].epoch == ta.epoch + 1
    assert time.monotonic() - released < 1.5, "the watch shows a release at once"
    b.release()


def test_ha_false_refuses_while_an_ha_instance_is_active(registry: Registry) -> None:
    name = "ha-mixed"
    a = election(registry, name, "127.0.0.1:1")
    assert a.campaign(threading.Event()) is not None
    with pytest.raises(ConfigError, match="active under HA at 127.0.0.1:1"):
        election(registry, name, "127.0.0.1:2", ha=False).take_without_ha()
    # A standby told to stop while waiting gives up without an epoch and without its key.
    b = election(registry, name, "127.0.0.1:3")
    t, stop, out = campaign_in_thread(b)
    wait_until(lambda: list_standbys(registry, name) == ["127.0.0.1:3"], 5, what="standby key")
    stop.set()
    t.join(5)
    assert out == [None] and list_standbys(registry, name) == []
    assert read_epoch(registry, name).epoch == a.term.epoch
    a.release()


def test_a_stale_drainer_cannot_overwrite_the_new_checkpoint(registry: Registry) -> None:
    """The etcd checkpoint write is conditioned on the epoch: once another instance took a newer
    epoch, the old one's save is refused (DrainerFenced) and the stored checkpoint is the new
    one's; the status mirror refuses a status that carries a newer epoch."""
    name = "ha-fence"
    registry.register(NodeStatus(node_id=name, kind=NodeKind.DRAINER, addr="a",
                                 state=NodeState.ONLINE))
    old = election(registry, name, "a", ha=False)
    old.take_without_ha()
    old_store = FencedCheckpointStore(registry, name, old)
    old_store.save(Checkpoint(100))
    assert read_checkpoint(registry, name).commit_ts == 100

    new = election(registry, name, "b", ha=False)
    new.take_without_ha()
    FencedCheckpointStore(registry, name, new).save(Checkpoint(150))
    with pytest.raises(DrainerFenced, match=f"epoch {old.term.epoch} and epoch {new.term.epoch}"):
        old_store.save(Checkpoint(120))
    assert read_checkpoint(registry, name).commit_ts == 150
    assert registry.get(NodeKind.DRAINER, name).status.checkpoint == 150


def test_lease_keeper_is_certain_only_until_ttl_minus_margin(registry: Registry) -> None:
    """A lease is certainly alive only until the send time of the last acknowledged keepalive
    + TTL − margin; without acknowledged keepalives the owner is told, once, and `check` fails."""
    etcd = registry.etcd
    lost: list[str] = []
    sent = time.monotonic()
    lease = etcd.grant(TTL)
    keeper = LeaseKeeper(etcd, lease, TTL, sent, MARGIN, on_lost=lost.append, what="test lease")
    assert keeper.certainly_alive()
    # Not started: no keepalive is acknowledged.
    wait_until(lambda: not keeper.certainly_alive(), TTL + 1, 0.02, what="the deadline")
    assert time.monotonic() - sent >= TTL - MARGIN
    assert "since the send time of the last acknowledged keepalive" in keeper.lost_reason()

    # Started, it keeps the lease certain well past the TTL...
    sent = time.monotonic()
    lease = etcd.grant(TTL)
    keeper = LeaseKeeper(etcd, lease, TTL, sent, MARGIN, on_lost=lost.append, what="test lease").start()
    time.sleep(TTL + 0.5)
    assert keeper.certainly_alive() and not lost
    # ...until etcd says the lease is gone.
    etcd.revoke(lease)
    wait_until(lambda: lost, TTL + 1, 0.02, what="on_lost")
    assert lost == ["test lease expired in etcd"] and not keeper.certainly_alive()
    keeper.stop(revoke=False)


def test_check_fails_once_the_active_lease_is_not_certain(registry: Registry) -> None:
    name = "ha-check"
    lost: list[str] = []
    a = election(registry, name, "127.0.0.1:1", lost=lost)
    assert a.campaign(threading.Event()) is not None
    a.check()
    a.keeper.stop(revoke=False)     # keepalives stop: as if the process were frozen
    def fails() -> bool:
        try:
            a.check()
        except LeadershipLost:
            return True
        return False
    wait_until(fails, TTL + 1, 0.05, what="check to fail")
    assert time.monotonic() - a.keeper.alive_until >= 0
    with pytest.raises(LeadershipLost, match="not certainly alive"):
        a.check()


# -- [filter] wiring (real processes) -----------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path_factory.mktemp("drainer-filter"), etcd_module.endpoint)
    try:
        c.start_tso()
        for p in ("pump-1", "pump-2"):
            c.start_pump(p)
        yield c
    finally:
        c.stop()


def test_filter_drops_tables_and_dbs_while_the_checkpoint_advances(cluster: Cluster) -> None:
    """Filters run between the merge and the sink: filtered tables and databases never reach the
    file sink, everything else arrives exactly once, and the checkpoint still moves past the
    dropped transactions."""
    t = TS(cluster.tso_addrs, CLUSTER_ID)
    t0 = t.get()
    t.close()
    w = TxnWriter(cluster, [table_info(60, "keep", "t0"), table_info(61, "keep", "t1"),
                            table_info(62, "skipdb", "t2")], seed=21)
    w.declare("pump-1")
    d = cluster.start_drainer("d-filter", **{"initial-commit-ts": t0,
                                             "filter.ignore-db": ["skipdb"],
                                             "filter.ignore-table": ["~^keep\\.t1$"]})
    acked = w.write(300, ["pump-1", "pump-2"], group=100)
    last = max(a.commit_ts for a in acked)
    etcd = Etcd(cluster.etcd, timeout=3)
    reg = Registry(etcd, CLUSTER_ID)
    try:
        wait_until(lambda: (read_checkpoint(reg, "d-filter").commit_ts >= last
                            or not d.proc.alive()), 30, 0.1, what="the checkpoint to pass the load")
        assert d.proc.alive(), d.proc.log_text()[-3000:]
        kept = [a for a in w.acked if a.table == "keep.t0"]
        assert kept and len(kept) < len([a for a in w.acked if a.rows])
        got = check_exactly_once(d.out_dir, kept)
        assert {r[0] for txn in got for r in txn["rows"]} == {"keep.t0"}
        assert len(got) == len(kept)
        assert d.metric("sluice_drainer_filtered_txns_total") == len(w.acked) - 1 - len(kept)
        st = reg.get(NodeKind.DRAINER, "d-filter").status
        assert st.epoch >= 1     # ha = false still takes an epoch for the sink to fence with
    finally:
        etcd.close()
        w.close()
    assert read_file_sink(d.out_dir)
