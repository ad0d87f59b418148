"""The TSO (DESIGN §2.1) with real etcd and real `sluice tso` processes, short leases.

etcd grants at least 2 s whatever is asked, so the tests use lease-ttl=2: a takeover takes about
2-3 s after a leader dies or stalls.
"""
from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sluice.core import ts as tsmod
from sluice.core.etcd import Etcd
from sluice.core.tso_client import MAX_TS_BATCH, LeaderInfo, SyncTSOClient, TSOClient, read_leader
from sluice.proto import sluice_pb2 as pb, sluice_pb2_grpc as pbg
from sluice.tso.allocator import Allocator, WindowExhausted
from tests.support.procs import Proc, free_port, sluice_argv, wait_until

CLUSTER = 1
TTL = 2


class TSONode:
    """One `sluice tso` child process."""

    def __init__(self, tmp: Path, etcd_endpoint: str, name: str, cluster: int = CLUSTER,
                 env: dict[str, str] | None = None, window_ms: int = 1000) -> None:
        self.name = name
        self.cluster = cluster
        self.addr = f"127.0.0.1:{free_port()}"
        argv = sluice_argv("tso", "--set", f"name='{name}'", "--set", f"addr='{self.addr}'",
                           "--set", f"cluster-id={cluster}",
                           "--set", f"etcd='{etcd_endpoint}'", "--set", f"lease-ttl={TTL}",
                           "--set", "margin-ms=500", "--set", f"window-ms={window_ms}")
        self.proc = Proc(f"tso-{name}", argv, tmp / f"tso-{name}.log", env=env)
        self.channel: grpc.Channel | None = None

    def start(self) -> "TSONode":
        self.proc.start()
        return self

    def get_ts(self, count: int = 1, cluster_id: int | None = None, timeout: float = 5.0) -> int:
        """GetTS straight to this node (no leader following): raises grpc.RpcError."""
        if self.channel is None:
            self.channel = grpc.insecure_channel(self.addr)
        resp = pbg.TSOStub(self.channel).GetTS(
            pb.GetTSReq(cluster_id=self.cluster if cluster_id is None else cluster_id,
                        count=count), timeout=timeout)
        assert resp.count == count
        return resp.first_ts

    def stop(self) -> None:
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        self.proc.stop()


@pytest.fixture
def nodes(tmp_path: Path) -> Iterator[list[TSONode]]:
    started: list[TSONode] = []
    yield started
    for n in started:
        n.stop()


def start(nodes: list[TSONode], tmp: Path, etcd_endpoint: str, name: str, cluster: int = CLUSTER,
          env: dict[str, str] | None = None, window_ms: int = 1000) -> TSONode:
    """Tests sharing `etcd_module` use their own cluster id, so their keys never meet."""
    node = TSONode(tmp, etcd_endpoint, name, cluster, env, window_ms).start()
    nodes.append(node)
    return node


def wait_leader(etcd: Etcd, name: str | None = None, timeout: float = 15.0,
                cluster: int = CLUSTER) -> LeaderInfo:
    def ok() -> LeaderInfo | None:
        info = read_leader(etcd, cluster)
        return info if info is not None and (name is None or info.name == name) else None
    return wait_until(ok, timeout, what=f"TSO leader {name or ''}")  # type: ignore[return-value]


def wait_serving(node: TSONode, timeout: float = 15.0) -> int:
    return wait_until(lambda: node.get_ts(timeout=1), timeout,  # type: ignore[return-value]
                      what=f"{node.name} to serve")


def status_of(fn) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    """(code, details) of calling fn; (OK, repr of the result) when it succeeds."""
    try:
        result = fn()
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, repr(result)


# -- allocation (pure logic) --------------------------------------------------------------------

def test_allocator_never_hands_out_above_the_window() -> None:
    """A term hands out a timestamp only when its physical part is <= the window persisted for it."""
    a = Allocator()
    a.begin_term(1, start_physical=1000, window=1001)
    _, first = a.allocate(tsmod.LOGICAL_MASK + 1, now_ms=900)   # fills ms 1000 exactly
    assert first == tsmod.compose(1000, 0)
    _, second = a.allocate(10, now_ms=900)                       # crosses into ms 1001
    assert second == tsmod.compose(1001, 0)
    with pytest.raises(WindowExhausted):
        a.allocate(tsmod.LOGICAL_MASK + 1, now_ms=900)
    a.set_window(1, 5000)
    _, third = a.allocate(1, now_ms=800)                         # clock went backwards
    assert third == second + 10
    _, fourth = a.allocate(1, now_ms=4000)
    assert fourth == tsmod.compose(4000, 0)


# -- the service ----------------------------------------------------------------------------

def test_four_threads_get_unique_strictly_increasing_ts(etcd_module, tmp_path, nodes) -> None:
    """4 threads x 50k timestamps: all unique, and strictly increasing within each thread."""
    node = start(nodes, tmp_path, etcd_module.endpoint, "solo", cluster=11)
    wait_serving(node)
    per_thread = 50_000
    results: list[list[int]] = [[] for _ in range(4)]
    failures: list[BaseException] = []
    shared = SyncTSOClient([node.addr], 11)   # two threads share one batching client

    def worker(i: int) -> None:
        own = SyncTSOClient([node.addr], 11) if i >= 2 else None
        client = own or shared
        rnd = random.Random(i)
        try:
            while len(results[i]) < per_thread:
                if rnd.random() < 0.3:
                    results[i].append(client.get_ts())
                else:
                    first, count = client.get_ts_range(min(rnd.randint(1, 3000),
                                                           per_thread - len(results[i])))
                    results[i].extend(range(first, first + count))
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            failures.append(e)
        finally:
            if own:
                own.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    shared.close()
    assert not failures, failures
    for seq in results:
        assert len(seq) == per_thread
        assert all(a < b for a, b in zip(seq, seq[1:]))
    assert len(set().union(*map(set, results))) == 4 * per_thread


def test_kill9_leader_standby_takes_over_and_ts_keep_increasing(etcd, tmp_path, nodes) -> None:
    """After kill -9 of the leader a standby takes over; every later ts > every earlier ts."""
    client_etcd = Etcd(etcd.endpoint, timeout=2)
    a = start(nodes, tmp_path, etcd.endpoint, "a")
    wait_leader(client_etcd, "a")
    b = start(nodes, tmp_path, etcd.endpoint, "b")

    async def scenario() -> list[tuple[float, int]]:
        client = TSOClient(None, CLUSTER, etcd=client_etcd, deadline_s=15)
        seen: list[tuple[float, int]] = []
        stop = asyncio.Event()

        async def requester() -> None:
            while not stop.is_set():
                seen.append((time.monotonic(), await client.get_ts()))

        tasks = [asyncio.create_task(requester()) for _ in range(4)]
        await asyncio.sleep(0.5)
        a.proc.kill9()
        killed_at = time.monotonic()
        await asyncio.to_thread(wait_leader, client_etcd, "b")
        while not any(t > killed_at + 0.1 for t, _ in seen[-4:]):
            await asyncio.sleep(0.1)
        # a restarted node starts as a standby; kill -9 the new leader too: `a` takes over
        a.proc.start()
        await asyncio.sleep(0.5)
        b.proc.kill9()
        second_kill = time.monotonic()
        await asyncio.to_thread(wait_leader, client_etcd, "a")
        while not any(t > second_kill + 0.1 for t, _ in seen[-4:]):
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.3)
        stop.set()
        await asyncio.gather(*tasks)
        await client.close()
        return seen

    seen = asyncio.run(scenario())
    client_etcd.close()
    values = [v for _, v in seen]
    # one client, one RPC in flight: the order of `seen` is the real-time order of replies
    assert all(x < y for x, y in zip(values, values[1:]))
    assert len(values) > 20


def test_stalled_old_leader_refuses_after_standby_took_over(etcd, tmp_path, nodes) -> None:
    """A leader serves only while its lease is certainly alive on a monotonic clock."""
    client_etcd = Etcd(etcd.endpoint, timeout=2)
    a = start(nodes, tmp_path, etcd.endpoint, "a")
    wait_leader(client_etcd, "a")
    b = start(nodes, tmp_path, etcd.endpoint, "b")
    before = wait_serving(a)
    wait_until(lambda: "leader is" in status_of(lambda: b.get_ts(timeout=1))[1], 10,
               what="standby b to name the leader")
    code, details = status_of(lambda: b.get_ts())
    assert code == grpc.StatusCode.UNAVAILABLE and f"leader is {a.addr}" in details

    a.proc.signal(signal.SIGSTOP)
    queued: list[tuple[grpc.StatusCode, str]] = []
    try:
        wait_leader(client_etcd, "b", timeout=TTL + 8)
        from_new = wait_serving(b)
        assert from_new > before
        # a request already waiting in the old leader's socket when it wakes up
        waiting = threading.Thread(target=lambda: queued.append(status_of(lambda: a.get_ts())))
        waiting.start()
        time.sleep(0.2)
    finally:
        a.proc.signal(signal.SIGCONT)
    waiting.join(10)
    assert queued and queued[0][0] == grpc.StatusCode.UNAVAILABLE, queued
    end = time.monotonic() + 1.5
    refusals = 0
    while time.monotonic() < end:
        try:
            old_ts = a.get_ts(timeout=2)
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.UNAVAILABLE, e
            refusals += 1
        else:
            pytest.fail(f"stalled old leader served ts {old_ts} (new leader already served "
                        f"{from_new}, {'<=' if old_ts <= from_new else '>'} it)")
        time.sleep(0.05)
    assert refusals > 0
    code, details = status_of(lambda: a.get_ts())
    assert "not leader" in details and b.addr in details
    assert b.get_ts() > from_new
    client_etcd.close()


def test_leader_whose_keepalives_stall_stops_serving_by_its_clock(etcd, tmp_path, nodes) -> None:
    """The lease is checked right before each reply on a monotonic clock, never a cached flag."""
    client_etcd = Etcd(etcd.endpoint, timeout=2)
    # The keepalive thread hangs at its 3rd keepalive; the gRPC side keeps running. The window
    # is far ahead, so only the clock check (not window fencing) can stop this leader.
    a = start(nodes, tmp_path, etcd.endpoint, "a", window_ms=60_000,
              env={"SLUICE_FAILPOINTS": "tso-before-keepalive=pause@3"})
    wait_leader(client_etcd, "a")
    b = start(nodes, tmp_path, etcd.endpoint, "b", window_ms=60_000)
    served_by_a = [wait_serving(a)]
    deadline = time.monotonic() + TTL + 5
    while True:
        code, details = status_of(lambda: a.get_ts(timeout=1))
        if code != grpc.StatusCode.OK:
            break
        served_by_a.append(int(details))
        assert time.monotonic() < deadline, "leader kept serving without acknowledged keepalives"
        time.sleep(0.02)
    assert code == grpc.StatusCode.UNAVAILABLE and "not certainly alive" in details, details
    wait_leader(client_etcd, "b", timeout=TTL + 5)
    from_new = wait_serving(b)
    assert from_new > max(served_by_a)
    for _ in range(10):
        code, details = status_of(lambda: a.get_ts(timeout=1))
        assert code == grpc.StatusCode.UNAVAILABLE, f"old leader served {details} after {from_new}"
    client_etcd.close()


def test_etcd_down_is_unavailable_with_a_clear_message_and_recovers(etcd, tmp_path, nodes) -> None:
    """etcd down: UNAVAILABLE naming etcd once the lease is uncertain; serving resumes when it is back."""
    node = start(nodes, tmp_path, etcd.endpoint, "solo")
    before = wait_serving(node)
    etcd.stop()
    try:
        wait_until(lambda: status_of(lambda: node.get_ts(timeout=1))[0]
                   == grpc.StatusCode.UNAVAILABLE, TTL + 5, what="UNAVAILABLE while etcd is down")
        code, details = status_of(lambda: node.get_ts(timeout=1))
        assert code == grpc.StatusCode.UNAVAILABLE
        assert f"etcd at {etcd.endpoint} unavailable" in details, details
    finally:
        etcd.start()
    after = wait_serving(node, timeout=20)
    assert after > before


def test_reply_stalled_past_the_ttl_is_refused(etcd_module, tmp_path, nodes) -> None:
    """A reply held up past the lease that covered its allocation is refused (UNAVAILABLE)."""
    node = start(nodes, tmp_path, etcd_module.endpoint, "slow", cluster=12,
                 env={"SLUICE_FAILPOINTS": f"tso-before-reply=1*sleep({TTL * 1000 + 500})"})
    e = Etcd(etcd_module.endpoint, timeout=2)
    wait_leader(e, "slow", cluster=12)
    e.close()
    code, details = status_of(lambda: node.get_ts(timeout=10))
    assert code == grpc.StatusCode.UNAVAILABLE and "lease not certainly alive" in details, details
    assert node.get_ts() > 0    # the failpoint fired once; the leader serves again


def test_bad_input_is_invalid_argument_and_others_are_served(etcd_module, tmp_path, nodes) -> None:
    """count 0, count > max and a wrong cluster_id are INVALID_ARGUMENT; the TSO keeps serving."""
    node = start(nodes, tmp_path, etcd_module.endpoint, "strict", cluster=13)
    first = wait_serving(node)
    for kwargs in ({"count": 0}, {"count": MAX_TS_BATCH + 1}, {"cluster_id": 14}):
        code, details = status_of(lambda: node.get_ts(**kwargs))
        assert code == grpc.StatusCode.INVALID_ARGUMENT, (kwargs, details)
    assert "cluster_id mismatch" in status_of(lambda: node.get_ts(cluster_id=7))[1]
    big = node.get_ts(count=MAX_TS_BATCH)
    assert big > first and node.get_ts() >= big + MAX_TS_BATCH


def test_config_errors_exit_2_with_one_line(etcd_module, tmp_path) -> None:
    """A bad key or an unreachable etcd: exit code 2 and one line naming the problem."""
    bad_key = subprocess.run(sluice_argv("tso", "--set", "lease-tll=2"), capture_output=True,
                             text=True, timeout=30)
    assert bad_key.returncode == 2
    assert bad_key.stderr.strip().count("\n") == 0 and "lease-tll" in bad_key.stderr
    assert "did you mean 'lease-ttl'" in bad_key.stderr
    cfg = tmp_path / "tso.toml"
    cfg.write_text(f'etcd = "127.0.0.1:{free_port()}"\naddr = "127.0.0.1:{free_port()}"\n')
    no_etcd = subprocess.run(sluice_argv("tso", "--config", str(cfg)), capture_output=True,
                             text=True, timeout=30)
    assert no_etcd.returncode == 2
    assert no_etcd.stderr.strip().count("\n") == 0, no_etcd.stderr
    assert "no etcd reachable" in no_etcd.stderr and str(cfg) in no_etcd.stderr


def test_sigterm_hands_leadership_over_at_once(etcd_module, tmp_path, nodes) -> None:
    """SIGTERM stops the leader cleanly (exit 0) and revokes its lease: the standby takes over."""
    e = Etcd(etcd_module.endpoint, timeout=2)
    a = start(nodes, tmp_path, etcd_module.endpoint, "term-a", cluster=15)
    wait_leader(e, "term-a", cluster=15)
    b = start(nodes, tmp_path, etcd_module.endpoint, "term-b", cluster=15)
    before = wait_serving(a)
    wait_until(lambda: "leader is" in status_of(lambda: b.get_ts(timeout=1))[1], 10,
               what="standby b to name the leader")
    a.proc.signal(signal.SIGTERM)
    assert a.proc.popen.wait(10) == 0  # type: ignore[union-attr]
    # well before the lease could have expired on its own
    wait_leader(e, "term-b", timeout=TTL - 0.5, cluster=15)
    assert wait_serving(b) > before
    e.close()


def test_demo_short_runs_end_to_end(tmp_path) -> None:
    """`sluice demo --short` starts etcd and two TSOs, fails the leader over, exits 0."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    res = subprocess.run(sluice_argv("demo", "--short"), capture_output=True, text=True,
                         timeout=90, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "took over" in res.stdout and "strictly increasing" in res.stdout
