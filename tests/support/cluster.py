"""A small real cluster for tests: etcd (fixture) + TSO + pump processes on free ports."""
from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg

from .procs import Proc, free_port, port_open, sluice_argv, wait_until

CLUSTER_ID = 7


def toml_value(v: object) -> str:
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


class Cluster:
    """Starts and always stops (by pid) the processes of one test."""

    def __init__(self, workdir: Path, etcd_endpoint: str, cluster_id: int = CLUSTER_ID) -> None:
        self.workdir = workdir
        self.etcd = etcd_endpoint
        self.cluster_id = cluster_id
        self.procs: list[Proc] = []
        self.tso_addrs: list[str] = []
        self.pumps: dict[str, PumpHandle] = {}

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

    def stop(self) -> None:
        for proc in reversed(self.procs):
            with contextlib.suppress(Exception):
                proc.stop()
