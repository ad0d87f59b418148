"""`sluice cluster`: when a process counts as healthy, and waiting until it is."""
from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from sluice.core.errors import Unavailable

from .cluster_config import Layout
from .cluster_state import RUNNING, Recorded, State, read_state, running
from .cluster_procs import POLL_S, describe_exit, tail


# ---------------------------------------------------------------------------------------------
# Health
# ---------------------------------------------------------------------------------------------

class Health:
    """Probes of one cluster's processes (etcd, TSO, registry), with the cluster's TLS."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.security = state.security_config()
        self._etcd: Any = None
        self._registry: Any = None

    @property
    def registry(self) -> Any:
        if self._registry is None:
            from sluice.core.etcd import Etcd
            from sluice.core.registry import Registry
            self._etcd = Etcd(self.state.etcd, self.security if self.security.enabled else None,
                              timeout=2)
            self._registry = Registry(self._etcd, self.state.cluster_id)
        return self._registry

    def close(self) -> None:
        if self._etcd is not None:
            self._etcd.close()

    def etcd_ready(self) -> bool:
        self.registry.etcd.revision()
        return True

    def tso_role(self, r: Recorded) -> str:
        """'leader' or 'standby' when the TSO answers GetTS; raises while it does not."""
        import grpc

        from sluice.core import grpcutil
        from sluice.proto import sluice_pb2 as pb
        from sluice.proto import sluice_pb2_grpc as pbg
        with grpcutil.sync_channel(r.addr, self.security) as ch:
            try:
                pbg.TSOStub(ch).GetTS(pb.GetTSReq(cluster_id=self.state.cluster_id, count=1),
                                      timeout=2)
                return "leader"
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.UNAVAILABLE and "leader" in (e.details() or ""):
                    return "standby"
                raise

    def node(self, kind: str, node_id: str) -> Any:
        from sluice.core.registry import NodeKind
        k = {"pump": NodeKind.PUMP, "drainer": NodeKind.DRAINER, "capture": NodeKind.PRODUCER}[kind]
        return self.registry.get(k, node_id)

    def drainer_role(self, r: Recorded) -> str:
        """An HA drainer instance's role: 'active' (it holds the leader key), 'standby' (its
        standby key is alive) or 'waiting' (neither yet: starting, or stopped)."""
        from sluice.drainer.ha import list_standbys, read_leader
        leader = read_leader(self.registry, r.node_id)
        if leader is not None and leader.addr == r.addr:
            return "active"
        return "standby" if r.addr in list_standbys(self.registry, r.node_id) else "waiting"

    def healthy(self, r: Recorded) -> bool:
        if r.kind == "drainer" and r.standby:
            # A standby serves nothing until it takes over; it is healthy once it waits in etcd.
            return self.drainer_role(r) in ("standby", "active")
        if r.kind == "etcd":
            return self.etcd_ready()
        if r.kind == "tso":
            return self.tso_role(r) in ("leader", "standby")
        if r.kind in ("pump", "drainer") and not r.standby:
            info = self.node(r.kind, r.node_id)
            return bool(info is not None and info.alive and info.state.value == "online")
        if r.kind == "capture" and r.metrics_addr:
            return capture_streaming(r.metrics_addr)
        return port_open(r.addr)

    def tso_leader_ready(self, tsos: list[Recorded]) -> bool:
        return any(self.tso_role(r) == "leader" for r in tsos)


def capture_streaming(metrics_addr: str) -> bool:
    """The capture passed its start-up checks and recovery and reads the binlog."""
    import urllib.request
    with urllib.request.urlopen(f"http://{metrics_addr}/metrics", timeout=2) as resp:
        text = resp.read().decode()
    return 'sluice_capture_state{state="streaming"} 1.0' in text


def port_open(addr: str) -> bool:
    host, _, port = addr.rpartition(":")
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host or "127.0.0.1", int(port))) == 0


def wait_healthy(r: Recorded, check: Callable[[], bool], timeout: float, what: str,
                 layout: Layout | None = None) -> None:
    """Probe `check` until it passes; fail at once when r ends (or is restarted) meanwhile."""
    end = time.monotonic() + timeout
    last = ""
    while True:
        ended = _ended_since(r, layout)
        if ended is not None:
            how = describe_exit(ended)
            raise Unavailable(f"{r.name} exited during start-up{f' ({how})' if how else ''}; "
                              f"last lines of {r.log}:\n" + "\n".join(tail(r.log, 15)))
        try:
            if check():
                return
        except Exception as e:  # noqa: BLE001 - probed again until the deadline
            last = f" (last probe: {type(e).__name__}: {str(e)[:200]})"
        if time.monotonic() > end:
            raise Unavailable(f"{r.name} not {what} after {timeout:.0f}s{last}; see {r.log}")
        time.sleep(POLL_S)


def _ended_since(r: Recorded, layout: Layout | None) -> Recorded | None:
    """r's current record when the run r describes has ended, else None."""
    if layout is None:
        return None if running(r) else r
    state = read_state(layout)
    now = state.find(r.name) if state is not None else r
    if now.pid == r.pid and now.status == RUNNING and running(now):
        return None
    # The supervisor may not have noticed yet: wait for its record of how the run ended.
    deadline = time.monotonic() + 2
    while now.pid == r.pid and now.status == RUNNING and time.monotonic() < deadline:
        time.sleep(POLL_S)
        state = read_state(layout)
        now = state.find(r.name) if state is not None else r
    return now
