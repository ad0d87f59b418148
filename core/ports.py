"""Free listening ports, chosen below the kernel's ephemeral port range.

A port found by binding port 0 comes from the ephemeral range, the range the kernel also takes the
local port of every outgoing connection from: between the moment it is chosen and the moment the
server binds it, any connection opened on the machine (a test's client, another cluster's
heartbeat) may take it, and the server fails with "address already in use". A port below the
range is taken only by another listener, which binding it here detects.
"""
from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 15000        # above the registered ports most services listen on by default
_TRIES = 64


def ephemeral_range() -> tuple[int, int]:
    """The kernel's (first, last) ephemeral port; Linux's default where it cannot be read."""
    try:
        first, last = (int(x) for x in _RANGE_FILE.read_text().split())
        return first, last
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on at `host`, below the ephemeral range when the range leaves
    room (otherwise one the kernel picks, as before)."""
    first, _ = ephemeral_range()
    if first - _LOWEST >= 1000:
        rnd = random.SystemRandom()
        for _ in range(_TRIES):
            port = rnd.randrange(_LOWEST, first)
            if _bindable(host, port):
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False
