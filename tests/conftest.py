"""Fixtures that start real processes on free 127.0.0.1 ports and always stop them."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("TZ", "UTC")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Before gRPC is imported: see sluice/ctl/main.py (fork handlers break processes we start).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from tests.support.procs import EtcdServer  # noqa: E402

pytest_plugins = ["tests.support.suite_time"]
from tests.support.mariadb import MariaDBServer  # noqa: E402,F401


@pytest.fixture(scope="module")
def etcd_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    """One etcd per test module (tests isolate themselves by key prefix / cluster name)."""
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdServer]:
    """A fresh etcd for one test (for tests that stop or restart it)."""
    server = EtcdServer(tmp_path / "etcd").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def mariadb_module(tmp_path_factory: pytest.TempPathFactory) -> Iterator["MariaDBServer"]:
    """One MariaDB (row binlog, FULL metadata) per test module; tests use their own databases."""
    from tests.support.mariadb import MariaDBServer
    server = MariaDBServer(tmp_path_factory.mktemp("mariadb")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def cluster(tmp_path: Path, etcd) -> Iterator["Cluster"]:  # type: ignore[no-untyped-def]
    """A fresh etcd with one TSO; tests start the pumps/drainers they need. (Modules that need
    another shape define their own `cluster` fixture, which takes precedence.)"""
    from tests.support.cluster import Cluster
    c = Cluster(tmp_path, etcd.endpoint)
    try:
        c.start_tso()
        yield c
    finally:
        c.stop()
