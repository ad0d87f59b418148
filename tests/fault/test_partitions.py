"""Faults between hosts (issue #20 item 6): etcd, two TSOs, two pumps, a MySQL drainer, a
capture and the two MariaDBs each run as a separate host in a network namespace of the test's
own (tests/support/netns.py), addressed by its own 10.x address. Under a bounded random load on
the source, the test cuts and heals, in turn, the links listed in FAULTS, plus 200 ms latency and
connection resets on the drainer's link to its downstream (a proxy of the test's own: this
kernel has no `tc netem`). Each fault must be visible in `sluice ctl` or the metrics while it
lasts, the pipeline must deliver a probe row after each heal, and at the end the downstream
equals the source (nothing lost, nothing applied twice).

Runs only where `ip netns` works (root); skipped with the reason otherwise.
"""
from __future__ import annotations

import contextlib
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pymysql
import pytest

from tests.support.capture import SourceLoad, gtid_pos
from tests.support.cluster import set_args
from tests.support.netns import ChaosProxy, Net, NsMariaDB, netns_unavailable
from tests.support.pipeline import differences
from tests.support.procs import PYTHON, Proc, sluice_argv, wait_until

_WHY_NOT = netns_unavailable()
pytestmark = [pytest.mark.timeout(420), pytest.mark.mariadb,
              pytest.mark.skipif(bool(_WHY_NOT), reason=f"needs network namespaces: {_WHY_NOT}")]

CLUSTER_ID = 31
SCHEMA = "nx"
PRODUCER = "cap-nx"
DRAINER = "d-nx"
PUMPS = ("pump-1", "pump-2")
TSOS = ("tso-1", "tso-2")
HOSTS = ("etcd", *TSOS, *PUMPS, "drainer", "capture", "source", "downstream", "proxy", "obs")
MAX_TXNS = 6000          # the load's bound in count (and LOAD_PACE_S between transactions)
LOAD_PACE_S = 0.03
FAULT_S = 45.0           # the longest a fault may take to become visible
PROBE_S = 120.0          # a probe row through the whole pipeline after a heal


class NsLoad(SourceLoad):
    """Random source transactions (inserts, updates, deletes over three tables) on a thread,
    over the source's unix socket, bounded in count (MAX_TXNS) and paced."""

    def __init__(self, db: NsMariaDB, schema: str, seed: int) -> None:
        super().__init__(db, schema, seed)
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _connect(self) -> Any:
        return self.db.connect(autocommit=False)

    def start(self, pace_s: float) -> None:
        def run() -> None:
            try:
                self.run(MAX_TXNS, self._stop, pace_s)
            except BaseException as e:  # noqa: BLE001 - surfaced by stop()/check()
                self.error = e
        self._thread = threading.Thread(target=run, name="netns-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            assert not self._thread.is_alive(), "the source load did not stop"
        self.check()

    def check(self) -> None:
        if self.error is not None:
            raise AssertionError(f"the source load failed: {self.error!r}") from self.error


class Hosts:
    """The processes of the run, each in its host; stopped (by pid) by `stop`."""

    def __init__(self, net: Net, workdir: Path) -> None:
        self.net, self.workdir = net, workdir
        self.procs: dict[str, Proc] = {}
        self.etcd = f"{net.ip('etcd')}:2379"
        self.tso = [f"{net.ip(t)}:7000" for t in TSOS]
        self.metrics_addr = {h: f"{net.ip(h)}:9100" for h in ("drainer", "capture", *PUMPS)}
        self.source = NsMariaDB(net, "source", workdir / "source", server_id=1)
        self.downstream = NsMariaDB(net, "downstream", workdir / "downstream", server_id=2,
                                    extra_args=["--gtid-domain-id=2"])
        self.proxy = ChaosProxy(net, "proxy", 3306, (net.ip("downstream"), 3306))
        self.load: NsLoad | None = None
        self.probes = 0

    # -- processes ---------------------------------------------------------------------------

    def start(self, name: str, host: str, argv: list[str]) -> Proc:
        proc = Proc(name, self.net.argv(host, *argv), self.workdir / f"{name}.log").start()
        self.procs[name] = proc
        return proc

    def sluice(self, name: str, host: str, command: str, settings: dict[str, object]) -> Proc:
        return self.start(name, host, sluice_argv(command, *set_args(settings)))

    def wait_log(self, name: str, text: str, timeout: float = 60) -> None:
        proc = self.procs[name]

        def seen() -> bool:
            assert proc.alive(), f"{name} exited:\n{proc.log_text()[-3000:]}"
            return text in proc.log_text()
        wait_until(seen, timeout, 0.1, what=f"{name} to log {text!r}")

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            assert p.alive(), f"{name} exited ({p.popen.returncode}):\n{p.log_text()[-3000:]}"  # type: ignore[union-attr]
        if self.load is not None:
            self.load.check()

    def start_all(self) -> None:
        self.source.start()
        self.downstream.start()
        self.proxy.start()
        url = f"http://{self.etcd}"
        peer = f"http://{self.net.ip('etcd')}:2380"
        self.start("etcd", "etcd", [
            "etcd", "--name", "default", "--data-dir", str(self.workdir / "etcd-data"),
            "--listen-client-urls", url, "--advertise-client-urls", url,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}", "--log-level", "warn"])
        # Up when ctl can ask it (the cluster has no keys yet: "no cluster with id").
        wait_until(lambda: (r := self.ctl_raw("pumps")).returncode == 0
                   or "no cluster with id" in r.stderr, 30, 0.3, what="etcd to answer")
        for t, addr in zip(TSOS, self.tso):
            self.sluice(t, t, "tso", {"cluster-id": CLUSTER_ID, "name": t, "addr": addr,
                                      "etcd": self.etcd, "lease-ttl": 3})
        wait_until(lambda: self.tso_leader(), 30, 0.3, what="a TSO leader")
        for p in PUMPS:
            self.sluice(p, p, "pump", {
                "cluster-id": CLUSTER_ID, "node-id": p, "addr": f"{self.net.ip(p)}:8250",
                "data-dir": str(self.workdir / p), "etcd": self.etcd, "tso": self.tso,
                "heartbeat-interval": 0.5, "pull-heartbeat-interval": 0.3, "alive-ttl": 2,
                "txn-timeout": 3.0, "gc-interval": 1.0, "metrics-addr": self.metrics_addr[p],
                "storage.stop-write-at-available-space": 0})
        wait_until(lambda: all(n["alive"] for n in self.ctl("pumps")) and
                   len(self.ctl("pumps")) == len(PUMPS), 60, 0.3, what="both pumps alive")
        self.source.execute("CREATE DATABASE IF NOT EXISTS nx_before")
        gtid_before = gtid_pos(self.source)
        t0 = int(self.ctl("tso")["ts"])
        self.sluice("drainer", "drainer", "drainer", {
            "cluster-id": CLUSTER_ID, "name": DRAINER, "addr": f"{self.net.ip('drainer')}:8249",
            "etcd": self.etcd, "tso": self.tso, "checkpoint-interval": 0.5, "alive-ttl": 2,
            "status-poll-interval": 0.2, "reconnect-max-backoff": 0.5, "sink": "mysql",
            "metrics-addr": self.metrics_addr["drainer"], "initial-commit-ts": t0,
            "to.host": self.net.ip("proxy"), "to.port": 3306, "to.user": "root",
            "to.password": self.downstream.password, "to.worker-count": 4,
            "to.checkpoint-schema": "sluice_cp", "to.retry-backoff-ms": 20})
        self.wait_log("drainer", "online: merging", 90)
        self.sluice("capture", "capture", "capture", {
            "producer-id": PRODUCER, "cluster-id": CLUSTER_ID, "etcd": self.etcd,
            "tso": self.tso, "addr": f"{self.net.ip('capture')}:7100",
            "start-position": f"gtid:{gtid_before}", "heartbeat-s": 0.5,
            "group-max-wait-ms": 5, "metrics-addr": self.metrics_addr["capture"],
            "source.host": self.net.ip("source"), "source.port": 3306, "source.user": "root",
            "source.password": self.source.password, "source.server-id": 20031,
            "source.name": "src"})
        self.wait_log("capture", "capture streaming", 60)
        self.load = NsLoad(self.source, SCHEMA, seed=int(time.time()) % 10000)
        self.load.create()
        self.load.ddl(f"CREATE TABLE {SCHEMA}.probe (id INT PRIMARY KEY, step VARCHAR(64)) "
                      "ENGINE=InnoDB")
        self.load.start(LOAD_PACE_S)

    def stop(self) -> None:
        if self.load is not None:
            with contextlib.suppress(BaseException):
                self.load.stop()
            with contextlib.suppress(Exception):
                self.load.close()
        for name in ("capture", "drainer", *PUMPS, *TSOS, "etcd"):
            if name in self.procs:
                with contextlib.suppress(Exception):
                    self.procs[name].stop()
        self.proxy.stop()
        for db in (self.source, self.downstream):
            with contextlib.suppress(Exception):
                db.stop()

    # -- observing (from the `obs` host: the test's own namespace is not on the bridge) ---------

    def ctl_raw(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = self.net.argv("obs", *sluice_argv("ctl", "--etcd", self.etcd, "--cluster-id",
                                                 str(CLUSTER_ID), "--json", *args))
        return subprocess.run(argv, capture_output=True, text=True, timeout=60)

    def ctl(self, *args: str) -> Any:
        r = self.ctl_raw(*args)
        assert r.returncode == 0, f"sluice ctl {' '.join(args)}: {r.stdout}{r.stderr}"
        return json.loads(r.stdout)

    def node(self, kind: str, node_id: str) -> dict[str, Any]:
        return next(n for n in self.ctl(kind) if n["node_id"] == node_id)

    def tso_leader(self) -> str:
        code = ("import sys; from sluice.core.etcd import Etcd; "
                "from sluice.core.tso_client import read_leader; "
                f"e = Etcd({self.etcd!r}, timeout=2); l = read_leader(e, {CLUSTER_ID}); "
                "print(l.name if l else '')")
        r = subprocess.run(self.net.argv("obs", PYTHON, "-c", code), capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip()

    def metrics(self, host: str) -> dict[str, float]:
        addr = self.metrics_addr[host]

        def scrape() -> str:
            return urllib.request.urlopen(f"http://{addr}/metrics", timeout=3).read().decode()
        out: dict[str, float] = {}
        for line in self.net.run_in("obs", scrape).splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    # -- checks ----------------------------------------------------------------------------

    def observe(self, what: str, cond: Callable[[], object]) -> object:
        """Until cond() holds while the fault lasts (processes must stay up meanwhile)."""
        def check() -> object:
            self.check_alive()
            return cond()
        return wait_until(check, FAULT_S, 0.5, what=what)

    def probe(self, step: str) -> float:
        """A probe row written at the source after the heal reaches the downstream."""
        t0 = time.monotonic()
        self.probes += 1
        n = self.probes
        self.source.execute(f"INSERT INTO {SCHEMA}.probe VALUES (%s, %s)", (n, step))

        def arrived() -> bool:
            self.check_alive()
            try:
                return bool(self.downstream.execute(
                    f"SELECT 1 FROM {SCHEMA}.probe WHERE id = %s", (n,)))
            except pymysql.MySQLError:
                return False
        wait_until(arrived, PROBE_S, 0.3, what=f"probe {n} ({step}) in the downstream")
        return time.monotonic() - t0

    def lag(self) -> float:
        return float(self.node("drainers", DRAINER).get("lag_seconds") or 0.0)


@contextlib.contextmanager
def step(name: str, hosts: Hosts, timings: list[tuple[str, float, float]]) -> Iterator[None]:
    t0 = time.monotonic()
    print(f"[partitions] {name}", flush=True)
    try:
        yield
    except BaseException:
        print(f"[partitions] FAILED in {name!r}; log tails:", flush=True)
        for pname, p in hosts.procs.items():
            print(f"----- {pname} ({'alive' if p.alive() else 'exited'}) -----\n"
                  f"{p.log_text()[-2500:]}", flush=True)
        raise
    recover = hosts.probe(name)
    timings.append((name, time.monotonic() - t0, recover))
    print(f"[partitions] {name}: {timings[-1][1]:.1f}s, probe after heal {recover:.1f}s",
          flush=True)


def test_partitions_between_hosts_lose_nothing_and_show_while_they_last(tmp_path: Path) -> None:
    """Each network fault between hosts is visible in `sluice ctl` or metrics while it lasts,
    replication resumes after each heal, and at the end the downstream equals the source."""
    timings: list[tuple[str, float, float]] = []
    started = time.monotonic()
    with Net(HOSTS) as net:
        hosts = Hosts(net, tmp_path)
        try:
            hosts.start_all()
            hosts.probe("start")
            net_ = hosts.net

            with step("drainer <-> pump-1 cut", hosts, timings):
                with net_.cutting("drainer", ["pump-1"]):
                    hosts.observe("the drainer's merge held by pump-1, lag growing", lambda: (
                        hosts.metrics("drainer").get(
                            'sluice_drainer_merge_holding{pump="pump-1"}') == 1.0
                        and hosts.lag() > 3.0))

            with step("pump-1 <-> etcd cut", hosts, timings):
                with net_.cutting("pump-1", ["etcd"]):
                    hosts.observe("`ctl pumps`: pump-1 not alive",
                                  lambda: hosts.node("pumps", "pump-1")["alive"] is False)

            with step("capture <-> pumps cut", hosts, timings):
                restarts = hosts.metrics("capture").get("sluice_capture_restarts_total", 0.0)
                with net_.cutting("capture", list(PUMPS)):
                    # It cannot commit to the pumps: it restarts in-process (new epoch,
                    # recovery from the pumps) until they answer again.
                    hosts.observe("capture restarting, or its source lag growing", lambda: (
                        (m := hosts.metrics("capture")).get("sluice_capture_restarts_total", 0.0)
                        > restarts or m.get("sluice_capture_source_lag_seconds", 0.0) > 3.0))

            with step("TSO leader <-> etcd cut", hosts, timings):
                leader = hosts.tso_leader()
                assert leader in TSOS
                with net_.cutting(leader, ["etcd"]):
                    hosts.observe(f"a TSO leader other than {leader}",
                                  lambda: hosts.tso_leader() not in ("", leader))

            with step("drainer <-> downstream cut", hosts, timings):
                with net_.cutting("drainer", ["proxy"]):
                    hosts.observe("`ctl drainers`: lag growing", lambda: hosts.lag() > 4.0)

            with step("pump-2 fully partitioned", hosts, timings):
                with net_.partitioned("pump-2"):
                    hosts.observe("`ctl pumps`: pump-2 not alive, and the drainer lags",
                                  lambda: hosts.node("pumps", "pump-2")["alive"] is False
                                  and hosts.lag() > 3.0)

            with step("drainer -> downstream: 200 ms latency, resets", hosts, timings):
                proxy = hosts.proxy
                try:
                    proxy.delay_s, proxy.reset_every_s = 0.2, 2.0
                    resets = proxy.resets
                    hosts.observe("`ctl drainers`: lag over 2 s on the slow, flaky link",
                                  lambda: hosts.lag() > 2.0 and proxy.resets > resets)
                finally:
                    proxy.delay_s, proxy.reset_every_s = 0.0, 0.0

            assert hosts.load is not None
            hosts.load.stop()
            assert hosts.load.committed > 100, f"only {hosts.load.committed} load transactions"
            hosts.probe("end")

            def same() -> list[str]:
                hosts.check_alive()
                return differences(hosts.source, hosts.downstream, SCHEMA)
            try:
                wait_until(lambda: not same(), 120, 1.0, what="the downstream to equal the source")
            except TimeoutError:
                raise AssertionError("downstream differs from the source:\n" + "\n".join(same()))
            print(f"[partitions] {hosts.load.committed} transactions; steps (s, probe s): "
                  f"{[(n, round(a, 1), round(b, 1)) for n, a, b in timings]}; "
                  f"total {time.monotonic() - started:.0f}s", flush=True)
        finally:
            hosts.stop()
    assert time.monotonic() - started < 360, "the partition matrix must stay under 6 minutes"
