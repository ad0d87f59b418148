"""The pump process over gRPC with real etcd and TSO: writes, pulls, rules, lifecycle, resolution."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, NodeStatus, Registry
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from tests.support.binlogs import TS, commit, decode, prewrite, pv, rollback
from tests.support.cluster import CLUSTER_ID, Cluster
from tests.support.procs import free_port, wait_until

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def ts(cluster: Cluster) -> Iterator[TS]:
    t = TS(cluster.tso_addrs, CLUSTER_ID)
    yield t
    t.close()


def write(stub: pbg.PumpStub, *payloads: bytes, cluster_id: int = CLUSTER_ID) -> int:
    return stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=cluster_id, payloads=list(payloads)),
                             timeout=10).served_watermark


def pull_until(stub: pbg.PumpStub, after: int, pred, timeout: float = 10.0) -> list[pb.Binlog]:  # type: ignore[no-untyped-def]
    """Pull from `after` until pred(binlogs) holds; returns the non-fake binlogs seen."""
    seen: list[pb.Binlog] = []
    stream = stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=after),
                              timeout=timeout)
    try:
        for resp in stream:
            seen.extend(b for b in map(decode, resp.binlogs) if b.tp != pb.FAKE)
            if pred(seen):
                return seen
    finally:
        stream.cancel()
    raise AssertionError(f"stream ended before the condition held; saw {len(seen)}")


def code_of(fn) -> grpc.StatusCode | None:  # type: ignore[no-untyped-def]
    """The status code fn() fails with; None when it succeeds."""
    try:
        fn()
    except grpc.RpcError as e:
        return e.code()
    return None


def test_pull_returns_whole_transactions_in_commit_order_then_follows(cluster: Cluster, ts: TS) -> None:
    pump = cluster.start_pump()
    ch, stub = pump.stub()
    s1, s2 = ts.get(), ts.get()
    write(stub, prewrite(s1), prewrite(s2))
    c2 = ts.get()
    write(stub, commit(s2, c2))
    c1 = ts.get()
    write(stub, commit(s1, c1))
    got = pull_until(stub, 0, lambda seen: sum(b.tp == pb.COMMIT for b in seen) >= 2)
    assert [(b.tp, b.start_ts) for b in got] == [(pb.PREWRITE, s2), (pb.COMMIT, s2),
                                                (pb.PREWRITE, s1), (pb.COMMIT, s1)]
    # From c2 on only newer data; then live follow picks up a new transaction.
    s3 = ts.get()

    def later() -> None:
        time.sleep(0.5)
        write(stub, prewrite(s3))
        write(stub, commit(s3, ts.get()))
    threading.Thread(target=later, daemon=True).start()
    got = pull_until(stub, c2, lambda seen: any(b.tp == pb.COMMIT and b.start_ts == s3 for b in seen))
    assert [b.start_ts for b in got if b.tp == pb.COMMIT] == [s1, s3]
    ch.close()


def test_a_pull_starts_with_a_small_response_and_grows_to_the_full_size(cluster: Cluster, ts: TS) -> None:
    """A consumer merging several pumps waits for every pump's first response: a backlog is
    served from a small first response, each next one twice the last, up to the full size, in
    commit order with nothing missing."""
    from sluice.pump.service import PULL_FIRST_MESSAGE_BYTES, PULL_MESSAGE_BYTES
    pump = cluster.start_pump()
    ch, stub = pump.stub()
    value = pv("v" * 1000)
    n = 4000   # ~8 MB of prewrites: beyond the first responses' doubling
    starts = []
    for i in range(0, n, 200):
        group = [ts.get() for _ in range(200)]
        write(stub, *(prewrite(s, value) for s in group))
        write(stub, *(commit(s, ts.get()) for s in group))
        starts += group
    sizes, commits = [], []
    stream = stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=0), timeout=30)
    for resp in stream:
        sizes.append(sum(map(len, resp.binlogs)))
        commits += [b.start_ts for b in map(decode, resp.binlogs) if b.tp == pb.COMMIT]
        if len(commits) >= n:
            break
    stream.cancel()
    ch.close()
    assert commits == starts
    txn = 1100   # ~ a transaction's two binlogs: a response ends after the one crossing its size
    assert sizes[0] <= PULL_FIRST_MESSAGE_BYTES + txn
    assert sizes[1] > sizes[0] * 1.5
    assert max(sizes) <= PULL_MESSAGE_BYTES + txn and max(sizes) > PULL_MESSAGE_BYTES // 2


def test_a_caught_up_stream_gets_each_capture_sized_group_in_one_response(cluster: Cluster,
                                                                          ts: TS) -> None:
    """Streams that have caught up (two, as two drainers follow a pump) get each durable group
    of a capture's size (140 transactions of ~1 KiB: more than 64 KiB, within
    PULL_INLINE_BYTES) whole in one response each, in commit order: one message per group and
    stream, not a first slice and then the rest from a worker thread."""
    from sluice.pump.service import PULL_INLINE_BYTES
    pump = cluster.start_pump(**{"heartbeat-interval": 3600.0, "pull-heartbeat-interval": 3600.0})
    ch, stub = pump.stub()
    value = pv("v" * 1000)
    groups, size = 5, 140
    got: list[list[list[int]]] = [[], []]     # per stream: the commits' start_ts per response
    ready = [threading.Event(), threading.Event()]
    streams = [stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=0,
                                                  packed_meta=True), timeout=60)
               for _ in range(2)]

    def follow(k: int) -> None:
        try:
            for resp in streams[k]:
                ready[k].set()   # the first (empty) response: the stream is live
                commits = [b.start_ts for b in map(decode, resp.binlogs) if b.tp == pb.COMMIT]
                if commits:
                    got[k].append(commits)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                raise
    threads = [threading.Thread(target=follow, args=(k,), daemon=True) for k in range(2)]
    for t in threads:
        t.start()
    for ev in ready:
        assert ev.wait(10), "a stream never answered its first (empty) response"
    starts: list[list[int]] = []
    for g in range(groups):
        group = [ts.get() for _ in range(size)]
        write(stub, *(prewrite(s, value) for s in group))
        write(stub, *(commit(s, ts.get()) for s in group))
        starts.append(group)
        # The next group only once both streams have this one: each read finds one group.
        wait_until(lambda: all(sum(map(len, g_)) >= (g + 1) * size for g_ in got), 20,
                   what=f"both streams to receive group {g}")
    for s in streams:
        s.cancel()
    for t in threads:
        t.join(10)
    ch.close()
    assert size * 1100 > 64 << 10 and size * 1100 < PULL_INLINE_BYTES
    for k in range(2):
        assert got[k] == starts, f"stream {k}: commits per response {list(map(len, got[k]))}"


def test_idle_pump_emits_fake_binlogs(cluster: Cluster) -> None:
    pump = cluster.start_pump()
    ch, stub = pump.stub()
    stream = stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=0), timeout=10)
    fakes, watermarks = [], []
    for resp in stream:
        fakes += [b for b in map(decode, resp.binlogs) if b.tp == pb.FAKE]
        watermarks.append(resp.watermark)
        if len(fakes) >= 3:
            break
    stream.cancel()
    assert [f.commit_ts for f in fakes] == sorted({f.commit_ts for f in fakes})
    assert watermarks == sorted(watermarks) and watermarks[-1] >= fakes[-1].commit_ts
    ch.close()


def test_write_rules_over_grpc(cluster: Cluster, ts: TS) -> None:
    pump = cluster.start_pump()
    ch, stub = pump.stub()
    s = ts.get()
    assert code_of(lambda: write(stub, prewrite(s), cluster_id=CLUSTER_ID + 1)) == grpc.StatusCode.INVALID_ARGUMENT
    assert code_of(lambda: write(stub, b"\xff\xff garbage")) == grpc.StatusCode.INVALID_ARGUMENT
    write(stub, prewrite(s, pv("v1")))
    write(stub, prewrite(s, pv("v1")))                      # identical retry: OK
    assert code_of(lambda: write(stub, prewrite(s, pv("v2")))) == grpc.StatusCode.ALREADY_EXISTS
    c = ts.get()
    write(stub, commit(s, c))
    write(stub, commit(s, c))                            # identical retry of the commit: OK
    assert code_of(lambda: write(stub, commit(s, c + 1))) == grpc.StatusCode.ALREADY_EXISTS
    assert code_of(lambda: write(stub, commit(ts.get(), ts.get()))) == grpc.StatusCode.FAILED_PRECONDITION
    # A commit below the served watermark is refused (invariant 2's last guard).
    old = ts.get()
    s_new = ts.get()
    write(stub, prewrite(s_new))
    write(stub, commit(s_new, ts.get()))
    wait_until(lambda: write(stub) > old, 10, what="watermark past old ts")
    s_late = old - 1
    write(stub, prewrite(s_late))   # start_ts below watermark is stored...
    assert code_of(lambda: write(stub, commit(s_late, old))) == grpc.StatusCode.FAILED_PRECONDITION
    # An atomic batch with one bad member stores nothing.
    s_a, s_b = ts.get(), ts.get()
    assert code_of(lambda: write(stub, prewrite(s_a), b"junk")) == grpc.StatusCode.INVALID_ARGUMENT
    state = stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=s_a)).state
    assert state == pb.TXN_NOT_FOUND
    ch.close()


def test_producer_epoch_fencing(cluster: Cluster, ts: TS) -> None:
    pump = cluster.start_pump()
    cluster.register_producer("cap")
    ch, stub = pump.stub()
    s = ts.get()
    pos = pb.Position(file_seq=3, offset=400)
    write(stub, prewrite(s, producer="cap", epoch=1))
    write(stub, commit(s, ts.get(), producer="cap", epoch=1, position=pos))
    resp = stub.GetProducerPosition(pb.GetProducerPositionReq(cluster_id=CLUSTER_ID,
                                                              producer_id="cap", epoch=2))
    assert resp.has_position and resp.position.offset == 400 and resp.epoch == 2
    code = code_of(lambda: write(stub, prewrite(ts.get(), producer="cap", epoch=1)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    code = code_of(lambda: stub.GetProducerPosition(pb.GetProducerPositionReq(
        cluster_id=CLUSTER_ID, producer_id="cap", epoch=1)))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    ch.close()


class _Producer(pbg.ProducerServicer):
    def __init__(self) -> None:
        self.answers: dict[int, tuple[int, int]] = {}
        self.asked: list[int] = []

    async def TxnStatus(self, request, context):  # type: ignore[no-untyped-def]
        self.asked.append(request.start_ts)
        state, cts = self.answers.get(request.start_ts, (pb.TXN_UNKNOWN, 0))
        return pb.TxnStatusResp(state=state, commit_ts=cts)


def test_unresolved_prewrites_are_resolved_through_txn_status(cluster: Cluster, ts: TS, etcd) -> None:  # type: ignore[no-untyped-def]
    """After txn-timeout the pump asks the producer: committed -> commit written; rolled back ->
    dropped; unknown -> keeps waiting."""
    producer = _Producer()
    port = free_port()
    ready = threading.Event()
    stop = threading.Event()

    def serve() -> None:
        async def main() -> None:
            server = grpc.aio.server()
            pbg.add_ProducerServicer_to_server(producer, server)
            server.add_insecure_port(f"127.0.0.1:{port}")
            await server.start()
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await server.stop(0)
        asyncio.run(main())
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    ready.wait(10)
    client = Etcd(etcd.endpoint)
    Registry(client, CLUSTER_ID).register(NodeStatus(
        node_id="app", kind=NodeKind.PRODUCER, addr=f"127.0.0.1:{port}",
        state=NodeState.ONLINE))
    pump = cluster.start_pump(**{"txn-timeout": 0.5})
    ch, stub = pump.stub()
    s_commit, s_roll, s_unknown = ts.get(), ts.get(), ts.get()
    acked = write(stub, prewrite(s_commit, producer="app"), prewrite(s_roll, producer="app"),
                  prewrite(s_unknown, producer="app"))
    c = ts.get()
    producer.answers[s_commit] = (pb.TXN_COMMITTED, c)
    producer.answers[s_roll] = (pb.TXN_ROLLED_BACK, 0)

    def state(s: int) -> int:
        return stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=s)).state
    wait_until(lambda: state(s_commit) == pb.TXN_COMMITTED and state(s_roll) == pb.TXN_ROLLED_BACK,
               15, what="resolution")
    assert stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=s_commit)).commit_ts == c
    wait_until(lambda: producer.asked.count(s_unknown) >= 2, 10, what="repeated questions")
    assert state(s_unknown) == pb.TXN_UNKNOWN
    # The unresolved prewrite holds the watermark where it stood when it was stored (a heartbeat
    # whose TSO ts came after s_unknown but was stored before the prewrite may have raised it
    # past s_unknown - 1; that ts is still older than c): the commit at c is not served yet.
    assert write(stub) == max(acked, s_unknown - 1) < c
    # An admin decision (ctl resolve-txn) ends the wait.
    stub.ResolveTxn(pb.ResolveTxnReq(cluster_id=CLUSTER_ID, start_ts=s_unknown, rollback=True))
    got = pull_until(stub, 0, lambda seen: any(b.tp == pb.COMMIT for b in seen))
    assert [b.start_ts for b in got if b.tp == pb.COMMIT] == [s_commit]
    ch.close()
    stop.set()
    client.close()


def test_pause_and_offline_lifecycle(cluster: Cluster, ts: TS, etcd) -> None:  # type: ignore[no-untyped-def]
    """Pausing refuses new prewrites, lets commits finish, then publishes the final ts."""
    pump = cluster.start_pump()
    ch, stub = pump.stub()
    reg_client = Etcd(etcd.endpoint)
    reg = Registry(reg_client, CLUSTER_ID)
    info = reg.get(NodeKind.PUMP, pump.node_id)
    assert info is not None and info.alive and info.status.state == "online"
    s = ts.get()
    write(stub, prewrite(s))
    reg.set_state(NodeKind.PUMP, pump.node_id, NodeState.PAUSING)

    def prewrite_refused() -> bool:
        probe = ts.get()
        code = code_of(lambda: write(stub, prewrite(probe)))
        if code is None:   # taken before the pump saw `pausing`: resolve it again
            write(stub, rollback(probe))
        return code == grpc.StatusCode.UNAVAILABLE
    wait_until(prewrite_refused, 10, what="prewrites refused")
    assert reg.get(NodeKind.PUMP, pump.node_id).status.state == "pausing"   # s is unresolved
    c = ts.get()
    write(stub, commit(s, c))
    wait_until(lambda: reg.get(NodeKind.PUMP, pump.node_id).status.state == "paused", 10,
               what="paused")
    assert reg.get(NodeKind.PUMP, pump.node_id).status.max_commit_ts >= c
    # Reads continue while paused.
    got = pull_until(stub, 0, lambda seen: any(b.tp == pb.COMMIT for b in seen))
    assert got[-1].start_ts == s
    reg.set_state(NodeKind.PUMP, pump.node_id, NodeState.ONLINE)
    wait_until(lambda: write(stub, prewrite(ts.get())) > 0, 10, what="resumed")
    reg.set_state(NodeKind.PUMP, pump.node_id, NodeState.CLOSING)
    wait_until(lambda: reg.get(NodeKind.PUMP, pump.node_id).status.state == "closing", 5, what="closing")
    ch.close()
    reg_client.close()


def test_pump_waits_for_an_online_drainer_that_is_not_alive(cluster: Cluster, etcd) -> None:  # type: ignore[no-untyped-def]
    client = Etcd(etcd.endpoint)
    reg = Registry(client, CLUSTER_ID)
    reg.register(NodeStatus(node_id="drainer-x", kind=NodeKind.DRAINER, addr="127.0.0.1:1",
                            state=NodeState.ONLINE))
    pump = cluster.start_pump(wait_online=False)
    wait_until(lambda: "drainer-x" in pump.proc.log_text() and "not alive" in pump.proc.log_text(),
               20, what="a clear waiting message")
    ch, stub = pump.stub()
    assert code_of(lambda: write(stub)) == grpc.StatusCode.UNAVAILABLE
    reg.set_state(NodeKind.DRAINER, "drainer-x", NodeState.CLOSING)
    cluster.wait_pump_writable(pump)
    ch.close()
    client.close()


def test_config_error_exits_2(tmp_path: Path) -> None:
    import subprocess
    from tests.support.procs import sluice_argv
    bad = tmp_path / "pump.toml"
    bad.write_text('data-dir = "x"\nheartbeat-intervall = 3\n')
    r = subprocess.run(sluice_argv("pump", "--config", str(bad)), capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2
    assert "heartbeat-intervall" in r.stderr and len(r.stderr.strip().splitlines()) == 1
