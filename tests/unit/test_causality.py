from __future__ import annotations

import random
import threading
import time

import pytest

from sluice.drainer.causality import Causality, Dispatcher


def test_two_changes_sharing_a_key_are_applied_in_source_order():
    """Two row changes that share a causality key are applied in source order. A change goes to
    the worker that holds one of its keys; a change whose keys are held by several workers stays
    with one of them and waits until each of the others has committed everything it was given."""
    rng = random.Random(3)
    applied: list[tuple[int, int, tuple[str, ...]]] = []  # (worker, change no, keys) at commit
    lock = threading.Lock()
    in_flight: dict[str, int] = {}

    def execute(worker: int, items: list[tuple[int, tuple[str, ...]]]) -> None:
        # A key being executed by two workers at once would mean two orders were possible.
        with lock:
            for _, keys in items:
                for k in keys:
                    assert in_flight.get(k, worker) == worker, f"key {k} on two workers at once"
                    in_flight[k] = worker
        time.sleep(rng.random() / 2000)
        with lock:
            for n, keys in items:
                applied.append((worker, n, keys))
                for k in keys:
                    in_flight.pop(k, None)

    d: Dispatcher = Dispatcher(8, 5, execute, queue_size=16)
    d.start()
    changes = []
    for n in range(3000):
        keys = tuple(dict.fromkeys(f"k{rng.randint(0, 60)}" for _ in range(rng.randint(1, 3))))
        changes.append((n, keys))
        d.dispatch(keys, (n, keys), commit_ts=n + 1)
        d.mark_done(n + 1)
    d.flush()
    d.close()
    assert sorted(n for _, n, _ in applied) == list(range(3000))
    # Per key, the commit order equals the source order.
    last: dict[str, int] = {}
    for _, n, keys in applied:
        for k in keys:
            assert last.get(k, -1) < n, f"key {k}: change {n} applied after {last[k]}"
            last[k] = n
    assert d.conflicts > 0 and d.waited_workers >= d.conflicts
    assert d.applied() == 3000


def test_a_conflict_waits_only_for_the_workers_holding_its_keys():
    """A change whose keys are held by several workers waits only for the others to commit —
    a third worker stuck in a long transaction does not hold the dispatcher up."""
    stuck = threading.Event()
    seen: list[tuple[int, list[str]]] = []

    def execute(w: int, items: list[str]) -> None:
        if "slow" in items:
            stuck.wait(10)
        seen.append((w, items))

    d: Dispatcher = Dispatcher(3, 100, execute, queue_size=400)
    d.start()
    c = Causality(3)
    key_on = {w: next(f"k{i}" for i in range(100) if c.route([f"k{i}"], [0] * 3) == w) for w in range(3)}
    d.dispatch([key_on[0]], "slow", commit_ts=1)
    d.nudge()                                    # worker 0 is now inside a long transaction
    d.dispatch([key_on[1]], "a", commit_ts=2)
    d.dispatch([key_on[2]], "b", commit_ts=3)
    started = time.monotonic()
    w = d.dispatch([key_on[1], key_on[2]], "ab", commit_ts=4)  # held by workers 1 and 2
    assert time.monotonic() - started < 5 and not stuck.is_set()
    assert d.conflicts == 1 and d.flushes == 0 and d.waited_workers == 1
    assert w in (1, 2)
    other = 3 - w
    assert (other, ["a" if other == 1 else "b"]) in seen   # the other holder committed first
    stuck.set()
    d.flush()
    assert any("ab" in items for _, items in seen)
    d.close()


def test_a_backlog_is_committed_in_fewer_larger_transactions():
    sizes: list[int] = []
    d: Dispatcher = Dispatcher(2, 5, lambda w, items: sizes.append(len(items)), queue_size=100,
                               max_batch=60)
    d.start()
    d.backlogged(True)
    for i in range(100):
        d.dispatch([f"k{i}"], i, commit_ts=i + 1)
    d.nudge()
    d.flush()
    assert sum(sizes) == 100 and max(sizes) > 5 and len(sizes) <= 4
    d.backlogged(False)
    sizes.clear()
    for i in range(100, 120):
        d.dispatch([f"k{i}"], i, commit_ts=i + 1)
    d.flush()
    assert sum(sizes) == 20 and max(sizes) <= 10  # batch_size, maybe two coalesced from the queue
    d.close()


def test_route_follows_the_holder_and_reports_a_conflict():
    c = Causality(4)
    committed = [0, 0, 0, 0]
    w = c.route(["a"], committed)
    c.record(["a"], w, 1)
    other = next(x for x in range(4) if x != w)
    c.record(["b"], other, 1)
    assert c.route(["a", "z"], committed) == w       # "a" pins the change to w
    assert c.route(["a", "b"], committed) is None    # held by two workers: flush first
    committed[other] = 1                             # "b" committed: free again
    assert c.route(["a", "b"], committed) == w
    c.prune(committed)
    assert len(c) == 1
    # Unheld keys spread by hash, deterministically.
    assert c.route(["q"], committed) == c.route(["q"], committed)
    assert c.route([], committed) == 0


def tidb_case(*changes: tuple[str, ...]) -> list[int]:
    """Route changes (each its key tuple) through a dispatcher that never commits by itself;
    return the conflicts seen before each change."""
    release = threading.Event()
    d: Dispatcher = Dispatcher(4, 100, lambda w, items: release.wait(5), queue_size=64)
    d.start()
    seen = []
    try:
        for i, keys in enumerate(changes):
            before = d.conflicts
            if d.causality.route(keys, d.committed) is None:
                release.set()  # a flush must be able to finish
            d.dispatch(keys, keys, commit_ts=i + 1)
            d.mark_done(i + 1)
            seen.append(d.conflicts - before)
    finally:
        release.set()
        d.flush()
        d.close()
    return seen


def test_tidb_binlog_conflict_cases():
    # delete id=1 then re-insert id=1 (separate transactions): same key, same worker, no flush.
    assert tidb_case(("t.PRIMARY.1",), ("t.PRIMARY.1",)) == [0, 0]
    # pk change 3 -> 4, then delete 3: the delete shares key 3, follows the update's worker.
    assert tidb_case(("t.PRIMARY.3", "t.PRIMARY.4"), ("t.PRIMARY.3",)) == [0, 0]
    # Two rows swapping a unique value, each row first touched on its own worker: the swap's
    # update carries keys of both workers -> a flush first.
    keys = [("t.PRIMARY.1", "t.uk.a"), ("t.PRIMARY.2", "t.uk.b")]
    c = Causality(4)
    spread = next((a, b) for a in range(10) for b in range(10)
                  if c.route([f"t.PRIMARY.{a}"], [0] * 4) != c.route([f"t.PRIMARY.{b}"], [0] * 4))
    keys = [(f"t.PRIMARY.{spread[0]}", "t.uk.a"), (f"t.PRIMARY.{spread[1]}", "t.uk.b")]
    assert tidb_case(keys[0], keys[1], (keys[0][0], "t.uk.a", "t.uk.b")) == [0, 0, 1]


def test_applied_counts_a_transaction_only_when_every_worker_committed_it():
    gate = {w: threading.Event() for w in range(2)}
    d: Dispatcher = Dispatcher(2, 1, lambda w, items: gate[w].wait(5), queue_size=8)
    d.start(frontier=10)
    c = Causality(2)
    k0 = next(f"k{i}" for i in range(50) if c.route([f"k{i}"], [0, 0]) == 0)
    k1 = next(f"k{i}" for i in range(50) if c.route([f"k{i}"], [0, 0]) == 1)
    d.dispatch([k0], "a", commit_ts=11)
    d.dispatch([k1], "b", commit_ts=11)   # one transaction over both workers
    d.mark_done(11)
    d.dispatch([k0], "c", commit_ts=12)
    d.mark_done(12)
    assert d.applied() == 10
    gate[0].set()
    time.sleep(0.2)
    assert d.applied() == 10            # worker 1 still holds part of transaction 11
    gate[1].set()
    d.flush()
    assert d.applied() == 12
    d.close()


def test_a_worker_error_reaches_the_dispatcher_and_nothing_hangs():
    def execute(w: int, items: list[str]) -> None:
        if "bad" in items:
            raise RuntimeError("boom")

    d: Dispatcher = Dispatcher(3, 2, execute, queue_size=2)
    d.start()
    d.dispatch(["x"], "bad", commit_ts=1)
    with pytest.raises(RuntimeError, match="boom"):
        for i in range(200):
            d.dispatch(["x"], f"ok{i}", commit_ts=i + 2)
        d.flush()
    assert d.applied() == 0
    d.close()
