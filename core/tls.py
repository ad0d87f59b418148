"""Mutual TLS for gRPC servers and channels (and etcd), when `[security]` is configured.

Each of `ssl-ca`, `ssl-cert`, `ssl-key` is a path to a PEM file, or `env:NAME` to take the PEM
text from the environment variable NAME (containers often inject secrets that way). The
material is read when credentials are built and is never logged: errors name the key and the
file or variable, never the content.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import grpc

from .errors import ConfigError


@dataclass(frozen=True)
class SecurityConfig:
    ssl_ca: str = ""      # CA that signs every peer's certificate
    ssl_cert: str = ""    # this process's certificate
    ssl_key: str = ""     # its private key (a file, or env:NAME; never logged)

    @property
    def enabled(self) -> bool:
        return bool(self.ssl_ca or self.ssl_cert or self.ssl_key)

    def _read(self) -> tuple[bytes, bytes, bytes]:
        missing = [k for k, v in (("ssl-ca", self.ssl_ca), ("ssl-cert", self.ssl_cert),
                                  ("ssl-key", self.ssl_key)) if not v]
        if missing:
            raise ConfigError(f"[security]: mutual TLS needs ssl-ca, ssl-cert and ssl-key; "
                              f"missing {', '.join(missing)}")
        out = [_material(key, where) for key, where in (
            ("ssl-ca", self.ssl_ca), ("ssl-cert", self.ssl_cert), ("ssl-key", self.ssl_key))]
        return out[0], out[1], out[2]

    def server_credentials(self) -> grpc.ServerCredentials:
        ca, cert, key = self._read()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        ca, cert, key = self._read()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                            certificate_chain=cert)


ENV_PREFIX = "env:"


def _material(key: str, where: str) -> bytes:
    """The PEM bytes named by a [security] value: a file path, or env:NAME."""
    if where.startswith(ENV_PREFIX):
        name = where[len(ENV_PREFIX):]
        value = os.environ.get(name)
        if not value:
            raise ConfigError(f"[security]: {key} {where}: environment variable {name} is not set")
        return value.encode()
    try:
        return Path(where).read_bytes()
    except OSError as e:
        raise ConfigError(f"[security]: {key} {where}: {e.strerror}") from None
