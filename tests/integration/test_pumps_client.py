"""PumpsClient against real etcd, TSO and pump processes: routing, pump membership, parts,
the ordering rule and NoPumpAvailable."""
from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from sluice.client.pumps import NoPumpAvailable, PrewriteAck, PumpsClient, check_commit_ts
from sluice.core import errors
from sluice.core.etcd import Etcd
from sluice.core.registry import NodeKind, NodeState, Registry
from sluice.core.tso_client import TSOClient
from sluice.proto import sluice_pb2 as pb
from sluice.proto import sluice_pb2_grpc as pbg
from tests.support.binlogs import decode, pv
from tests.support.cluster import CLUSTER_ID, Cluster
from tests.support.procs import wait_until

pytestmark = pytest.mark.timeout(120)

PART_LIMIT = 256 << 10     # the pumps' storage.max-binlog-size in this module
VALUE = pv("v" * 1024)
# Every producer id this module writes with (pumps take prewrites only from registered ones).
PRODUCERS = ("spread-range", "spread-hash", "h", "split", "parts", "newpump", "pause", "paused",
             "app")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, etcd_module) -> Iterator[Cluster]:  # type: ignore[no-untyped-def]
    c = Cluster(tmp_path_factory.mktemp("client"), etcd_module.endpoint)
    try:
        c.start_tso()
        for i in (1, 2, 3):
            c.start_pump(f"pump-{i}", **{"storage.max-binlog-size": PART_LIMIT})
        for producer in PRODUCERS:
            c.register_producer(producer)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def registry(etcd_module) -> Iterator[Registry]:  # type: ignore[no-untyped-def]
    etcd = Etcd(etcd_module.endpoint)
    yield Registry(etcd, CLUSTER_ID)
    etcd.close()


@dataclass
class Done:
    start_ts: int
    commit_ts: int
    pumps: tuple[str, ...]


async def run_load(client: PumpsClient, tso: TSOClient, n: int, producer: str,
                   concurrency: int = 64, value: bytes = VALUE) -> list[Done]:
    """n transactions in TiDB's order: start_ts, prewrite (acked), commit_ts, checked, commit."""
    todo = iter(range(n))
    done: list[Done] = []

    async def worker() -> None:
        for _ in todo:
            s = await tso.get_ts()
            ack = await client.write_prewrite(pb.Binlog(tp=pb.PREWRITE, start_ts=s,
                                                        prewrite_value=value, producer_id=producer))
            c = await tso.get_ts()
            check_commit_ts(c, ack)
            await client.write_commits([pb.Binlog(tp=pb.COMMIT, start_ts=s, commit_ts=c,
                                                  producer_id=producer)], ack)
            done.append(Done(s, c, ack.pumps))
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done


def pull(addr: str, upto: int, timeout: float = 30.0) -> list[pb.Binlog]:
    """Every non-fake binlog a pump serves, until its watermark reaches `upto`."""
    ch = grpc.insecure_channel(addr, options=[("grpc.max_receive_message_length", 1 << 30)])
    out: list[pb.Binlog] = []
    stream = pbg.PumpStub(ch).PullBinlogs(pb.PullBinlogsReq(cluster_id=CLUSTER_ID, after_commit_ts=0),
                                          timeout=timeout)
    try:
        for resp in stream:
            out += [b for b in map(decode, resp.binlogs) if b.tp != pb.FAKE]
            if resp.watermark >= upto:
                return out
    finally:
        stream.cancel()
        ch.close()
    raise AssertionError(f"pump {addr} stream ended below watermark {upto}")


def commits_by_pump(cluster: Cluster, producer: str, upto: int) -> dict[str, dict[int, int]]:
    """pump -> {start_ts: commit_ts} of `producer`'s transactions, each checked to have its
    prewrite right before its commit in the pulled stream."""
    out: dict[str, dict[int, int]] = {}
    for node_id, handle in cluster.pumps.items():
        if not handle.proc.alive():
            continue
        got: dict[int, int] = {}
        prewritten: set[int] = set()
        for b in pull(handle.addr, upto):
            if b.producer_id != producer:
                continue
            if b.tp == pb.PREWRITE:
                prewritten.add(b.start_ts)
            elif b.tp == pb.COMMIT:
                assert b.start_ts in prewritten, f"{node_id}: commit of {b.start_ts} without prewrite"
                got[b.start_ts] = b.commit_ts
        out[node_id] = got
    return out


async def with_client(cluster: Cluster, fn, **kwargs):  # type: ignore[no-untyped-def]
    client = PumpsClient(cluster.etcd, CLUSTER_ID, **kwargs)
    tso = TSOClient(cluster.tso_addrs, CLUSTER_ID)
    await client.start()
    try:
        return await fn(client, tso)
    finally:
        await client.close()
        await tso.close()


@pytest.mark.parametrize("selector", ["range", "hash"])
def test_prewrites_spread_evenly_and_every_commit_sits_on_its_prewrites_pump(
        cluster: Cluster, registry: Registry, selector: str) -> None:
    """10k transactions spread over 3 pumps within ±15%; each commit is on the pump holding its
    prewrite, and nowhere else."""
    producer = f"spread-{selector}"
    n = 10_000

    async def go(client: PumpsClient, tso: TSOClient) -> list[Done]:
        assert sorted(client.available_pumps()) == ["pump-1", "pump-2", "pump-3"]
        return await run_load(client, tso, n, producer)
    done = asyncio.run(with_client(cluster, go, selector=selector))
    assert len(done) == n
    spread = Counter(d.pumps for d in done)
    assert set(spread) == {("pump-1",), ("pump-2",), ("pump-3",)}
    for pumps, count in spread.items():
        assert abs(count - n / 3) <= 0.15 * n / 3, f"{selector}: {pumps} got {count} of {n}"
    stored = commits_by_pump(cluster, producer, max(d.commit_ts for d in done))
    for d in done:
        (holder,) = d.pumps
        assert stored[holder].get(d.start_ts) == d.commit_ts
    assert sum(map(len, stored.values())) == n   # no copies anywhere else


def test_hash_routes_one_start_ts_to_one_pump(cluster: Cluster) -> None:
    """The hash selector sends a start_ts to the same pump from any client."""
    async def go(client: PumpsClient, tso: TSOClient) -> list[tuple[str, ...]]:
        acks = []
        for s in [await tso.get_ts() for _ in range(20)]:
            ack = await client.write_prewrite(pb.Binlog(tp=pb.PREWRITE, start_ts=s,
                                                        prewrite_value=VALUE, producer_id="h"))
            await client.write_commits([pb.Binlog(tp=pb.ROLLBACK, start_ts=s, producer_id="h")], ack)
            acks.append((s, ack.pumps))
        return acks
    first = asyncio.run(with_client(cluster, go, selector="hash"))

    async def again(client: PumpsClient, tso: TSOClient) -> list[tuple[str, ...]]:
        from sluice.client.routing import Candidate, HashSelector
        sel = HashSelector()
        cands = [Candidate(p) for p in sorted(client.available_pumps())]
        return [(s, (sel.rank(s, cands)[0],)) for s, _ in first]
    assert asyncio.run(with_client(cluster, again, selector="hash")) == first
    assert len({p for _, p in first}) == 3


def test_a_failed_coalesced_batch_is_split_so_one_bad_binlog_fails_only_its_caller(
        cluster: Cluster) -> None:
    """Concurrent callers' binlogs go to the pump coalesced (linger gathers them into one
    WriteBinlogs); the pump applies a batch atomically, so when one member is bad the batch is
    retried member by member: only the bad binlog's caller fails, every other one is stored."""
    from sluice.client.batcher import WriteBatcher
    from tests.support.binlogs import commit, prewrite, rollback
    pump = cluster.pumps["pump-1"]

    async def go(tso: TSOClient) -> None:
        ch = grpc.aio.insecure_channel(pump.addr)
        batcher = WriteBatcher(ch, CLUSTER_ID, linger_s=0.05)
        try:
            starts = [await tso.get_ts() for _ in range(20)]
            # Coalesced: 20 prewrites from 20 callers in one RPC.
            await asyncio.gather(*(batcher.write(prewrite(s, producer="split")) for s in starts))
            assert (batcher.rpcs, batcher.binlogs) == (1, 20)
            c0 = await tso.get_ts()
            bad = commit(starts[0], 1, producer="split")   # commit_ts 1: below its start_ts
            results = await asyncio.gather(
                batcher.write(bad),
                *(batcher.write(commit(s, c0 + i, producer="split")) for i, s in enumerate(starts[1:])),
                return_exceptions=True)
            assert isinstance(results[0], errors.InvalidArgument), results[0]
            assert f"commit_ts 1 <= start_ts {starts[0]}" in str(results[0]), results[0]
            assert all(isinstance(r, int) for r in results[1:]), results[1:]
            # One coalesced attempt failed as a whole, then 19 good members alone.
            assert (batcher.rpcs, batcher.binlogs) == (1 + 19, 20 + 19)
        finally:
            await batcher.close()
            await ch.close()
        stub = pbg.PumpStub(ch := grpc.aio.insecure_channel(pump.addr))
        try:
            for i, s in enumerate(starts[1:]):
                got = await stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=s))
                assert (got.state, got.commit_ts) == (pb.TXN_COMMITTED, c0 + i)
            first = await stub.GetCommit(pb.GetCommitReq(cluster_id=CLUSTER_ID, start_ts=starts[0]))
            assert first.state == pb.TXN_UNKNOWN   # its prewrite waits for a valid decision
            # Decide it: an unresolved prewrite would hold this pump's watermark.
            await stub.WriteBinlogs(pb.WriteBinlogsReq(cluster_id=CLUSTER_ID, payloads=[
                rollback(starts[0], producer="split")]))
        finally:
            await ch.close()

    async def main() -> None:
        tso = TSOClient(cluster.tso_addrs, CLUSTER_ID)
        try:
            await go(tso)
        finally:
            await tso.close()
    asyncio.run(main())


def test_big_prewrite_is_written_as_parts_to_one_pump(cluster: Cluster) -> None:
    """A prewrite over max_binlog_size is split into parts (same start_ts) on the same pump,
    each within the pump's limit, and read back whole."""
    value = pv("".join(map(chr, range(32, 127))) * 11_100)   # ~1 MiB: 5 parts of <= 256 KiB

    async def go(client: PumpsClient, tso: TSOClient) -> Done:
        (d,) = await run_load(client, tso, 1, "parts", concurrency=1, value=value)
        return d
    d = asyncio.run(with_client(cluster, go, max_binlog_size=PART_LIMIT))
    (holder,) = d.pumps
    binlogs = [b for b in pull(cluster.pumps[holder].addr, d.commit_ts)
               if b.start_ts == d.start_ts]
    parts = [b for b in binlogs if b.tp == pb.PREWRITE]
    assert [b.part_no for b in parts] == list(range(len(parts))) and len(parts) == 5
    assert all(b.part_count == 5 and len(b.SerializeToString()) <= PART_LIMIT for b in parts)
    assert b"".join(b.prewrite_value for b in parts) == value
    assert binlogs[-1].tp == pb.COMMIT and binlogs[-1].commit_ts == d.commit_ts


def test_new_pump_is_used_without_restart_and_pausing_pump_gets_no_new_prewrites(
        cluster: Cluster, registry: Registry) -> None:
    """Pumps come from the registry watch: a new pump takes prewrites without restarting the
    client; a pausing/paused pump takes none, but still the commit of a prewrite it holds."""
    async def go(client: PumpsClient, tso: TSOClient) -> None:
        assert "pump-4" not in client.available_pumps()
        await asyncio.to_thread(cluster.start_pump, "pump-4", **{"storage.max-binlog-size": PART_LIMIT})
        await asyncio.to_thread(wait_until, lambda: "pump-4" in client.available_pumps(), 10,
                                what="the client to see pump-4")
        done = await run_load(client, tso, 400, "newpump", concurrency=16)
        assert Counter(d.pumps for d in done)[("pump-4",)] > 50

        # A prewrite on pump-4, then pump-4 starts pausing before the commit.
        for _ in range(8):
            s = await tso.get_ts()
            ack = await client.write_prewrite(pb.Binlog(tp=pb.PREWRITE, start_ts=s,
                                                        prewrite_value=VALUE, producer_id="pause"))
            if ack.pumps == ("pump-4",):
                break
            await client.write_commits([pb.Binlog(tp=pb.ROLLBACK, start_ts=s, producer_id="pause")], ack)
        assert ack.pumps == ("pump-4",)
        await asyncio.to_thread(registry.set_state, NodeKind.PUMP, "pump-4", NodeState.PAUSING)
        await asyncio.to_thread(wait_until, lambda: "pump-4" not in client.available_pumps(), 10,
                                what="the client to stop routing to pump-4")
        during = await run_load(client, tso, 300, "paused", concurrency=16)
        c = await tso.get_ts()
        await client.write_commits([pb.Binlog(tp=pb.COMMIT, start_ts=s, commit_ts=c,
                                              producer_id="pause")], ack)
        await asyncio.to_thread(
            wait_until, lambda: registry.get(NodeKind.PUMP, "pump-4").status.state == NodeState.PAUSED,
            15, what="pump-4 to finish pausing")
        after = await run_load(client, tso, 300, "paused", concurrency=16)
        assert all(d.pumps != ("pump-4",) for d in during + after)
        stored = {b.start_ts: b.commit_ts for b in pull(cluster.pumps["pump-4"].addr, c)
                  if b.tp == pb.COMMIT}
        assert stored[s] == c
        assert not {d.start_ts for d in during + after} & set(stored)
    try:
        asyncio.run(with_client(cluster, go, probe_interval_s=1.0))
    finally:
        # Leave the module's cluster with its three pumps.
        info = registry.get(NodeKind.PUMP, "pump-4")
        if info is not None and info.status.state != NodeState.OFFLINE:
            registry.set_state(NodeKind.PUMP, "pump-4", NodeState.CLOSING, force=True)
        cluster.pumps["pump-4"].proc.stop()
        del cluster.pumps["pump-4"]


def test_commit_ts_is_fetched_only_after_a_delayed_prewrite_ack(tmp_path: Path, etcd_module) -> None:  # type: ignore[no-untyped-def]
    """commit_ts is fetched only after every prewrite is durably acknowledged: with the pump's
    acks delayed, no commit_ts is taken before the ack, and a commit_ts taken too early is
    refused by check_commit_ts and, loudly, by the pump (no retry, no failover)."""
    c = Cluster(tmp_path, etcd_module.endpoint, cluster_id=CLUSTER_ID + 2)
    try:
        c.start_tso()
        c.start_pump("slow", env={"SLUICE_FAILPOINTS": "pump-before-write=sleep(1200)"},
                     **{"heartbeat-interval": 0.2})
        c.register_producer("app")
        events: list[tuple[float, str, int]] = []

        async def go() -> None:
            client = PumpsClient(c.etcd, c.cluster_id, write_timeout_s=5.0)
            tso = TSOClient(c.tso_addrs, c.cluster_id)
            await client.start()
            try:
                async def txn(i: int) -> None:
                    s = await tso.get_ts()
                    events.append((time.monotonic(), "prewrite-sent", s))
                    ack = await client.write_prewrite(pb.Binlog(tp=pb.PREWRITE, start_ts=s,
                                                                prewrite_value=VALUE,
                                                                producer_id="app"))
                    events.append((time.monotonic(), "prewrite-acked", s))
                    commit_ts = await tso.get_ts()
                    events.append((time.monotonic(), "commit-ts-fetched", s))
                    check_commit_ts(commit_ts, ack)
                    await client.write_commits([pb.Binlog(tp=pb.COMMIT, start_ts=s,
                                                          commit_ts=commit_ts)], ack)
                    events.append((time.monotonic(), "committed", s))
                await asyncio.gather(*(txn(i) for i in range(8)))

                # The wrong order: commit_ts before the prewrite. While the prewrite waits in
                # the pump, fake binlogs carry its served watermark past that commit_ts.
                s = await tso.get_ts()
                early = await tso.get_ts()
                ack = await client.write_prewrite(pb.Binlog(tp=pb.PREWRITE, start_ts=s,
                                                            prewrite_value=VALUE,
                                                            producer_id="app"))
                assert ack.watermark >= early
                with pytest.raises(errors.FailedPrecondition, match="not above the served watermark"):
                    check_commit_ts(early, ack)
                # Skip the client's own guard: the pump refuses it too, and the client neither
                # retries (one 1.2 s pump delay, not three) nor fails over.
                t0 = time.monotonic()
                with pytest.raises(errors.FailedPrecondition, match="served watermark"):
                    await client.write_commits(
                        [pb.Binlog(tp=pb.COMMIT, start_ts=s, commit_ts=early)],
                        PrewriteAck(s, ack.pumps, 0))
                assert time.monotonic() - t0 < 2.3
                assert client.available_pumps() == ["slow"]
                assert client.metrics.m.registry.get_sample_value("sluice_client_failovers_total") == 0
            finally:
                await client.close()
                await tso.close()
        asyncio.run(go())
        for s in {s for _, kind, s in events}:
            times = {kind: t for t, kind, s2 in events if s2 == s}
            assert times["prewrite-acked"] - times["prewrite-sent"] >= 1.1
            assert times["prewrite-acked"] <= times["commit-ts-fetched"] <= times["committed"]
    finally:
        c.stop()


def test_no_pump_available_names_every_pump_and_why(cluster: Cluster, registry: Registry) -> None:
    """With every pump paused (or pausing) the client raises NoPumpAvailable naming each."""
    async def go(client: PumpsClient, tso: TSOClient) -> str:
        for node_id in ("pump-1", "pump-2", "pump-3"):
            await asyncio.to_thread(registry.set_state, NodeKind.PUMP, node_id, NodeState.PAUSING)
        await asyncio.to_thread(wait_until, lambda: not client.available_pumps(), 10,
                                what="no pump available")
        with pytest.raises(NoPumpAvailable) as e:
            await client.write_prewrite(pb.Binlog(tp=pb.PREWRITE, start_ts=await tso.get_ts(),
                                                  prewrite_value=VALUE, producer_id="app"))
        return str(e.value)
    try:
        message = asyncio.run(with_client(cluster, go))
    finally:
        for node_id in ("pump-1", "pump-2", "pump-3"):
            wait_until(lambda: registry.get(NodeKind.PUMP, node_id).status.state == NodeState.PAUSED,
                       15, what=f"{node_id} paused")
            registry.set_state(NodeKind.PUMP, node_id, NodeState.ONLINE)
    assert "no pump can take the prewrite" in message
    for node_id in ("pump-1", "pump-2", "pump-3"):
        assert node_id in message
    assert message.count("state paus") == 3, message


def test_selectors_rank_every_candidate_and_score_follows_weights() -> None:
    """Selectors rank all candidates (failover walks the ranking); `score` sends prewrites in
    proportion to the pumps' scores and ranks score <= 0 last."""
    from sluice.client.routing import Candidate, make_selector
    cands = [Candidate("a", 300), Candidate("b", 100), Candidate("c", 0)]
    for name in ("range", "hash", "score"):
        sel = make_selector(name)
        for s in range(1, 50):
            assert sorted(sel.rank(s, cands)) == ["a", "b", "c"]
    sel = make_selector("score")
    firsts = Counter(sel.rank(s, cands)[0] for s in range(4000))
    assert firsts == {"a": 3000, "b": 1000}
    assert sel.rank(1, cands)[-1] == "c"
    with pytest.raises(errors.ConfigError, match="unknown pump selector"):
        make_selector("random")
