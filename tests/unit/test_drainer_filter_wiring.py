"""The drainer's `[filter]` table and HA keys: parsed from drainer.toml into the filter module's
config, checked at load with one line naming the key (the wiring into the merge loop is tested
with real processes in tests/integration/test_drainer_ha.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from sluice.core import config
from sluice.core.errors import ConfigError
from sluice.drainer.config import DrainerConfig
from sluice.drainer.filter import FilterConfig, IgnoreDML, TxnFilter


def test_filter_table_parses_into_the_filter_config(tmp_path: Path) -> None:
    """Every filter rule is reachable from drainer.toml, ignore-dml as an array of tables."""
    f = tmp_path / "drainer.toml"
    f.write_text('''
name = "d1"
[filter]
do-db = ["shop", "~^app_"]
ignore-table = ["shop.tmp"]
ignore-txn-commit-ts = [42]

[[filter.ignore-dml]]
table = "shop.audit"
types = ["delete"]
''')
    cfg = config.load(DrainerConfig, f)
    assert cfg.filter == FilterConfig(do_db=["shop", "~^app_"], ignore_table=["shop.tmp"],
                                      ignore_txn_commit_ts=[42],
                                      ignore_dml=[IgnoreDML(table="shop.audit", types=["delete"])])
    flt = TxnFilter(cfg.filter)
    assert flt.active and flt.allows_table("app_1", "x") and not flt.allows_table("shop", "tmp")
    # Without a [filter] table the filter passes everything and costs nothing.
    assert not TxnFilter(config.load(DrainerConfig, None).filter).active


def test_filter_and_ha_keys_are_checked_at_load() -> None:
    with pytest.raises(ConfigError, match=r"unknown key 'ignore-dbs' in \[filter\].*'ignore-db'"):
        config.load(DrainerConfig, None, ['filter.ignore-dbs=["x"]'])
    with pytest.raises(ConfigError, match="ha-margin must be > 0 and < alive-ttl / 2"):
        config.load(DrainerConfig, None, ["ha=true", "alive-ttl=2", "ha-margin=1.5"])
    with pytest.raises(ConfigError, match="alive-ttl must be >= 2 with ha = true"):
        config.load(DrainerConfig, None, ["ha=true", "alive-ttl=1"])
    cfg = config.load(DrainerConfig, None, ["ha=true", "alive-ttl=3", "ha-margin=0.5"])
    assert cfg.ha and cfg.ha_margin == 0.5
    # Default: no HA — one instance, exactly as before.
    assert config.load(DrainerConfig, None).ha is False


def test_grpc_sink_refuses_a_filter_at_start() -> None:
    """The grpc sink forwards binlogs as stored: a [filter] with it is a config error, found
    with the rest of the config (before any network call)."""
    cfg = config.load(DrainerConfig, None, ['sink="grpc"', 'filter.ignore-db=["x"]'])
    with pytest.raises(ConfigError, match=r"^drainer.toml: \[filter\] is set but the grpc sink"):
        cfg.validate("drainer.toml")
