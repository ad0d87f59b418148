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

import os

# Before gRPC is imported anywhere in the process: its core installs fork handlers by default,
# and a fork while its threads poll (the JVM launcher, any subprocess) broke the child — seen as
# Spark's "Java gateway process exited", and 11 of 300 `/bin/true` children failing beside an
# etcd client in a test. Every process we fork execs at once and never uses gRPC.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import argparse  # noqa: E402
import importlib  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402

from sluice.core.errors import ConfigError, SluiceError

# command -> (module with add_arguments(parser) and run(args) -> int, help)
COMMANDS: dict[str, tuple[str, str]] = {
    "tso": ("sluice.tso.server", "run a TSO (timestamp oracle) server"),
    "pump": ("sluice.pump.server", "run a pump: durable binlog storage"),
    "drainer": ("sluice.drainer.main", "run a drainer: merge pumps and apply to a sink"),
    "capture": ("sluice.capture.server", "run a MySQL/MariaDB binlog capture"),
    "ctl": ("sluice.ctl.admin", "administer nodes, checkpoints, positions and snapshots"),
    "cluster": ("sluice.ctl.cluster", "run a local cluster: up | down | status | logs | stop | start | restart"),
    "demo": ("sluice.ctl.demo", "run the pipeline end to end on a local cluster"),
    "spark-sql": ("sluice.spark_sink.sql", "run Spark SQL against the Sluice tables"),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser: it knows the command names only (no command module imported)."""
    lines = [f"  {name:<10} {help_text}" for name, (_, help_text) in COMMANDS.items()]
    parser = argparse.ArgumentParser(
        prog="sluice", description=__doc__.split("\n\n")[0],
        epilog="commands:\n" + "\n".join(lines) + "\n\n`sluice COMMAND --help` for each command's flags",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND")
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def command_parser(name: str):  # type: ignore[no-untyped-def]
    """(parser, module) for one command; imports only that command's module."""
    module_name, help_text = COMMANDS[name]
    p = argparse.ArgumentParser(prog=f"sluice {name}", description=help_text)
    try:
        mod = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            return p, None
        raise
    mod.add_arguments(p)
    return p, mod


def main(argv: list[str] | None = None) -> int:
    top = build_parser().parse_args(argv)
    parser, mod = command_parser(top.command)
    if mod is None:
        print(f"sluice {top.command}: not part of this build yet", file=sys.stderr)
        return 2
    args = parser.parse_args(top.args)
    args.command = top.command
    run: Callable[[argparse.Namespace], int] = mod.run
    from sluice.core.grpcutil import calm_blocking_waits
    calm_blocking_waits()
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
