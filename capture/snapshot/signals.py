"""Snapshot signals: Debezium's signal-table rows and etcd signal values as typed commands.

Invariant: a signal is either parsed into exactly one typed command or refused with
`InvalidSignal` naming the signal id and what is wrong — never half-applied, never guessed.

Formats (Debezium-compatible, docs/snapshots.md):
- signal table `(id VARCHAR(42) PRIMARY KEY, type VARCHAR(32) NOT NULL, data VARCHAR(2048))`;
  the capture reads its inserts from the binlog (the table itself is never captured as data);
- etcd: a JSON object `{"id": ..., "type": ..., "data": {...}}` under
  `/sluice/<cluster>/producers/<producer_id>/signals/<id>` (core/registry.py `signals_path`) for read-only
  sources; `data` may also be the JSON text, as in the table. The capture deletes a key once the
  signal's effect is committed to the pumps, and publishes its snapshot progress as JSON at
  `/sluice/<cluster>/producers/<producer_id>/snapshot` (`snapshot_progress_path`).

Types: `execute-snapshot` (data-collections: regexes on "db.table", full match; type incremental
(default) or read-only; additional-conditions: [{data-collection, filter}]; surrogate-key),
`stop-snapshot` (data-collections optional: all), `pause-snapshot`, `resume-snapshot`, `log`,
and the watermarks the snapshot writes itself: `snapshot-window-open`/`snapshot-window-close`.
"""
from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from sluice.core.errors import InvalidArgument

__all__ = ["InvalidSignal", "ExecuteSnapshot", "StopSnapshot", "PauseSnapshot", "ResumeSnapshot",
           "LogSignal", "Watermark", "Signal", "parse_signal", "parse_etcd_signal",
           "watermark_row", "WINDOW_OPEN", "WINDOW_CLOSE", "SIGNAL_TABLE_DDL"]

WINDOW_OPEN = "snapshot-window-open"
WINDOW_CLOSE = "snapshot-window-close"
SIGNAL_TABLE_DDL = ("CREATE TABLE IF NOT EXISTS {table} (id VARCHAR(42) PRIMARY KEY, "
                    "type VARCHAR(32) NOT NULL, data VARCHAR(2048) NULL)")
_SNAPSHOT_TYPES = ("incremental", "read-only")
# A filter is pasted into the chunk SELECT's WHERE: one expression, no statement separator or
# comment that could end it early.
_BAD_FILTER = re.compile(r";|--|/\*|#")


class InvalidSignal(InvalidArgument):
    def __init__(self, signal_id: str, problem: str) -> None:
        super().__init__(f"signal {signal_id!r}: {problem}")
        self.signal_id = signal_id


@dataclasses.dataclass(frozen=True, slots=True)
class ExecuteSnapshot:
    id: str
    data_collections: tuple[str, ...]          # regexes, full match on "db.table"
    snapshot_type: str = "incremental"          # incremental (signal-table) | read-only
    additional_conditions: tuple[tuple[str, str], ...] = ()   # (data-collection regex, filter)
    surrogate_key: str = ""

    def tables(self, available: Iterable[str]) -> list[str]:
        """The "db.table" names this signal selects, in the signal's pattern order, each once."""
        pats = [re.compile(p) for p in self.data_collections]
        avail = sorted(available)
        out: list[str] = []
        for p in pats:
            out += [t for t in avail if p.fullmatch(t) and t not in out]
        return out

    def condition_for(self, table: str) -> str:
        """The additional condition of one table ("" if none); several are ANDed."""
        conds = [f for pat, f in self.additional_conditions if re.fullmatch(pat, table)]
        return " AND ".join(f"({c})" for c in conds)


@dataclasses.dataclass(frozen=True, slots=True)
class StopSnapshot:
    id: str
    data_collections: tuple[str, ...] = ()     # empty: stop the whole snapshot


@dataclasses.dataclass(frozen=True, slots=True)
class PauseSnapshot:
    id: str


@dataclasses.dataclass(frozen=True, slots=True)
class ResumeSnapshot:
    id: str


@dataclasses.dataclass(frozen=True, slots=True)
class LogSignal:
    id: str
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class Watermark:
    """A chunk window's low (open) or high (close) watermark row."""

    id: str
    window_id: str
    open: bool


Signal = ExecuteSnapshot | StopSnapshot | PauseSnapshot | ResumeSnapshot | LogSignal | Watermark


def _data(signal_id: str, data: Any) -> dict[str, Any]:
    if data is None or data == "":
        return {}
    if isinstance(data, (bytes, bytearray)):
        data = data.decode("utf-8")
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise InvalidSignal(signal_id, f"data is not JSON ({e.msg} at {e.pos})") from None
    if not isinstance(data, dict):
        raise InvalidSignal(signal_id, f"data must be a JSON object, got {type(data).__name__}")
    return data


def _collections(signal_id: str, data: Mapping[str, Any], required: bool) -> tuple[str, ...]:
    raw = data.get("data-collections")
    if raw is None:
        if required:
            raise InvalidSignal(signal_id, "data-collections is missing: give a list of "
                                "'db.table' regexes")
        return ()
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list) or not all(isinstance(x, str) and x for x in raw):
        raise InvalidSignal(signal_id, "data-collections must be a list of non-empty strings")
    for pat in raw:
        try:
            re.compile(pat)
        except re.error as e:
            raise InvalidSignal(signal_id, f"data-collection {pat!r} is not a valid regex: {e}") from None
    if required and not raw:
        raise InvalidSignal(signal_id, "data-collections is empty")
    return tuple(raw)


def _execute(signal_id: str, data: Mapping[str, Any]) -> ExecuteSnapshot:
    unknown = set(data) - {"data-collections", "type", "additional-conditions", "surrogate-key",
                           "additional-condition"}
    if unknown:
        raise InvalidSignal(signal_id, f"unknown execute-snapshot field(s) {sorted(unknown)}")
    stype = str(data.get("type", "incremental")).lower()
    if stype not in _SNAPSHOT_TYPES:
        raise InvalidSignal(signal_id, f"snapshot type {stype!r} is not supported: want one of "
                            f"{', '.join(_SNAPSHOT_TYPES)} (blocking snapshots are not implemented)")
    conds: list[tuple[str, str]] = []
    raw = data.get("additional-conditions", [])
    if not isinstance(raw, list):
        raise InvalidSignal(signal_id, "additional-conditions must be a list of "
                            "{data-collection, filter} objects")
    for c in raw:
        if not isinstance(c, dict) or not isinstance(c.get("data-collection"), str) \
                or not isinstance(c.get("filter"), str) or not c["filter"].strip():
            raise InvalidSignal(signal_id, f"additional-condition {c!r} needs a string "
                                "data-collection and a non-empty string filter")
        if _BAD_FILTER.search(c["filter"]):
            raise InvalidSignal(signal_id, f"filter {c['filter']!r} may not contain ';' or a comment")
        conds.append((c["data-collection"], c["filter"].strip()))
    if "additional-condition" in data:   # Debezium 1.x form: one filter for every collection
        f = data["additional-condition"]
        if not isinstance(f, str) or _BAD_FILTER.search(f):
            raise InvalidSignal(signal_id, "additional-condition must be one SQL expression")
        conds.append((".*", f.strip()))
    sk = data.get("surrogate-key", "")
    if not isinstance(sk, str):
        raise InvalidSignal(signal_id, "surrogate-key must be a column name")
    return ExecuteSnapshot(id=signal_id, data_collections=_collections(signal_id, data, True),
                           snapshot_type=stype, additional_conditions=tuple(conds),
                           surrogate_key=sk)


def parse_signal(signal_id: Any, signal_type: Any, data: Any) -> Signal:
    """One signal-table row (id, type, data) -> a typed command, or InvalidSignal."""
    sid = signal_id.decode() if isinstance(signal_id, bytes) else str(signal_id or "")
    if not sid:
        raise InvalidSignal("", "id is empty")
    st = signal_type.decode() if isinstance(signal_type, bytes) else str(signal_type or "")
    st = st.strip().lower()
    if st in (WINDOW_OPEN, WINDOW_CLOSE):
        d = _data(sid, data) if data not in (None, "") else {}
        suffix = "-open" if st == WINDOW_OPEN else "-close"
        window = str(d.get("window", sid[:-len(suffix)] if sid.endswith(suffix) else sid))
        return Watermark(id=sid, window_id=window, open=st == WINDOW_OPEN)
    d = _data(sid, data)
    if st == "execute-snapshot":
        return _execute(sid, d)
    if st == "stop-snapshot":
        stype = str(d.get("type", "incremental")).lower()
        if stype not in _SNAPSHOT_TYPES:
            raise InvalidSignal(sid, f"snapshot type {stype!r} is not supported")
        return StopSnapshot(id=sid, data_collections=_collections(sid, d, False))
    if st == "pause-snapshot":
        return PauseSnapshot(id=sid)
    if st == "resume-snapshot":
        return ResumeSnapshot(id=sid)
    if st == "log":
        msg = d.get("message")
        if not isinstance(msg, str):
            raise InvalidSignal(sid, "log signal needs a string 'message'")
        return LogSignal(id=sid, message=msg)
    raise InvalidSignal(sid, f"unknown signal type {st!r}: want execute-snapshot, stop-snapshot, "
                        "pause-snapshot, resume-snapshot or log")


def parse_etcd_signal(key: str, value: bytes | str) -> Signal:
    """An etcd signal value (JSON object with id, type, data; id defaults to the key's last part)."""
    text = value.decode("utf-8") if isinstance(value, (bytes, bytearray)) else value
    key_id = key.rstrip("/").rpartition("/")[2]
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidSignal(key_id, f"etcd value at {key} is not JSON ({e.msg})") from None
    if not isinstance(obj, dict) or "type" not in obj:
        raise InvalidSignal(key_id, f"etcd value at {key} must be an object with 'type' and 'data'")
    return parse_signal(obj.get("id") or key_id, obj["type"], obj.get("data"))


def watermark_row(window_id: str, open_: bool) -> tuple[str, str, str]:
    """(id, type, data) of a watermark row; the id fits the signal table's VARCHAR(42)."""
    suffix = "-open" if open_ else "-close"
    if len(window_id) + len(suffix) > 42:
        raise InvalidArgument(f"window id {window_id!r} too long for the signal table's id column")
    return (window_id + suffix, WINDOW_OPEN if open_ else WINDOW_CLOSE,
            json.dumps({"window": window_id}))
