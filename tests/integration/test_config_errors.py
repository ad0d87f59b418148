"""Config errors before side effects (issue #21): every process checks its whole config — a
drainer's sink options (`[to]`) included — before its first network call, and reports a typo as
one line naming the file and the table the user wrote, exit 2, even when etcd is down."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sluice.core.etcd import Etcd
from tests.support.procs import free_port, sluice_argv

pytestmark = pytest.mark.timeout(120)

# (process, config body after its `etcd` line, the error after "<file>: ")
TYPOS = [
    ("tso", "lease-ttl = 3\nleese-ttl = 4\n", "unknown key 'leese-ttl' (did you mean 'lease-ttl'?)"),
    ("pump", "[storage]\nsnyc = true\n", "unknown key 'snyc' in [storage] (did you mean 'sync'?)"),
    ("drainer", 'sink = "mysql"\n[to]\nhots = "127.0.0.1"\n',
     "[to] (mysql sink): unknown key 'hots' (did you mean 'host'?)"),
    ("drainer", 'sink = "file"\n[to]\ndir = "out"\nmax-file-sise = 1\n',
     "[to] (file sink): unknown key 'max-file-sise' (did you mean 'max-file-size'?)"),
    ("drainer", 'sink = "mysql"\n[to]\nworker-count = 0\n',
     "[to] (mysql sink): mysql sink: worker-count must be >= 1, got 0"),
    ("drainer", 'sink = "kafka"\n', "key 'sink': unknown sink 'kafka' (known: file, grpc, mysql, spark)"),
    # docs/mysql-sink.md used to show this form; it is the wrong shape, said at once.
    ("drainer", '[sink]\nname = "mysql"\n', "key 'sink': expected str, got dict {'name': 'mysql'}"),
    ("drainer", 'sink = "file"\n[to]\ndir = "out"\n[filter]\ndo-db = ["~("]\n',
     "[filter] do-db: bad regular expression '(':"),
    ("capture", '[source]\nhots = "127.0.0.1"\n', "unknown key 'hots' in [source] (did you mean 'host'?)"),
]


def run(kind: str, conf: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(sluice_argv(kind, "--config", str(conf)), capture_output=True,
                          text=True, timeout=60, cwd=cwd)


@pytest.mark.parametrize("kind,body,error", TYPOS, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(TYPOS)])
def test_a_typo_is_reported_as_a_typo_with_etcd_down(tmp_path: Path, kind: str, body: str,
                                                     error: str) -> None:
    """With etcd down, a config typo is still reported as the config error (exit 2, one line
    naming the file and the table), not as the etcd error."""
    conf = tmp_path / f"{kind}.toml"
    conf.write_text(f'etcd = "127.0.0.1:{free_port()}"\n' + body)   # nothing listens there
    r = run(kind, conf, tmp_path)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith(f"sluice {kind}: {conf}: {error}"), lines[0]


def test_a_drainer_with_a_sink_typo_writes_nothing_to_etcd(tmp_path: Path, etcd) -> None:  # type: ignore[no-untyped-def]
    """The sink's options are checked before the drainer joins etcd: a typo in [to] leaves no
    registration and takes no epoch."""
    conf = tmp_path / "drainer.toml"
    conf.write_text(f'etcd = "{etcd.endpoint}"\ncluster-id = 5\nname = "d1"\nsink = "file"\n'
                    f'[to]\ndir = "{tmp_path / "out"}"\nfsynk = false\n')
    r = run("drainer", conf, tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"sluice drainer: {conf}: [to] (file sink): unknown key 'fsynk' "
                                "(did you mean 'fsync'?)")
    client = Etcd(etcd.endpoint)
    try:
        kvs, _ = client.get_prefix("/sluice/")
    finally:
        client.close()
    assert kvs == []
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["tso", "pump", "drainer", "capture"])
def test_a_malformed_etcd_endpoint_is_a_config_error(tmp_path: Path, kind: str) -> None:
    """A malformed etcd endpoint is one line naming the file and the key, exit 2 — not a
    ValueError traceback from deep inside the etcd client."""
    conf = tmp_path / f"{kind}.toml"
    extra = 'sink = "file"\n[to]\ndir = "out"\n' if kind == "drainer" else ""
    conf.write_text('etcd = "garbage"\n' + extra)
    r = run(kind, conf, tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == (f"sluice {kind}: {conf}: key 'etcd': etcd endpoint 'garbage' is "
                                "not host:port (e.g. 127.0.0.1:2379; several separated by commas)")
