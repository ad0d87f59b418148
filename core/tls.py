"""Mutual TLS for gRPC servers and channels (and etcd), when `[security]` is configured."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

from .errors import ConfigError


@dataclass(frozen=True)
class SecurityConfig:
    ssl_ca: str = ""      # CA that signs every peer's certificate
    ssl_cert: str = ""    # this process's certificate
    ssl_key: str = ""     # its private key (read from the file; never logged)

    @property
    def enabled(self) -> bool:
        return bool(self.ssl_ca or self.ssl_cert or self.ssl_key)

    def _read(self) -> tuple[bytes, bytes, bytes]:
        missing = [k for k, v in (("ssl-ca", self.ssl_ca), ("ssl-cert", self.ssl_cert),
                                  ("ssl-key", self.ssl_key)) if not v]
        if missing:
            raise ConfigError(f"[security]: mutual TLS needs ssl-ca, ssl-cert and ssl-key; "
                              f"missing {', '.join(missing)}")
        out = []
        for key, path in (("ssl-ca", self.ssl_ca), ("ssl-cert", self.ssl_cert),
                          ("ssl-key", self.ssl_key)):
            try:
                out.append(Path(path).read_bytes())
            except OSError as e:
                raise ConfigError(f"[security]: {key} {path}: {e.strerror}") from None
        return out[0], out[1], out[2]

    def server_credentials(self) -> grpc.ServerCredentials:
        ca, cert, key = self._read()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        ca, cert, key = self._read()
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key,
                                            certificate_chain=cert)
