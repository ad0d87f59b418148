"""Command-line flags every long-running process shares (pump, drainer, capture, TSO)."""
from __future__ import annotations

import argparse


def add_process_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by every long-running process."""
    p.add_argument("--config", "-c", help="TOML config file (kebab-case keys)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set storage.max-binlog-size=1048576")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-file", help="log to this file instead of stderr")
