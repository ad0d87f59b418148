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
