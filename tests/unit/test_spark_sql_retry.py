"""`sluice spark-sql` runs a read-only query again when the catalog changed under it.

A query planned while the sink compacts can find a partition row or file gone (CI met
"MetaException(message:No such database row)" in a third JVM). The race cannot be provoked on
demand, so the policy is tested with a stand-in session: read-only statements are retried on
the known transient errors (at most 3 attempts); writes and other errors are not.
"""
from __future__ import annotations

from typing import Any

import pytest

from sluice.spark_sink import sql as sparksql


class _Frame:
    columns = ["a"]

    def limit(self, n: int) -> "_Frame":
        return self

    def collect(self) -> list[tuple[int]]:
        return [(1,)]


class _Session:
    def __init__(self, failures: list[str]) -> None:
        self.failures = list(failures)
        self.calls = 0

    def sql(self, stmt: str) -> _Frame:
        self.calls += 1
        if self.failures:
            raise RuntimeError(self.failures.pop(0))
        return _Frame()


@pytest.fixture(autouse=True)
def no_sleep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sparksql.time, "sleep", lambda s: None)


def test_a_read_only_query_is_run_again_after_a_catalog_race(capsys: Any) -> None:
    s = _Session(["HiveException: MetaException(message:No such database row)",
                  "java.io.FileNotFoundException: part-0.parquet"])
    assert sparksql._query(s, ["SELECT * FROM t"], 10) == (["a"], [[1]])
    assert s.calls == 3
    assert "the catalog changed under the query" in capsys.readouterr().err


def test_writes_other_errors_and_a_third_failure_are_not_retried() -> None:
    race = "MetaException(message:No such database row)"
    with pytest.raises(RuntimeError, match="No such database row"):
        sparksql._query(_Session([race]), ["INSERT INTO t VALUES (1)"], 10)
    s = _Session(["AnalysisException: table not found"])
    with pytest.raises(RuntimeError, match="table not found"):
        sparksql._query(s, ["SELECT * FROM t"], 10)
    assert s.calls == 1
    s = _Session([race] * 3)
    with pytest.raises(RuntimeError, match="No such database row"):
        sparksql._query(s, ["SELECT 1"], 10)
    assert s.calls == 3
