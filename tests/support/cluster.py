"""A small real cluster for tests: etcd (fixture) + TSO + pump and drainer processes on free ports.

`TxnWriter` plays a producer: it writes random transactions to chosen pumps the way the client
does (prewrites acknowledged, then commit_ts from the TSO, then commits) and keeps the ack log
the sinks are checked against.
"""
from __future__ import annotations

import contextlib
import json
import random
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

from .binlogs import TS
from .procs import Proc, free_port, port_open, sluice_argv, wait_until

CLUSTER_ID = 7
# Producer ids the binlog builders of tests/support write with (binlogs.prewrite, rows.binlogs,
# TxnWriter; "load" of the fault tests' client load): every Cluster registers them, since pumps take prewrites only from registered
# producers (pump/admission.py).
TEST_PRODUCERS = ("test-producer", "cap-1", "test-app", "load")


def register_producer(etcd_endpoint: str, cluster_id: int, producer_id: str, addr: str = "",
                      labels: dict[str, str] | None = None) -> None:
    """Register a test producer in the registry (status online), as `client.producer` does for
    real ones. Without an address it has no TxnStatus: a prewrite of it left unresolved past
    txn-timeout is then a stuck prewrite the pump reports (pump/loops.py)."""
    from sluice.core.etcd import Etcd
    from sluice.core.registry import NodeKind, NodeState, NodeStatus, Registry
    etcd = Etcd(etcd_endpoint)
    try:
        Registry(etcd, cluster_id).register(NodeStatus(
            node_id=producer_id, kind=NodeKind.PRODUCER, addr=addr, state=NodeState.ONLINE,
            labels=dict(labels or {})))
    finally:
        etcd.close()


def toml_value(v: object) -> str:
    if isinstance(v, dict):   # an inline table, keys quoted (Spark's contain dots)
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_value(x)}" for k, x in v.items()) + "}"
    return json.dumps(v) if isinstance(v, (str, list)) else str(v).lower() if isinstance(v, bool) else str(v)


def set_args(settings: dict[str, object]) -> list[str]:
    out: list[str] = []
    for k, v in settings.items():
        out += ["--set", f"{k}={toml_value(v)}"]
    return out


@dataclass
class PumpHandle:
    node_id: str
    addr: str
    data_dir: Path
    proc: Proc
    settings: dict[str, object] = field(default_factory=dict)

    def stub(self) -> tuple[grpc.Channel, pbg.PumpStub]:
        ch = grpc.insecure_channel(self.addr, options=[("grpc.max_receive_message_length", 1 << 30),
                                                       ("grpc.max_send_message_length", 1 << 30)])
        return ch, pbg.PumpStub(ch)


@dataclass
class DrainerHandle:
    name: str
    addr: str
    proc: Proc
    sink: str
    out_dir: Path                     # the file sink's directory
    metrics_addr: str
    settings: dict[str, object] = field(default_factory=dict)

    def metrics(self) -> dict[str, float]:
        """Scrape /metrics: {"name{labels}": value}."""
        import urllib.request
        text = urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=2).read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def metric(self, name: str, default: float = 0.0) -> float:
        return self.metrics().get(name, default)


class Cluster:
    """Starts and always stops (by pid) the processes of one test."""

    def __init__(self, workdir: Path, etcd_endpoint: str, cluster_id: int = CLUSTER_ID) -> None:
        self.workdir = workdir
        self.etcd = etcd_endpoint
        self.cluster_id = cluster_id
        self.procs: list[Proc] = []
        self.tso_addrs: list[str] = []
        self.pumps: dict[str, PumpHandle] = {}
        self.drainers: dict[str, DrainerHandle] = {}
        self.producers: set[str] = set()

    def register_producer(self, producer_id: str) -> None:
        """Register a test producer (once) so pumps take its prewrites."""
        if producer_id not in self.producers:
            register_producer(self.etcd, self.cluster_id, producer_id)
            self.producers.add(producer_id)

    def start_tso(self, name: str = "tso-1", lease_ttl: int = 2, env: dict[str, str] | None = None) -> Proc:
        addr = f"127.0.0.1:{free_port()}"
        proc = Proc(name, sluice_argv("tso", *set_args({
            "cluster-id": self.cluster_id, "name": name, "addr": addr, "etcd": self.etcd,
            "lease-ttl": lease_ttl})), self.workdir / f"{name}.log", env=env).start()
        self.procs.append(proc)
        port = int(addr.rsplit(":", 1)[1])
        wait_until(lambda: port_open(port) or not proc.alive(), 20, what=f"{name} to listen")
        assert proc.alive(), proc.log_text()
        self.tso_addrs.append(addr)
        return proc

    def pump_settings(self, node_id: str, addr: str, data_dir: Path, **extra: object) -> dict[str, object]:
        settings: dict[str, object] = {
            "cluster-id": self.cluster_id, "node-id": node_id, "addr": addr,
            "data-dir": str(data_dir), "etcd": self.etcd, "tso": self.tso_addrs,
            "heartbeat-interval": 0.5, "pull-heartbeat-interval": 0.3, "alive-ttl": 2,
            "txn-timeout": 2.0, "gc-interval": 1.0,
            "storage.stop-write-at-available-space": 0,
        }
        settings.update(extra)
        return settings

    def start_pump(self, node_id: str = "pump-1", env: dict[str, str] | None = None,
                   wait_online: bool = True, **extra: object) -> PumpHandle:
        for producer_id in TEST_PRODUCERS:
            self.register_producer(producer_id)
        old = self.pumps.get(node_id)
        addr = old.addr if old else f"127.0.0.1:{free_port()}"
        data_dir = old.data_dir if old else self.workdir / node_id
        settings = self.pump_settings(node_id, addr, data_dir, **(old.settings if old else {}))
        settings.update(extra)
        proc = Proc(node_id, sluice_argv("pump", *set_args(settings)),
                    self.workdir / f"{node_id}.log", env=env).start()
        self.procs.append(proc)
        handle = PumpHandle(node_id, addr, data_dir, proc, {**(old.settings if old else {}), **extra})
        self.pumps[node_id] = handle
        if wait_online:
            self.wait_pump_writable(handle)
        return handle

    def wait_pump_writable(self, handle: PumpHandle, timeout: float = 30) -> None:
        ch, stub = handle.stub()

        def probe() -> bool:
            if not handle.proc.alive():
                raise AssertionError(f"{handle.node_id} exited:\n{handle.proc.log_text()[-3000:]}")
            try:
                stub.WriteBinlog(pb.WriteBinlogReq(cluster_id=self.cluster_id), timeout=1)
                return True
            except grpc.RpcError:
                return False
        try:
            wait_until(probe, timeout, 0.1, what=f"{handle.node_id} to accept writes")
        finally:
            ch.close()

    def drainer_settings(self, name: str, addr: str, sink: str, out_dir: Path,
                         metrics_addr: str, **extra: object) -> dict[str, object]:
        settings: dict[str, object] = {
            "cluster-id": self.cluster_id, "name": name, "addr": addr, "etcd": self.etcd,
            "tso": self.tso_addrs, "checkpoint-interval": 0.5, "alive-ttl": 2,
            "status-poll-interval": 0.2, "reconnect-max-backoff": 0.5, "sink": sink,
            "metrics-addr": metrics_addr,
        }
        if sink == "file":
            settings["to.dir"] = str(out_dir)
        elif sink == "spark":
            # The Iceberg warehouse (and its SQLite catalog) under the name's output dir, shared
            # by every instance of the name. Small, quick micro-batches: tests land few rows, and
            # a Spark session here takes 20-35 s to start, so wait for it with
            # start_drainer(wait_online=False) + wait_drainer_online(handle, timeout=...).
            from tests.support.spark import TEST_CONF
            settings.update({"to.warehouse": str(out_dir / "warehouse"),
                             "to.master": "local[2]", "to.shuffle-partitions": 1,
                             "to.batch-interval": 2.0, "to.log-level": "ERROR",
                             "to.spark-conf": TEST_CONF})
        settings.update(extra)
        return settings

    def start_drainer(self, name: str = "drainer-1", sink: str = "file",
                      env: dict[str, str] | None = None, wait_online: bool = True,
                      instance: str | None = None, **settings: object) -> DrainerHandle:
        """Start (or restart, same address and output dir) drainer `name`; extra settings are
        config keys (`initial-commit-ts`, `to.consumers`, ...).

        `instance` runs another process under the same drainer name (HA: pass `ha=True`), with
        its own address, metrics address and log, sharing the name's output dir (the sink's
        "shared storage"); its handle is `drainers[instance]`."""
        key = instance or name
        old = self.drainers.get(key)
        sibling = next((h for h in self.drainers.values() if h.name == name), None)
        addr = old.addr if old else f"127.0.0.1:{free_port()}"
        metrics_addr = old.metrics_addr if old else f"127.0.0.1:{free_port()}"
        out_dir = (old.out_dir if old else sibling.out_dir if sibling
                   else self.workdir / f"{name}-out")
        merged = {**(old.settings if old else {}), **settings}
        full = self.drainer_settings(name, addr, sink, out_dir, metrics_addr, **merged)
        proc = Proc(key, sluice_argv("drainer", *set_args(full)), self.workdir / f"{key}.log",
                    env=env).start()
        self.procs.append(proc)
        handle = DrainerHandle(name, addr, proc, sink, out_dir, metrics_addr, merged)
        self.drainers[key] = handle
        if wait_online:
            self.wait_drainer_online(handle)
        return handle

    def wait_drainer_online(self, handle: DrainerHandle, timeout: float = 30) -> None:
        from sluice.core.etcd import Etcd
        from sluice.core.registry import NodeKind, Registry
        etcd = Etcd(self.etcd, timeout=2)
        reg = Registry(etcd, self.cluster_id)

        def online() -> bool:
            if not handle.proc.alive():
                raise AssertionError(f"{handle.name} exited:\n{handle.proc.log_text()[-3000:]}")
            info = reg.get(NodeKind.DRAINER, handle.name)
            return (info is not None and info.alive and info.state.value == "online"
                    and info.status.addr == handle.addr
                    and "online: merging" in handle.proc.log_text())
        try:
            wait_until(online, timeout, 0.1, what=f"{handle.name} online")
        finally:
            etcd.close()

    def wait_drainer_standby(self, handle: DrainerHandle, timeout: float = 30) -> None:
        """Until an HA instance says it waits as a standby (another instance is active)."""
        def waiting() -> bool:
            if not handle.proc.alive():
                raise AssertionError(f"{handle.name} at {handle.addr} exited:\n"
                                     f"{handle.proc.log_text()[-3000:]}")
            return "waiting" in handle.proc.log_text()
        wait_until(waiting, timeout, 0.1, what=f"{handle.name} at {handle.addr} standing by")

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(Exception):
                proc.stop()


# ---------------------------------------------------------------------------------------------
# A producer for tests
# ---------------------------------------------------------------------------------------------

def table_info(table_id: int, db: str, name: str) -> pb.TableInfo:
    return pb.TableInfo(
        table_id=table_id, schema_name=db, table_name=name, version=1,
        columns=[pb.ColumnInfo(name="id", data_type="bigint", column_type="bigint(20)"),
                 pb.ColumnInfo(name="v", data_type="varchar", column_type="varchar(64)",
                               length=64, nullable=True)],
        indexes=[pb.IndexInfo(name="PRIMARY", columns=["id"], primary=True)])


@dataclass(frozen=True)
class Acked:
    """One acknowledged transaction: what a sink must hold exactly once."""

    start_ts: int
    commit_ts: int
    pump: str
    table: str                      # "db.name"
    rows: tuple[tuple[str, int, str], ...]   # (op, id, v)


class TxnWriter:
    """Writes random transactions to pumps like the client does; keeps the ack log."""

    def __init__(self, cluster: Cluster, tables: list[pb.TableInfo], seed: int = 1,
                 producer: str = "test-app") -> None:
        self.cluster = cluster
        self.tables = tables
        self.rng = random.Random(seed)
        self.producer = producer
        cluster.register_producer(producer)
        self.ts = TS(cluster.tso_addrs, cluster.cluster_id)
        self.acked: list[Acked] = []
        self.declared: set[int] = set()
        self._stubs: dict[str, tuple[grpc.Channel, pbg.PumpStub]] = {}
        self._next_id = 0

    def stub(self, pump: str) -> pbg.PumpStub:
        if pump not in self._stubs:
            self._stubs[pump] = self.cluster.pumps[pump].stub()
        return self._stubs[pump][1]

    def forget(self, pump: str) -> None:
        """Drop a cached channel (after the pump was restarted)."""
        entry = self._stubs.pop(pump, None)
        if entry is not None:
            entry[0].close()

    def _write(self, pump: str, payloads: list[bytes]) -> None:
        self.stub(pump).WriteBinlogs(pb.WriteBinlogsReq(cluster_id=self.cluster.cluster_id,
                                                        payloads=payloads), timeout=30)

    def declare(self, pump: str) -> list[Acked]:
        """One transaction declaring every table not yet declared (schema snapshots)."""
        infos = [t for t in self.tables if t.table_id not in self.declared]
        value = pb.PrewriteValue(schema_version=1, schema_snapshots=infos)
        acked = self._commit_group([(pump, value, "", ())])
        self.declared.update(t.table_id for t in infos)
        return acked

    def _random_txn(self) -> tuple[pb.PrewriteValue, str, tuple[tuple[str, int, str], ...]]:
        from sluice.core.rowcodec import python_to_datum
        t = self.rng.choice(self.tables)
        rows = []
        changes = []
        for _ in range(self.rng.randint(1, 3)):
            self._next_id += 1
            v = f"v{self.rng.randrange(10**6)}"
            rows.append(("c", self._next_id, v))
            changes.append(pb.RowChange(tp=pb.INSERT, after=pb.Row(columns=[
                python_to_datum(self._next_id), python_to_datum(v)])))
        value = pb.PrewriteValue(schema_version=1, mutations=[pb.TableMutation(
            table_id=t.table_id, schema_name=t.schema_name, table_name=t.table_name,
            table_version=1, changes=changes)])
        return value, f"{t.schema_name}.{t.table_name}", tuple(rows)

    def write(self, n: int, pumps: list[str], group: int = 500) -> list[Acked]:
        """n random transactions spread over pumps, in groups written with one RPC per pump."""
        out: list[Acked] = []
        while n > 0:
            k = min(group, n)
            n -= k
            txns = []
            for _ in range(k):
                value, table, rows = self._random_txn()
                txns.append((self.rng.choice(pumps), value, table, rows))
            out += self._commit_group(txns)
        return out

    def write_values(self, values: list[pb.PrewriteValue], pumps: list[str],
                     group: int = 500) -> list[Acked]:
        """These prewrite values as transactions committed in this order (each one's changes
        may depend on the previous ones'), spread over pumps; Acked in the values' order."""
        out: list[Acked] = []
        for i in range(0, len(values), group):
            out += self._commit_group([(self.rng.choice(pumps), v, "", ())
                                       for v in values[i:i + group]], ordered=True)
        return out

    def _commit_group(self, txns: list[tuple[str, pb.PrewriteValue, str, Any]],
                      ordered: bool = False) -> list[Acked]:
        from .binlogs import commit, prewrite
        first = self.ts.get(len(txns))
        starts = list(range(first, first + len(txns)))
        by_pump: dict[str, list[bytes]] = {}
        for (pump, value, _, _), s in zip(txns, starts):
            by_pump.setdefault(pump, []).append(
                prewrite(s, value.SerializeToString(), producer=self.producer))
        for pump, payloads in by_pump.items():
            self._write(pump, payloads)
        # commit_ts only after every prewrite was acknowledged (DESIGN §2.2), in random order.
        c0 = self.ts.get(len(txns))
        commit_ts = list(range(c0, c0 + len(txns)))
        if not ordered:
            self.rng.shuffle(commit_ts)
        by_pump = {}
        acked = []
        for (pump, _, table, rows), s, c in zip(txns, starts, commit_ts):
            by_pump.setdefault(pump, []).append(commit(s, c, producer=self.producer))
            acked.append(Acked(s, c, pump, table, rows))
        for pump, payloads in by_pump.items():
            self._write(pump, payloads)
        self.acked += acked
        return acked

    def close(self) -> None:
        for ch, _ in self._stubs.values():
            ch.close()
        self._stubs.clear()
        self.ts.close()


def read_file_sink(out_dir: Path) -> list[dict[str, Any]]:
    """Every transaction in a file sink's output, in file order: {commit_ts, id, rows: [...]}."""
    txns: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    files = sorted(p for p in out_dir.glob("binlog-*.jsonl"))
    for path in files:
        for line in path.read_text().splitlines():
            ev = json.loads(line)
            status = ev.get("status")
            if status == "BEGIN":
                assert current is None, f"BEGIN inside a transaction in {path.name}"
                current = {"commit_ts": ev["commit_ts"], "id": ev["id"], "rows": []}
            elif status == "END":
                assert current is not None and current["id"] == ev["id"], f"unmatched END in {path.name}"
                assert ev["event_count"] == len(current["rows"])
                txns.append(current)
                current = None
            elif "op" in ev:
                assert current is not None, f"row outside a transaction in {path.name}"
                src = ev["source"]
                assert src["commit_ts"] == current["commit_ts"]
                assert ev["transaction"]["id"] == current["id"]
                current["rows"].append((f"{src['db']}.{src['table']}", ev["op"],
                                        ev["after"]["id"], ev["after"]["v"]))
    assert current is None, "the output ends inside a transaction"
    return txns


def check_exactly_once(out_dir: Path, acked: list[Acked]) -> list[dict[str, Any]]:
    """The file sink holds each acked data transaction exactly once, in commit order, with its
    start_ts as id, its commit_ts and its rows; returns what was read."""
    got = read_file_sink(out_dir)
    cts = [t["commit_ts"] for t in got]
    assert cts == sorted(cts), "file sink is not in commit order"
    assert len(set(cts)) == len(cts), "a transaction appears twice"
    want = {a.commit_ts: a for a in acked if a.rows}
    by_ct = {t["commit_ts"]: t for t in got}
    missing = sorted(set(want) - set(by_ct))
    assert not missing, f"{len(missing)} acked transactions missing, first {missing[:5]}"
    for ct, a in want.items():
        t = by_ct[ct]
        assert t["id"] == str(a.start_ts)
        assert t["rows"] == [(a.table, op, i, v) for op, i, v in a.rows]
    return got


def drainer_pull(addr: str, after: int, want: set[int], consumer: str = "c1",
                 cluster_id: int = CLUSTER_ID, timeout: float = 30) -> list[pb.Binlog]:
    """Binlogs from a drainer's merged stream (grpc sink) after `after` until every commit_ts
    in want has arrived."""
    ch = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 1 << 30)])
    got: list[pb.Binlog] = []
    seen: set[int] = set()
    stream = pbg.DrainerStub(ch).PullBinlogs(
        pb.DrainerPullReq(cluster_id=cluster_id, after_commit_ts=after, consumer_id=consumer),
        timeout=timeout)
    try:
        for resp in stream:
            for raw in resp.binlogs:
                b = pb.Binlog.FromString(raw)
                got.append(b)
                if b.tp == pb.COMMIT:
                    seen.add(b.commit_ts)
            if want <= seen:
                return got
    finally:
        stream.cancel()
        ch.close()
    raise AssertionError("stream ended early")


def commits_in_order(binlogs: list[pb.Binlog]) -> list[int]:
    """Commit ts in stream order; checks every COMMIT follows its PREWRITE."""
    prewritten: set[int] = set()
    out = []
    for b in binlogs:
        if b.tp == pb.PREWRITE:
            prewritten.add(b.start_ts)
        elif b.tp == pb.COMMIT:
            assert b.start_ts in prewritten, "a COMMIT before its PREWRITE"
            out.append(b.commit_ts)
    return out


def fresh_ts(cluster: Cluster) -> int:
    """One timestamp from the cluster's TSO (e.g. a drainer's initial-commit-ts)."""
    t = TS(cluster.tso_addrs, cluster.cluster_id)
    try:
        return t.get()
    finally:
        t.close()


def load_in_background(w: TxnWriter, n: int, pumps: list[str], group: int = 100,
                       pause: float = 0.0) -> threading.Thread:
    """Write n transactions on a thread, `pause` seconds between groups (a load that lasts
    whatever the machine's speed); the thread's `errors` list holds what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            left = n
            while left > 0:
                k = min(group, left)
                w.write(k, pumps, group=group)
                left -= k
                if pause and left:
                    time.sleep(pause)
        except BaseException as e:  # noqa: BLE001 - re-raised by the test through `errors`
            errors.append(e)
    t = threading.Thread(target=run, daemon=True)
    t.errors = errors  # type: ignore[attr-defined]
    t.start()
    return t


@contextlib.contextmanager
def running_cluster(workdir: Path, etcd_endpoint: str, pumps: list[str],
                    wait_writable: bool = True) -> Iterator[Cluster]:
    """A TSO and these pumps (started together, then each waited on until writable); always
    stopped at the end. The usual body of a module-scoped `cluster` fixture."""
    c = Cluster(workdir, etcd_endpoint)
    try:
        c.start_tso()
        for p in pumps:
            c.start_pump(p, wait_online=not wait_writable)
        if wait_writable:
            for p in pumps:
                c.wait_pump_writable(c.pumps[p])
        yield c
    finally:
        c.stop()
