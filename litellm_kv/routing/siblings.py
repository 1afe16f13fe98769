"""Sibling prediction: a short-lived side index fed by the router's own decisions.

When an agent fans out N requests sharing a prefix within milliseconds, the engine has not yet
announced (or even computed) the prefix blocks of the first one when the second is routed, so
the event-fed index sees no hit anywhere and the burst scatters. Recording each decision's
prompt blocks here for a few seconds lets the followers join the first. Entries are kept apart
from the engine-event index: they are predictions, and they expire on their own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from litellm_kv.config import doc
from litellm_kv.retire import free_some


@dataclass(slots=True)
class SiblingSettings:
    """Sibling index options (``model_groups.<g>.kv.siblings``)."""

    ttl_s: float = doc("How long a routing decision predicts its blocks on the chosen replica.",
                       default=5.0)
    max_entries: int = doc("Bound on (block, replica) entries; the oldest are dropped beyond it.",
                           default=200_000)


class SiblingIndex:
    """block hash -> {replica: expiry}; lookups count leading blocks per replica.

    Two generations of entries: records go to the current one, which becomes the previous one
    every TTL (or at half of ``max_entries``), when the older generation is dropped — freed a slice
    per later ``record``, not in one pause. Expired entries still present are ignored at lookup.
    A generation holds one dict per replica, block hash -> expiry: a record allocates no object per
    block (~52 bytes an entry; a dict per block took ~236, and each counted toward the garbage
    collector's generation-0 threshold). ``record`` costs one dict write per block, expiry nothing
    per entry.
    """

    def __init__(self, ttl_s: float = 5.0, max_entries: int = 200_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._cur: dict[str, dict[int, float]] = {}
        self._prev: dict[str, dict[int, float]] = {}
        self._retiring: list[dict[int, float]] = []
        self._rotated = clock()
        # replica -> expiry below which its entries predate a purge of its cache (recorded then, so void).
        self._void_before: dict[str, float] = {}

    def __len__(self) -> int:
        """(block, replica) entries held, expired ones included until their generation is dropped."""
        return self._entries(self._cur) + self._entries(self._prev)

    @staticmethod
    def _entries(generation: dict[str, dict[int, float]]) -> int:
        return sum(len(d) for d in generation.values())  # a dict per replica: a few lengths

    def _rotate(self, now: float) -> None:
        if now - self._rotated >= self.ttl_s or self._entries(self._cur) >= self.max_entries // 2:
            # Freeing a whole generation at once is a pause on the request path (docs/performance.md):
            # it is freed a slice per record() instead, as fast as blocks are recorded.
            self._retiring.extend(d for d in self._prev.values() if d)
            self._prev = self._cur
            self._cur = {}
            self._rotated = now

    def record(self, replica: str, block_hashes: Sequence[int]) -> None:
        now = self._clock()
        self._rotate(now)
        mine = self._cur.get(replica)
        if mine is None:
            mine = self._cur[replica] = {}
        mine.update(dict.fromkeys(block_hashes, now + self.ttl_s))
        if self._retiring:
            free_some(self._retiring, len(block_hashes) + 64)

    def forget(self, replica: str) -> None:
        """The replica's cache was emptied (``AllBlocksCleared``, an engine restart, a purge): what was routed there
        before is no longer predicted there. O(1): its older entries are ignored until they expire."""
        self._void_before[replica] = self._clock() + self.ttl_s

    def lookup(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of the chain each replica is predicted to hold."""
        if not block_hashes:
            return {}
        now = self._clock()
        self._rotate(now)
        out: dict[str, int] = {}
        empty: dict[int, float] = {}
        replicas = [*self._cur, *(r for r in self._prev if r not in self._cur)]  # a fixed order: no set of names
        for replica in replicas:
            cur = self._cur.get(replica, empty)
            prev = self._prev.get(replica, empty)
            # An entry counts while it has not expired and was recorded after the replica's last purge.
            floor = max(now, self._void_before.get(replica, 0.0))
            n = 0
            for h in block_hashes:
                if cur.get(h, 0.0) <= floor and prev.get(h, 0.0) <= floor:
                    break
                n += 1
            if n:
                out[replica] = n
        return out
