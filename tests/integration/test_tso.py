"""The TSO (DESIGN §2.1) with real etcd and real `sluice tso` processes, short leases.

etcd grants at least 2 s whatever is asked, so the tests use lease-ttl=2: a takeover takes about
2-3 s after a leader dies or stalls.
"""
from __future__ import annotations

import asyncio
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
from sluice.core.errors import Unavailable
from sluice.core.etcd import Etcd
from sluice.core.tso_client import MAX_TS_BATCH, LeaderInfo, SyncTSOClient, TSOClient, read_leader
from sluice.proto import sluice_pb2 as pb, sluice_pb2_grpc as pbg
from sluice.tso.allocator import Allocator, WindowExhausted
from sluice.tso.leader import LEADER_MAX_SLEEP_S, Leadership
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

def test_an_idle_leader_wakes_for_its_duties_only_and_keeps_the_window_ahead(etcd_module) -> None:
    """The election thread sleeps until its next duty (a keepalive, the lease's safe end, the
    window extension), at most LEADER_MAX_SLEEP_S: an idle leader wakes a few times a second,
    not ten, and its persisted window stays well ahead of the clock, so allocations never wait
    for etcd."""
    etcd = Etcd(etcd_module.endpoint, timeout=2)
    allocator = Allocator()
    lead = Leadership(etcd, 9301, "sleepy", "127.0.0.1:1", allocator, lease_ttl=3,
                      window_ms=1000)
    sleeps: list[float] = []
    wait = lead._stop.wait
    lead._stop.wait = lambda timeout=None: (sleeps.append(timeout), wait(timeout))[1]  # type: ignore[method-assign]
    lead.start()
    try:
        wait_until(lambda: lead.term is not None, 10, what="the leadership")
        term = lead.term
        time.sleep(0.5)
        sleeps.clear()
        least_ahead = 10_000.0
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            least_ahead = min(least_ahead, allocator.window - time.time() * 1000)
            time.sleep(0.01)
        assert lead.term is term
        # keepalives every 1 s, extensions every 0.5 s (window-ms/2): ~3 wakeups a second
        assert len(sleeps) <= 10, f"{len(sleeps)} wakeups in 3 s: {sleeps}"
        assert all(0 < t <= LEADER_MAX_SLEEP_S for t in sleeps), sleeps
        assert least_ahead >= 250, f"the window came within {least_ahead:.0f} ms of the clock"
    finally:
        lead.stop()
        etcd.close()


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


# -- GetTSStream and the pipelining client ------------------------------------------------------

def stream_status(addr: str, requests: list[pb.GetTSReq],
                  timeout: float = 10.0) -> tuple[list[int], grpc.StatusCode, str]:
    """Send `requests` on one GetTSStream: (first_ts of each answer, final code, details)."""
    with grpc.insecure_channel(addr) as channel:
        answers: list[int] = []
        try:
            for resp in pbg.TSOStub(channel).GetTSStream(iter(requests), timeout=timeout):
                answers.append(resp.first_ts)
        except grpc.RpcError as e:
            return answers, e.code(), e.details() or ""
        return answers, grpc.StatusCode.OK, ""


class Calls:
    """(call time, return time, timestamps) of every get_ts/get_ts_range, per caller."""

    def __init__(self, callers: int) -> None:
        self.per_caller: list[list[tuple[float, float, int, int]]] = [[] for _ in range(callers)]

    async def call(self, i: int, client: TSOClient, count: int) -> None:
        t0 = time.monotonic()
        first, n = (await client.get_ts(), 1) if count == 1 else await client.get_ts_range(count)
        self.per_caller[i].append((t0, time.monotonic(), first, n))

    def check(self) -> int:
        """Per caller strictly increasing, globally unique, linearizable; returns how many ts."""
        every = [c for per in self.per_caller for c in per]
        for per in self.per_caller:
            assert all(a[2] + a[3] - 1 < b[2] for a, b in zip(per, per[1:])), "caller went back"
        ranges = sorted((first, first + n) for _, _, first, n in every)
        assert all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:])), "a timestamp handed twice"
        # Sweep in time order: every ts handed out after a call started must exceed every ts
        # that had already been returned to anyone when that call started.
        events = sorted([(t_ret, 1, first + n - 1) for _, t_ret, first, n in every]
                        + [(t_call, 0, first) for t_call, _, first, _ in every])
        returned_max = 0
        for _, kind, value in events:
            if kind == 1:
                returned_max = max(returned_max, value)
            else:
                assert value > returned_max, f"ts {value} not above the already returned {returned_max}"
        return sum(n for _, _, _, n in every)


def test_stream_ts_are_linearizable_across_clients(etcd_module, tmp_path, nodes) -> None:
    """A timestamp handed to a caller was allocated after that caller asked."""
    node = start(nodes, tmp_path, etcd_module.endpoint, "lin", cluster=16)
    wait_serving(node)

    async def scenario() -> Calls:
        # Three clients = three streams; unsynchronised callers keep several requests in flight.
        clients = [TSOClient([node.addr], 16, max_inflight=k) for k in (1, 2, 4)]
        calls = Calls(24)
        end = time.monotonic() + 1.5

        async def caller(i: int) -> None:
            rnd = random.Random(i)
            while time.monotonic() < end:
                await calls.call(i, clients[i % 3], rnd.choice((1, 1, 1, 7, 300)))
                if rnd.random() < 0.3:
                    await asyncio.sleep(rnd.random() / 1000)

        await asyncio.gather(*(caller(i) for i in range(24)))
        sent = sum(c.requests_sent for c in clients)
        for c in clients:
            await c.close()
        assert sent > 50
        return calls

    assert asyncio.run(scenario()).check() > 1000


def test_stream_kill9_leader_ts_unique_increasing_linearizable(etcd, tmp_path, nodes) -> None:
    """Across a kill -9 of the leader, stream callers' ts stay strictly increasing, unique and
    linearizable; a standby ends a stream with UNAVAILABLE "not leader: leader is ADDR"."""
    client_etcd = Etcd(etcd.endpoint, timeout=2)
    a = start(nodes, tmp_path, etcd.endpoint, "a")
    wait_leader(client_etcd, "a")
    b = start(nodes, tmp_path, etcd.endpoint, "b")
    wait_serving(a)
    wait_until(lambda: stream_status(b.addr, [pb.GetTSReq(cluster_id=CLUSTER, count=1)])[2]
               .startswith("not leader: leader is"), 10, what="standby b to name the leader")
    answers, code, details = stream_status(b.addr, [pb.GetTSReq(cluster_id=CLUSTER, count=1)])
    assert (answers, code) == ([], grpc.StatusCode.UNAVAILABLE) and a.addr in details, details

    async def scenario() -> tuple[Calls, int]:
        clients = [TSOClient(None, CLUSTER, etcd=client_etcd, deadline_s=15, max_inflight=k)
                   for k in (2, 4)]
        calls = Calls(16)
        stop = asyncio.Event()

        async def caller(i: int) -> None:
            rnd = random.Random(i)
            while not stop.is_set():
                await calls.call(i, clients[i % 2], rnd.choice((1, 1, 5)))

        tasks = [asyncio.create_task(caller(i)) for i in range(16)]
        await asyncio.sleep(0.5)
        a.proc.kill9()
        killed_at = time.monotonic()
        before = sum(len(per) for per in calls.per_caller)
        await asyncio.to_thread(wait_leader, client_etcd, "b")
        # every caller got an answer that it asked for after the kill
        while not all(per and per[-1][0] > killed_at for per in calls.per_caller):
            await asyncio.sleep(0.1)
        stop.set()
        await asyncio.gather(*tasks)
        for c in clients:
            await c.close()
        return calls, before

    calls, before_kill = asyncio.run(scenario())
    client_etcd.close()
    assert before_kill > 50
    assert calls.check() > before_kill


def test_stream_bad_input_is_invalid_argument_other_streams_served(etcd_module, tmp_path,
                                                                   nodes) -> None:
    """On the stream, a bad count or cluster_id ends that stream with INVALID_ARGUMENT after the
    good requests before it were answered; other streams and clients keep being served."""
    node = start(nodes, tmp_path, etcd_module.endpoint, "strict-stream", cluster=17)
    first = wait_serving(node)

    async def scenario() -> None:
        client = TSOClient([node.addr], 17)     # an open stream across the bad ones
        before = await client.get_ts()
        for bad in (pb.GetTSReq(cluster_id=17, count=0),
                    pb.GetTSReq(cluster_id=17, count=MAX_TS_BATCH + 1),
                    pb.GetTSReq(cluster_id=18, count=1)):
            answers, code, details = await asyncio.to_thread(
                stream_status, node.addr, [pb.GetTSReq(cluster_id=17, count=3), bad,
                                           pb.GetTSReq(cluster_id=17, count=1)])
            assert code == grpc.StatusCode.INVALID_ARGUMENT, (bad, code, details)
            assert len(answers) == 1 and answers[0] > before, answers
            assert ("out of range" in details if bad.count != 1
                    else "cluster_id mismatch" in details), details
        assert await client.get_ts() > answers[0]
        await client.close()

    asyncio.run(scenario())
    assert node.get_ts() > first


def test_stream_reply_stalled_past_the_ttl_is_unavailable(etcd_module, tmp_path, nodes) -> None:
    """A stream reply held up past the lease that covered its allocation ends the stream with
    UNAVAILABLE (tso-before-reply failpoint); a client whose request stalls re-sends it on a new
    stream after rpc_timeout_s instead of waiting for the stalled one."""
    node = start(nodes, tmp_path, etcd_module.endpoint, "slow-stream", cluster=19,
                 env={"SLUICE_FAILPOINTS": f"tso-before-reply=2*sleep({TTL * 1000 + 500})"})
    e = Etcd(etcd_module.endpoint, timeout=2)
    wait_leader(e, "slow-stream", cluster=19)
    e.close()
    answers, code, details = stream_status(node.addr, [pb.GetTSReq(cluster_id=19, count=1)] * 2)
    assert answers == [] and code == grpc.StatusCode.UNAVAILABLE, (answers, code, details)
    assert "lease not certainly alive at reply time" in details, details

    async def scenario() -> tuple[int, float]:
        client = TSOClient([node.addr], 19, rpc_timeout_s=0.5)
        t0 = time.monotonic()
        try:
            return await client.get_ts(), time.monotonic() - t0
        finally:
            await client.close()

    ts, waited = asyncio.run(scenario())   # the second (last) stall hits this client's request
    assert ts > 0 and waited < TTL, waited


def test_client_deadline_names_what_was_tried(tmp_path) -> None:
    """No TSO answering: callers get Unavailable after deadline_s, naming the address tried."""
    addr = f"127.0.0.1:{free_port()}"

    async def scenario() -> str:
        client = TSOClient([addr], CLUSTER, deadline_s=1.0)
        t0 = time.monotonic()
        try:
            results = await asyncio.gather(client.get_ts(), client.get_ts_range(5),
                                           return_exceptions=True)
        finally:
            await client.close()
        assert 1.0 <= time.monotonic() - t0 < 3.0
        assert all(isinstance(r, Unavailable) for r in results), results
        return str(results[0])

    message = asyncio.run(scenario())
    assert "no TSO leader answered within 1.0s" in message and f"tried {addr}" in message, message


def test_client_falls_back_to_unary_when_stream_is_unimplemented(etcd_module, tmp_path,
                                                                 nodes) -> None:
    """A TSO without GetTSStream (UNIMPLEMENTED) is used through unary GetTS."""
    node = start(nodes, tmp_path, etcd_module.endpoint, "old", cluster=20)
    wait_serving(node)

    calls = [0]

    async def get_ts(request: pb.GetTSReq, context: grpc.aio.ServicerContext) -> pb.GetTSResp:
        calls[0] += 1
        async with grpc.aio.insecure_channel(node.addr) as ch:
            return await pbg.TSOStub(ch).GetTS(request)

    # An older TSO: only unary GetTS is registered (forwarded to the real one).
    older = grpc.method_handlers_generic_handler("sluice.v1.TSO", {
        "GetTS": grpc.unary_unary_rpc_method_handler(
            get_ts, request_deserializer=pb.GetTSReq.FromString,
            response_serializer=pb.GetTSResp.SerializeToString)})

    async def scenario() -> None:
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((older,))
        addr = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        await server.start()
        client = TSOClient([addr], 20)
        try:
            seen = [await client.get_ts() for _ in range(3)]
            seen += await asyncio.gather(*(client.get_ts() for _ in range(20)))
            assert all(x < y for x, y in zip(seen[:3], seen[1:4]))
            assert len(set(seen)) == 23
            # one stream request (UNIMPLEMENTED), then unary only
            assert calls[0] >= 4 and client.requests_sent == calls[0] + 1
        finally:
            await client.close()
            await server.stop(0)

    asyncio.run(scenario())
