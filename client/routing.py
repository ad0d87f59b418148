"""Prewrite routing: which pumps a new transaction's prewrite goes to, in order of preference.

A selector never sees commits or rollbacks: those go to the pumps that acknowledged the prewrite
(the `PrewriteAck`). It ranks the pumps that can take a prewrite right now; the client takes the
first one (two with `replicas=2`) and walks further down the same ranking on failover, so a
failed-over prewrite lands on a pump the selector would have chosen next, deterministically.

- `range`: round robin over the candidates (TiDB-Binlog's default).
- `hash`: a 64-bit mix of start_ts modulo the number of candidates, so retries of one start_ts by
  any client pick the same pump while the membership is unchanged. The mix matters: TSO
  timestamps taken in start/commit pairs are often all even or all odd, and a plain
  `start_ts % n` would then skew two pumps 100:0.
- `score`: smooth weighted round robin (nginx's) over the pumps' registry `score`: **higher score,
  more prewrites**, in proportion. A pump with score <= 0 is ranked last: it gets prewrites only
  when nothing else can take them (a way to drain a pump without pausing it).
"""
from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.core.errors import ConfigError

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Candidate:
    """A pump that can take prewrites now."""

    node_id: str
    score: int = 0


class Selector(ABC):
    name = ""

    @abstractmethod
    def rank(self, start_ts: int, candidates: Sequence[Candidate]) -> list[str]:
        """Node ids of `candidates` (sorted by node id), most preferred first."""

    def first(self, start_ts: int, candidates: Sequence[Candidate]) -> str | None:
        """rank()[0] (None without candidates), with the same effect on the selector's state;
        selectors override it to skip building the whole ranking on the hot path."""
        ranked = self.rank(start_ts, candidates)
        return ranked[0] if ranked else None


class RangeSelector(Selector):
    name = "range"

    def __init__(self) -> None:
        self._next = itertools.count()

    def rank(self, start_ts: int, candidates: Sequence[Candidate]) -> list[str]:
        if not candidates:
            return []
        i = next(self._next) % len(candidates)
        ids = [c.node_id for c in candidates]
        return ids[i:] + ids[:i]

    def first(self, start_ts: int, candidates: Sequence[Candidate]) -> str | None:
        if not candidates:
            return None
        return candidates[next(self._next) % len(candidates)].node_id


def mix64(x: int) -> int:
    """splitmix64's finalizer: consecutive or same-parity inputs spread over all residues."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


class HashSelector(Selector):
    name = "hash"

    def rank(self, start_ts: int, candidates: Sequence[Candidate]) -> list[str]:
        if not candidates:
            return []
        i = mix64(start_ts) % len(candidates)
        ids = [c.node_id for c in candidates]
        return ids[i:] + ids[:i]

    def first(self, start_ts: int, candidates: Sequence[Candidate]) -> str | None:
        if not candidates:
            return None
        return candidates[mix64(start_ts) % len(candidates)].node_id


class ScoreSelector(Selector):
    name = "score"

    def __init__(self) -> None:
        self._current: dict[str, int] = {}

    def rank(self, start_ts: int, candidates: Sequence[Candidate]) -> list[str]:
        weighted = [c for c in candidates if c.score > 0]
        rest = [c.node_id for c in candidates if c.score <= 0]
        if not weighted:
            return rest
        live = {c.node_id for c in weighted}
        # Forget pumps that left, so one coming back starts fresh instead of with a stale credit.
        for gone in [k for k in self._current if k not in live]:
            del self._current[gone]
        total = 0
        for c in weighted:
            self._current[c.node_id] = self._current.get(c.node_id, 0) + c.score
            total += c.score
        best = max(weighted, key=lambda c: (self._current[c.node_id], c.node_id))
        self._current[best.node_id] -= total
        others = sorted((c for c in weighted if c is not best), key=lambda c: (-c.score, c.node_id))
        return [best.node_id] + [c.node_id for c in others] + rest


SELECTORS: dict[str, type[Selector]] = {
    RangeSelector.name: RangeSelector,
    HashSelector.name: HashSelector,
    ScoreSelector.name: ScoreSelector,
}


def make_selector(name: str) -> Selector:
    try:
        return SELECTORS[name]()
    except KeyError:
        raise ConfigError(f"unknown pump selector {name!r}: use one of "
                          f"{', '.join(sorted(SELECTORS))}") from None
