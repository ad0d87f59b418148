"""Chunk splitting against a real MariaDB: dense, sparse, composite, varchar, keyless, resume."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.capture.snapshot.chunks import ChunkSplitter, SplitOptions
from sluice.capture.snapshot.keys import NoSnapshotKey, key_of_row, load_shape
from sluice.capture.snapshot.progress import PrefixTracker, SnapshotState, decode, encode
from sluice.capture.snapshot.reader import read_chunk, snapshot_connect
from tests.support.mariadb import MariaDBServer

DB = "snap_chunks"


@pytest.fixture(scope="module")
def src(mariadb_module: MariaDBServer) -> Iterator[Any]:
    db = mariadb_module
    db.execute(f"DROP DATABASE IF EXISTS {DB}")
    db.execute(f"CREATE DATABASE {DB}")
    for sql in [
        "CREATE TABLE dense (id INT UNSIGNED PRIMARY KEY, v INT)",
        "INSERT INTO dense SELECT seq, seq FROM seq_1_to_5000",
        "CREATE TABLE sparse (id BIGINT PRIMARY KEY, v INT)",
        # ids up to 1e12 with gaps: 3000 rows spread over 12 orders of magnitude
        "INSERT INTO sparse SELECT FLOOR(POW(seq, 3.45)) + seq, seq FROM seq_1_to_3000",
        "CREATE TABLE comp (a INT, b VARCHAR(20), v INT, PRIMARY KEY (a, b))",
        "INSERT INTO comp SELECT seq % 7, CONCAT('k', seq), seq FROM seq_1_to_4000",
        "CREATE TABLE vc (k VARCHAR(40) PRIMARY KEY, v INT) COLLATE utf8mb4_general_ci",
        "INSERT INTO vc SELECT CONCAT(IF(seq % 2, 'a', 'B'), MD5(seq)), seq FROM seq_1_to_3000",
        "CREATE TABLE keyless (u INT NOT NULL, n INT NOT NULL, v INT, UNIQUE KEY uk (u), KEY kn (n))",
        "INSERT INTO keyless SELECT seq * 3, seq, seq FROM seq_1_to_2500",
        "ANALYZE TABLE dense, sparse, comp, vc, keyless",
    ]:
        db.execute(sql, database=DB)
    conn = snapshot_connect({"host": "127.0.0.1", "port": db.port, "user": db.user,
                             "password": db.password})
    try:
        yield conn
    finally:
        conn.close()


def read_all(conn: Any, table: str, chunk_size: int, surrogate: str = "") -> tuple[list, ChunkSplitter]:
    shape = load_shape(conn, DB, table, surrogate)
    sp = ChunkSplitter(conn, shape.key, SplitOptions(chunk_size=chunk_size))
    keys: list[list] = []
    for c in sp:
        keys.append([key_of_row(r, shape) for r in read_chunk(conn, shape, c)])
    return keys, sp


def all_keys(conn: Any, table: str, cols: str) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(f"SELECT {cols} FROM {DB}.{table}")
        return [tuple(r) for r in cur.fetchall()]


def assert_partition(chunks: list[list], expected: list[tuple], chunk_size: int) -> None:
    """Every row in exactly one chunk; no chunk bigger than chunk-size."""
    flat = [k for c in chunks for k in c]
    assert len(flat) == len(set(flat)) == len(expected)
    assert set(flat) == set(expected)
    assert max(len(c) for c in chunks) <= chunk_size


def test_dense_integer_key_is_split_evenly_without_queries_per_chunk(src: Any) -> None:
    """Invariant: the chunks of one table partition its key space up to the max key taken at
    snapshot start; a dense integer key is cut arithmetically."""
    chunks, sp = read_all(src, "dense", 500)
    assert sp.strategy == "even"
    queries_at_plan = 3               # max, min, row estimate
    assert sp.queries == queries_at_plan
    assert_partition(chunks, all_keys(src, "dense", "id"), 500 * 2)
    assert len(chunks) >= 5000 // 1000


def test_sparse_key_falls_back_to_query_bounds(src: Any) -> None:
    """A key with ids up to 1e12 and gaps has a huge distribution factor: query-based bounds give
    full chunks instead of millions of empty ones."""
    chunks, sp = read_all(src, "sparse", 400)
    assert sp.strategy == "query"
    assert sp.max_key is not None and sp.max_key[0] > 10**11
    assert_partition(chunks, all_keys(src, "sparse", "id"), 400)
    assert len(chunks) == -(-3000 // 400)
    assert all(len(c) == 400 for c in chunks[:-1])


def test_composite_key_chunks_by_row_value_comparison(src: Any) -> None:
    chunks, sp = read_all(src, "comp", 300)
    assert sp.strategy == "query"
    assert_partition(chunks, all_keys(src, "comp", "a, b"), 300)


def test_varchar_key_follows_the_collation(src: Any) -> None:
    """Mixed-case keys under a case-insensitive collation: bounds are compared by the server."""
    chunks, _ = read_all(src, "vc", 256)
    assert_partition(chunks, all_keys(src, "vc", "k"), 256)


def test_keyless_table_is_refused_unless_a_surrogate_key_is_given(src: Any) -> None:
    with pytest.raises(NoSnapshotKey, match="no primary key.*surrogate-key"):
        load_shape(src, DB, "keyless")
    with pytest.raises(NoSnapshotKey, match="no single-column UNIQUE index"):
        load_shape(src, DB, "keyless", "n")
    chunks, sp = read_all(src, "keyless", 700, surrogate="u")
    assert sp.spec.kind == "surrogate"
    assert_partition(chunks, all_keys(src, "keyless", "u"), 700 * 2)


@pytest.mark.parametrize("table", ["sparse", "comp"])
def test_resume_continues_at_the_next_chunk(src: Any, table: str) -> None:
    """Invariant: a splitter built from a SnapshotProgress continues after its last chunk without
    re-reading earlier ones (counted: one boundary query per remaining chunk, no more)."""
    shape = load_shape(src, DB, table)
    full = list(ChunkSplitter(src, shape.key, SplitOptions(chunk_size=300)))
    state = SnapshotState(snapshot_id="s1", tables=(f"{DB}.{table}",),
                          current_table=f"{DB}.{table}")
    tracker = PrefixTracker(state)
    first = ChunkSplitter(src, shape.key, SplitOptions(chunk_size=300))
    state = tracker.state
    for _ in range(4):
        c = first.next_chunk()
        assert c is not None
        state = tracker.emitted(c, 300)
    progress = encode(dataclasses.replace(state, max_key=first.max_key))
    back = decode(progress)
    resumed = ChunkSplitter(src, shape.key, SplitOptions(chunk_size=300),
                            max_key_at_start=back.max_key, resume_after=back.last_chunk_end,
                            chunks_done=back.chunks_done)
    rest = list(resumed)
    assert [(c.index, c.lower, c.upper) for c in rest] == [(c.index, c.lower, c.upper) for c in full[4:]]
    # One boundary query per remaining chunk (+1 row estimate for an integer key); no max-key
    # query and nothing for chunks 0..3.
    assert resumed.queries <= len(rest) + 1 < len(full)


def test_information_schema_marks_json_columns_as_the_binlog_ddl_reader_does(src: Any) -> None:
    """A MariaDB JSON column is described as the binlog capture's DDL reader describes it: a
    text-family column whose CHECK starts with json_valid(<that column>) gets data_type and
    column_type "json"; any other column keeps its own type whatever its CHECK says. Every
    producer (application transactions, snapshots, ctl verify) reads tables through the one
    core.table.read_table_info, so a table's rows carry the same Datum kinds from all of them."""
    from sluice.capture import ddl as capture_ddl
    from sluice.core.table import read_table_info
    create = ("CREATE TABLE js (id INT PRIMARY KEY, j JSON, `j``q` JSON, "
              "jm LONGTEXT CHECK (json_valid(jm)), "
              "vc VARCHAR(200) CHECK (json_valid(vc)), "
              "nj LONGTEXT CHECK (NOT json_valid(nj)), "
              "both_ TEXT, CONSTRAINT c1 CHECK (length(both_) < 100 AND json_valid(both_)))")
    with src.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS {DB}.js")
        cur.execute(f"USE {DB}")
        cur.execute(create)
        cur.execute(f"SHOW CREATE TABLE {DB}.js")
        shown = cur.fetchone()[1]
        info = read_table_info(cur, DB, "js")
    got = {c.name: (c.data_type, c.column_type) for c in info.columns}
    assert got["j"] == got["j`q"] == got["jm"] == ("json", "json"), got
    assert got["vc"] == ("varchar", "varchar(200)"), got      # not text: a checked VARCHAR
    assert got["nj"] == ("longtext", "longtext"), got          # NOT json_valid is no JSON column
    assert got["both_"] == ("text", "text"), got               # json_valid is not the check
    st = capture_ddl.parse(shown, DB)
    assert st is not None and st.table_def is not None
    from_binlog = {c.name: (c.data_type, c.column_type) for c in st.table_def.columns}
    assert {n: got[n] for n in ("j", "j`q", "jm", "vc")} == \
        {n: from_binlog[n] for n in ("j", "j`q", "jm", "vc")}
    assert load_shape(src, DB, "js").columns == tuple(info.columns)
