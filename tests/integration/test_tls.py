"""Mutual TLS (DESIGN §9): with `[security]` set, every gRPC server and etcd take only clients
that present a certificate signed by the cluster's CA; plaintext and certificate-less TLS are
refused. One module-scoped TLS cluster: etcd (TLS, client-cert-auth), a TSO, a pump, a drainer.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from sluice.core import grpcutil
from sluice.core.errors import EtcdUnavailable
from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, Registry
from sluice.core.tls import SecurityConfig
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from tests.support.certs import CertFiles, PKI, make_pki
from tests.support.cluster import set_args
from tests.support.procs import Proc, free_port, port_open, sluice_argv, wait_until

CLUSTER_ID = 23


def sec(files: CertFiles) -> SecurityConfig:
    return SecurityConfig(str(files.ca), str(files.cert), str(files.key))


@dataclass
class TLSCluster:
    pki: PKI
    etcd: str
    tso: str
    pump: str
    drainer: str
    procs: list[Proc]


def _wait(proc: Proc, cond, what: str, timeout: float = 40) -> None:  # type: ignore[no-untyped-def]
    def check() -> bool:
        assert proc.alive(), f"{proc.name} exited:\n{proc.log_text()[-3000:]}"
        return bool(cond())
    wait_until(check, timeout, 0.1, what=what)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSCluster]:
    work = tmp_path_factory.mktemp("tls")
    pki = make_pki(work / "pki")
    s = pki.server
    procs: list[Proc] = []
    try:
        cport, pport = free_port(), free_port()
        etcd_addr = f"127.0.0.1:{cport}"
        peer = f"http://127.0.0.1:{pport}"
        procs.append(Proc("etcd", [
            "etcd", "--name", "tls", "--data-dir", str(work / "etcd"),
            "--listen-client-urls", f"https://{etcd_addr}", "--advertise-client-urls",
            f"https://{etcd_addr}", "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"tls={peer}", "--log-level", "warn",
            "--cert-file", str(s.cert), "--key-file", str(s.key), "--trusted-ca-file", str(s.ca),
            "--client-cert-auth"], work / "etcd.log").start())
        wait_until(lambda: port_open(cport), 15, what="etcd to listen")
        client = Etcd(etcd_addr, sec(pki.client), timeout=2)
        try:
            client.wait_ready(15)
        finally:
            client.close()

        security = {f"security.{k}": v for k, v in s.security().items()}
        tso_addr = f"127.0.0.1:{free_port()}"
        procs.append(Proc("tso", sluice_argv("tso", *set_args({
            "cluster-id": CLUSTER_ID, "name": "tso-tls", "addr": tso_addr, "etcd": etcd_addr,
            "lease-ttl": 2, **security})), work / "tso.log").start())
        _wait(procs[-1], lambda: port_open(int(tso_addr.rsplit(":", 1)[1])), "tso to listen")

        pump_addr = f"127.0.0.1:{free_port()}"
        procs.append(Proc("pump", sluice_argv("pump", *set_args({
            "cluster-id": CLUSTER_ID, "node-id": "pump-tls", "addr": pump_addr,
            "data-dir": str(work / "pump"), "etcd": etcd_addr, "tso": [tso_addr],
            "heartbeat-interval": 0.5, "alive-ttl": 2,
            "storage.stop-write-at-available-space": 0, **security})), work / "pump.log").start())
        etcd = Etcd(etcd_addr, sec(pki.client), timeout=2)
        reg = Registry(etcd, CLUSTER_ID)

        def online(kind: NodeKind, node: str) -> bool:
            info = reg.get(kind, node)
            return info is not None and info.alive and info.state.value == "online"
        try:
            _wait(procs[-1], lambda: online(NodeKind.PUMP, "pump-tls"), "pump online")
            drainer_addr = ""
            try:
                import sluice.drainer.main  # noqa: F401 - the drainer may not be in this build
            except ModuleNotFoundError:
                pass
            else:
                drainer_addr = f"127.0.0.1:{free_port()}"
                procs.append(Proc("drainer", sluice_argv("drainer", *set_args({
                    "cluster-id": CLUSTER_ID, "name": "drainer-tls", "addr": drainer_addr,
                    "etcd": etcd_addr, "tso": [tso_addr], "alive-ttl": 2,
                    "checkpoint-interval": 0.5, "sink": "file", "to.dir": str(work / "out"),
                    **security})), work / "drainer.log").start())
                _wait(procs[-1], lambda: online(NodeKind.DRAINER, "drainer-tls"), "drainer online")
        finally:
            etcd.close()
        yield TLSCluster(pki, etcd_addr, tso_addr, pump_addr, drainer_addr, procs)
    finally:
        for p in reversed(procs):
            p.stop()


# -- how each kind of client dials ------------------------------------------------------------

def plaintext(addr: str) -> grpc.Channel:
    return grpc.insecure_channel(addr)


def tls_without_cert(addr: str, pki: PKI) -> grpc.Channel:
    creds = grpc.ssl_channel_credentials(root_certificates=pki.client.ca.read_bytes())
    return grpc.secure_channel(addr, creds)


def refused(call) -> None:  # type: ignore[no-untyped-def]
    """The server never ran the handler: the connection itself was refused."""
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, e.value


def bad_clients(c: TLSCluster, addr: str) -> list[grpc.Channel]:
    return [plaintext(addr), tls_without_cert(addr, c.pki),
            grpcutil.sync_channel(addr, sec(c.pki.rogue_client))]


# -- TSO ----------------------------------------------------------------------------------------

def get_ts(ch: grpc.Channel) -> int:
    return pbg.TSOStub(ch).GetTS(pb.GetTSReq(cluster_id=CLUSTER_ID, count=1), timeout=3).first_ts


def test_tso_serves_a_client_with_the_cluster_certificate(tls_cluster: TLSCluster) -> None:
    """With [security], a client presenting a certificate signed by the cluster CA is served."""
    with grpcutil.sync_channel(tls_cluster.tso, sec(tls_cluster.pki.client)) as ch:
        first = wait_until(lambda: get_ts(ch), 20, what="TSO leader to serve over TLS")
        assert get_ts(ch) > first  # type: ignore[operator]


def test_tso_refuses_plaintext_and_certificate_less_clients(tls_cluster: TLSCluster) -> None:
    """Plaintext, TLS without a client certificate, and a certificate from another CA: refused."""
    for ch in bad_clients(tls_cluster, tls_cluster.tso):
        with ch:
            refused(lambda: get_ts(ch))


# -- pump ---------------------------------------------------------------------------------------

def empty_write(ch: grpc.Channel) -> None:
    pbg.PumpStub(ch).WriteBinlog(pb.WriteBinlogReq(cluster_id=CLUSTER_ID), timeout=3)


def test_pump_serves_a_client_with_the_cluster_certificate(tls_cluster: TLSCluster) -> None:
    with grpcutil.sync_channel(tls_cluster.pump, sec(tls_cluster.pki.client)) as ch:
        wait_until(lambda: empty_write(ch) or True, 20, what="pump to accept a TLS write")


def test_pump_refuses_plaintext_and_certificate_less_clients(tls_cluster: TLSCluster) -> None:
    for ch in bad_clients(tls_cluster, tls_cluster.pump):
        with ch:
            refused(lambda: empty_write(ch))


# -- drainer ------------------------------------------------------------------------------------

def notify_wrong_cluster(ch: grpc.Channel) -> None:
    # A Notify for another cluster reaches the handler and is answered INVALID_ARGUMENT without
    # touching the drainer's merge: proof the TLS connection works, with no side effect.
    pbg.CisternStub(ch).Notify(pb.NotifyReq(cluster_id=CLUSTER_ID + 1, pump_id="x",
                                            pump_addr="127.0.0.1:1"), timeout=3)


def test_drainer_takes_only_mutual_tls(tls_cluster: TLSCluster) -> None:
    if not tls_cluster.drainer:
        pytest.skip("the drainer is not part of this build")
    with grpcutil.sync_channel(tls_cluster.drainer, sec(tls_cluster.pki.client)) as ch:
        with pytest.raises(grpc.RpcError) as e:
            notify_wrong_cluster(ch)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    for ch in bad_clients(tls_cluster, tls_cluster.drainer):
        with ch:
            refused(lambda: notify_wrong_cluster(ch))


# -- etcd ---------------------------------------------------------------------------------------

def test_etcd_takes_only_mutual_tls(tls_cluster: TLSCluster) -> None:
    """The processes registered through TLS etcd; a client without a certificate is refused."""
    good = Etcd(tls_cluster.etcd, sec(tls_cluster.pki.client), timeout=2)
    try:
        assert Registry(good, CLUSTER_ID).get(NodeKind.PUMP, "pump-tls") is not None
    finally:
        good.close()
    for bad in (Etcd(tls_cluster.etcd, None, timeout=1),
                Etcd(tls_cluster.etcd, sec(tls_cluster.pki.rogue_client), timeout=1)):
        try:
            with pytest.raises(EtcdUnavailable):
                bad.revision()
        finally:
            bad.close()


def test_private_key_never_reaches_the_logs(tls_cluster: TLSCluster) -> None:
    """Secrets are read from their files and never logged."""
    key_body = tls_cluster.pki.server.key.read_text().splitlines()[1]
    for p in tls_cluster.procs:
        assert key_body not in p.log_text(), f"{p.name} logged its private key"


def test_half_configured_security_is_refused_at_start(tmp_path: Path, tls_cluster: TLSCluster) -> None:
    """[security] with a CA but no certificate or key stops the process with exit 2."""
    proc = Proc("tso-half", sluice_argv("tso", *set_args({
        "cluster-id": CLUSTER_ID, "name": "tso-half", "addr": f"127.0.0.1:{free_port()}",
        "etcd": tls_cluster.etcd, "security.ssl-ca": str(tls_cluster.pki.server.ca)})),
        tmp_path / "tso-half.log").start()
    try:
        assert proc.popen is not None
        code = proc.popen.wait(30)
    finally:
        proc.stop()
    assert code == 2, proc.log_text()
    assert "ssl-cert" in proc.log_text()


def test_certificates_can_come_from_the_environment(tls_cluster: TLSCluster,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`ssl-key = "env:NAME"` reads the PEM from the environment (secrets injected by the
    container runtime); a missing variable is a ConfigError naming it, not its content."""
    from sluice.core.errors import ConfigError
    files = tls_cluster.pki.client
    monkeypatch.setenv("SLUICE_TEST_CLIENT_KEY", files.key.read_text())
    security = SecurityConfig(str(files.ca), str(files.cert), "env:SLUICE_TEST_CLIENT_KEY")
    with grpcutil.sync_channel(tls_cluster.tso, security) as ch:
        wait_until(lambda: get_ts(ch), 20, what="TSO to serve a client whose key came from env")
    monkeypatch.delenv("SLUICE_TEST_CLIENT_KEY")
    with pytest.raises(ConfigError, match="SLUICE_TEST_CLIENT_KEY is not set"):
        security.channel_credentials()
