"""`sluice capture` command line: flags, config, start-up checks, and the loop that starts a
new incarnation after a transient failure.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from sluice.capture.config import CaptureConfig
from sluice.capture.metrics import CaptureMetrics
from sluice.core.cli import check_etcd_reachable
from sluice.core import config as cfg
from sluice.core import log as logsetup
from sluice.core.loopwatch import watched
from sluice.capture.incarnation import TRANSIENT, Capture
from sluice.capture.start import source_checks

RESTART_BACKOFF_S = (1.0, 30.0)      # first and longest wait between in-process restarts
RESTART_RESET_S = 60.0               # a run this long resets the restart backoff


def add_arguments(p: argparse.ArgumentParser) -> None:
    from sluice.core.cli import add_process_arguments
    add_process_arguments(p)
    p.add_argument("--check", action="store_true",
                   help="run the source start-up checks and exit (0: ok, 2: a check failed)")


def load_config(args: argparse.Namespace) -> CaptureConfig:
    config = cfg.load(CaptureConfig, args.config, list(args.overrides))
    config.validate(str(args.config or "<defaults>"))
    return config

def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    logsetup.setup(args.log_level, args.log_file)
    sp = config.start_position
    # Checked before touching the cluster, so a misconfigured source fails fast with exit 2.
    source_checks(config, sp[5:] if sp.startswith("gtid:") else None)
    if args.check:
        return 0
    check_etcd_reachable(config.etcd, config.security)
    metrics = CaptureMetrics()
    metrics.metrics.serve(config.metrics_addr)
    return run_restarting(config, metrics)


def run_restarting(config: CaptureConfig, metrics: CaptureMetrics,
                   sleep: Any = time.sleep) -> int:
    """Run the capture; after a transient failure start it over in this process, as a
    supervisor would restart it: a new incarnation bumps the producer epoch and recovers its
    position from the pumps (DESIGN §8), so nothing is written twice. A group whose commit was
    cut off stays in flight on its pump until the new epoch's TxnStatus decides it. While a
    non-offline pump stays unreachable, recovery fails and is retried with backoff: the capture
    waits for the pump (or for `sluice ctl pump offline/mark-lost`) instead of exiting."""
    backoff = RESTART_BACKOFF_S[0]
    while True:
        began = time.monotonic()
        try:
            return asyncio.run(watched(f"capture {config.producer_id}",
                                       Capture(config, metrics).run()))
        except TRANSIENT as e:
            if time.monotonic() - began > RESTART_RESET_S:
                backoff = RESTART_BACKOFF_S[0]
            metrics.restarts.inc()
            metrics.set_state("restarting", error=f"{type(e).__name__}: {e}"[:300],
                              retry_in_s=backoff)
            sleep(backoff)
            backoff = min(backoff * 2, RESTART_BACKOFF_S[1])
