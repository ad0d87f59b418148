"""A pump resolves prewrites of a producer that is down by writing to its outbox (DESIGN §5)."""
from __future__ import annotations


import pytest

from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, NodeStatus, Registry
from sluice.proto import sluice_pb2 as pb
from tests.support.binlogs import TS, prewrite
from tests.support.cluster import CLUSTER_ID, Cluster
from tests.support.procs import free_port, wait_until

pytestmark = pytest.mark.timeout(120)


def test_prewrites_of_a_dead_producer_are_decided_by_its_outbox(cluster: Cluster, etcd,  # type: ignore[no-untyped-def]
                                                               mariadb_module) -> None:
    db = f"pump_outbox_{free_port()}"
    mariadb_module.execute(f"CREATE DATABASE {db}")
    mariadb_module.execute("CREATE TABLE sluice_outbox (start_ts BIGINT NOT NULL PRIMARY KEY, "
                           "commit_ts BIGINT NULL) ENGINE=InnoDB", database=db)
    client = Etcd(etcd.endpoint)
    # Registered with an unreachable TxnStatus address and no alive key: the application is down.
    Registry(client, CLUSTER_ID).register(NodeStatus(
        node_id="app", kind=NodeKind.PRODUCER, addr=f"127.0.0.1:{free_port()}",
        state=NodeState.ONLINE,
        labels={"outbox-dsn": f"{mariadb_module.dsn(db)}?table=sluice_outbox"}))
    pump = cluster.start_pump(**{"txn-timeout": 1.5})
    ch, stub = pump.stub()
    ts = TS(cluster.tso_addrs, CLUSTER_ID)
    s_committed, s_open = ts.get(), ts.get()
    stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=CLUSTER_ID, payloads=[
        prewrite(s_committed, producer="app"), prewrite(s_open, producer="app")]), timeout=10)
    # The application committed s_committed (its outbox row, commit_ts fetched after the
    # prewrite ack) and died before its Commit binlog; s_open never reached its DB commit.
    c = ts.get()
    mariadb_module.execute("INSERT INTO sluice_outbox VALUES (%s, %s)", (s_committed, c),
                           database=db)

    def state(s: int) -> pb.GetCommitResp:
        return stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=s), timeout=5)
    wait_until(lambda: state(s_committed).state == pb.TXN_COMMITTED
               and state(s_open).state == pb.TXN_ROLLED_BACK, 30, what="outbox resolution")
    assert state(s_committed).commit_ts == c
    # Deciding by writing left the rolled-back marker, so the application can never commit it.
    assert mariadb_module.execute("SELECT start_ts, commit_ts FROM sluice_outbox ORDER BY 1",
                                  database=db) == [(s_committed, c), (s_open, None)]
    assert mariadb_module.password not in pump.proc.log_text(), "the DSN password was logged"
    ch.close()
    client.close()
    ts.close()
