"""Fuzz the pump's write handlers through its real gRPC server (one pump for the module)."""
from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import TS, commit, decode, prewrite, pv
from tests.support.cluster import Cluster
from tests.support.procs import free_port

pytestmark = pytest.mark.timeout(120)

MAX_BINLOG = 64 << 10
CLEAN = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
         grpc.StatusCode.ALREADY_EXISTS}


class Pump:
    """The module's pump and what it acknowledged before the fuzzing started."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.cluster_id = cluster.cluster_id
        self.handle = cluster.start_pump(**{
            "heartbeat-interval": 3600.0, "pull-heartbeat-interval": 3600.0,
            "txn-timeout": 3600.0, "storage.max-binlog-size": MAX_BINLOG})
        self.channel, self.stub = self.handle.stub()
        self.ts = TS(cluster.tso_addrs, cluster.cluster_id)
        self.committed: list[tuple[int, int, bytes]] = []   # (start_ts, commit_ts, value)
        for i in range(5):
            s = self.ts.get()
            value = pv(f"row {i}" * 10)
            self.write([prewrite(s, value)])
            c = self.ts.get()
            self.write([commit(s, c)])
            self.committed.append((s, c, value))
        # An unresolved prewrite stays open throughout: mutated copies of it probe the
        # part/commit rules of a pending transaction.
        self.open_start = self.ts.get()
        self.write([prewrite(self.open_start, pv("open"))])

    def fresh(self) -> int:
        """A timestamp the TSO issued and nothing above used (the pump stores no other)."""
        return self.ts.get()

    def write(self, payloads: list[bytes], cluster_id: int | None = None, single: bool = False
              ) -> None:
        cid = self.cluster_id if cluster_id is None else cluster_id
        if single:
            self.stub.WriteBinlog(pb.WriteBinlogReq(cluster_id=cid, payload=payloads[0]),
                                  timeout=10)
        else:
            self.stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=cid, payloads=payloads),
                                   timeout=10)

    def status(self) -> pb.PumpStatusResp:
        return self.stub.Status(pb.PumpStatusReq(cluster_id=self.cluster_id), timeout=10)

    def served(self) -> list[tuple[int, int, int, bytes]]:
        """(type, start_ts, commit_ts, value) of every non-fake binlog served from 0."""
        upto = self.status().served_watermark
        out: list[tuple[int, int, int, bytes]] = []
        stream = self.stub.PullBinlogs(pb.PullBinlogsReq(cluster_id=self.cluster_id),
                                       timeout=20)
        try:
            for resp in stream:
                out += [(b.tp, b.start_ts, b.commit_ts, b.prewrite_value)
                        for b in map(decode, resp.binlogs) if b.tp != pb.FAKE]
                if resp.watermark >= upto:
                    return out
        finally:
            stream.cancel()
        raise AssertionError("stream ended")

    def close(self) -> None:
        self.channel.close()
        self.ts.close()


@pytest.fixture(scope="module")
def pump(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Pump]:  # type: ignore[no-untyped-def]
    cluster = Cluster(tmp_path_factory.mktemp("fuzz"), etcd_module.endpoint,
                      cluster_id=free_port())
    try:
        cluster.start_tso()
        p = Pump(cluster)
        yield p
        p.close()
    finally:
        cluster.stop()


# -- the cases -----------------------------------------------------------------------------

def _mutate(data: hst.DataObject, payload: bytes) -> bytes:
    buf = bytearray(payload)
    for _ in range(data.draw(hst.integers(1, 4))):
        op = data.draw(hst.sampled_from(["flip", "cut", "insert"]))
        pos = data.draw(hst.integers(0, len(buf)))
        if op == "flip" and pos < len(buf):
            buf[pos] = data.draw(hst.integers(0, 255))
        elif op == "cut":
            del buf[pos:]
        else:
            buf[pos:pos] = data.draw(hst.binary(min_size=1, max_size=8))
    return bytes(buf)


def _case(data: hst.DataObject, p: Pump) -> tuple[list[bytes], set[grpc.StatusCode], str, int]:
    """(payloads, the status codes allowed, a word the message must contain, cluster_id)."""
    s, c, value = data.draw(hst.sampled_from(p.committed))
    kind = data.draw(hst.sampled_from([
        "ts<=0", "commit-without-prewrite", "different-content", "other-commit-ts",
        "commit<=start", "oversized", "wrong-cluster", "random", "mutated", "wrong-type",
        "unknown-type", "rollback-committed", "part-no", "no-producer", "unregistered",
        "bad-value", "fake", "future-ts"]))
    fresh = p.fresh()
    if kind == "ts<=0":
        bad_ts = data.draw(hst.integers(-(1 << 63), 0))
        maker = data.draw(hst.sampled_from(["prewrite", "commit", "fake"]))
        payload = (prewrite(bad_ts) if maker == "prewrite" else commit(bad_ts, 5)
                   if maker == "commit" else pb.Binlog(tp=pb.FAKE, start_ts=bad_ts,
                                                       commit_ts=bad_ts).SerializeToString())
        return [payload], {grpc.StatusCode.INVALID_ARGUMENT}, "", p.cluster_id
    if kind == "fake":
        # Heartbeats are the pump's own: a client's fake at a future ts once raised the served
        # watermark past the TSO, and every later commit was refused.
        t = data.draw(hst.sampled_from([c, p.ts.get(), p.ts.get() + (1 << 40), 1 << 62]))
        return [pb.Binlog(tp=pb.FAKE, start_ts=t, commit_ts=t).SerializeToString()], \
            {grpc.StatusCode.INVALID_ARGUMENT}, "fake binlogs are written by the pump itself", \
            p.cluster_id
    if kind == "future-ts":
        # A timestamp the TSO has not issued yet (32 s, 70 min, ~146 years ahead): stored, it
        # would order its transaction after later ones or hold it back until the clock caught up.
        ahead = data.draw(hst.sampled_from([1 << 33, 1 << 40, 1 << 62]))
        payload = (prewrite(fresh + ahead, pv("future")) if data.draw(hst.booleans())
                   else commit(p.open_start, fresh + ahead))
        return [payload], {grpc.StatusCode.INVALID_ARGUMENT}, \
            "ahead of every timestamp the TSO has issued", p.cluster_id
    if kind == "commit-without-prewrite":
        return [commit(fresh, fresh + 1)], {grpc.StatusCode.FAILED_PRECONDITION}, \
            "without its prewrite", p.cluster_id
    if kind == "different-content":
        other = pv(data.draw(hst.text(min_size=1, max_size=64)))
        if other == value:
            other = pv("other")
        return [prewrite(s, other)], {grpc.StatusCode.ALREADY_EXISTS}, "already", p.cluster_id
    if kind == "other-commit-ts":
        return [commit(s, c + data.draw(hst.integers(1, 1000)))], \
            {grpc.StatusCode.ALREADY_EXISTS}, "already", p.cluster_id
    if kind == "commit<=start":
        return [commit(p.open_start, p.open_start - data.draw(hst.integers(0, 1000)))], \
            {grpc.StatusCode.INVALID_ARGUMENT}, "commit_ts", p.cluster_id
    if kind == "oversized":
        return [prewrite(fresh, b"x" * (MAX_BINLOG + data.draw(hst.integers(1, 4096))))], \
            {grpc.StatusCode.INVALID_ARGUMENT}, "max-binlog-size", p.cluster_id
    if kind == "wrong-cluster":
        return [prewrite(fresh)], {grpc.StatusCode.INVALID_ARGUMENT}, "cluster", \
            p.cluster_id + data.draw(hst.integers(1, 1000))
    if kind == "unknown-type":
        tp = data.draw(hst.integers(5, 1 << 20))
        return [pb.Binlog(tp=tp, start_ts=fresh).SerializeToString()], \
            {grpc.StatusCode.INVALID_ARGUMENT}, "type", p.cluster_id
    if kind == "rollback-committed":
        return [pb.Binlog(tp=pb.ROLLBACK, start_ts=s).SerializeToString()], \
            {grpc.StatusCode.ALREADY_EXISTS}, "committed", p.cluster_id
    if kind == "no-producer":
        return [prewrite(fresh, producer="")], {grpc.StatusCode.INVALID_ARGUMENT}, \
            "producer_id", p.cluster_id
    if kind == "unregistered":
        who = "nobody-" + data.draw(hst.text("abcdefgh", min_size=1, max_size=12))
        return [prewrite(fresh, producer=who)], {grpc.StatusCode.INVALID_ARGUMENT}, \
            "not registered", p.cluster_id
    if kind == "bad-value":
        # eleven 0xff bytes: a varint longer than 64 bits, never a valid PrewriteValue
        junk = b"\xff" * 11 + data.draw(hst.binary(max_size=64))
        return [prewrite(fresh, junk)], {grpc.StatusCode.INVALID_ARGUMENT}, \
            "PrewriteValue", p.cluster_id
    if kind == "part-no":
        count = data.draw(hst.integers(1, 8))
        return [prewrite(fresh, b"v", part_no=count + data.draw(hst.integers(0, 5)),
                         part_count=count)], {grpc.StatusCode.INVALID_ARGUMENT}, "part_no", \
            p.cluster_id
    # Payloads that might even be valid binlogs: sent with a poison binlog after them, so the
    # atomic batch must fail with a clean code whatever the fuzzed payload turned out to be.
    if kind == "random":
        payload = data.draw(hst.binary(max_size=200))
    elif kind == "mutated":
        payload = _mutate(data, data.draw(hst.sampled_from(
            [prewrite(s, value), commit(s, c), prewrite(p.open_start, pv("open"))])))
    else:   # wrong-type: another message's bytes where a Binlog belongs
        payload = data.draw(hst.sampled_from([
            pb.TableInfo(table_id=fresh, schema_name="db", table_name="t").SerializeToString(),
            pb.PrewriteValue(schema_version=fresh).SerializeToString(),
            pb.WriteBinlogsReq(cluster_id=p.cluster_id, payloads=[prewrite(fresh)])
            .SerializeToString(),
            pb.GetTSResp(first_ts=fresh, count=3).SerializeToString()]))
    poison = commit(p.fresh(), p.fresh() + 1)
    return [payload, poison], CLEAN, "", p.cluster_id


def test_write_handlers_answer_clean_errors_and_store_nothing(pump: Pump) -> None:
    """Garbled, mistyped, out-of-rule and oversized writes each get the status code of their
    rule with a message, and afterwards the storage is exactly what was acknowledged before."""
    before_status = pump.status()
    before = pump.served()
    assert [(t, s) for t, s, _, _ in before if t == pb.COMMIT] == \
        [(pb.COMMIT, s) for s, _, _ in pump.committed]

    @settings(max_examples=400, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(hst.data())
    def check(data: hst.DataObject) -> None:
        payloads, codes, word, cluster_id = _case(data, pump)
        # Alone, and behind a valid new prewrite in the same atomic batch.
        if data.draw(hst.booleans()):
            payloads = [prewrite(pump.fresh(), pv("good"))] + payloads
        single = len(payloads) == 1 and data.draw(hst.booleans())
        with pytest.raises(grpc.RpcError) as e:
            pump.write(payloads, cluster_id=cluster_id, single=single)
        assert e.value.code() in codes, (e.value.code(), e.value.details())
        assert e.value.details() and word in e.value.details(), e.value.details()
        st = pump.status()
        assert (st.served_watermark, st.max_commit_ts, st.unresolved, st.storage_bytes) == \
            (before_status.served_watermark, before_status.max_commit_ts,
             before_status.unresolved, before_status.storage_bytes), "a refused write stored"

    check()
    assert pump.served() == before


def test_a_timestamp_the_tso_has_not_issued_is_refused(pump: Pump) -> None:
    """DESIGN §2.2: a pump stores no start_ts or commit_ts above what the TSO has issued. A
    prewrite or commit 32 s ahead of the TSO is INVALID_ARGUMENT naming it and stores nothing;
    the same transaction's commit at a timestamp the TSO issued a moment ago (above everything
    the pump has seen: it asks the TSO) is stored and served."""
    before = pump.status()
    ahead = pump.ts.get() + (1 << 33)
    for payload, field in ((prewrite(ahead, pv("future")), "start_ts"),
                           (commit(pump.open_start, ahead), "commit_ts")):
        with pytest.raises(grpc.RpcError) as e:
            pump.write([payload])
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert f"{field} {ahead} is ahead of every timestamp the TSO has issued" in \
            e.value.details(), e.value.details()
    st = pump.status()
    assert (st.max_commit_ts, st.unresolved, st.storage_bytes) == \
        (before.max_commit_ts, before.unresolved, before.storage_bytes)
    c = pump.ts.get()
    pump.write([commit(pump.open_start, c)])
    assert (pb.COMMIT, pump.open_start, c, b"") in pump.served()
