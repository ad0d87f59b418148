"""What a local cluster runs: its spec (cluster.toml) and the plan of its processes.

`sluice cluster up` reads one TOML (`ClusterSpec`, defaults built in) and turns it into a plan:
one `ProcessPlan` per child — its argv, its own TOML config, data dir, log file and address.
`sluice.ctl.cluster` runs the plan; this module only decides it, so it is pure and testable.

Invariant: every config file the cluster writes is loaded back through the real config
dataclass of its process (`validate`) before anything starts — the cluster never invents a key,
and a key renamed in a process's config fails `up` at once instead of a child at run time. The
same classes generate docs/config.md (`ctl/config_reference.py`).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sluice.core import config as cfgmod
from sluice.core.errors import ConfigError
from sluice.core.tls import SecurityConfig

# process kind -> "module:ConfigClass". A module that is not in this build yet is skipped by
# the docs and refused by the cluster with a clear message.
PROCESS_CONFIGS: dict[str, str] = {
    "tso": "sluice.tso.server:TSOConfig",
    "pump": "sluice.pump.config:PumpConfig",
    "drainer": "sluice.drainer.config:DrainerConfig",
    "capture": "sluice.capture.config:CaptureConfig",
    "ctl": "sluice.ctl.context:CtlConfig",
}


# ---------------------------------------------------------------------------------------------
# Config classes: lookup and validation
# ---------------------------------------------------------------------------------------------

def _import(target: str) -> Any | None:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and (module_name == e.name or module_name.startswith(e.name + ".")):
            return None
        raise
    return getattr(module, attr, None)


def config_class(kind: str) -> type | None:
    """The config dataclass of a process kind, or None when that process is not in this build."""
    target = PROCESS_CONFIGS.get(kind)
    if target is None:
        raise ConfigError(f"unknown process kind {kind!r} (known: {', '.join(PROCESS_CONFIGS)})")
    return _import(target)


def sink_config_class(sink: str) -> type | None:
    """The options dataclass of a drainer sink (`[to]`), or None when the sink is not in this build."""
    from sluice.drainer.sink import SINK_CONFIGS, sink_config_class as lookup
    if sink not in SINK_CONFIGS:
        raise ConfigError(f"unknown sink '{sink}' (known: {', '.join(sorted(SINK_CONFIGS))})")
    try:
        return lookup(sink)
    except ConfigError:
        return None


def validate(kind: str, data: dict[str, Any], where: str) -> Any:
    """Load `data` (a TOML-shaped dict) through the real config class of `kind` and its own
    checks (a drainer's include its sink's `[to]`); ConfigError if a key is unknown, mistyped or
    invalid. Returns the config object."""
    cls = config_class(kind)
    if cls is None:
        raise ConfigError(f"{where}: `sluice {kind}` is not part of this build yet")
    conf = cfgmod.from_dict(cls, data, where)
    for check in ("validated", "validate"):
        method = getattr(conf, check, None)
        if callable(method):
            method(where)
            break
    return conf


# ---------------------------------------------------------------------------------------------
# TOML output (the standard library reads TOML but does not write it)
# ---------------------------------------------------------------------------------------------

def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)          # a JSON string is a valid TOML basic string
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_value(x)}" for k, x in v.items()) + "}"
    raise ConfigError(f"cannot write {type(v).__name__} {v!r} as TOML")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def to_toml(data: dict[str, Any]) -> str:
    """A TOML document for a dict of scalars, lists and nested tables (empty tables omitted)."""
    return "\n".join(_toml_lines(data, "")).strip("\n") + "\n"


def _toml_lines(data: dict[str, Any], prefix: str) -> list[str]:
    lines = [f"{_toml_key(k)} = {toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, v in data.items():
        if isinstance(v, dict) and v:
            name = prefix + _toml_key(k)
            lines += ["", f"[{name}]", *_toml_lines(v, name + ".")]
    return lines


# ---------------------------------------------------------------------------------------------
# The cluster spec (`sluice cluster up --config cluster.toml`)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EtcdSpec:
    bin: str = "etcd"                  # etcd binary (Debian: etcd-server)
    port: int = 0                      # client port; 0: a free port chosen at `up`
    restart: str = ""                  # its restart policy; "": the cluster's `restart`


@dataclass(frozen=True)
class TSOSpec:
    count: int = 2                     # TSO servers (one leader, the rest standbys)
    lease_ttl: int = 3                 # seconds
    restart: str = ""                  # restart policy of every TSO; "": the cluster's `restart`
    config: dict[str, Any] = field(default_factory=dict)   # extra keys for every tso.toml


@dataclass(frozen=True)
class PumpSpec:
    count: int = 2                     # pumps: pump-1 .. pump-N
    restart: str = ""                  # restart policy of every pump; "": the cluster's `restart`
    # Extra keys for every pump.toml. A local cluster shares one disk with everything else,
    # so it stops writes at 1 GiB free rather than the production default of 10 GiB.
    config: dict[str, Any] = field(default_factory=lambda: {
        "storage": {"stop-write-at-available-space": 1 << 30}})


@dataclass(frozen=True)
class DrainerSpec:
    name: str = "drainer-file"         # drainer name (its node id in the registry)
    sink: str = "file"                 # file | grpc | mysql | spark
    # The sink's `[to]` options. Strings may use {dir} (the cluster dir), {data} (this
    # drainer's data dir; a standby shares it), {mariadb-port}.
    to: dict[str, Any] = field(default_factory=dict)
    # Also run a standby with the same name: both get `ha = true` (drainer HA, DESIGN §6); the
    # standby takes over when the active one stops or dies.
    standby: bool = False
    restart: str = ""                  # its restart policy; "": the cluster's `restart`
    config: dict[str, Any] = field(default_factory=dict)   # extra keys for this drainer.toml


@dataclass(frozen=True)
class MariaDBSpec:
    # Run a local MariaDB source (a convenience for the demo; `capture.enabled` captures it).
    # External sources need none of it: see [[sources]].
    enabled: bool = False
    port: int = 0                      # 0: a free port chosen at `up`
    server_id: int = 1                 # its server id; capture uses this + 10000
    root_password: str = "sluice-root"  # root@127.0.0.1; also what capture logs in with
    restart: str = ""                  # its restart policy; "": the cluster's `restart`


@dataclass(frozen=True)
class CaptureSpec:
    enabled: bool = False              # run `sluice capture` on the local MariaDB
    producer_id: str = "capture-1"     # the capture's producer id
    restart: str = ""                  # its restart policy; "": the cluster's `restart`
    config: dict[str, Any] = field(default_factory=dict)   # extra keys for capture.toml


@dataclass(frozen=True)
class SourceFilterSpec:
    """[[sources]] filter: the capture's own `[filter]` keys (capture.toml)."""

    include_databases: list[str] = field(default_factory=list)   # only these (empty: all)
    exclude_databases: list[str] = field(default_factory=list)   # never these
    include_tables: list[str] = field(default_factory=list)      # regex on "db.table"
    exclude_tables: list[str] = field(default_factory=list)      # regex on "db.table"


@dataclass(frozen=True)
class SourceSpec:
    """One external MariaDB/MySQL source: `sluice cluster up` runs one capture for it,
    `capture-<name>`, into the cluster's pumps (several sources: the shard-merge case)."""

    name: str                          # names its capture process (capture-<name>)
    host: str = "127.0.0.1"            # source host
    port: int = 3306                   # source port
    user: str = "sluice"               # replication user (REPLICATION SLAVE, REPLICATION CLIENT, SELECT)
    password: str = ""                 # its password (or env:NAME / file:PATH; see password-file)
    # A file holding the password (one trailing newline ignored); relative to cluster.toml's
    # directory. Passed on as `file:PATH`, so the secret is never copied into the cluster dir.
    password_file: str = ""
    server_id: int = 0                 # the capture's replica server id; 0: 10000 + its position
    producer_id: str = ""              # "": capture-<name>
    snapshot_mode: str = ""            # capture's snapshot-mode; "": the capture's default (no_data)
    start_position: str = ""           # capture's start-position; "": the capture's default (latest)
    filter: SourceFilterSpec = field(default_factory=SourceFilterSpec)
    restart: str = ""                  # its restart policy; "": the cluster's `restart`
    config: dict[str, Any] = field(default_factory=dict)   # extra keys for its capture.toml

    @property
    def process_name(self) -> str:
        return f"capture-{self.name}"


@dataclass(frozen=True)
class RestartPolicySpec:
    """How the supervisor restarts a process that ends (compose's deploy.restart_policy)."""

    # Failures in a row before giving up (0: never give up); an exit counts as one only when
    # the process ran less than `window` seconds.
    max_attempts: int = 5
    delay: float = 1.0                 # seconds before the first restart; doubled each failure
    max_delay: float = 30.0            # longest wait between restarts
    window: float = 30.0               # a run this long resets the failure count


RESTART_POLICIES = ("no", "on-failure", "always")


@dataclass(frozen=True)
class ClusterSpec:
    cluster_id: int = 1                # cluster id of every process
    host: str = "127.0.0.1"            # every process listens here
    start_timeout: float = 60.0        # seconds `up` waits for each process to be healthy
    stop_timeout: float = 15.0         # seconds `down` waits after SIGTERM before SIGKILL
    # What the supervisor does when a process ends: "no" (stays dead), "on-failure" (restart
    # after a non-zero exit or a signal), "always" (restart after any exit). `stop NAME` and
    # `down` are never undone. Each group (tso, pump, drainers[], sources[], ...) may override it.
    restart: str = "on-failure"
    restart_policy: RestartPolicySpec = field(default_factory=RestartPolicySpec)
    etcd: EtcdSpec = field(default_factory=EtcdSpec)
    tso: TSOSpec = field(default_factory=TSOSpec)
    pump: PumpSpec = field(default_factory=PumpSpec)
    # One [[drainers]] table per named drainer (one sink each); default: one file drainer.
    drainers: list[DrainerSpec] = field(default_factory=lambda: [DrainerSpec()])
    mariadb: MariaDBSpec = field(default_factory=MariaDBSpec)
    capture: CaptureSpec = field(default_factory=CaptureSpec)
    # One [[sources]] table per external MariaDB/MySQL source, each captured by its own process.
    sources: list[SourceSpec] = field(default_factory=list)
    # Mutual TLS for every process and etcd with your own certificates. Empty (the default):
    # `up` makes a CA and certificates in <cluster dir>/certs (`sluice ctl certs`) and uses those.
    security: SecurityConfig = field(default_factory=SecurityConfig)
    # Plaintext gRPC and etcd, no certificates: anyone who reaches a port can write binlogs and
    # change the registry. Only on purpose (a throwaway local try-out); excludes [security].
    insecure: bool = False

    def check(self, where: str) -> "ClusterSpec":
        if self.insecure and self.security.enabled:
            raise ConfigError(f"{where}: `insecure = true` and a [security] table are both set: "
                              "keep one (insecure runs plaintext, [security] runs mutual TLS)")
        if self.tso.count < 1 or self.pump.count < 1:
            raise ConfigError(f"{where}: tso.count and pump.count must be >= 1")
        names = [d.name for d in self.drainers]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}: drainer names must be unique, got {names}")
        if self.capture.enabled and not self.mariadb.enabled:
            raise ConfigError(f"{where}: capture.enabled needs mariadb.enabled (the local source); "
                              "to capture your own MariaDB/MySQL, add a [[sources]] table instead")
        policies = [("restart", self.restart)] + [
            (f"{group}.restart", getattr(self, group).restart)
            for group in ("etcd", "tso", "pump", "mariadb", "capture")] + [
            (f"drainers[{i}].restart", d.restart) for i, d in enumerate(self.drainers)] + [
            (f"sources[{i}].restart", s.restart) for i, s in enumerate(self.sources)]
        for key, value in policies:
            if value not in RESTART_POLICIES and not (value == "" and key != "restart"):
                raise ConfigError(f"{where}: key '{key}' is {value!r}: want "
                                  + ", ".join(f'"{p}"' for p in RESTART_POLICIES))
        rp = self.restart_policy
        if rp.max_attempts < 0 or rp.delay < 0 or rp.max_delay < rp.delay or rp.window < 0:
            raise ConfigError(f"{where}: [restart-policy] wants max-attempts >= 0, delay >= 0, "
                              "max-delay >= delay and window >= 0")
        seen: set[str] = set()
        for i, s in enumerate(self.sources):
            if not re.fullmatch(r"[A-Za-z0-9_-]+", s.name):
                raise ConfigError(f"{where}: key 'sources[{i}].name' is {s.name!r}: want letters, "
                                  "digits, '-' or '_' (it names the capture process)")
            if s.name in seen:
                raise ConfigError(f"{where}: [[sources]] names must be unique, got {s.name!r} twice")
            seen.add(s.name)
            if s.password and s.password_file:
                raise ConfigError(f"{where}: [[sources]] {s.name!r} sets both 'password' and "
                                  "'password-file': keep one")
        return self


def load_spec(path: str | Path | None, overrides: list[str] | None = None) -> ClusterSpec:
    where = str(path) if path else "<defaults>"
    spec = cfgmod.load(ClusterSpec, path, overrides).check(where)
    # A relative password-file is relative to cluster.toml (the processes run elsewhere).
    base = Path(path).resolve().parent if path else Path.cwd()
    sources = []
    for s in spec.sources:
        if s.password_file:
            pw = Path(s.password_file)
            pw = pw if pw.is_absolute() else base / pw
            if not pw.is_file():
                raise ConfigError(f"{where}: [[sources]] {s.name!r}: password-file {str(pw)!r} "
                                  "not found")
            s = dataclasses.replace(s, password_file=str(pw))
        sources.append(s)
    return dataclasses.replace(spec, sources=sources)


def cluster_security(spec: ClusterSpec, layout: "Layout") -> SecurityConfig:
    """What every process of the cluster (and etcd) runs with: nothing when `insecure = true`,
    the spec's [security] when given, else the certificates `up` makes in layout.certs."""
    if spec.insecure:
        return SecurityConfig()
    if spec.security.enabled:
        return spec.security
    from sluice.core.pki import CertsDir
    return CertsDir(layout.certs).node_security()


def client_security(spec: ClusterSpec, layout: "Layout") -> SecurityConfig:
    """What clients of the cluster (`sluice ctl --cluster-dir`, the demo) present: the generated
    client certificate, or the spec's own [security] (its certificate must allow clientAuth)."""
    if spec.insecure or spec.security.enabled:
        return cluster_security(spec, layout)
    from sluice.core.pki import CertsDir
    return CertsDir(layout.certs).client_security()


def generated_certs(spec: ClusterSpec) -> bool:
    """True when `up` makes (and owns) the cluster's certificates."""
    return not spec.insecure and not spec.security.enabled


def restart_policy(spec: ClusterSpec, p: "ProcessPlan") -> str:
    """The restart policy of one planned process: its group's, else the cluster's."""
    own = {"etcd": spec.etcd.restart, "tso": spec.tso.restart, "pump": spec.pump.restart,
           "mariadb": spec.mariadb.restart}.get(p.kind, "")
    if p.kind == "drainer":
        own = next((d.restart for d in spec.drainers if d.name == p.node_id), "")
    elif p.kind == "capture":
        own = next((s.restart for s in spec.sources if s.process_name == p.name),
                   spec.capture.restart)
    return own or spec.restart


# ---------------------------------------------------------------------------------------------
# The plan
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcessPlan:
    """One child of the cluster: how to start it and where it keeps things."""

    name: str                          # unique in the cluster: etcd, tso-1, pump-2, ...
    kind: str                          # etcd | tso | pump | drainer | mariadb | capture
    argv: tuple[str, ...]
    addr: str                          # what it serves (host:port); "" if nothing
    data_dir: str
    log: str
    config_path: str = ""              # its TOML, when it has one
    config: dict[str, Any] = field(default_factory=dict)
    metrics_addr: str = ""
    node_id: str = ""                  # registry id (pumps, drainers, producers)
    standby: bool = False


@dataclass(frozen=True)
class Layout:
    """Where the cluster keeps its files."""

    root: Path

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.json"

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def ctl_config(self) -> Path:
        return self.root / "ctl.toml"

    def conf(self, name: str) -> Path:
        return self.root / "conf" / f"{name}.toml"

    def data(self, name: str) -> Path:
        return self.root / "data" / name

    def log(self, name: str) -> Path:
        return self.root / "logs" / f"{name}.log"


# `[to]` keys a drainer's spec does not give: everything under the drainer's data dir (so
# `to = { current-state = "..." }` keeps the default warehouse). A spark drainer's warehouse holds the Iceberg tables and the embedded catalog (an SQLite file), which
# its standby shares: no catalog server to run.
DEFAULT_SINK_OPTIONS: dict[str, dict[str, Any]] = {
    "file": {"dir": "{data}/out"},
    "spark": {"warehouse": "{data}/warehouse"},
}


def _substitute(value: Any, tokens: dict[str, str]) -> Any:
    """Replace {token} in strings (only the known tokens; other braces are left alone)."""
    if isinstance(value, str):
        whole = value[1:-1] in tokens if value.startswith("{") and value.endswith("}") else False
        for k, v in tokens.items():
            value = value.replace("{" + k + "}", v)
        # A value that is only a token naming a number ("{mariadb-port}") becomes that number.
        return int(value) if whole and value.isdigit() else value
    if isinstance(value, dict):
        return {k: _substitute(v, tokens) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, tokens) for v in value]
    return value


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def plan(spec: ClusterSpec, layout: Layout, port: Callable[[str], int],
         python: str = sys.executable) -> list[ProcessPlan]:
    """Every process of the cluster in start order; `port(key)` gives the port for a key
    (the caller picks free ports, or reuses the ones a previous `up` recorded)."""
    h = spec.host
    sec = cluster_security(spec, layout)
    tls = sec.enabled
    scheme = "https" if tls else "http"
    security = ({"ssl-ca": sec.ssl_ca, "ssl-cert": sec.ssl_cert, "ssl-key": sec.ssl_key}
                if tls else {})
    out: list[ProcessPlan] = []

    etcd_addr = f"{h}:{spec.etcd.port or port('etcd')}"
    peer = f"http://{h}:{port('etcd-peer')}"
    etcd_argv = [spec.etcd.bin, "--name", "sluice", "--data-dir", str(layout.data("etcd")),
                 "--listen-client-urls", f"{scheme}://{etcd_addr}",
                 "--advertise-client-urls", f"{scheme}://{etcd_addr}",
                 "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                 "--initial-cluster", f"sluice={peer}", "--log-level", "warn",
                 # zap honours --log-level for raft too (capnslog printed ~15 INFO lines and
                 # two deprecation warnings at every start).
                 "--logger", "zap"]
    if tls:
        etcd_argv += ["--cert-file", sec.ssl_cert, "--key-file", sec.ssl_key,
                      "--trusted-ca-file", sec.ssl_ca, "--client-cert-auth"]
    out.append(ProcessPlan("etcd", "etcd", tuple(etcd_argv), etcd_addr,
                           str(layout.data("etcd")), str(layout.log("etcd"))))

    def sluice(kind: str, name: str, conf: dict[str, Any], addr: str, metrics: str,
               node_id: str = "", standby: bool = False, data_dir: str = "") -> ProcessPlan:
        if security:
            conf = {**conf, "security": security}
        path = layout.conf(name)
        validate(kind, conf, str(path))
        return ProcessPlan(name, kind, (python, "-m", "sluice.ctl.main", kind, "--config", str(path)),
                           addr, data_dir or str(layout.data(name)), str(layout.log(name)),
                           str(path), conf, metrics, node_id, standby)

    tso_addrs = []
    for i in range(1, spec.tso.count + 1):
        name = f"tso-{i}"
        addr, metrics = f"{h}:{port(name)}", f"{h}:{port(name + '-metrics')}"
        tso_addrs.append(addr)
        conf = _deep_merge({"cluster-id": spec.cluster_id, "name": name, "addr": addr,
                            "etcd": etcd_addr, "lease-ttl": spec.tso.lease_ttl,
                            "metrics-addr": metrics}, spec.tso.config)
        out.append(sluice("tso", name, conf, addr, metrics, node_id=name))

    for i in range(1, spec.pump.count + 1):
        name = f"pump-{i}"
        addr, metrics = f"{h}:{port(name)}", f"{h}:{port(name + '-metrics')}"
        conf = _deep_merge({"cluster-id": spec.cluster_id, "node-id": name, "addr": addr,
                            "data-dir": str(layout.data(name)), "etcd": etcd_addr,
                            "tso": tso_addrs, "metrics-addr": metrics}, spec.pump.config)
        out.append(sluice("pump", name, conf, addr, metrics, node_id=name))

    mariadb_port = ""
    if spec.mariadb.enabled:
        mariadb_port = str(spec.mariadb.port or port("mariadb"))
        out.append(mariadb_plan(spec, layout, mariadb_port))

    for d in spec.drainers:
        addr, metrics = f"{h}:{port(d.name)}", f"{h}:{port(d.name + '-metrics')}"
        data = layout.data(d.name)
        tokens = {"dir": str(layout.root), "data": str(data), "mariadb-port": mariadb_port}
        to = _substitute(_deep_merge(DEFAULT_SINK_OPTIONS.get(d.sink, {}), d.to), tokens)
        conf = _deep_merge({"cluster-id": spec.cluster_id, "name": d.name, "addr": addr,
                            "etcd": etcd_addr, "tso": tso_addrs, "metrics-addr": metrics,
                            "sink": d.sink, "to": to}, _substitute(d.config, tokens))
        if d.standby:
            # Both instances are members of one HA group (same name, same sink files): the
            # first one `up` starts becomes the active one, the other waits as its standby.
            conf = {**conf, "ha": True}
        out.append(sluice("drainer", d.name, conf, addr, metrics, node_id=d.name, data_dir=str(data)))
        if d.standby:
            name = f"{d.name}-standby"
            s_addr, s_metrics = f"{h}:{port(name)}", f"{h}:{port(name + '-metrics')}"
            out.append(sluice("drainer", name, {**conf, "addr": s_addr, "metrics-addr": s_metrics},
                              s_addr, s_metrics, node_id=d.name, standby=True, data_dir=str(data)))

    if spec.capture.enabled:
        addr, metrics = f"{h}:{port('capture')}", f"{h}:{port('capture-metrics')}"
        conf = _deep_merge({
            "cluster-id": spec.cluster_id, "producer-id": spec.capture.producer_id,
            "etcd": etcd_addr, "tso": tso_addrs, "addr": addr, "metrics-addr": metrics,
            "source": {"host": h, "port": int(mariadb_port), "user": "root",
                       "password": spec.mariadb.root_password,
                       "server-id": spec.mariadb.server_id + 10000},
        }, spec.capture.config)
        out.append(sluice("capture", "capture", conf, addr, metrics, node_id=spec.capture.producer_id))

    for i, s in enumerate(spec.sources, start=1):
        name = s.process_name
        addr, metrics = f"{h}:{port(name)}", f"{h}:{port(name + '-metrics')}"
        producer = s.producer_id or name
        out.append(sluice("capture", name, capture_config(spec, s, i, {
            "cluster-id": spec.cluster_id, "producer-id": producer, "etcd": etcd_addr,
            "tso": tso_addrs, "addr": addr, "metrics-addr": metrics}), addr, metrics,
            node_id=producer))
    return out


def capture_config(spec: ClusterSpec, s: SourceSpec, position: int,
                   base: dict[str, Any]) -> dict[str, Any]:
    """capture.toml of one [[sources]] entry: each key mapped to the capture's own key."""
    source: dict[str, Any] = {"host": s.host, "port": s.port, "user": s.user,
                              "server-id": s.server_id or 10000 + position}
    if s.password_file:
        source["password"] = cfgmod.SECRET_FILE + s.password_file
    elif s.password:
        source["password"] = s.password
    conf: dict[str, Any] = {**base, "source": source}
    filt = {cfgmod.field_key(f.name): getattr(s.filter, f.name)
            for f in dataclasses.fields(s.filter) if getattr(s.filter, f.name)}
    if filt:
        conf["filter"] = filt
    if s.snapshot_mode:
        conf["snapshot-mode"] = s.snapshot_mode
    if s.start_position:
        conf["start-position"] = s.start_position
    return _deep_merge(conf, s.config)


def mariadb_plan(spec: ClusterSpec, layout: Layout, port: str) -> ProcessPlan:
    """mariadbd as tests/support/mariadb.py runs it: no option files, row binlogs with FULL
    image and metadata (what capture's start-up checks demand), utf8mb4."""
    import os
    data = layout.data("mariadb")
    run = layout.root / "run"
    argv = ["mariadbd", "--no-defaults", f"--datadir={data}", f"--port={port}",
            f"--bind-address={spec.host}", f"--socket={run / 'mariadb.sock'}",
            f"--pid-file={run / 'mariadb.pid'}", f"--tmpdir={run / 'tmp'}", "--skip-name-resolve",
            "--character-set-server=utf8mb4", "--collation-server=utf8mb4_general_ci",
            "--max-allowed-packet=256M", f"--server-id={spec.mariadb.server_id}",
            "--innodb-buffer-pool-size=64M", "--innodb-log-file-size=48M",
            f"--log-bin={data / 'mariadb-bin'}", "--binlog-format=ROW",
            "--binlog-row-image=FULL", "--binlog-row-metadata=FULL", "--log-slave-updates"]
    if os.geteuid() == 0:
        argv.append("--user=root")
    return ProcessPlan("mariadb", "mariadb", tuple(argv), f"{spec.host}:{port}", str(data),
                       str(layout.log("mariadb")))
