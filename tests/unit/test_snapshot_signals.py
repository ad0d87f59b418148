"""Signal-table rows and etcd values -> typed snapshot commands, with clear refusals."""
from __future__ import annotations

import json

import pytest

from sluice.capture.snapshot.signals import (ExecuteSnapshot, InvalidSignal, LogSignal,
                                             PauseSnapshot, ResumeSnapshot, StopSnapshot,
                                             Watermark, parse_etcd_signal, parse_signal,
                                             watermark_row)


def test_execute_snapshot_debezium_format() -> None:
    """Invariant: a signal is parsed into exactly one typed command or refused naming its id."""
    s = parse_signal("ad-hoc-1", "execute-snapshot", json.dumps({
        "data-collections": ["shop\\.orders", "shop\\.line_.*"], "type": "incremental",
        "additional-conditions": [{"data-collection": "shop\\.orders", "filter": "id > 100"}],
        "surrogate-key": "uuid"}))
    assert isinstance(s, ExecuteSnapshot)
    assert s.snapshot_type == "incremental" and s.surrogate_key == "uuid"
    tables = ["shop.orders", "shop.line_items", "shop.line_x", "shop.users", "shopXorders"]
    assert s.tables(tables) == ["shop.orders", "shop.line_items", "shop.line_x"]
    assert s.condition_for("shop.orders") == "(id > 100)"
    assert s.condition_for("shop.line_x") == ""


def test_other_signal_types() -> None:
    assert parse_signal("2", "stop-snapshot", '{"data-collections": ["a\\\\.b"]}') == \
        StopSnapshot("2", ("a\\.b",))
    assert parse_signal("3", "stop-snapshot", None) == StopSnapshot("3", ())
    assert parse_signal("4", "pause-snapshot", "") == PauseSnapshot("4")
    assert parse_signal("5", "resume-snapshot", None) == ResumeSnapshot("5")
    assert parse_signal("6", "log", '{"message": "hi"}') == LogSignal("6", "hi")
    rid, rtype, rdata = watermark_row("w1", True)
    assert parse_signal(rid, rtype, rdata) == Watermark("w1-open", "w1", True)
    rid, rtype, rdata = watermark_row("w1", False)
    assert parse_signal(rid, rtype, rdata) == Watermark("w1-close", "w1", False)


@pytest.mark.parametrize("type_,data,problem", [
    ("execute-snapshot", "{", "data is not JSON"),
    ("execute-snapshot", "[]", "must be a JSON object"),
    ("execute-snapshot", "{}", "data-collections is missing"),
    ("execute-snapshot", '{"data-collections": ["("]}', "not a valid regex"),
    ("execute-snapshot", '{"data-collections": ["a"], "type": "blocking"}', "not supported"),
    ("execute-snapshot", '{"data-collections": ["a"], "additional-conditions": '
                         '[{"data-collection": "a", "filter": "1; DROP TABLE x"}]}', "';' or a comment"),
    ("execute-snapshot", '{"data-collections": ["a"], "additional-conditions": [{"filter": "x"}]}',
     "needs a string data-collection"),
    ("execute-snapshot", '{"data-collections": ["a"], "colections": 1}', "unknown execute-snapshot"),
    ("log", "{}", "needs a string 'message'"),
    ("reboot", "{}", "unknown signal type 'reboot'"),
])
def test_invalid_signals_are_refused_with_the_reason(type_: str, data: str, problem: str) -> None:
    with pytest.raises(InvalidSignal, match=f"signal 'x1': .*{problem}"):
        parse_signal("x1", type_, data)


def test_etcd_signal_values() -> None:
    s = parse_etcd_signal("/c1/signals/capture-1/sig-9",
                          json.dumps({"type": "execute-snapshot",
                                      "data": {"data-collections": ["db\\.t"], "type": "read-only"}}))
    assert isinstance(s, ExecuteSnapshot) and s.id == "sig-9" and s.snapshot_type == "read-only"
    with pytest.raises(InvalidSignal, match="sig-10.*not JSON"):
        parse_etcd_signal("/c1/signals/capture-1/sig-10", b"nope")
    with pytest.raises(InvalidSignal, match="must be an object with 'type'"):
        parse_etcd_signal("/c1/signals/capture-1/sig-11", b"{}")


def test_stop_snapshot_of_listed_tables_keeps_the_rest() -> None:
    """stop-snapshot with data-collections drops only the matching tables not done yet; without
    them (or when nothing is left) the snapshot is finished."""
    from sluice.capture.snapshot.progress import SnapshotState
    from sluice.capture.snapshotter import _stopped
    st = SnapshotState("s1", ("a.t1", "a.t2", "b.t3", "b.t4"), current_table="a.t2",
                       last_chunk_end=(10,), chunks_done=3)
    kept, restart = _stopped(st, ["b\\.t3"])
    assert (kept.tables, kept.current_table, kept.chunks_done, restart) == (
        ("a.t1", "a.t2", "b.t4"), "a.t2", 3, False)
    moved, restart = _stopped(st, ["a\\..*"])
    assert (moved.tables, moved.current_table, moved.last_chunk_end, restart) == (
        ("a.t1", "b.t3", "b.t4"), "b.t3", None, True)
    done, restart = _stopped(st, ["a\\.t2", "b\\..*"])
    assert done.finished and restart and done.tables == ("a.t1",)
    everything, restart = _stopped(st, [])
    assert everything.finished and restart


def test_ctl_refuses_an_invalid_signal_before_writing_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Invariant (ctl snapshot): ctl only ever writes a signal the capture would accept — a bad
    regex or filter is refused here (exit 2) and never reaches etcd (none runs at this address)."""
    from sluice.ctl import main as cli
    base = ["ctl", "--etcd", "127.0.0.1:1", "--timeout", "1", "snapshot", "execute",
            "--producer", "cap-1"]
    assert cli.main(base + ["--tables", "db\\.(t"]) == 2
    assert "not a valid regex" in capsys.readouterr().err
    assert cli.main(base + ["--tables", "db\\.t", "--condition", "1; DROP TABLE x"]) == 2
    assert "may not contain ';'" in capsys.readouterr().err
