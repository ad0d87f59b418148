"""A cluster's certificates, made the way CockroachDB's `cockroach cert` makes them.

One directory holds everything a Sluice cluster needs for mutual TLS:

    ca.pem            the cluster CA (trusted by every process and client)
    ca-key.pem        the CA's private key (0600; only `sluice ctl certs` needs it)
    node.pem          the certificate every server presents (serverAuth + clientAuth: servers
    node-key.pem      also dial each other); its SubjectAltNames are the hosts it serves on
    client.pem        the certificate of clients (`sluice ctl`, producers, the demo): clientAuth
    client-key.pem

Invariant: existing files are never overwritten unless asked (`renew`), and a node or client
certificate is only ever issued by the CA in the same directory, so running `ensure` again
(each `sluice cluster up` does) is harmless. Keys are EC P-256, written 0600, never logged.
"""
from __future__ import annotations

import datetime as _dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import ConfigError
from .tls import SecurityConfig

CA_CERT, CA_KEY = "ca.pem", "ca-key.pem"
NODE_CERT, NODE_KEY = "node.pem", "node-key.pem"
CLIENT_CERT, CLIENT_KEY = "client.pem", "client-key.pem"

# What every node certificate names besides the hosts asked for: processes dial each other and
# etcd on the loopback address in a local cluster, and tools dial `localhost`.
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
CA_DAYS = 3650
CERT_DAYS = 365


@dataclass(frozen=True)
class CertsDir:
    """The files of one certificates directory (they may not exist yet)."""

    root: Path

    @property
    def ca(self) -> Path:
        return self.root / CA_CERT

    @property
    def ca_key(self) -> Path:
        return self.root / CA_KEY

    @property
    def node(self) -> Path:
        return self.root / NODE_CERT

    @property
    def node_key(self) -> Path:
        return self.root / NODE_KEY

    @property
    def client(self) -> Path:
        return self.root / CLIENT_CERT

    @property
    def client_key(self) -> Path:
        return self.root / CLIENT_KEY

    def node_security(self) -> SecurityConfig:
        return SecurityConfig(str(self.ca), str(self.node), str(self.node_key))

    def client_security(self) -> SecurityConfig:
        return SecurityConfig(str(self.ca), str(self.client), str(self.client_key))

    def complete(self) -> bool:
        return all(p.is_file() for p in (self.ca, self.node, self.node_key, self.client,
                                          self.client_key))


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Sluice"),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    data = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    # Created 0600 from the start: never readable by others, not even for an instant.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    path.chmod(0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load_ca(d: CertsDir) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    if not d.ca_key.is_file():
        raise ConfigError(f"{d.ca_key}: the CA key is missing; a certificate can only be issued "
                          f"by the CA whose key is in {d.root} (or start over in an empty "
                          "directory)")
    try:
        key = serialization.load_pem_private_key(d.ca_key.read_bytes(), password=None)
        cert = x509.load_pem_x509_certificate(d.ca.read_bytes())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{d.root}: cannot read the CA ({type(e).__name__}: {e})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ConfigError(f"{d.ca_key}: not an EC private key")
    return key, cert


def create_ca(d: CertsDir, days: int = CA_DAYS) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    now = _dt.datetime.now(_dt.timezone.utc)
    cert = (x509.CertificateBuilder()
            .subject_name(_name("Sluice CA")).issuer_name(_name("Sluice CA"))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - _dt.timedelta(minutes=5))
            .not_valid_after(now + _dt.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write_key(key, d.ca_key)
    _write_cert(cert, d.ca)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def issue(d: CertsDir, *, node: bool, hosts: tuple[str, ...] = (), name: str = "",
          days: int = CERT_DAYS) -> None:
    """Issue node.pem (node=True; SANs: hosts + DEFAULT_HOSTS) or client.pem with the CA of d."""
    ca_key, ca_cert = _load_ca(d)
    key = ec.generate_private_key(ec.SECP256R1())
    now = _dt.datetime.now(_dt.timezone.utc)
    usages = ([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH] if node
              else [ExtendedKeyUsageOID.CLIENT_AUTH])
    builder = (x509.CertificateBuilder()
               .subject_name(_name(name or ("node" if node else "client")))
               .issuer_name(ca_cert.subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - _dt.timedelta(minutes=5))
               .not_valid_after(min(now + _dt.timedelta(days=days),
                                    ca_cert.not_valid_after_utc))
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False,
                                            key_cert_sign=False, crl_sign=False,
                                            content_commitment=False, data_encipherment=False,
                                            key_agreement=True, encipher_only=False,
                                            decipher_only=False), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
    if node:
        names = list(dict.fromkeys((*hosts, *DEFAULT_HOSTS)))
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_san(h) for h in names]), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    cert_path, key_path = (d.node, d.node_key) if node else (d.client, d.client_key)
    _write_key(key, key_path)
    _write_cert(cert, cert_path)


def node_hosts(d: CertsDir) -> list[str]:
    """The SubjectAltNames of d's node certificate ([] when it has none)."""
    cert = x509.load_pem_x509_certificate(d.node.read_bytes())
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(n.value) for n in san]


def ensure(root: Path, hosts: tuple[str, ...] = (), renew: bool = False) -> list[str]:
    """Make what is missing in root: the CA, the node certificate (naming `hosts` too), the client
    certificate. A node certificate that does not name one of `hosts` is re-issued (a new host
    joined); `renew` re-issues node and client certificates with the same CA (rotation).
    Returns the files written."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o700)
    d = CertsDir(root)
    written: list[str] = []
    if not d.ca.is_file():
        if d.node.exists() or d.client.exists():
            raise ConfigError(f"{root}: holds certificates but no {CA_CERT}; remove them or give "
                              "the CA they were issued by")
        create_ca(d)
        written += [CA_CERT, CA_KEY]
    wanted = set(hosts) | set(DEFAULT_HOSTS)
    if renew or not (d.node.is_file() and d.node_key.is_file()) or not wanted <= set(
            node_hosts(d)):
        have = set(node_hosts(d)) if d.node.is_file() else set()
        issue(d, node=True, hosts=tuple(sorted(have | set(hosts))))
        written += [NODE_CERT, NODE_KEY]
    if renew or not (d.client.is_file() and d.client_key.is_file()):
        issue(d, node=False)
        written += [CLIENT_CERT, CLIENT_KEY]
    return written
