"""Free ports are chosen below the kernel's ephemeral range, where no outgoing connection can take
one between its choice and the server's bind (core/ports.py)."""
from __future__ import annotations

import socket

import pytest

from sluice.core import ports

pytestmark = pytest.mark.timeout(30)


def test_a_free_port_is_below_the_ephemeral_range_and_bindable() -> None:
    first, last = ports.ephemeral_range()
    assert 0 < first <= last
    seen = set()
    for _ in range(50):
        p = ports.free_port()
        assert ports._LOWEST <= p < first
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
        seen.add(p)
    assert len(seen) > 40   # chosen at random: two parallel callers rarely collide


def test_a_port_something_listens_on_is_not_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (taken + 1, 60999))
        monkeypatch.setattr(ports, "_LOWEST", taken - 1000)
        # every candidate but one is the busy port, so the chooser has to skip it
        picks = iter([taken] * 10 + [taken - 1])
        monkeypatch.setattr(ports.random.SystemRandom, "randrange", lambda self, a, b: next(picks))
        assert ports.free_port() == taken - 1


def test_without_room_below_the_range_the_kernel_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (ports._LOWEST + 10, 60999))
    p = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", p))
