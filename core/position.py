"""Source positions: comparison, formatting and parsing of `pb.Position`.

Invariant: source positions are totally ordered per producer by (generation, file_seq, offset,
sub_seq); MariaDB GTIDs are compared per domain. `compare` raises `IncomparablePositions` for
pairs with no common coordinate; `is_after` (the drainer's per-producer filter) is True for them,
so the filter drops only what is provably covered. The full rule: docs/capture.md ("Source
positions and their order").
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from sluice.core.errors import InvalidArgument, SluiceError
from sluice.proto import sluice_pb2 as pb

__all__ = [
    "IncomparablePositions", "position_key", "compare", "is_after", "max_position",
    "format_position", "parse_position", "is_empty", "EMPTY_KEY",
]

EMPTY_KEY: tuple[int, int, int, int] = (0, 0, 0, 0)
"""`position_key` of an empty position: below the key of every position with file coordinates."""

_GTID_RE = re.compile(r"(\d+)-(\d+)-(\d+)")
_GTID_LIST_RE = re.compile(r"\d+-\d+-\d+(?:,\d+-\d+-\d+)*")
_FILE_SEQ_RE = re.compile(r"\.(\d+)$")
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

_Intervals = list[tuple[int, int]]


class IncomparablePositions(SluiceError):
    """Two positions without a common coordinate to order them by (see the module rule)."""

    def __init__(self, a: pb.Position | None, b: pb.Position | None, why: str) -> None:
        super().__init__(f"positions {format_position(a)!r} and {format_position(b)!r} "
                         f"are not comparable: {why}")
        self.a, self.b = a, b


def _has_file(pos: pb.Position) -> bool:
    return pos.file_seq != 0 or pos.offset != 0


def is_empty(pos: pb.Position | None) -> bool:
    """True for None and for a position with no file coordinates and no GTIDs of either kind."""
    return pos is None or (pos.file_seq == 0 and pos.offset == 0 and not pos.gtids
                           and not pos.mysql_gtid_set)


def position_key(pos: pb.Position | None) -> tuple[int, int, int, int]:
    """A sortable key, (generation, file_seq, offset, sub_seq), consistent with `compare`.

    Only positions with file coordinates (and empty ones, keyed EMPTY_KEY) have one: GTID states
    are partially ordered, so a GTID-only position raises IncomparablePositions — use `compare`.
    """
    if pos is None or (pos.file_seq == 0 and pos.offset == 0):
        if is_empty(pos):
            return EMPTY_KEY
        raise IncomparablePositions(pos, None, "a GTID-only position has no sortable key")
    return (pos.generation, pos.file_seq, pos.offset, pos.sub_seq)


def _cmp(x: object, y: object) -> int:
    return (x > y) - (x < y)  # type: ignore[operator]


def _gtid_state(pos: pb.Position) -> dict[int, int]:
    return {g.domain_id: g.seq_no for g in pos.gtids}


def _cmp_gtids(a: pb.Position, b: pb.Position) -> int | None:
    da, db = _gtid_state(a), _gtid_state(b)
    a_le_b = all(d in db and db[d] >= s for d, s in da.items())
    b_le_a = all(d in da and da[d] >= s for d, s in db.items())
    return _by_inclusion(a_le_b, b_le_a, a, b)


def _parse_mysql_gtid_set(text: str) -> dict[str, _Intervals]:
    """'uuid:1-5:7,uuid2:1-3' -> {uuid: merged sorted closed intervals}."""
    out: dict[str, _Intervals] = {}
    body = "".join(text.split())
    if not body:
        return out
    for member in body.split(","):
        uuid, *ranges = member.split(":")
        if not _UUID_RE.fullmatch(uuid) or not ranges:
            raise InvalidArgument(f"bad MySQL GTID set member {member!r} in {text!r}: "
                                  "want uuid:N[-M][:N[-M]...]")
        ivs = out.setdefault(uuid.lower(), [])
        for r in ranges:
            lo, sep, hi = r.partition("-")
            if not lo.isdigit() or (sep and not hi.isdigit()):
                raise InvalidArgument(f"bad interval {r!r} in MySQL GTID set {text!r}")
            ivs.append((int(lo), int(hi) if sep else int(lo)))
    for uuid, ivs in out.items():
        ivs.sort()
        merged: _Intervals = []
        for lo, hi in ivs:
            if merged and lo <= merged[-1][1] + 1:
                merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
            else:
                merged.append((lo, hi))
        out[uuid] = merged
    return out


def _gtid_set_subset(a: dict[str, _Intervals], b: dict[str, _Intervals]) -> bool:
    for uuid, ivs in a.items():
        other = b.get(uuid, [])
        for lo, hi in ivs:
            if not any(olo <= lo and hi <= ohi for olo, ohi in other):
                return False
    return True


def _cmp_mysql_sets(a: pb.Position, b: pb.Position) -> int | None:
    sa, sb = _parse_mysql_gtid_set(a.mysql_gtid_set), _parse_mysql_gtid_set(b.mysql_gtid_set)
    a_le_b, b_le_a = _gtid_set_subset(sa, sb), _gtid_set_subset(sb, sa)
    return _by_inclusion(a_le_b, b_le_a, a, b)


def compare(a: pb.Position | None, b: pb.Position | None) -> int:
    """-1, 0 or 1 as a is before, equal to or after b; IncomparablePositions if no rule applies."""
    ea, eb = is_empty(a), is_empty(b)
    if ea or eb:
        return eb - ea  # both empty: 0; only a empty: -1; only b empty: 1
    assert a is not None and b is not None
    if a.generation != b.generation:
        return _cmp(a.generation, b.generation)
    if _has_file(a) and _has_file(b):
        return _cmp((a.file_seq, a.offset, a.sub_seq), (b.file_seq, b.offset, b.sub_seq))
    if a.gtids and b.gtids:
        c = _cmp_gtids(a, b)
        if c is None:
            raise IncomparablePositions(a, b, "each GTID state is ahead in some domain")
        return c
    if a.mysql_gtid_set and b.mysql_gtid_set:
        c = _cmp_mysql_sets(a, b)
        if c is None:
            raise IncomparablePositions(a, b, "neither MySQL GTID set contains the other")
        return c
    raise IncomparablePositions(a, b, "no common coordinate (file position or GTIDs of one kind)")


def is_after(a: pb.Position | None, b: pb.Position | None) -> bool:
    """True iff a is not at or before b: a holds something b does not provably cover.

    For comparable positions this is `compare(a, b) > 0`; incomparable ones count as after, so a
    filter built on it never drops what it cannot prove was already applied.
    """
    if a is not None and b is not None and (a.file_seq or a.offset) and (b.file_seq or b.offset):
        # The common case, kept cheap: both carry file coordinates of one binlog.
        return ((a.generation, a.file_seq, a.offset, a.sub_seq)
                > (b.generation, b.file_seq, b.offset, b.sub_seq))
    try:
        return compare(a, b) > 0
    except IncomparablePositions:
        return True


def max_position(positions: Iterable[pb.Position | None]) -> pb.Position:
    """The greatest of the positions (one of the given objects, not a copy).

    Empty or None entries are skipped; with none left the result is an empty Position.
    Raises IncomparablePositions if two of them cannot be ordered.
    """
    best: pb.Position | None = None
    for p in positions:
        if is_empty(p):
            continue
        if best is None or compare(p, best) > 0:
            best = p
    return best if best is not None else pb.Position()


def _file_seq_of(name: str) -> int | None:
    m = _FILE_SEQ_RE.search(name)
    return int(m.group(1)) if m else None


def format_position(pos: pb.Position | None) -> str:
    """Human form, e.g. "mysql-bin.000042:1234#0 gtid=0-1-99"; `parse_position` reads it back.

    Tokens: `<file>:<offset>#<sub_seq>` (file is file_name, or the zero-padded file_seq when there
    is no name), `gtid=d-s-n,...`, `mysql-gtid=<set>`, and only when set: `file-seq=` (a file_name
    whose suffix does not give file_seq), `sub-seq=` (no file coordinates), `server-id=`, `ts-ms=`,
    `gen=` (the rewind generation).
    An empty position is "empty".
    """
    # The Spark sink formats one per transaction (its `_pos` column): every field is read once.
    if pos is None:
        return "empty"
    file_seq, offset, name, gtids = pos.file_seq, pos.offset, pos.file_name, pos.gtids
    mysql_gtids = pos.mysql_gtid_set
    if not (file_seq or offset or gtids or mysql_gtids):
        return "empty"
    parts: list[str] = []
    extra: list[str] = []
    if file_seq or offset:
        if name:
            if _file_seq_cached(name) != file_seq:
                extra.append(f"file-seq={file_seq}")
            parts.append(f"{name}:{offset}#{pos.sub_seq}")
        else:
            parts.append(f"{file_seq:06d}:{offset}#{pos.sub_seq}")
    else:
        if name:
            extra.append(f"file={name}")
        if pos.sub_seq:
            extra.append(f"sub-seq={pos.sub_seq}")
    if gtids:
        parts.append("gtid=" + ",".join([f"{g.domain_id}-{g.server_id}-{g.seq_no}" for g in gtids]))
    if mysql_gtids:
        parts.append("mysql-gtid=" + "".join(mysql_gtids.split()))
    server_id, ts_ms, gen = pos.server_id, pos.ts_ms, pos.generation
    if server_id:
        extra.append(f"server-id={server_id}")
    if ts_ms:
        extra.append(f"ts-ms={ts_ms}")
    if gen:
        extra.append(f"gen={gen}")
    return " ".join(parts + extra) if extra else " ".join(parts)


_FILE_SEQS: dict[str, int | None] = {}


def _file_seq_cached(name: str) -> int | None:
    """_file_seq_of, remembered: a producer writes the same binlog file name for a long while."""
    seq = _FILE_SEQS.get(name, -1)
    if seq == -1:
        if len(_FILE_SEQS) >= 1024:
            _FILE_SEQS.clear()
        seq = _FILE_SEQS[name] = _file_seq_of(name)
    return seq


def _parse_gtids(text: str, whole: str) -> list[pb.GtidPos]:
    if not _GTID_LIST_RE.fullmatch(text):
        raise InvalidArgument(f"bad GTID list {text!r} in position {whole!r}: "
                              "want domain-server-seq[,domain-server-seq...], e.g. 0-1-99,1-2-5")
    out: list[pb.GtidPos] = []
    seen: set[int] = set()
    for m in _GTID_RE.finditer(text):
        d, s, n = (int(x) for x in m.groups())
        if d in seen:
            raise InvalidArgument(f"domain {d} appears twice in GTID list {text!r}")
        if d >= 2**32 or s >= 2**32 or n >= 2**64:
            raise InvalidArgument(f"GTID {m.group(0)!r} out of range in {whole!r}")
        seen.add(d)
        out.append(pb.GtidPos(domain_id=d, server_id=s, seq_no=n))
    return out


def _uint(text: str, what: str, whole: str, bits: int = 64) -> int:
    if not text.isdigit() or int(text) >= 2**bits:
        raise InvalidArgument(f"bad {what} {text!r} in position {whole!r}: "
                              f"want an unsigned {bits}-bit integer")
    return int(text)


def parse_position(text: str) -> pb.Position:
    """Read a position for `ctl … position set`: the output of `format_position`, or a bare GTID
    list such as "0-1-99,1-2-5", or "mysql-bin.000042:1234". Raises InvalidArgument naming the
    bad part.
    """
    whole = text
    tokens = text.split()
    if not tokens:
        raise InvalidArgument("empty position: want e.g. 'mysql-bin.000042:1234#0 gtid=0-1-99' "
                              "or '0-1-99,1-2-5' (or 'empty')")
    if tokens == ["empty"]:
        return pb.Position()
    pos = pb.Position()
    seen: set[str] = set()

    def once(key: str) -> None:
        if key in seen:
            raise InvalidArgument(f"{key} given twice in position {whole!r}")
        seen.add(key)

    explicit_seq: int | None = None
    for tok in tokens:
        key, eq, val = tok.partition("=")
        if eq:
            once(key)
            if key == "gtid":
                pos.gtids.extend(_parse_gtids(val, whole))
            elif key == "mysql-gtid":
                _parse_mysql_gtid_set(val)  # validate
                pos.mysql_gtid_set = val
            elif key == "file-seq":
                explicit_seq = _uint(val, "file-seq", whole)
            elif key == "file":
                pos.file_name = val
            elif key == "sub-seq":
                pos.sub_seq = _uint(val, "sub-seq", whole)
            elif key == "server-id":
                pos.server_id = _uint(val, "server-id", whole, 32)
            elif key == "ts-ms":
                pos.ts_ms = _uint(val, "ts-ms", whole, 63)
            elif key == "gen":
                pos.generation = _uint(val, "gen", whole, 32)
            else:
                raise InvalidArgument(f"unknown key {key!r} in position {whole!r}: want gtid=, "
                                      "mysql-gtid=, file-seq=, sub-seq=, server-id=, ts-ms=, gen=")
        elif _GTID_LIST_RE.fullmatch(tok):
            once("gtid")
            pos.gtids.extend(_parse_gtids(tok, whole))
        else:
            once("file coordinates")
            name, colon, rest = tok.rpartition(":")
            if not colon or not name:
                raise InvalidArgument(f"bad token {tok!r} in position {whole!r}: want "
                                      "<file>:<offset>[#<sub_seq>], a GTID list or key=value")
            off, hash_, sub = rest.partition("#")
            pos.offset = _uint(off, "offset", whole)
            if hash_:
                pos.sub_seq = _uint(sub, "sub_seq", whole)
            if name.isdigit():
                pos.file_seq = _uint(name, "file sequence", whole)
            else:
                pos.file_name = name
                pos.file_seq = _file_seq_of(name) or 0
    if explicit_seq is not None:
        pos.file_seq = explicit_seq
    elif pos.file_name and "file coordinates" in seen and _file_seq_of(pos.file_name) is None:
        raise InvalidArgument(f"binlog file {pos.file_name!r} in position {whole!r} has no "
                              "numeric suffix (like mysql-bin.000042): add file-seq=N")
    if "file coordinates" in seen and not _has_file(pos):
        raise InvalidArgument(f"position {whole!r}: binlog file sequence and offset are both 0")
    return pos


def _by_inclusion(a_le_b: bool, b_le_a: bool, a: pb.Position, b: pb.Position) -> int | None:
    """Order two GTID-described positions from set inclusion both ways (None: incomparable);
    equal GTIDs are ordered by sub_seq."""
    if a_le_b and b_le_a:
        return _cmp(a.sub_seq, b.sub_seq)
    if a_le_b:
        return -1
    if b_le_a:
        return 1
    return None
