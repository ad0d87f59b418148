"""What every long-running process (pump, drainer, capture, TSO) does the same at start-up:
its shared flags, flag overrides, the etcd reachability check."""
from __future__ import annotations

import argparse
from collections.abc import Iterable

from .errors import ConfigError, EtcdUnavailable
from .etcd import Etcd
from .tls import SecurityConfig


def add_process_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by every long-running process."""
    p.add_argument("--config", "-c", help="TOML config file (kebab-case keys)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set storage.max-binlog-size=1048576")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-file", help="log to this file instead of stderr")


def flag_overrides(args: argparse.Namespace, flags: Iterable[tuple[str, str]]) -> list[str]:
    """`--set` overrides followed by the string flags given on the command line, as
    `key="value"` overrides (a flag wins over the config file, the same as `--set`)."""
    overrides = list(args.overrides)
    for flag, key in flags:
        value = getattr(args, flag, None)
        if value:
            overrides.append(f'{key}="{value}"')
    return overrides


def check_etcd_reachable(endpoints: str, security: SecurityConfig) -> None:
    """Fail at start-up with a ConfigError naming the endpoints, not later inside a loop."""
    etcd = Etcd(endpoints, security, timeout=3)
    try:
        etcd.revision()
    except EtcdUnavailable as e:
        raise ConfigError(f"etcd {endpoints}: unreachable ({e}); start etcd or fix the "
                          "`etcd` key") from None
    finally:
        etcd.close()
