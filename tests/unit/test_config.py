"""TOML config loading: every key and type checked, one-line errors naming the file and the key."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sluice.core import config
from sluice.core.errors import ConfigError
from tests.support.procs import REPO, sluice_argv


@dataclass
class Storage:
    max_binlog_size: int = 64 << 20
    sync: bool = True
    ratio: float = 0.5


@dataclass
class Tls:
    ca: str = ""


@dataclass
class Security:
    tls: Tls = field(default_factory=Tls)


@dataclass
class PumpLike:
    addr: str = "127.0.0.1:8250"
    endpoints: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    retention: float | None = None
    storage: Storage = field(default_factory=Storage)
    security: Security = field(default_factory=Security)


@dataclass
class Required:
    name: str
    port: int = 1


def write(tmp_path: Path, text: str, name: str = "pump.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def error_of(fn) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ConfigError) as e:
        fn()
    msg = str(e.value)
    assert "\n" not in msg, f"error is not one line: {msg!r}"
    return msg


def test_defaults_without_file() -> None:
    c = config.load(PumpLike)
    assert c == PumpLike()


def test_file_values_and_nested_tables(tmp_path: Path) -> None:
    p = write(tmp_path, 'addr = "0.0.0.0:1"\nendpoints = ["a:1", "b:2"]\nretention = 3\n'
                        '[labels]\nzone = "z1"\n'
                        '[storage]\nmax-binlog-size = 1024\nratio = 1\n'
                        '[security.tls]\nca = "/ca.pem"\n')
    c = config.load(PumpLike, p)
    assert c.addr == "0.0.0.0:1" and c.endpoints == ["a:1", "b:2"]
    assert c.retention == 3.0 and isinstance(c.retention, float)
    assert c.labels == {"zone": "z1"}
    assert c.storage == Storage(max_binlog_size=1024, sync=True, ratio=1.0)
    assert c.security.tls.ca == "/ca.pem"


def test_unknown_key_names_key_and_file_with_suggestion(tmp_path: Path) -> None:
    p = write(tmp_path, "adr = 'x'\n")
    assert error_of(lambda: config.load(PumpLike, p)) == \
        f"{p}: unknown key 'adr' (did you mean 'addr'?)"
    p = write(tmp_path, "[storage]\nmax-binlog-sise = 1\n")
    assert error_of(lambda: config.load(PumpLike, p)) == \
        f"{p}: unknown key 'max-binlog-sise' in [storage] (did you mean 'max-binlog-size'?)"
    p = write(tmp_path, "[security.tls]\nkey-file = 'k'\n")
    assert error_of(lambda: config.load(PumpLike, p)) == f"{p}: unknown key 'key-file' in [security.tls]"
    p = write(tmp_path, "max_binlog_size = 1\n")  # snake_case is not the TOML spelling
    assert "unknown key 'max_binlog_size'" in error_of(lambda: config.load(PumpLike, p))


def test_wrong_type_names_the_key(tmp_path: Path) -> None:
    cases = {
        "addr = 5\n": "key 'addr': expected str, got int 5",
        "[storage]\nmax-binlog-size = 'big'\n": "key 'storage.max-binlog-size': expected int, got str 'big'",
        "[storage]\nmax-binlog-size = true\n": "key 'storage.max-binlog-size': expected an integer, got a boolean",
        "[storage]\nsync = 1\n": "key 'storage.sync': expected bool, got int 1",
        "endpoints = ['a', 2]\n": "key 'endpoints[1]': expected str, got int 2",
        "endpoints = 'a'\n": "key 'endpoints': expected a list, got str",
        "storage = 3\n": "key 'storage': expected a table, got int",
        "retention = 'soon'\n": "key 'retention': expected float, got str 'soon'",
        "[labels]\nzone = 1\n": "key 'labels.zone': expected str, got int 1",
    }
    for text, want in cases.items():
        p = write(tmp_path, text)
        assert error_of(lambda: config.load(PumpLike, p)) == f"{p}: {want}", text


def test_missing_required_key_and_bad_files(tmp_path: Path) -> None:
    p = write(tmp_path, "port = 2\n", "r.toml")
    assert error_of(lambda: config.load(Required, p)) == f"{p}: missing required key 'name'"
    assert error_of(lambda: config.load(PumpLike, tmp_path / "nope.toml")) == \
        f"{tmp_path / 'nope.toml'}: config file not found"
    p = write(tmp_path, "addr = \n")
    assert error_of(lambda: config.load(PumpLike, p)).startswith(f"{p}: invalid TOML")


def test_set_overrides_win_over_the_file(tmp_path: Path) -> None:
    p = write(tmp_path, "addr = 'a:1'\n[storage]\nmax-binlog-size = 10\n")
    c = config.load(PumpLike, p, ["storage.max-binlog-size=20", "addr=b:2", "storage.sync=false",
                                  "security.tls.ca=/x.pem", 'endpoints=["e:1"]'])
    assert c.addr == "b:2"  # a bare word is a string
    assert c.storage.max_binlog_size == 20 and c.storage.sync is False
    assert c.security.tls.ca == "/x.pem" and c.endpoints == ["e:1"]
    # an error in an override says it came from --set, not from the file
    assert error_of(lambda: config.load(PumpLike, p, ["storage.max-binlog-size=x1"])) == \
        f"{p} (--set storage.max-binlog-size): key 'storage.max-binlog-size': expected int, got str 'x1'"
    assert error_of(lambda: config.load(PumpLike, None, ["storage.synk=1"])) == \
        "--set: unknown key 'synk' in [storage] (did you mean 'sync'?)"
    assert error_of(lambda: config.load(PumpLike, None, ["addr"])) == "--set 'addr': expected key=value"
    assert error_of(lambda: config.load(PumpLike, p, ["addr.x=1"])).startswith("--set 'addr.x=1'")


def test_from_dict_checks_like_load() -> None:
    assert config.from_dict(Storage, {"sync": False}, "drainer.toml [sink]") == Storage(sync=False)
    assert error_of(lambda: config.from_dict(Storage, {"snyc": 1}, "drainer.toml [sink]")) == \
        "drainer.toml [sink]: unknown key 'snyc' (did you mean 'sync'?)"


def test_dump_defaults_is_toml_shaped() -> None:
    d = config.dump_defaults(PumpLike)
    assert d["addr"] == "127.0.0.1:8250"
    assert d["storage"] == {"max-binlog-size": 64 << 20, "sync": True, "ratio": 0.5}
    assert d["security"] == {"tls": {"ca": ""}}


def test_process_exits_2_with_one_line_naming_the_key(tmp_path: Path) -> None:
    """A process given a bad config exits 2 with one line naming the file and the key."""
    bad = write(tmp_path, "lease-tll = 3\n", "bad.toml")
    r = subprocess.run(sluice_argv("tso", "--config", str(bad)), capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "bad.toml" in lines[0] and "'lease-tll'" in lines[0] and "lease-ttl" in lines[0]


@dataclass
class Source:
    user: str = "root"
    password: str = ""


@dataclass
class WithSecrets:
    source: Source = field(default_factory=Source)
    admin_password: str = ""


def test_passwords_come_from_env_or_file_and_errors_never_show_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A key named `password` (or ending in `-password`) may say `env:NAME` or `file:PATH`, so
    TOML files, `--set` flags and process listings need not carry the secret; the value is
    resolved at load time and never appears in an error message."""
    monkeypatch.setenv("SLUICE_TEST_PW", "s3cret-env")
    secret = tmp_path / "pw"
    secret.write_text("s3cret-file\n")
    f = tmp_path / "c.toml"
    f.write_text(f'admin-password = "file:{secret}"\n[source]\npassword = "env:SLUICE_TEST_PW"\n')
    c = config.load(WithSecrets, f)
    assert c.source.password == "s3cret-env" and c.admin_password == "s3cret-file"
    assert config.load(WithSecrets, f, ["source.password=plain"]).source.password == "plain"
    # only secret keys are resolved: any other string is taken as written
    assert config.load(WithSecrets, None, ["source.user=env:SLUICE_TEST_PW"]).source.user \
        == "env:SLUICE_TEST_PW"
    with pytest.raises(ConfigError, match=r"key 'source.password': environment variable "
                                          r"'SLUICE_NOT_SET_PW' is not set"):
        config.load(WithSecrets, None, ["source.password=env:SLUICE_NOT_SET_PW"])
    with pytest.raises(ConfigError, match="cannot read secret file") as e:
        config.load(WithSecrets, None, [f"admin-password=file:{tmp_path / 'missing'}"])
    assert "s3cret" not in str(e.value)
    # the real configs take it too: the capture's source and the MySQL sink's [to]
    from sluice.capture.config import CaptureConfig
    from sluice.drainer.sinks.mysql import MySQLSinkConfig
    cap = config.load(CaptureConfig, None, ["producer-id=c1", "source.password=env:SLUICE_TEST_PW"])
    assert cap.source.password == "s3cret-env"
    assert config.from_dict(MySQLSinkConfig, {"password": f"file:{secret}"}, "to").password \
        == "s3cret-file"


def test_capture_group_timing_keys_are_bounded() -> None:
    """group-max-wait-ms and group-min-interval-ms: 0..10000 ms, else an error naming the key."""
    from sluice.capture.config import CaptureConfig
    ok = config.load(CaptureConfig, None, ["producer-id=c1", "group-min-interval-ms=0",
                                           "group-max-wait-ms=0"])
    ok.validate("capture")
    for key, value in (("group-min-interval-ms", -1), ("group-max-wait-ms", 10_001)):
        cfg = config.load(CaptureConfig, None, ["producer-id=c1", f"{key}={value}"])
        with pytest.raises(ConfigError, match=rf"key '{key}' must be in \[0, 10000\] ms, not {value}"):
            cfg.validate("capture")
