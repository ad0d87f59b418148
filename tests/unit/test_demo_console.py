"""The demo's terminal (ctl/demo.py Console): on a terminal the progress line is redrawn in
place with a carriage return and messages print above it; on a pipe (CI logs, a test reading
the demo's output) every progress line is a plain line and no control character is written."""
from __future__ import annotations

import fcntl
import os
import select
import struct
import termios

from sluice.ctl.demo import Console


def _drain(fd: int) -> str:
    out = b""
    while select.select([fd], [], [], 0.2)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out.decode()


def test_on_a_terminal_the_progress_line_is_redrawn_in_place() -> None:
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        c = Console(tty)
        assert c.tty
        c.status("[ 1s] workload source 1 txns")
        c.status("[ 2s] workload source 2 txns")
        c.say("failover: tso-1 killed")
        c.end_status()
        c.say("verifying")
        text = _drain(master)
    os.close(master)
    assert "\r[ 1s] workload source 1 txns\x1b[K\r[ 2s] workload source 2 txns\x1b[K" in text
    # The message clears the live line, prints on its own line, then the live line returns.
    msg = text.index("failover: tso-1 killed")
    assert text[:msg].endswith("\r\x1b[K")
    assert text[msg:].startswith("failover: tso-1 killed\r\n[ 2s] workload source 2 txns")
    # After end_status the last progress line stays and later lines go below it.
    assert text.endswith("[ 2s] workload source 2 txns\r\nverifying\r\n")


def test_the_live_line_is_cut_to_the_terminal_width() -> None:
    """A line longer than the terminal would wrap, and `\\r` would then redraw only its last
    row: it is cut to the width (minus one column)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 30, 0, 0))
    with os.fdopen(slave, "w") as tty:
        Console(tty).status("x" * 100)
        text = _drain(master)
    os.close(master)
    assert text == "\r" + "x" * 29 + "\x1b[K"


def test_on_a_pipe_progress_lines_are_plain_lines() -> None:
    r, w = os.pipe()
    with os.fdopen(w, "w") as pipe:
        c = Console(pipe)
        assert not c.tty
        c.status("[ 1s] workload source 1 txns")
        c.say("workload done")
        c.status("[ 2s] draining source 2 txns")
        c.end_status()
    with os.fdopen(r) as f:
        text = f.read()
    assert text == ("[ 1s] workload source 1 txns\nworkload done\n"
                    "[ 2s] draining source 2 txns\n")
