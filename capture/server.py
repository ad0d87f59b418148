"""`sluice capture --config capture.toml`: MariaDB binlog -> pumps, exactly once.

Invariant: the capture streams only after the source passed every start-up check (exit 2 with
one line otherwise) and after recovery fenced older epochs and found where the pumps' committed
prefix ends; it then reads strictly after that position, and every later connection of the run
resumes strictly after the last transaction it read.

Start position, the schema-snapshot transaction, threads and snapshots: docs/capture.md
("Start position", "Schema at start", "Threads") and docs/snapshots.md.

The parts: capture/main.py (command line, restart loop), capture/incarnation.py (one producer
epoch: start-up and schema at start), capture/streaming.py (threads, groups, lag and progress
publishers), capture/start.py (what is read from the source at start).
"""
from __future__ import annotations

from sluice.capture.incarnation import TRANSIENT, Capture
from sluice.capture.main import (RESTART_BACKOFF_S, RESTART_RESET_S, add_arguments, load_config,
                                 run, run_restarting)
from sluice.capture.start import (_SYSTEM_DBS, _oldest_binlog, earliest_state,
                                  read_table_definitions, source_checks, start_snapshot_position)
from sluice.capture.streaming import (_END, _QUEUE, _STOP, PUBLISH_S, RECONNECT_BACKOFF_S,
                                      SIGNAL_POLL_S, TICK_S, Streaming, _Disconnected,
                                      _progress_only, progress_doc)

__all__ = ["PUBLISH_S", "RECONNECT_BACKOFF_S", "RESTART_BACKOFF_S", "RESTART_RESET_S",
           "SIGNAL_POLL_S", "TICK_S", "TRANSIENT", "Capture", "Streaming", "_END", "_QUEUE",
           "_STOP", "_SYSTEM_DBS", "_Disconnected", "_oldest_binlog", "_progress_only",
           "add_arguments", "earliest_state", "load_config", "progress_doc",
           "read_table_definitions", "run", "run_restarting", "source_checks",
           "start_snapshot_position"]
