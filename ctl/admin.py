"""`sluice ctl`: administer a Sluice cluster (TiDB-Binlog's binlogctl, for Sluice).

    sluice ctl [--cluster-dir DIR | --etcd HOST:PORT,... --cluster-id N] [--json] COMMAND ...

    pumps | drainers | producers            list nodes (state, alive, ts, score, epoch, updated)
    pause-pump | offline-pump ID [--wait]   ask a pump to become paused / offline
    update-pump ID --state S [--force]      set any legal state (--force: any state)
    mark-lost ID [--force]                  take a dead pump out of the merge (data loss at replicas=1)
    pause-drainer | offline-drainer | update-drainer ID ...
    update-producer ID --state S [--force]
    checkpoint show NAME | set NAME --commit-ts TS [--position PRODUCER=POS ...]
    position show PRODUCER | set PRODUCER POSITION   a capture's position; rewind or skip it
    tso                                     a fresh ts from the TSO leader
    txn-status START_TS [--producer ID]     what each pump and the producer know of a transaction
    resolve-txn START_TS [--commit-ts TS | --rollback] [--producer ID]
    generate-meta [--data-dir DIR]          initial commit ts for a drainer after a full dump
    snapshot execute|stop|pause|resume|status --producer ID [--tables RE,...] [--condition SQL]
    verify --source DSN --target DSN|--spark-config TOML   chunked source vs sink comparison
    certs [--certs-dir DIR] [--host H ...] [--renew]       make the CA and node/client certificates

Invariant: every expected failure ends in one line on stderr and exit code 1 (runtime: etcd, a
pump, the TSO or a producer unreachable) or 2 (bad usage or input, or a refusal the command can
fix) — never a traceback (see ctl/context.py for which is which).

Common options are accepted before or after the command (`sluice ctl pumps --json`).
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from sluice.core import errors
from sluice.core import log as logsetup

from . import certs, checkpoints, meta, nodes, positions, snapshots, txns, verify
from .context import CLUSTER_CTL_CONFIG, ENV_CLUSTER_ID, ENV_ETCD, Ctx, exit_code, load_config

Handler = Callable[[Ctx, argparse.Namespace], int]


def _add_common(p: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command takes; in sub-parsers they default to SUPPRESS so a value given
    before the command is not reset by the command's parser."""
    def d(value: object) -> object:
        return argparse.SUPPRESS if suppress else value
    g = p.add_argument_group("cluster")
    g.add_argument("--etcd", default=d(None), metavar="HOST:PORT[,...]",
                   help=f"etcd endpoints (env {ENV_ETCD}; default 127.0.0.1:2379)")
    g.add_argument("--cluster-id", type=int, default=d(None), metavar="N",
                   help=f"cluster id (env {ENV_CLUSTER_ID}; default 1)")
    g.add_argument("--config", "-c", default=d(None), metavar="TOML",
                   help="read etcd, cluster-id, timeout and [security] from this TOML (ctl's "
                        "own or any process's config file)")
    g.add_argument("--cluster-dir", default=d(None), metavar="DIR",
                   help=f"a `sluice cluster up` directory: read its {CLUSTER_CTL_CONFIG} (etcd, "
                        "cluster-id and the client certificate); env SLUICE_CLUSTER_DIR")
    g.add_argument("--timeout", type=float, default=d(None), metavar="SECONDS",
                   help="per call to etcd, a pump, the TSO or a producer (default 5)")
    g.add_argument("--ssl-ca", default=d(None), help="CA for mutual TLS (etcd and gRPC)")
    g.add_argument("--ssl-cert", default=d(None), help="client certificate for mutual TLS")
    g.add_argument("--ssl-key", default=d(None), help="client key for mutual TLS")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", default=d(False),
                   help="machine-readable JSON on stdout")
    o.add_argument("--log-level", default=d("error"),
                   choices=["debug", "info", "warning", "error"],
                   help="library log level on stderr (default error)")
    o.add_argument("--log-file", default=d(None), help="log to this file instead of stderr")
    return p


# Destinations of the options _add_common adds: usage lines show them as one "[options]".
COMMON_DESTS = frozenset({"etcd", "cluster_id", "config", "cluster_dir", "timeout", "ssl_ca",
                          "ssl_cert", "ssl_key", "json", "log_level", "log_file"})


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Usage lines without the common options (`--help` still lists them): a usage error
    shows what the command itself takes, not eight lines of cluster and output options."""

    def add_usage(self, usage, actions, groups, prefix=None):  # type: ignore[no-untyped-def]
        if usage is None:
            own = [a for a in actions if a.dest not in COMMON_DESTS]
            if len(own) < len(actions):
                text = self._format_usage(None, own, [], "").strip()
                prog = self._prog
                usage = prog + " [options]" + text[len(prog):] if text.startswith(prog) else text
        super().add_usage(usage, actions, groups, prefix)


class _CommandParser(argparse.ArgumentParser):
    """A command's parser reports arguments it does not know itself, with its own usage (by
    default argparse hands them up and `sluice ctl`'s usage is printed instead)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def _use_formatter(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = _Formatter
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                _use_formatter(sub)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_common(parser, suppress=False)
    parser.epilog = "\n\n".join(__doc__.split("\n\n")[1:3])
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, suppress=True)
    sub = parser.add_subparsers(dest="ctl_command", metavar="COMMAND", required=True,
                                parser_class=_CommandParser)
    nodes.add_commands(sub, common)
    checkpoints.add_commands(sub, common)
    positions.add_commands(sub, common)
    meta.add_commands(sub, common)
    txns.add_commands(sub, common)
    snapshots.add_commands(sub, common)
    verify.add_commands(sub, common)
    certs.add_commands(sub, common)
    _use_formatter(parser)


def execute(args: argparse.Namespace, out=None, err=None) -> int:  # type: ignore[no-untyped-def]
    """Run the parsed command; map expected failures to one stderr line and an exit code."""
    stderr = err or sys.stderr
    ctx: Ctx | None = None
    try:
        ctx = Ctx(load_config(args), json_out=bool(getattr(args, "json", False)), out=out,
                  err=stderr)
        handler: Handler = args.func
        return int(handler(ctx, args) or 0)
    except errors.SluiceError as e:
        stderr.write(f"sluice ctl: {_one_line(str(e))}\n")
        return exit_code(e)
    finally:
        if ctx is not None:
            ctx.close()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def run(args: argparse.Namespace) -> int:
    logsetup.setup(getattr(args, "log_level", "error"), getattr(args, "log_file", None))
    return execute(args)
