"""`sluice`: one CLI for every process and for administration.

    sluice tso|pump|drainer|capture --config x.toml [--set key=value ...]
    sluice ctl ...            admin commands (nodes, states, checkpoints, positions, snapshots)
    sluice cluster up|down|status|logs
    sluice demo
    sluice spark-sql "SELECT ..."

Each process module is imported only when its command runs, so `--help` stays fast and the CLI
does not pull every dependency into every process. Exit codes: 0 ok, 1 runtime failure, 2 bad
configuration or usage (one line naming the problem).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable

from sluice.core.errors import ConfigError, SluiceError

# command -> (module with add_arguments(parser) and run(args) -> int, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "tso": ("sluice.tso.server", "run a TSO (timestamp oracle) server"),
    "pump": ("sluice.pump.server", "run a pump: durable binlog storage"),
    "drainer": ("sluice.drainer.server", "run a drainer: merge pumps and apply to a sink"),
    "capture": ("sluice.capture.server", "run a MySQL/MariaDB binlog capture"),
    "ctl": ("sluice.ctl.admin", "administer nodes, checkpoints, positions and snapshots"),
    "cluster": ("sluice.ctl.cluster", "run a local cluster: up | down | status | logs"),
    "demo": ("sluice.ctl.demo", "run the pipeline end to end on a local cluster"),
    "spark-sql": ("sluice.spark_sink.sql", "run Spark SQL against the Sluice tables"),
}


def add_process_arguments(p: argparse.ArgumentParser) -> None:
    """Flags shared by every long-running process."""
    p.add_argument("--config", "-c", help="TOML config file (kebab-case keys)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set storage.max-binlog-size=1048576")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-file", help="log to this file instead of stderr")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluice", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module)
        mod = _load(module)
        if mod is None:
            p.set_defaults(_unavailable=True)
            continue
        mod.add_arguments(p)
    return parser


def _load(module: str):  # type: ignore[no-untyped-def]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            return None
        raise


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "_unavailable", False):
        print(f"sluice {args.command}: not part of this build yet", file=sys.stderr)
        return 2
    run: Callable[[argparse.Namespace], int] = importlib.import_module(args._module).run
    try:
        return int(run(args) or 0)
    except ConfigError as e:
        print(f"sluice {args.command}: {e}", file=sys.stderr)
        return 2
    except SluiceError as e:
        logging.getLogger("sluice").error("%s", e)
        print(f"sluice {args.command}: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
