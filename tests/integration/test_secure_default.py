"""Secure by default (issue #20 item 5): `sluice cluster up` without any security setting makes
its own CA and certificates and runs etcd and every gRPC server with mutual TLS; `sluice ctl
--cluster-dir` finds the client certificate; a client without a certificate signed by the
cluster's CA (plaintext, TLS without a certificate, a certificate of another CA) is refused by
etcd, the TSO, the pump and the drainer. Plaintext only with `insecure = true`.
"""
from __future__ import annotations

import os
import signal
import subprocess
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from sluice.core import grpcutil, pki
from sluice.core.errors import ConfigError, EtcdUnavailable
from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, Registry
from sluice.core.tls import SecurityConfig
from sluice.ctl import cluster_config as cc
from sluice.ctl.cluster import read_state, running
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from tests.support.procs import REPO, sluice_argv

CLUSTER_ID = 12
SMALL = f"""
cluster-id = {CLUSTER_ID}
start-timeout = 40.0
stop-timeout = 10.0

[tso]
count = 1
lease-ttl = 2

[pump]
count = 1
config = {{ alive-ttl = 2, heartbeat-interval = 0.5, storage = {{ stop-write-at-available-space = 0 }} }}

[[drainers]]
name = "drainer-file"
sink = "file"
config = {{ alive-ttl = 2, checkpoint-interval = 0.5 }}
"""


def run(*args: str, timeout: float = 90, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("SLUICE_ETCD", "SLUICE_CLUSTER_ID", "SLUICE_CLUSTER_DIR")}
    return subprocess.run(sluice_argv(*args), capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env)


def kill_cluster(d: Path) -> None:
    """Nothing the test started survives it (by recorded pid, supervisor first)."""
    state = read_state(cc.Layout(d))
    if state is None:
        return
    if state.supervisor is not None and running(state.supervisor):
        os.kill(state.supervisor.pid, signal.SIGKILL)
    for r in state.processes:
        if running(r):
            os.kill(r.pid, signal.SIGKILL)


@dataclass
class Up:
    dir: Path
    etcd: str
    addrs: dict[str, str]          # process name -> address
    rogue: pki.CertsDir            # certificates of another CA


def up_cluster(tmp: Path, extra: str = "") -> Path:
    conf = tmp / "cluster.toml"
    conf.write_text(extra + SMALL)
    d = tmp / "cluster"
    out = run("cluster", "up", "--dir", str(d), "--config", str(conf))
    assert out.returncode == 0, out.stdout + out.stderr
    return d


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    tmp = tmp_path_factory.mktemp("secure")
    d = tmp / "cluster"
    try:
        up_cluster(tmp)
        state = read_state(cc.Layout(d))
        assert state is not None
        rogue = tmp / "rogue"
        pki.ensure(rogue)
        yield Up(d, state.etcd, {r.name: r.addr for r in state.processes}, pki.CertsDir(rogue))
    finally:
        kill_cluster(d)


def client(up: Up) -> SecurityConfig:
    return pki.CertsDir(up.dir / "certs").client_security()


def bad_clients(up: Up, addr: str) -> list[tuple[str, grpc.Channel]]:
    ca = (up.dir / "certs" / "ca.pem").read_bytes()
    # The rogue client trusts our CA (so it could verify the server): the refusal is the
    # server's, because it cannot verify the client's certificate.
    rogue = SecurityConfig(str(up.dir / "certs" / "ca.pem"), str(up.rogue.client),
                           str(up.rogue.client_key))
    return [("plaintext", grpc.insecure_channel(addr)),
            ("TLS without a certificate",
             grpc.secure_channel(addr, grpc.ssl_channel_credentials(root_certificates=ca))),
            ("a certificate of another CA", grpcutil.sync_channel(addr, rogue))]


def refused(what: str, call) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as e:
        call()
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, f"{what}: {e.value}"


def get_ts(ch: grpc.Channel) -> int:
    return pbg.TSOStub(ch).GetTS(pb.GetTSReq(cluster_id=CLUSTER_ID, count=1), timeout=3).first_ts


def empty_write(ch: grpc.Channel) -> None:
    pbg.PumpStub(ch).WriteBinlog(pb.WriteBinlogReq(cluster_id=CLUSTER_ID), timeout=3)


def notify_other_cluster(ch: grpc.Channel) -> None:
    # Answered INVALID_ARGUMENT by the handler without touching the merge: proof the connection
    # works, with no side effect.
    pbg.CisternStub(ch).Notify(pb.NotifyReq(cluster_id=CLUSTER_ID + 1, pump_id="x",
                                            pump_addr="127.0.0.1:1"), timeout=3)


def test_up_makes_the_cluster_pki_and_runs_everything_with_mutual_tls(secure: Up) -> None:
    """Without [security] or `insecure`, `up` makes ca/node/client certificates (keys 0600) and
    every process config and etcd use them."""
    certs = pki.CertsDir(secure.dir / "certs")
    assert certs.complete()
    for key in (certs.ca_key, certs.node_key, certs.client_key):
        assert key.stat().st_mode & 0o077 == 0, f"{key} readable by others"
    state = read_state(cc.Layout(secure.dir))
    assert state is not None
    for r in state.processes:
        if r.kind == "etcd":
            assert "--client-cert-auth" in r.argv and f"https://{r.addr}" in r.argv
        else:
            conf = tomllib.loads(Path(r.config_path).read_text())
            assert conf["security"]["ssl-cert"] == str(certs.node), r.name


def test_ctl_with_cluster_dir_finds_the_client_certificate(secure: Up) -> None:
    """`sluice ctl --cluster-dir DIR` reads DIR/ctl.toml: etcd, cluster id, client certificate."""
    out = run("ctl", "--cluster-dir", str(secure.dir), "pumps", "--json")
    assert out.returncode == 0, out.stderr
    assert '"pump-1"' in out.stdout
    out = run("ctl", "--cluster-dir", str(secure.dir), "tso")
    assert out.returncode == 0, out.stderr


def test_ctl_with_no_settings_uses_the_default_cluster_dir_here(secure: Up, tmp_path: Path) -> None:
    """With nothing saying where the cluster is, ctl reads ./.sluice-cluster/ctl.toml (the
    default dir of `sluice cluster up`) instead of dialling 127.0.0.1:2379 in plaintext."""
    (tmp_path / ".sluice-cluster").symlink_to(secure.dir)
    out = run("ctl", "pumps", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert '"pump-1"' in out.stdout


def test_ctl_without_certificates_is_refused_with_a_tls_hint(secure: Up) -> None:
    """A plaintext ctl gets exit 1 and a message telling it to give the cluster's certificates."""
    out = run("ctl", "--etcd", secure.etcd, "--cluster-id", str(CLUSTER_ID), "--timeout", "2",
              "pumps")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "--cluster-dir" in out.stderr and "plaintext" in out.stderr, out.stderr


def test_etcd_refuses_plaintext_and_other_ca_clients(secure: Up) -> None:
    good = Etcd(secure.etcd, client(secure), timeout=2)
    try:
        assert Registry(good, CLUSTER_ID).get(NodeKind.PUMP, "pump-1") is not None
    finally:
        good.close()
    rogue = SecurityConfig(str(secure.dir / "certs" / "ca.pem"), str(secure.rogue.client),
                           str(secure.rogue.client_key))
    for what, sec in (("plaintext", None), ("a certificate of another CA", rogue)):
        bad = Etcd(secure.etcd, sec, timeout=1)
        try:
            with pytest.raises(EtcdUnavailable):
                bad.revision()
        finally:
            bad.close()


def test_tso_refuses_plaintext_and_other_ca_clients(secure: Up) -> None:
    with grpcutil.sync_channel(secure.addrs["tso-1"], client(secure)) as ch:
        assert get_ts(ch) > 0
    for what, ch in bad_clients(secure, secure.addrs["tso-1"]):
        with ch:
            refused(what, lambda: get_ts(ch))


def test_pump_refuses_plaintext_and_other_ca_clients(secure: Up) -> None:
    with grpcutil.sync_channel(secure.addrs["pump-1"], client(secure)) as ch:
        empty_write(ch)
    for what, ch in bad_clients(secure, secure.addrs["pump-1"]):
        with ch:
            refused(what, lambda: empty_write(ch))


def test_drainer_refuses_plaintext_and_other_ca_clients(secure: Up) -> None:
    with grpcutil.sync_channel(secure.addrs["drainer-file"], client(secure)) as ch:
        with pytest.raises(grpc.RpcError) as e:
            notify_other_cluster(ch)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value
    for what, ch in bad_clients(secure, secure.addrs["drainer-file"]):
        with ch:
            refused(what, lambda: notify_other_cluster(ch))


def test_insecure_true_runs_plaintext_on_purpose(tmp_path: Path) -> None:
    """`insecure = true`: no certificates, etcd and servers in plaintext, ctl.toml without TLS."""
    d = tmp_path / "cluster"
    try:
        up_cluster(tmp_path, "insecure = true\n")
        assert not (d / "certs").exists()
        assert "security" not in tomllib.loads((d / "ctl.toml").read_text())
        state = read_state(cc.Layout(d))
        assert state is not None
        etcd = Etcd(state.etcd, None, timeout=2)
        try:
            assert Registry(etcd, CLUSTER_ID).get(NodeKind.PUMP, "pump-1") is not None
        finally:
            etcd.close()
        tso = next(r.addr for r in state.processes if r.kind == "tso")
        with grpc.insecure_channel(tso) as ch:
            assert get_ts(ch) > 0
        out = run("ctl", "--cluster-dir", str(d), "pumps")
        assert out.returncode == 0, out.stderr
    finally:
        kill_cluster(d)
        run("cluster", "down", "--dir", str(d))


def test_insecure_and_security_together_are_refused(tmp_path: Path) -> None:
    conf = tmp_path / "cluster.toml"
    conf.write_text('insecure = true\n[security]\nssl-ca = "a"\nssl-cert = "b"\nssl-key = "c"\n')
    with pytest.raises(ConfigError, match="`insecure = true` and a \\[security\\] table"):
        cc.load_spec(conf)


def test_ctl_cluster_dir_without_ctl_toml_is_a_clear_usage_error(tmp_path: Path) -> None:
    out = run("ctl", "--cluster-dir", str(tmp_path), "pumps")
    assert out.returncode == 2
    assert "ctl.toml: not found" in out.stderr, out.stderr
