"""The read-only hold/release component on synthetic binlog positions."""
from __future__ import annotations

from sluice.capture.snapshot.chunks import Chunk
from sluice.capture.snapshot.emit import SNAPSHOT_SUB_SEQ
from sluice.capture.snapshot.keys import KeySpec, SnapshotTable
from sluice.capture.snapshot.readonly import ConsistentReadHold
from sluice.core.table import TableShape
from sluice.proto import sluice_pb2 as pb

SHAPE = SnapshotTable(
    shape=TableShape(pb.TableInfo(schema_name="d", table_name="t",
                                  columns=[pb.ColumnInfo(name="id", data_type="int")]), ("id",)),
    key=KeySpec("d", "t", ("id",), "primary", True))
FILE = "mariadb-bin.000002"


def pos(off: int) -> pb.Position:
    return pb.Position(file_seq=2, offset=off, file_name=FILE)


def names(released: list) -> list[str]:
    return [f"chunk@{r.chunk.position.offset}+{r.chunk.position.sub_seq - SNAPSHOT_SUB_SEQ}"
            if r.chunk else r.txn for r in released]


def test_chunk_is_emitted_between_the_transactions_before_and_after_its_position() -> None:
    """Invariant: a chunk read at binlog position p is emitted after every source transaction
    that starts before p and before every one that starts at or after p."""
    hold = ConsistentReadHold(start_position=pos(100))
    assert names(hold.offer("t100", pos(100))) == ["t100"]
    ticket = hold.register()
    # p unknown: anything read after registration waits
    assert hold.offer("t200", pos(200)) == []
    hold.set_position(ticket, FILE, 300)
    assert names(hold.poll()) == ["t200"]            # before p: flows
    assert hold.offer("t300", pos(300)) == []        # at p: held
    assert hold.offer("t400", pos(400)) == []
    hold.complete(ticket, SHAPE, Chunk("d.t", 0, None, (10,), False), [])
    assert names(hold.poll()) == ["chunk@200+0", "t300", "t400"]
    assert hold.held == 0 and hold.pending == 0


def test_chunks_wait_for_the_reader_and_go_out_in_position_order() -> None:
    hold = ConsistentReadHold(start_position=pos(100))
    a, b = hold.register(), hold.register()
    hold.set_position(b, FILE, 500)
    hold.set_position(a, FILE, 300)
    hold.complete(b, SHAPE, Chunk("d.t", 1, (10,), (20,), False), [])
    hold.complete(a, SHAPE, Chunk("d.t", 0, None, (10,), False), [])
    assert hold.poll() == []                         # the reader has not reached p yet
    assert names(hold.offer("t250", pos(250))) == ["t250"]
    assert names(hold.reader_at(2, 320)) == ["chunk@250+0"]
    assert names(hold.offer("t450", pos(450))) == ["t450"]
    assert names(hold.offer("t500", pos(500))) == ["chunk@450+0", "t500"]


def test_abandoned_ticket_releases_what_it_held() -> None:
    hold = ConsistentReadHold()
    t = hold.register()
    assert hold.offer("t1", pos(10)) == []
    hold.abandon(t)
    assert names(hold.poll()) == ["t1"]
