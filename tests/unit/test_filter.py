from __future__ import annotations

import pytest

from sluice.core import config
from sluice.core.errors import ConfigError
from sluice.drainer.filter import FilterConfig, IgnoreDML, TxnFilter
from sluice.proto import sluice_pb2 as pb
from tests.support.rows import Table, col, database_ddl, ddl_txn, prewrite_value, txn

ORDERS = Table(1, "shop", "orders", [col("id", "int(11)", nullable=False), col("v", "int(11)")], ["id"])
ORDER_7 = Table(2, "shop", "order_7", [col("id", "int(11)", nullable=False)], ["id"])
LOGS = Table(3, "ops", "logs", [col("id", "int(11)", nullable=False)], ["id"])
TMP = Table(4, "test_1", "t", [col("id", "int(11)", nullable=False)], ["id"])


def mixed(commit_ts: int = 100):
    return txn(prewrite_value(
        ORDERS.mutation(ORDERS.insert(id=1, v=1), ORDERS.update({"id": 1, "v": 1}, {"v": 2}),
                        ORDERS.delete(id=1, v=2)),
        ORDER_7.mutation(ORDER_7.insert(id=5)),
        LOGS.mutation(LOGS.insert(id=9)),
        TMP.mutation(TMP.insert(id=3))), commit_ts)


def tables_of(t) -> list[str]:
    return [f"{m.schema_name}.{m.table_name}" for m in t.prewrite.mutations]


def test_the_filter_only_removes_and_keeps_order():
    """The filter only removes. A transaction comes out whole, or without the row changes of
    filtered tables or of ignored DML types, or not at all; nothing is reordered or altered."""
    original = mixed()
    f = TxnFilter(FilterConfig(ignore_db=["~^test_"], ignore_table=["shop.order_7"]))
    out = f.filter(original)
    assert tables_of(out) == ["shop.orders", "ops.logs"]
    assert out.prewrite.mutations[0] == original.prewrite.mutations[0]
    assert (out.commit_ts, out.start_ts, out.producer_id) == (original.commit_ts, original.start_ts,
                                                             original.producer_id)
    # The input transaction is untouched.
    assert tables_of(original) == ["shop.orders", "shop.order_7", "ops.logs", "test_1.t"]
    # Nothing to filter: the very same object.
    assert TxnFilter(FilterConfig(ignore_db=["nothing"])).filter(original) is original
    assert TxnFilter().filter(original) is original


def test_do_db_and_do_table_regex():
    f = TxnFilter(FilterConfig(do_db=["ops"], do_table=[r"~^shop\.order_\d+$"]))
    assert tables_of(f.filter(mixed())) == ["shop.order_7", "ops.logs"]
    assert f.allows_table("shop", "order_12") and not f.allows_table("shop", "orders")
    # Anchored regexes match the whole name.
    assert not f.allows_table("shop", "order_7x")
    only = TxnFilter(FilterConfig(do_table=["shop.orders"]))
    assert tables_of(only.filter(mixed())) == ["shop.orders"]


def test_ignore_rules_win_over_do_rules():
    f = TxnFilter(FilterConfig(do_db=["shop"], ignore_table=["shop.orders"]))
    assert tables_of(f.filter(mixed())) == ["shop.order_7"]
    g = TxnFilter(FilterConfig(do_table=["~.*"], ignore_db=["ops", "~^test_"]))
    assert tables_of(g.filter(mixed())) == ["shop.orders", "shop.order_7"]


def test_names_are_exact_and_case_sensitive():
    f = TxnFilter(FilterConfig(ignore_db=["Shop"]))
    assert f.allows_table("shop", "orders") and not f.allows_table("Shop", "orders")


def test_ignore_txn_commit_ts_drops_the_whole_transaction():
    f = TxnFilter(FilterConfig(ignore_txn_commit_ts=[100, 300]))
    assert f.filter(mixed(100)) is None
    assert f.filter(mixed(200)) is not None


def test_ignore_dml_types_per_table():
    f = TxnFilter(FilterConfig(ignore_dml=[IgnoreDML("shop.orders", ["delete", "update"]),
                                           IgnoreDML("~^ops\\.", ["insert"])]))
    out = f.filter(mixed())
    assert tables_of(out) == ["shop.orders", "shop.order_7", "test_1.t"]
    assert [c.tp for c in out.prewrite.mutations[0].changes] == [pb.INSERT]
    # A snapshot read counts as an insert.
    assert f.ignores_dml("ops", "logs", pb.READ) and not f.ignores_dml("ops", "logs", pb.DELETE)
    only_logs = txn(prewrite_value(LOGS.mutation(LOGS.insert(id=1))), 5)
    assert f.filter(only_logs) is None


def test_ddl_follows_the_table_and_database_rules():
    f = TxnFilter(FilterConfig(do_db=["shop"]))
    assert f.filter(ddl_txn(10, ORDERS.create_ddl("CREATE TABLE orders (id int)"))) is not None
    assert f.filter(ddl_txn(11, LOGS.create_ddl("CREATE TABLE logs (id int)"))) is None
    assert f.filter(ddl_txn(12, database_ddl(pb.CREATE_DATABASE, "ops"))) is None
    assert f.filter(ddl_txn(13, database_ddl(pb.CREATE_DATABASE, "shop"))) is not None
    # RENAME follows the new name.
    renamed = ORDERS.rename("ops", "orders_old")
    assert f.filter(ddl_txn(14, renamed.rename_ddl(ORDERS))) is None
    # With a do-table pattern any database may hold a matching table.
    assert TxnFilter(FilterConfig(do_table=["~^x\\."])).allows_database("x")
    # A DDL transaction that also declares schema snapshots keeps them when its DDL is filtered.
    value = prewrite_value(ddl=LOGS.create_ddl(), snapshots=[ORDERS])
    value.mutations.append(ORDERS.mutation(ORDERS.insert(id=1)))
    out = f.filter(txn(value, 15))
    assert not out.is_ddl and len(out.prewrite.schema_snapshots) == 1


def test_built_from_toml_and_bad_rules_are_config_errors(tmp_path):
    path = tmp_path / "f.toml"
    path.write_text('do-db = ["shop"]\nignore-table = ["~^shop\\\\.tmp_"]\n'
                    'ignore-txn-commit-ts = [42]\n'
                    '[[ignore-dml]]\ntable = "shop.orders"\ntypes = ["delete"]\n')
    cfg = config.load(FilterConfig, path)
    f = TxnFilter(cfg)
    assert not f.allows_table("shop", "tmp_1") and f.allows_table("shop", "orders")
    assert f.ignores_dml("shop", "orders", pb.DELETE)
    with pytest.raises(ConfigError, match="ignore-dml\\[0\\]: types must be"):
        TxnFilter(FilterConfig(ignore_dml=[IgnoreDML("a.b", ["truncate"])]))
    with pytest.raises(ConfigError, match="do-table: bad regular expression"):
        TxnFilter(FilterConfig(do_table=["~(unclosed"]))
