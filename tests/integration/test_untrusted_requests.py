"""No single request can stall replication (issue #20): the three cases a new user found, each
against real etcd, TSO, pump and drainer processes, plus undecodable bytes on every RPC."""
from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from collections.abc import Iterator

import grpc
import pytest

from sluice.client.producer import ProducerServer
from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, Registry
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from tests.support.binlogs import TS, commit, prewrite, pv
from tests.support.cluster import (CLUSTER_ID, Cluster, TxnWriter, check_exactly_once,
                                   read_file_sink, register_producer, table_info)
from tests.support.ctl import ctl_in
from tests.support.procs import free_port, wait_until

pytestmark = pytest.mark.timeout(150)

# Not a valid message of any type: a varint longer than 64 bits, and a truncated bytes field.
GARBAGE = (b"\xff" * 11, b"\x12\x05ab")


@pytest.fixture
def registry(cluster: Cluster) -> Iterator[Registry]:
    etcd = Etcd(cluster.etcd)
    yield Registry(etcd, CLUSTER_ID)
    etcd.close()


def write(stub: pbg.PumpStub, *payloads: bytes) -> int:
    return stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=CLUSTER_ID, payloads=list(payloads)),
                             timeout=10).served_watermark


def refused(fn) -> grpc.RpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        fn()
    return e.value


def pump_metric(addr: str, name: str) -> float:
    text = urllib.request.urlopen(f"http://{addr}/metrics", timeout=2).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_prewrite_the_pump_could_not_resolve_later_is_refused_and_nothing_is_stored(
        cluster: Cluster, registry: Registry) -> None:
    """A binlog is accepted only when everything the pump needs later to resolve it is there and
    valid: a registered producer id, a prewrite value that decodes, parts that add up. Otherwise
    INVALID_ARGUMENT naming the field, and nothing is stored — so the issue's stray prewrite
    (start_ts 99, 300 random bytes, no producer) no longer freezes the pump's watermark."""
    pump = cluster.start_pump()
    ch, stub = pump.stub()
    ts = TS(cluster.tso_addrs, CLUSTER_ID)
    try:
        before = stub.Status(pb.PumpStatusReq(cluster_id=CLUSTER_ID))
        junk = os.urandom(300)
        e = refused(lambda: stub.WriteBinlog(pb.WriteBinlogReq(
            cluster_id=CLUSTER_ID, payload=pb.Binlog(tp=pb.PREWRITE, start_ts=99,
                                                     prewrite_value=junk).SerializeToString())))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "producer_id" in e.details()

        s = ts.get()
        e = refused(lambda: write(stub, prewrite(s, pv("x"), producer="nobody")))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "producer_id 'nobody' is not registered" in e.details()

        bad_value = b"\xff" * 11 + junk
        e = refused(lambda: write(stub, prewrite(s, bad_value)))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "prewrite_value is not a valid PrewriteValue" in e.details()

        e = refused(lambda: write(stub, prewrite(s, pv("x"), part_no=0, part_count=1 << 20)))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "part_count" in e.details()

        # Parts that are each fine but do not add up to a PrewriteValue: the last is refused.
        whole = pv("y" * 1000)
        write(stub, prewrite(s, whole[:500], part_no=0, part_count=2))
        e = refused(lambda: write(stub, prewrite(s, b"\xff" * 11, part_no=1, part_count=2)))
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "PrewriteValue" in e.details()
        write(stub, prewrite(s, whole[500:], part_no=1, part_count=2))   # the right part: OK
        write(stub, commit(s, ts.get()))

        # A producer registered a moment ago is admitted at once (the watch may lag; the pump
        # re-reads that producer once).
        register_producer(cluster.etcd, CLUSTER_ID, "fresh-producer")
        s2 = ts.get()
        write(stub, prewrite(s2, pv("z"), producer="fresh-producer"))
        write(stub, commit(s2, ts.get(), producer="fresh-producer"))

        after = stub.Status(pb.PumpStatusReq(cluster_id=CLUSTER_ID))
        assert after.unresolved == before.unresolved == 0
        for start_ts in (99,):
            got = stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=start_ts))
            assert got.state == pb.TXN_NOT_FOUND
        # Past txn-timeout (2 s here) the watermark still moves: nothing refused is waited on.
        t = ts.get()
        time.sleep(2.5)
        wait_until(lambda: write(stub) > t, 10, what="the served watermark to pass a fresh ts")
    finally:
        ch.close()
        ts.close()


def test_a_stuck_prewrite_raises_an_alert_naming_the_command_and_the_drainer_says_who_holds_it(
        cluster: Cluster, registry: Registry) -> None:
    """A prewrite that cannot be resolved past txn-timeout (its producer's registry entry is
    gone) is never decided by the pump: it raises sluice_pump_stuck_prewrites and an alert in
    the pump's registry status that `sluice ctl pumps` shows with the resolve-txn command, and
    the drainer's status names the pump and start_ts that hold its merge — until an operator
    resolves it, after which everything flows and the alerts clear."""
    metrics_addr = f"127.0.0.1:{free_port()}"
    pump = cluster.start_pump(**{"metrics-addr": metrics_addr})
    tables = [table_info(501, "stuck", "t0")]
    w = TxnWriter(cluster, tables, producer="ghost")
    w.declare("pump-1")
    w.write(5, ["pump-1"], group=5)
    d = cluster.start_drainer("d-stuck", **{"initial-commit-ts": 0})
    ch, stub = pump.stub()
    try:
        s = w.ts.get()
        write(stub, prewrite(s, pv("never committed"), producer="ghost"))
        # The producer goes away for good: nobody can answer for s any more.
        assert registry.delete(NodeKind.PRODUCER, "ghost")

        def alerts() -> list[dict]:
            return registry.get(NodeKind.PUMP, "pump-1").status.alerts
        wait_until(lambda: alerts(), 20, what="the pump to publish an alert")
        (alert,) = alerts()
        assert alert["start_ts"] == s and alert["producer"] == "ghost"
        assert alert["pump"] == "pump-1" and alert["since_ms"] > 0
        assert alert["command"] == f"sluice ctl resolve-txn {s} --commit-ts COMMIT_TS | --rollback"
        assert "not registered" in alert["reason"]
        assert pump_metric(metrics_addr, "sluice_pump_stuck_prewrites") == 1
        assert pump_metric(metrics_addr, "sluice_pump_stuck_prewrite_oldest_start_ts") == float(s)

        shown = ctl_in(cluster.etcd, CLUSTER_ID, "pumps")
        assert shown.code == 0
        assert f"ALERT pump pump-1: prewrite start_ts={s} of producer 'ghost'" in shown.out
        assert f"sluice ctl resolve-txn {s} --commit-ts COMMIT_TS | --rollback" in shown.out
        as_json = ctl_in(cluster.etcd, CLUSTER_ID, "--json", "pumps").json()
        assert as_json[0]["alerts"][0]["start_ts"] == s

        # Commits after s wait in the pump (invariant 3): the drainer is held, and says by whom.
        live = TxnWriter(cluster, tables, seed=2, producer="live-app")
        live._next_id = 10_000   # row ids apart from the first writer's
        later = live.write(3, ["pump-1"], group=3)

        def held_by() -> str | None:
            return registry.get(NodeKind.DRAINER, "d-stuck").status.labels.get("held-by")
        wait_until(lambda: held_by() == f"pump-1 start_ts={s} producer='ghost'", 20,
                   what="the drainer to name what holds it")
        drained = ctl_in(cluster.etcd, CLUSTER_ID, "--json", "drainers").json()
        assert drained[0]["held_by"] == f"pump-1 start_ts={s} producer='ghost'"
        wait_until(lambda: d.metric('sluice_drainer_merge_held_by_start_ts{pump="pump-1"}')
                   == float(s), 10, what="the drainer's held-by metric")
        assert not {a.commit_ts for a in later} & {t["commit_ts"] for t in read_file_sink(d.out_dir)}

        # The operator decides (the source never committed it) with the published command.
        done = ctl_in(cluster.etcd, CLUSTER_ID, "resolve-txn", str(s), "--rollback")
        assert done.code == 0, done.err
        wait_until(lambda: not alerts(), 20, what="the alert to clear")
        wait_until(lambda: held_by() is None, 20, what="the drainer's held-by to clear")
        wait_until(lambda: pump_metric(metrics_addr, "sluice_pump_stuck_prewrites") == 0, 10,
                   what="the metric to clear")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = {t["commit_ts"] for t in read_file_sink(d.out_dir)}
            if {a.commit_ts for a in later} <= got:
                break
            time.sleep(0.2)
        check_exactly_once(d.out_dir, w.acked + live.acked)
        live.close()
    finally:
        ch.close()
        w.close()


def test_notify_from_a_pump_the_registry_does_not_hold_live_is_refused_and_holds_nothing(
        cluster: Cluster, registry: Registry) -> None:
    """A drainer admits a source on Cistern.Notify only if the registry holds that pump id with
    that address, online and alive; otherwise FAILED_PRECONDITION and nothing changes: the
    issue's `Notify(pump_id="evil", pump_addr="127.0.0.1:1")` no longer joins the merge, and
    replication goes on."""
    cluster.start_pump()
    w = TxnWriter(cluster, [table_info(601, "notify", "t0")])
    w.declare("pump-1")
    w.write(5, ["pump-1"], group=5)
    d = cluster.start_drainer("d-notify", **{"initial-commit-ts": 0})
    pump_addr = cluster.pumps["pump-1"].addr
    ch = grpc.insecure_channel(d.addr)
    try:
        stub = pbg.CisternStub(ch)
        for pump_id, addr, why in (
                ("evil", "127.0.0.1:1", "not registered"),
                ("pump-1", "127.0.0.1:1", f"registered at '{pump_addr}'"),
        ):
            e = refused(lambda: stub.Notify(pb.NotifyReq(cluster_id=CLUSTER_ID, pump_id=pump_id,
                                                         pump_addr=addr), timeout=10))
            assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e.details()
            assert why in e.details(), e.details()
        # A registered pump that is not alive (never started) is refused too.
        from sluice.core.registry import NodeState, NodeStatus
        registry.register(NodeStatus(node_id="pump-dead", kind=NodeKind.PUMP,
                                     addr="127.0.0.1:2", state=NodeState.PAUSED))
        e = refused(lambda: stub.Notify(pb.NotifyReq(cluster_id=CLUSTER_ID, pump_id="pump-dead",
                                                     pump_addr="127.0.0.1:2"), timeout=10))
        assert e.code() == grpc.StatusCode.FAILED_PRECONDITION and "paused" in e.details()
        # The live, registered pump itself is still admitted (idempotent: it is in the merge).
        stub.Notify(pb.NotifyReq(cluster_id=CLUSTER_ID, pump_id="pump-1", pump_addr=pump_addr),
                    timeout=10)
        time.sleep(1.5)   # a metrics round
        assert d.metric("sluice_drainer_pumps_in_merge") == 1
        more = w.write(20, ["pump-1"], group=10)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if {a.commit_ts for a in more} <= {t["commit_ts"] for t in read_file_sink(d.out_dir)}:
                break
            time.sleep(0.2)
        check_exactly_once(d.out_dir, w.acked)
        assert 'sluice_drainer_pump_watermark{pump="evil"}' not in d.metrics()
    finally:
        ch.close()
        w.close()


def test_undecodable_request_bytes_get_invalid_argument_on_every_rpc(cluster: Cluster) -> None:
    """Bytes that are not a valid request message get INVALID_ARGUMENT naming the message on
    every method of the pump, drainer (Cistern and Drainer), TSO and producer servers — never
    UNKNOWN "Unexpected DecodeError" — and the servers go on serving."""
    pump = cluster.start_pump()
    d = cluster.start_drainer("d-garbage")

    async def producer_addr() -> tuple[ProducerServer, str]:
        async def decide(start_ts: int) -> tuple[int, int]:
            return pb.TXN_UNKNOWN, 0
        server = ProducerServer(cluster.etcd, CLUSTER_ID, "garbage-producer", decide)
        await server.start()
        return server, server.addr

    loop = asyncio.new_event_loop()
    producer, paddr = loop.run_until_complete(producer_addr())
    import threading
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    targets = {pump.addr: "Pump", d.addr: "Cistern", cluster.tso_addrs[0]: "TSO", paddr: "Producer"}
    try:
        from google.protobuf import descriptor_pool
        pool = descriptor_pool.Default()
        checked = []
        for addr, service in [*targets.items(), (d.addr, "Drainer")]:
            desc = pool.FindServiceByName(f"sluice.v1.{service}")
            with grpc.insecure_channel(addr) as ch:
                for m in desc.methods:
                    path = f"/sluice.v1.{service}/{m.name}"
                    for junk in GARBAGE:
                        if m.client_streaming and m.server_streaming:
                            call = ch.stream_stream(path)
                            fn = lambda: list(call(iter([junk]), timeout=10))  # noqa: E731
                        elif m.server_streaming:
                            call = ch.unary_stream(path)
                            fn = lambda: list(call(junk, timeout=10))  # noqa: E731
                        else:
                            call = ch.unary_unary(path)
                            fn = lambda: call(junk, timeout=10)  # noqa: E731
                        e = refused(fn)
                        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (path, e.code(),
                                                                             e.details())
                        assert f"request is not a valid {m.input_type.name}" in e.details()
                    checked.append(path)
        assert len(checked) == 7 + 1 + 2 + 1 + 2
        # Still serving: a real request to each.
        ch, stub = pump.stub()
        assert stub.Status(pb.PumpStatusReq(cluster_id=CLUSTER_ID), timeout=10).state == "online"
        ch.close()
        ts = TS(cluster.tso_addrs, CLUSTER_ID)
        assert ts.get() > 0
        ts.close()
    finally:
        asyncio.run_coroutine_threadsafe(producer.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()
