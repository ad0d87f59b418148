"""`sluice ctl certs` / core/pki.py: a cluster CA and node/client certificates, idempotent."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from sluice.core import pki
from sluice.core.errors import ConfigError
from tests.support.procs import REPO, sluice_argv


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_ensure_makes_ca_node_and_client_signed_by_that_ca(tmp_path: Path) -> None:
    """node.pem is serverAuth+clientAuth and names the hosts plus loopback; client.pem is
    clientAuth only; both verify against ca.pem; keys are 0600 and the directory 0700."""
    d = pki.CertsDir(tmp_path / "certs")
    written = pki.ensure(d.root, ("pump-1", "10.0.0.7"))
    assert set(written) == {"ca.pem", "ca-key.pem", "node.pem", "node-key.pem", "client.pem",
                            "client-key.pem"}
    ca = load(d.ca)
    for cert_path, usages in ((d.node, {ExtendedKeyUsageOID.SERVER_AUTH,
                                        ExtendedKeyUsageOID.CLIENT_AUTH}),
                              (d.client, {ExtendedKeyUsageOID.CLIENT_AUTH})):
        cert = load(cert_path)
        cert.verify_directly_issued_by(ca)
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(eku) == usages
    assert set(pki.node_hosts(d)) == {"pump-1", "10.0.0.7", "localhost", "127.0.0.1", "::1"}
    for key in (d.ca_key, d.node_key, d.client_key):
        assert key.stat().st_mode & 0o777 == 0o600
    assert d.root.stat().st_mode & 0o777 == 0o700


def test_ensure_again_keeps_everything_and_a_new_host_reissues_only_the_node_cert(
        tmp_path: Path) -> None:
    d = pki.CertsDir(tmp_path)
    pki.ensure(d.root, ("a",))
    before = {p: p.read_bytes() for p in (d.ca, d.node, d.client)}
    assert pki.ensure(d.root, ("a",)) == []
    assert {p: p.read_bytes() for p in before} == before
    assert pki.ensure(d.root, ("b",)) == ["node.pem", "node-key.pem"]
    assert {"a", "b"} <= set(pki.node_hosts(d))
    assert d.ca.read_bytes() == before[d.ca] and d.client.read_bytes() == before[d.client]
    load(d.node).verify_directly_issued_by(load(d.ca))


def test_renew_reissues_node_and_client_with_the_same_ca(tmp_path: Path) -> None:
    d = pki.CertsDir(tmp_path)
    pki.ensure(d.root)
    ca, node = d.ca.read_bytes(), d.node.read_bytes()
    assert pki.ensure(d.root, renew=True) == ["node.pem", "node-key.pem", "client.pem",
                                              "client-key.pem"]
    assert d.ca.read_bytes() == ca and d.node.read_bytes() != node
    load(d.node).verify_directly_issued_by(load(d.ca))


def test_certificates_without_their_ca_are_refused(tmp_path: Path) -> None:
    d = pki.CertsDir(tmp_path)
    pki.ensure(d.root)
    d.ca.unlink()
    with pytest.raises(ConfigError, match="no ca.pem"):
        pki.ensure(d.root)


def test_ctl_certs_command(tmp_path: Path) -> None:
    """`sluice ctl certs` needs no etcd and prints how to use what it made."""
    out = subprocess.run(sluice_argv("ctl", "certs", "--certs-dir", str(tmp_path / "c"),
                                     "--host", "etcd"), capture_output=True, text=True,
                         timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert "node certificate names: etcd, localhost" in out.stdout
    assert pki.CertsDir(tmp_path / "c").complete()
