"""The TSO as the pump's write path checks clients' timestamps against it (DESIGN §2.2).

A start_ts or commit_ts a client sends was handed out by the TSO before its request arrived, so a
timestamp the TSO hands out afterwards is at least as high. The stager (pump/storage/stage.py)
keeps the highest timestamp it knows the TSO issued (this pump's heartbeats raise it) and asks
here only for a client timestamp above it: at most one TSO round trip per write group under
load, none for a retry or an older transaction.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from typing import TYPE_CHECKING

from sluice.core import errors

if TYPE_CHECKING:
    from sluice.core.tso_client import TSOClient

# The committer thread waits this long for the TSO (writes wait with it): a TSO that does not
# answer makes writes with new timestamps fail UNAVAILABLE, and their producers retry.
FETCH_TIMEOUT_S = 5.0


class TsoView:
    """`fresh_ts` for the storage's committer thread, served by the pump's TSO client on the
    pump's event loop (the client is not thread-safe)."""

    def __init__(self, tso: "TSOClient", loop: asyncio.AbstractEventLoop,
                 timeout_s: float = FETCH_TIMEOUT_S) -> None:
        self._tso = tso
        self._loop = loop
        self._timeout_s = timeout_s

    def fresh_ts(self) -> int:
        fut = asyncio.run_coroutine_threadsafe(self._tso.get_ts(), self._loop)
        try:
            return fut.result(self._timeout_s)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise errors.Unavailable(
                f"the TSO did not answer within {self._timeout_s:.0f} s: a new timestamp cannot "
                "be checked against it (the pump stores only timestamps the TSO has issued)"
            ) from None
        except errors.SluiceError as e:
            raise errors.Unavailable(
                f"the TSO is unavailable ({e}): a new timestamp cannot be checked against it"
            ) from None
