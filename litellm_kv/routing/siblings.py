"""Sibling prediction: a short-lived side index fed by the router's own decisions.

When an agent fans out N requests sharing a prefix within milliseconds, the engine has not yet
announced (or even computed) the prefix blocks of the first one when the second is routed, so
the event-fed index sees no hit anywhere and the burst scatters. Recording each decision's
prompt blocks here for a few seconds lets the followers join the first. Entries are kept apart
from the engine-event index: they are predictions, and they expire on their own.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from litellm_kv.config import doc


@dataclass(slots=True)
class SiblingConfig:
    """Sibling index options (``model_groups.<g>.kv.siblings``)."""

    ttl_s: float = doc("How long a routing decision predicts its blocks on the chosen replica.",
                       default=5.0)
    max_entries: int = doc("Bound on (block, replica) entries; the oldest are dropped beyond it.",
                           default=200_000)


class SiblingIndex:
    """block hash -> {replica: expiry}; lookups count leading blocks per replica."""

    def __init__(self, ttl_s: float = 5.0, max_entries: int = 200_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        # Insertion-ordered by expiry (constant TTL), so expiry pops from the front.
        self._entries: OrderedDict[tuple[int, str], float] = OrderedDict()
        self._by_hash: dict[int, dict[str, float]] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def record(self, replica: str, block_hashes: Sequence[int]) -> None:
        now = self._clock()
        self._expire(now)
        until = now + self.ttl_s
        for h in block_hashes:
            key = (h, replica)
            if key in self._entries:
                self._entries.move_to_end(key)
            self._entries[key] = until
            self._by_hash.setdefault(h, {})[replica] = until
        while len(self._entries) > self.max_entries:
            self._drop_first()

    def lookup(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of the chain each replica is predicted to hold."""
        now = self._clock()
        self._expire(now)
        if not block_hashes:
            return {}
        first = self._by_hash.get(block_hashes[0])
        if not first:
            return {}
        out: dict[str, int] = {}
        for replica in first:
            n = 0
            for h in block_hashes:
                holders = self._by_hash.get(h)
                if holders is None or replica not in holders:
                    break
                n += 1
            out[replica] = n
        return out

    def _expire(self, now: float) -> None:
        entries = self._entries
        while entries:
            _key, until = next(iter(entries.items()))
            if until > now:
                break
            self._drop_first()

    def _drop_first(self) -> None:
        (h, replica), _ = self._entries.popitem(last=False)
        holders = self._by_hash.get(h)
        if holders is not None:
            holders.pop(replica, None)
            if not holders:
                del self._by_hash[h]
