"""Test certificates made with `cryptography`: one CA, a server cert and a client cert.

The server certificate names 127.0.0.1, ::1 and localhost (gRPC and etcd clients verify the
address they dial against its SubjectAltName); the client certificate carries the clientAuth
usage. A second, unrelated CA (`rogue`) makes a client certificate the servers must refuse.
Keys are EC P-256: fast to generate, so every test module can make fresh ones.
"""
from __future__ import annotations

import datetime as _dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    """PEM files for one party: the CA to trust, its certificate and its private key."""

    ca: Path
    cert: Path
    key: Path

    def security(self) -> dict[str, str]:
        """The `[security]` table of a process config using these files."""
        return {"ssl-ca": str(self.ca), "ssl-cert": str(self.cert), "ssl-key": str(self.key)}


@dataclass(frozen=True)
class PKI:
    server: CertFiles
    client: CertFiles
    rogue_client: CertFiles       # signed by another CA: refused by our servers


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sluice tests"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    path.chmod(0o600)


def _ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _dt.datetime.now(_dt.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(_name(cn)).issuer_name(_name(cn))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return key, cert


def _leaf(ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, cn: str,
          server: bool) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _dt.datetime.now(_dt.timezone.utc)
    # Both usages on the server cert: etcd and our processes also dial peers with it.
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if server
              else [ExtendedKeyUsageOID.CLIENT_AUTH])
    builder = (x509.CertificateBuilder()
               .subject_name(_name(cn)).issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - _dt.timedelta(minutes=5))
               .not_valid_after(now + _dt.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
    if server:
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            x509.IPAddress(ipaddress.ip_address("::1")),
        ]), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_pki(directory: Path) -> PKI:
    """Write ca.pem, server.pem/-key.pem, client.pem/-key.pem and a rogue client into directory."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = _ca("Sluice test CA")
    rogue_key, rogue_cert = _ca("Someone else's CA")
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    (directory / "rogue-ca.pem").write_bytes(rogue_cert.public_bytes(pem))

    def leaf(name: str, issuer_key: ec.EllipticCurvePrivateKey, issuer: x509.Certificate,
             server: bool, ca_file: str) -> CertFiles:
        key, cert = _leaf(issuer_key, issuer, f"sluice-{name}", server)
        files = CertFiles(directory / ca_file, directory / f"{name}.pem", directory / f"{name}-key.pem")
        files.cert.write_bytes(cert.public_bytes(pem))
        _write_key(key, files.key)
        return files

    # The rogue client trusts our CA (so it can verify the server) but presents a cert the
    # server cannot verify: the refusal is the server's, which is what the test must show.
    return PKI(server=leaf("server", ca_key, ca_cert, True, "ca.pem"),
                   client=leaf("client", ca_key, ca_cert, False, "ca.pem"),
                   rogue_client=leaf("rogue-client", rogue_key, rogue_cert, False, "ca.pem"))
