"""What every `sluice ctl` command runs with: where the cluster is, and how failures exit.

Settings come from, lowest to highest precedence: defaults, a `--config` TOML (ctl's own, or any
process's file — only `etcd`, `cluster-id`, `timeout` and `[security]` are read from it; or
`--cluster-dir DIR` / SLUICE_CLUSTER_DIR, which reads the `ctl.toml` that `sluice cluster up`
writes there, client certificate included; with none of these nor an etcd address given,
./.sluice-cluster/ctl.toml when it exists), the environment (SLUICE_ETCD, SLUICE_CLUSTER_ID),
then flags.

Exit codes (kept here, in one place): 0 ok; 1 a runtime failure (etcd, a pump, the TSO or a
producer unreachable or failing); 2 bad usage or input, or a refusal the user resolves by changing
the command (unknown node, illegal transition, bad ts, `--force` needed, node still alive).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tomllib
from dataclasses import dataclass, field
from typing import Any, TextIO

import grpc

from sluice.core import config as cfgmod
from sluice.core import errors, grpcutil
from sluice.core.etcd import Etcd, check_endpoints
from sluice.core.registry import NodeInfo, NodeKind, Registry
from sluice.core.tls import SecurityConfig

ENV_ETCD = "SLUICE_ETCD"
ENV_CLUSTER_ID = "SLUICE_CLUSTER_ID"
ENV_CLUSTER_DIR = "SLUICE_CLUSTER_DIR"
CLUSTER_CTL_CONFIG = "ctl.toml"          # written into its directory by `sluice cluster up`
DEFAULT_CLUSTER_DIR = ".sluice-cluster"  # `sluice cluster`'s default --dir

# Errors the user fixes by changing the command: exit 2. Everything else: exit 1.
USAGE_ERRORS: tuple[type[errors.SluiceError], ...] = (
    errors.ConfigError, errors.InvalidArgument, errors.NotFound, errors.FailedPrecondition,
    errors.AlreadyExists, errors.OutOfRange,
)

SINGULAR = {NodeKind.PUMP: "pump", NodeKind.DRAINER: "drainer", NodeKind.PRODUCER: "producer"}


def exit_code(e: errors.SluiceError) -> int:
    return 2 if isinstance(e, USAGE_ERRORS) else 1


@dataclass
class CtlConfig:
    etcd: str = "127.0.0.1:2379"
    cluster_id: int = 1
    timeout: float = 5.0           # seconds per etcd / gRPC call
    security: SecurityConfig = field(default_factory=SecurityConfig)


_FILE_KEYS = ("etcd", "cluster-id", "timeout", "security")


def load_config(args: argparse.Namespace, environ: dict[str, str] | None = None) -> CtlConfig:
    env = os.environ if environ is None else environ
    path = getattr(args, "config", None)
    cluster_dir = getattr(args, "cluster_dir", None) or env.get(ENV_CLUSTER_DIR)
    if not (cluster_dir or path or getattr(args, "etcd", None) or env.get(ENV_ETCD)) and \
            os.path.isfile(os.path.join(DEFAULT_CLUSTER_DIR, CLUSTER_CTL_CONFIG)):
        # Nothing says where the cluster is: the one `sluice cluster up` runs from here by
        # default (its certificates included), rather than a plaintext 127.0.0.1:2379.
        cluster_dir = DEFAULT_CLUSTER_DIR
    if cluster_dir and not path:
        path = os.path.join(cluster_dir, CLUSTER_CTL_CONFIG)
        if not os.path.isfile(path):
            raise errors.ConfigError(f"{path}: not found; is {cluster_dir} a `sluice cluster up` "
                                     "directory (it writes ctl.toml there)?")
    data: dict[str, Any] = {}
    where = "<defaults>"
    if path:
        where = str(path)
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except FileNotFoundError:
            raise errors.ConfigError(f"{path}: config file not found") from None
        except tomllib.TOMLDecodeError as e:
            raise errors.ConfigError(f"{path}: invalid TOML: {e}") from None
        data = {k: raw[k] for k in _FILE_KEYS if k in raw}
    conf = cfgmod.from_dict(CtlConfig, data, where)
    etcd_from = f"{where}: key 'etcd'"
    if env.get(ENV_ETCD):
        conf.etcd, etcd_from = env[ENV_ETCD], f"environment {ENV_ETCD}"
    if env.get(ENV_CLUSTER_ID):
        conf.cluster_id = _cluster_id(env[ENV_CLUSTER_ID], f"environment {ENV_CLUSTER_ID}")
    if getattr(args, "etcd", None):
        conf.etcd, etcd_from = args.etcd, "--etcd"
    check_endpoints(conf.etcd, etcd_from)
    if getattr(args, "cluster_id", None) is not None:
        conf.cluster_id = args.cluster_id
    if getattr(args, "timeout", None) is not None:
        conf.timeout = args.timeout
    tls = {k: getattr(args, k, None) for k in ("ssl_ca", "ssl_cert", "ssl_key")}
    if any(tls.values()):
        conf.security = dataclasses.replace(
            conf.security, **{k: v for k, v in tls.items() if v})
    if conf.timeout <= 0:
        raise errors.ConfigError(f"timeout must be > 0 seconds, got {conf.timeout}")
    return conf


def _cluster_id(text: str, where: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise errors.ConfigError(f"{where}: cluster id {text!r} is not an integer") from None
    if value < 0:
        raise errors.ConfigError(f"{where}: cluster id must be >= 0, got {value}")
    return value


class Ctx:
    """One command's connections (opened lazily) and output streams."""

    def __init__(self, config: CtlConfig, json_out: bool = False,
                 out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.config = config
        self.json = json_out
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self._etcd: Etcd | None = None
        self._registry: Registry | None = None
        self._channels: dict[str, grpc.Channel] = {}

    @property
    def cluster_id(self) -> int:
        return self.config.cluster_id

    @property
    def etcd(self) -> Etcd:
        if self._etcd is None:
            self._etcd = Etcd(self.config.etcd, self.config.security, timeout=self.config.timeout)
        return self._etcd

    @property
    def registry(self) -> Registry:
        """The cluster's registry; NotFound (exit 2) when etcd holds nothing of that cluster id,
        so a mistyped --cluster-id is not answered with an empty but successful listing."""
        if self._registry is None:
            registry = self.keys
            if not registry.exists():
                raise errors.NotFound(f"no cluster with id {self.config.cluster_id} in etcd at "
                                      f"{self.config.etcd}: check --cluster-id")
            self._registry = registry
        return self._registry

    @property
    def keys(self) -> Registry:
        """The registry without the cluster check, for naming keys (no etcd call)."""
        return Registry(self.etcd, self.config.cluster_id)

    def channel(self, addr: str) -> grpc.Channel:
        ch = self._channels.get(addr)
        if ch is None:
            ch = grpcutil.sync_channel(addr, self.config.security)
            self._channels[addr] = ch
        return ch

    def print(self, text: str = "") -> None:
        self.out.write(text + "\n")

    def warn(self, text: str) -> None:
        self.err.write(f"warning: {text}\n")

    def node(self, kind: NodeKind, node_id: str) -> NodeInfo:
        """The node, or NotFound naming the cluster and the ids it does know."""
        nodes, _ = self.registry.list(kind)
        for info in nodes:
            if info.node_id == node_id:
                return info
        known = ", ".join(n.node_id for n in nodes) or "none registered"
        raise errors.NotFound(f"no {SINGULAR[kind]} {node_id!r} in cluster {self.cluster_id} "
                              f"(known: {known})")

    def close(self) -> None:
        for ch in self._channels.values():
            ch.close()
        self._channels.clear()
        if self._etcd is not None:
            self._etcd.close()
            self._etcd = None


def rpc_error(what: str, e: grpc.RpcError) -> errors.SluiceError:
    """A peer's gRPC failure as a SluiceError whose message says which peer and call failed."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    details = " ".join(((e.details() if hasattr(e, "details") else str(e)) or code.name).split())
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return errors.Unavailable(f"{what}: {code.name}: {details}")
    return errors.from_status(code, f"{what}: {details}")
