"""Fuzz every RPC of every server while a pipeline runs (issue #20 item 7).

Two pumps, a drainer (file sink), a TSO and a producer server run as real processes and servers;
a writer produces real transactions the whole time. Hypothesis sends each method of the Pump,
Cistern, Drainer, TSO and Producer services random bytes, valid requests with mutated fields
(wrong cluster ids, huge and negative numbers, unknown producers and pumps, empty fields, binlogs
of every type with such fields) and bit-flipped copies of those. tests/integration/
test_pump_fuzz.py covers the pump's write rules one by one on an idle pump; this one covers the
breadth of the API under load and the pipeline's outcome.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hst

from sluice.client.producer import ProducerServer
from sluice.proto import sluice_pb2 as pb
from tests.support.cluster import (Cluster, TxnWriter, check_exactly_once, read_file_sink,
                                   table_info)
from tests.support.procs import free_port, wait_until

pytestmark = pytest.mark.timeout(150)

# Never UNKNOWN (an unhandled exception), INTERNAL, UNIMPLEMENTED or DATA_LOSS.
CLEAN = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION,
         grpc.StatusCode.ALREADY_EXISTS, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE,
         grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE,
         grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED}
# Ends of a stream the test itself causes: it stops reading after a moment.
OURS = {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED}
SERVICES = ("Pump", "Cistern", "Drainer", "TSO", "Producer")
# Producer ids a fuzzed binlog may carry: none of them registered, so no fuzzed prewrite can be
# admitted (a registered one without a TxnStatus would be a stuck prewrite by design, holding
# the drainer until an operator decides it: that is tests/integration/test_untrusted_requests.py).
STRANGERS = ("", "nobody", "evil", "pump-1", "x" * 300, "ünïcode", "a/b", "\x00")
WRITER = "test-app"
WRITES_MAX = 4000      # the writer's bound (transactions)

_pool = descriptor_pool.Default()


class Pipeline:
    """The module's servers, the writer thread and what it acknowledged."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.cid = cluster.cluster_id
        cluster.start_tso()
        for p in ("pump-1", "pump-2"):
            cluster.start_pump(p, wait_online=False)
        for p in ("pump-1", "pump-2"):
            cluster.wait_pump_writable(cluster.pumps[p])
        self.drainer = cluster.start_drainer("d-fuzz", sink="file")
        self.loop = asyncio.new_event_loop()

        async def start_producer() -> ProducerServer:
            async def decide(start_ts: int) -> tuple[int, int]:
                return pb.TXN_UNKNOWN, 0
            server = ProducerServer(cluster.etcd, self.cid, "fuzz-producer", decide)
            await server.start()
            return server
        self.producer = self.loop.run_until_complete(start_producer())
        self.runner = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runner.start()
        self.targets = {"Pump": cluster.pumps["pump-1"].addr, "Cistern": self.drainer.addr,
                        "Drainer": self.drainer.addr, "TSO": cluster.tso_addrs[0],
                        "Producer": self.producer.addr}
        self.channels = {s: grpc.insecure_channel(a) for s, a in self.targets.items()}
        self.writer = TxnWriter(cluster, [table_info(1, "fz", "t1"), table_info(2, "fz", "t2")],
                                producer=WRITER)
        self.writer.declare("pump-1")
        self.now_ts = self.writer.ts.get()
        self._stop = threading.Event()
        self.write_errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._write, daemon=True)
        self._thread.start()

    def _write(self) -> None:
        try:
            done = 0
            while done < WRITES_MAX and not self._stop.is_set():
                self.writer.write(20, ["pump-1", "pump-2"], group=20)
                done += 20
                time.sleep(0.05)
        except BaseException as e:  # noqa: BLE001 - asserted by the test
            self.write_errors.append(e)

    def stop_writer(self) -> None:
        self._stop.set()
        self._thread.join(60)
        assert not self._thread.is_alive(), "the writer did not stop"

    def close(self) -> None:
        self._stop.set()
        for ch in self.channels.values():
            ch.close()
        self.writer.close()
        asyncio.run_coroutine_threadsafe(self.producer.stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.runner.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Pipeline]:  # type: ignore[no-untyped-def]
    cluster = Cluster(tmp_path_factory.mktemp("rpcfuzz"), etcd_module.endpoint,
                      cluster_id=free_port())
    p = None
    try:
        p = Pipeline(cluster)
        yield p
    finally:
        if p is not None:
            p.close()
        cluster.stop()


# -- requests ------------------------------------------------------------------------------

_INT_RANGES = {
    FieldDescriptor.TYPE_INT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SINT64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(1 << 63), (1 << 63) - 1),
    FieldDescriptor.TYPE_UINT64: (0, (1 << 64) - 1),
    FieldDescriptor.TYPE_FIXED64: (0, (1 << 64) - 1),
    FieldDescriptor.TYPE_INT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SINT32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(1 << 31), (1 << 31) - 1),
    FieldDescriptor.TYPE_UINT32: (0, (1 << 32) - 1),
    FieldDescriptor.TYPE_FIXED32: (0, (1 << 32) - 1),
}
_EDGES = (0, 1, -1, 2, (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 53) + 1,
          (1 << 62), (1 << 63) - 1, -(1 << 63), (1 << 64) - 1)


def _int(data: hst.DataObject, f: FieldDescriptor, p: Pipeline) -> int:
    lo, hi = _INT_RANGES[f.type]
    choices = [v for v in _EDGES if lo <= v <= hi]
    if f.name == "cluster_id" and data.draw(hst.integers(0, 9)) > 0:
        return p.cid   # mostly the real one, so the request gets past the first check
    if f.name == "cluster_id":
        choices += [p.cid + 1, p.cid - 1]
    elif f.name.endswith("ts") or f.name.endswith("_ts"):
        choices += [p.now_ts, p.now_ts + 1, p.now_ts + (1 << 30), p.now_ts - (1 << 30)]
    kind = data.draw(hst.sampled_from(["edge", "any", "near", "near"] if f.name.endswith("ts")
                                      else ["edge", "any"]))
    if kind == "near":   # around now: the past, the present and the future of the TSO
        return data.draw(hst.sampled_from([p.now_ts - (1 << 30), p.now_ts, p.now_ts + (1 << 18),
                                           p.now_ts + (1 << 40), 1 << 62]))
    v = data.draw(hst.sampled_from(choices)) if kind == "edge" else data.draw(hst.integers(lo, hi))
    return v if lo <= v <= hi else lo


def _string(data: hst.DataObject, f: FieldDescriptor, p: Pipeline) -> str:
    if "addr" in f.name:
        return data.draw(hst.sampled_from(["", "127.0.0.1:1", p.targets["Pump"], "nowhere",
                                           "[::1]:99999", "x" * 500]))
    if f.name.endswith("_id") or f.name in ("name", "producer"):
        return data.draw(hst.sampled_from(STRANGERS))
    return data.draw(hst.text(max_size=24))


def _bytes(data: hst.DataObject, f: FieldDescriptor, p: Pipeline, depth: int) -> bytes:
    kinds = ["random", "binlog", "binlog", "prewrite_value"]
    kind = data.draw(hst.sampled_from(kinds if "payload" in f.name else kinds[::3]))
    if kind == "random" or depth > 2:
        return data.draw(hst.binary(max_size=128))
    desc = pb.Binlog.DESCRIPTOR if kind == "binlog" else pb.PrewriteValue.DESCRIPTOR
    return message(data, desc, p, depth + 1).SerializeToString()


def _value(data: hst.DataObject, f: FieldDescriptor, p: Pipeline, depth: int) -> Any:
    t = f.type
    if t in _INT_RANGES:
        return _int(data, f, p)
    if t == FieldDescriptor.TYPE_BOOL:
        return data.draw(hst.booleans())
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return data.draw(hst.floats(width=32 if t == FieldDescriptor.TYPE_FLOAT else 64))
    if t == FieldDescriptor.TYPE_ENUM:
        # proto3 enums are open: numbers no value names are legal on the wire.
        known = [v.number for v in f.enum_type.values]
        return data.draw(hst.sampled_from(known) | hst.integers(-2, 12))
    if t == FieldDescriptor.TYPE_STRING:
        return _string(data, f, p)
    if t == FieldDescriptor.TYPE_BYTES:
        return _bytes(data, f, p, depth)
    raise AssertionError(f"unexpected field type {t}")


def message(data: hst.DataObject, desc: Descriptor, p: Pipeline, depth: int = 0) -> Any:
    """A valid message of type `desc` with each field absent or set to a value drawn from edge
    cases: wrong cluster ids, huge and negative numbers, unknown producers and pumps, empty
    strings, binlogs and prewrite values built the same way."""
    cls = _message_class(desc)
    msg = cls()
    for f in desc.fields:
        if data.draw(hst.integers(0, 2)) == 0 and not (f.name == "cluster_id" and depth == 0):
            continue
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 2 or f.message_type.GetOptions().map_entry:
                continue
            n = data.draw(hst.integers(0, 2)) if f.is_repeated else 1
            for _ in range(n):
                sub = message(data, f.message_type, p, depth + 1)
                if f.is_repeated:
                    getattr(msg, f.name).append(sub)
                else:
                    getattr(msg, f.name).CopyFrom(sub)
            continue
        if f.is_repeated:
            for _ in range(data.draw(hst.integers(0, 3))):
                getattr(msg, f.name).append(_value(data, f, p, depth))
        else:
            setattr(msg, f.name, _value(data, f, p, depth))
    if desc.full_name == "sluice.v1.Binlog":
        # Mostly the shape of one binlog type (fields set as that type has them), with the
        # values drawn above: a fuzzed binlog then gets past the first checks.
        shape = data.draw(hst.sampled_from(["free", "prewrite", "commit", "rollback", "fake"]))
        if shape == "prewrite":
            msg.tp = pb.PREWRITE
        elif shape == "commit":
            msg.tp = pb.COMMIT
            msg.commit_ts = max(msg.commit_ts, min(msg.start_ts + 1, (1 << 63) - 1))
        elif shape == "rollback":
            msg.tp = pb.ROLLBACK
        elif shape == "fake":   # a heartbeat carries nothing else; its ts is past or future
            t = data.draw(hst.sampled_from([msg.start_ts, p.now_ts - (1 << 30),
                                            p.now_ts + (1 << 40), 1 << 62]))
            msg = cls(tp=pb.FAKE, start_ts=t, commit_ts=t)
    return msg


def _message_class(desc: Descriptor) -> Any:
    from google.protobuf import message_factory
    return message_factory.GetMessageClass(desc)


def _flip(data: hst.DataObject, raw: bytes) -> bytes:
    buf = bytearray(raw)
    for _ in range(data.draw(hst.integers(1, 4))):
        pos = data.draw(hst.integers(0, len(buf)))
        op = data.draw(hst.sampled_from(["set", "cut", "insert"]))
        if op == "set" and pos < len(buf):
            buf[pos] = data.draw(hst.integers(0, 255))
        elif op == "cut":
            del buf[pos:]
        else:
            buf[pos:pos] = data.draw(hst.binary(min_size=1, max_size=6))
    return bytes(buf)


def _methods() -> list[tuple[str, Any]]:
    return [(s, m) for s in SERVICES for m in _pool.FindServiceByName(f"sluice.v1.{s}").methods]


def call(p: Pipeline, service: str, m: Any, requests: list[bytes]) -> grpc.StatusCode:
    """Send raw request bytes to one method; the status it ended with (streams: after at most
    one response, or 1.5 s)."""
    ch = p.channels[service]
    path = f"/sluice.v1.{service}/{m.name}"
    try:
        if m.client_streaming and m.server_streaming:
            stream = ch.stream_stream(path)(iter(requests), timeout=1.5)
            for _ in stream:
                stream.cancel()
                break
        elif m.server_streaming:
            stream = ch.unary_stream(path)(requests[0], timeout=1.5)
            for _ in stream:
                stream.cancel()
                break
        else:
            ch.unary_unary(path)(requests[0], timeout=10)
    except grpc.RpcError as e:
        code = e.code()
        assert code in CLEAN | OURS, f"{path}: {code} {e.details()!r}"
        if code in CLEAN:
            assert e.details(), f"{path}: {code} without a message"
        return code
    return grpc.StatusCode.OK


def test_fuzzed_requests_to_every_rpc_get_clean_answers_and_the_pipeline_delivers(
        pipe: Pipeline) -> None:
    """Every fuzzed request to every method of every server is answered OK or with a clean
    status code and a message (never UNKNOWN or INTERNAL); meanwhile and afterwards real
    transactions flow, and the drainer's sink holds each acknowledged one exactly once."""
    methods = _methods()
    assert len(methods) == 7 + 1 + 2 + 2 + 1, [f"{s}.{m.name}" for s, m in methods]
    seen: dict[str, set[str]] = {f"{s}.{m.name}": set() for s, m in methods}
    # The pump's writes are where a request can change what every drainer sees: three times
    # the share of the other methods.
    weighted = methods + [(s, m) for s, m in methods if m.name.startswith("WriteBinlog")] * 2
    started = time.monotonic()

    @settings(max_examples=1200, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                     HealthCheck.data_too_large])
    @given(hst.data())
    def check(data: hst.DataObject) -> None:
        service, m = data.draw(hst.sampled_from(weighted))
        kind = data.draw(hst.sampled_from(["random", "mutated", "flipped"]))
        n = data.draw(hst.integers(1, 3)) if m.client_streaming else 1
        requests = []
        for _ in range(n):
            if kind == "random":
                requests.append(data.draw(hst.binary(max_size=256)))
            else:
                raw = message(data, m.input_type, pipe).SerializeToString()
                requests.append(_flip(data, raw) if kind == "flipped" else raw)
        code = call(pipe, service, m, requests)
        seen[f"{service}.{m.name}"].add(code.name)

    check()
    fuzz_s = time.monotonic() - started
    assert all(seen.values()), f"methods never called: {[k for k, v in seen.items() if not v]}"
    assert not pipe.write_errors, f"the writer failed: {pipe.write_errors[0]!r}"
    pipe.stop_writer()
    # Still flowing: a last batch, then everything acknowledged is in the sink exactly once.
    last = pipe.writer.write(40, ["pump-1", "pump-2"], group=20)
    out = pipe.drainer.out_dir

    def caught_up() -> bool:
        assert pipe.drainer.proc.alive(), pipe.drainer.proc.log_text()[-3000:]
        got = {t["commit_ts"] for t in read_file_sink(out)} if out.exists() else set()
        return {a.commit_ts for a in last} <= got
    wait_until(caught_up, 60, 0.3, what="the drainer to deliver the last batch")
    check_exactly_once(out, pipe.writer.acked)
    # No fuzzed write moved a pump's timeline past the TSO (a client's FAKE at a future ts
    # once did: every later commit was refused as <= the served watermark).
    now = pipe.writer.ts.get()
    for name, h in pipe.cluster.pumps.items():
        ch, stub = h.stub()
        try:
            st = stub.Status(pb.PumpStatusReq(cluster_id=pipe.cid), timeout=10)
        finally:
            ch.close()
        assert st.max_commit_ts <= now and st.served_watermark <= now, (name, st)
    for h in pipe.cluster.pumps.values():
        assert h.proc.alive(), h.proc.log_text()[-3000:]
    print(f"[rpc-fuzz] {fuzz_s:.0f}s fuzzing, {len(pipe.writer.acked)} transactions; codes per "
          f"method: { {k: sorted(v) for k, v in seen.items()} }", flush=True)
