"""Event-loop accounting for `bench/pump_write.py --count` (loaded into the pump process through
PYTHONPATH; never part of a running Sluice): counts every event-loop callback by the function it
runs, every `call_soon_threadsafe` (a hand-off from another thread to the loop) and every
`run_in_executor` (a hand-off from the loop to a worker thread), the cyclic garbage collector's
runs and time by generation, and writes the totals as JSON to
$SLUICE_LOOPCOUNT_FILE every 0.2 s, so the bench can take a difference over its write phase."""
from __future__ import annotations

import asyncio.base_events
import asyncio.events
import collections
import json
import os
import threading
import time

_PATH = os.environ.get("SLUICE_LOOPCOUNT_FILE", "")
_counts: collections.Counter[str] = collections.Counter()


def _name(cb: object) -> str:
    fn = getattr(cb, "func", cb)   # functools.partial
    self = getattr(fn, "__self__", None)
    if self is not None and type(self).__name__ in ("Task", "Future", "_asyncio.Task"):
        coro = getattr(self, "get_coro", lambda: None)()
        return f"{type(self).__name__}.{getattr(fn, '__name__', '?')}:" \
               f"{getattr(coro, '__qualname__', '?')}"
    return getattr(fn, "__qualname__", None) or type(fn).__name__


if _PATH:
    _run = asyncio.events.Handle._run

    def _counted_run(self: asyncio.events.Handle) -> None:
        _counts["callbacks"] += 1
        _counts["cb " + _name(self._callback)] += 1
        _run(self)

    asyncio.events.Handle._run = _counted_run   # type: ignore[method-assign]

    _cst = asyncio.base_events.BaseEventLoop.call_soon_threadsafe

    def _counted_cst(self, callback, *args, **kw):  # type: ignore[no-untyped-def]
        _counts["call_soon_threadsafe"] += 1
        _counts["threadsafe " + _name(callback)] += 1
        return _cst(self, callback, *args, **kw)

    asyncio.base_events.BaseEventLoop.call_soon_threadsafe = _counted_cst  # type: ignore

    _rie = asyncio.base_events.BaseEventLoop.run_in_executor

    def _counted_rie(self, executor, func, *args):  # type: ignore[no-untyped-def]
        _counts["run_in_executor"] += 1
        _counts["executor " + _name(func)] += 1
        return _rie(self, executor, func, *args)

    asyncio.base_events.BaseEventLoop.run_in_executor = _counted_rie  # type: ignore

    import gc

    _gc_started = [0.0]

    def _on_gc(phase: str, info: dict) -> None:   # type: ignore[type-arg]
        # The collector holds the GIL throughout: its wall time is the process's CPU for it.
        if phase == "start":
            _gc_started[0] = time.perf_counter()
        else:
            gen = info.get("generation", -1)
            _counts[f"gc gen{gen} collections"] += 1
            _counts[f"gc gen{gen} us"] += int((time.perf_counter() - _gc_started[0]) * 1e6)

    gc.callbacks.append(_on_gc)

    def _dump() -> None:
        while True:
            time.sleep(0.2)
            try:
                snapshot = dict(_counts)
            except RuntimeError:   # another thread added a key meanwhile: next time
                continue
            tmp = _PATH + ".tmp"
            with open(tmp, "w") as f:
                json.dump(snapshot, f)
            os.replace(tmp, _PATH)

    threading.Thread(target=_dump, name="loopcount", daemon=True).start()
