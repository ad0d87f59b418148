"""The capture's native dump-connection reader (sluice_native.PacketReader, native/src/sockread.rs)
against a real TCP socket served by the test, and the strict stream reader's read timeout against
a real MariaDB: payloads cut across reads, a 16 MB payload in continuation packets, a connection
lost mid-packet, a read timeout, a packet out of sequence, lingering after a small read, and the
read count read by another thread while the reader waits without the GIL."""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pymysql
import pytest

from sluice.capture.reader import EVENTS, SourceDisconnected, StrictBinLogStreamReader
from sluice.capture.types import sluice_native
from tests.support.mariadb import MariaDBServer

CHUNK, SMALL = 256 * 1024, 16 * 1024


def pk(payload: bytes, seq: int) -> bytes:
    return len(payload).to_bytes(3, "little") + bytes([seq & 255]) + payload


@pytest.fixture
def conn() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the server's side, the client's side) of a loopback TCP connection; the client in
    Python's timeout mode (a non-blocking descriptor), as pymysql leaves the dump connection."""
    with socket.create_server(("127.0.0.1", 0)) as srv:
        client = socket.create_connection(srv.getsockname())
        server, _ = srv.accept()
    client.settimeout(10)
    try:
        yield server, client
    finally:
        server.close()
        client.close()


def in_thread(fn: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def read(r: object, timeout: float | None = 5.0, linger_ms: float = 0.0,
         linger_max_ms: float = 0.0) -> tuple[list[bytes], int, int, str | None]:
    return r.read(timeout, CHUNK, SMALL, linger_ms, linger_max_ms)  # type: ignore[attr-defined]


def test_a_payload_cut_across_many_reads_comes_back_whole(conn: tuple[socket.socket, socket.socket]) -> None:
    server, client = conn
    a, b = b"\x00" + b"a" * 999, b"\x00event-b"
    wire = pk(a, 254) + pk(b, 255)

    def trickle() -> None:
        for i in range(0, len(wire), 97):
            server.sendall(wire[i:i + 97])
            time.sleep(0.001)
    t = in_thread(trickle)
    r = sluice_native.PacketReader(client.fileno(), 254)
    got: list[bytes] = []
    while len(got) < 2:
        payloads, seq, bad, err = read(r)
        assert err is None and bad == -1
        got += payloads
    t.join()
    assert got == [a, b] and seq == 0     # sequence numbers wrap at 256
    assert r.reads > 2


def test_bytes_fed_first_then_the_socket(conn: tuple[socket.socket, socket.socket]) -> None:
    """What the connection's buffered reader held is read before the socket."""
    server, client = conn
    wire = pk(b"\x00first", 1) + pk(b"\x00second", 2)
    r = sluice_native.PacketReader(client.fileno(), 1)
    r.feed(wire[:7])
    server.sendall(wire[7:])
    got: list[bytes] = []
    while len(got) < 2:
        payloads, _, _, err = read(r)
        assert err is None
        got += payloads
    assert got == [b"\x00first", b"\x00second"]


def test_a_16mb_payload_in_continuation_packets(conn: tuple[socket.socket, socket.socket]) -> None:
    server, client = conn
    big = b"\x00" + b"x" * (0xFFFFFF - 1)
    wire = pk(big, 3) + pk(b"tail", 4) + pk(b"\x00after", 5)

    def send() -> None:
        for i in range(0, len(wire), 1 << 20):
            server.sendall(wire[i:i + (1 << 20)])
    t = in_thread(send)
    r = sluice_native.PacketReader(client.fileno(), 3)
    got: list[bytes] = []
    while len(got) < 2:
        payloads, seq, bad, err = read(r)
        assert err is None and bad == -1
        got += payloads
    t.join()
    assert len(got[0]) == 0xFFFFFF + 4 and got[0] == big + b"tail" and got[1] == b"\x00after"
    assert seq == 6


def test_a_connection_lost_mid_packet(conn: tuple[socket.socket, socket.socket]) -> None:
    """The whole payloads first, then the loss ("": the peer closed), even when the loss came
    while lingering after them."""
    server, client = conn
    wire = pk(b"\x00whole", 0) + pk(b"\x00cut-in-the-middle", 1)[:9]
    server.sendall(wire)
    server.shutdown(socket.SHUT_WR)
    r = sluice_native.PacketReader(client.fileno(), 0)
    assert read(r, linger_ms=50, linger_max_ms=200) == ([b"\x00whole"], 1, -1, None)
    assert read(r) == ([], 1, -1, "")


def test_a_read_timeout(conn: tuple[socket.socket, socket.socket]) -> None:
    _, client = conn
    r = sluice_native.PacketReader(client.fileno(), 0)
    t0 = time.monotonic()
    assert read(r, timeout=0.3) == ([], 0, -1, "timed out")
    assert 0.29 <= time.monotonic() - t0 < 3


def test_a_packet_out_of_sequence(conn: tuple[socket.socket, socket.socket]) -> None:
    """The payloads before it are returned, its number reported; MariaDB's shutdown error packet
    comes with sequence number 0."""
    server, client = conn
    server.sendall(pk(b"\x00a", 7) + pk(b"\x00b", 8) + pk(b"\xff\x00\x00error", 0))
    r = sluice_native.PacketReader(client.fileno(), 7)
    got, seq, bad = [], 7, -1
    while bad < 0:
        payloads, seq, bad, err = read(r)
        assert err is None
        got += payloads
    assert (got, seq, bad) == ([b"\x00a", b"\x00b"], 9, 0)


def test_lingering_hands_a_trickle_over_in_one_batch(conn: tuple[socket.socket, socket.socket]) -> None:
    """After a small read the reader keeps reading while bytes keep coming (here every 5 ms,
    lingering 30 ms): one batch; without lingering the first read's payload alone."""
    server, client = conn

    def trickle(first: int) -> None:
        for i in range(4):
            server.sendall(pk(b"\x00%d" % i, first + i))
            time.sleep(0.005)
    r = sluice_native.PacketReader(client.fileno(), 0)
    t = in_thread(lambda: trickle(0))
    payloads, seq, _, err = read(r, linger_ms=30, linger_max_ms=500)
    t.join()
    assert err is None and payloads == [b"\x000", b"\x001", b"\x002", b"\x003"] and seq == 4
    time.sleep(0.05)
    t = in_thread(lambda: trickle(4))
    payloads, seq, _, err = read(r)
    t.join()
    assert err is None and payloads == [b"\x000"] and seq == 5


def test_a_trickle_is_read_once_per_linger_not_once_per_packet(
        conn: tuple[socket.socket, socket.socket]) -> None:
    """A live source sends about one packet per transaction. While lingering the reader sleeps
    and takes what came in one read: 40 packets 1 ms apart, lingering 10 ms (200 ms at most),
    take ~5 reads; a reader that waited on the socket instead would read each one as it came
    (~40 reads, as many wakeups)."""
    server, client = conn

    def trickle() -> None:
        for i in range(40):
            server.sendall(pk(b"\x00%d" % i, i))
            time.sleep(0.001)
    r = sluice_native.PacketReader(client.fileno(), 0)
    t = in_thread(trickle)
    got: list[bytes] = []
    while len(got) < 40:
        payloads, _, _, err = read(r, linger_ms=10, linger_max_ms=200)
        assert err is None
        got += payloads
    t.join()
    assert got == [b"\x00%d" % i for i in range(40)]
    assert r.reads <= 15, f"{r.reads} reads for 40 packets"


def test_lingering_is_bounded(conn: tuple[socket.socket, socket.socket]) -> None:
    """A source that never pauses is handed over after `linger_max_ms` at most."""
    server, client = conn
    stop = threading.Event()

    def stream() -> None:
        seq = 0
        while not stop.is_set():
            server.sendall(pk(b"\x00tick", seq))
            seq += 1
            time.sleep(0.0005)
    t = in_thread(stream)
    r = sluice_native.PacketReader(client.fileno(), 0)
    try:
        t0 = time.monotonic()
        payloads, _, _, err = read(r, linger_ms=20, linger_max_ms=50)
        took = time.monotonic() - t0
    finally:
        stop.set()
        t.join()
    assert err is None and len(payloads) > 1 and took < 1.0


def test_the_read_count_is_readable_while_a_read_waits(conn: tuple[socket.socket, socket.socket]) -> None:
    """The capture's metrics read `reads` from the event loop while the reader thread waits in
    `read` without the GIL."""
    server, client = conn
    r = sluice_native.PacketReader(client.fileno(), 0)
    out: list[object] = []
    t = in_thread(lambda: out.append(read(r)))
    time.sleep(0.1)
    assert r.reads == 0 and t.is_alive()
    server.sendall(pk(b"\x00late", 0))
    t.join(5)
    assert out == [([b"\x00late"], 1, -1, None)] and r.reads == 1


def test_read_timeout_of_the_dump_connection(mariadb_module: MariaDBServer) -> None:
    """No heartbeats and nothing written: the dump connection's read times out as pymysql's
    would (OperationalError 2013, "timed out", the connection force-closed) and the strict
    reader turns the library's reconnect into SourceDisconnected."""
    db = mariadb_module
    pos = str(db.execute("SELECT @@GLOBAL.gtid_binlog_pos")[0][0] or "")
    s = StrictBinLogStreamReader({"host": "127.0.0.1", "port": db.port, "user": db.user,
                                  "password": db.password, "read_timeout": 1},
                                 server_id=4250, blocking=True, is_mariadb=True,
                                 auto_position=pos, only_events=EVENTS, enable_logging=False)
    errors: list[BaseException] = []
    refill = s._refill

    def recording() -> bytes:
        try:
            return refill()
        except BaseException as e:
            errors.append(e)
            raise
    s._refill = recording  # type: ignore[method-assign]
    t0 = time.monotonic()
    try:
        with pytest.raises(SourceDisconnected):
            for _ in s:
                pass
    finally:
        s.close()
    assert 0.9 < time.monotonic() - t0 < 10
    e = errors[-1]
    assert isinstance(e, pymysql.OperationalError) and e.args[0] == 2013 and "timed out" in e.args[1]
    assert s.reads >= 1
