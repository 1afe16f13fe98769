"""Prefix demand: how much of a group's recent traffic each cached prefix draws, for the prefix hold.

The TTFT cost (:mod:`litellm_kv.routing.cost`) keeps a request with the replicas holding its longest hit
unless that prefix is *hot*: it draws more than its fair share of the group's traffic for the replicas
holding it. A group of users sharing one system prompt among many such groups is not hot, and its requests
stay where the prompt is cached (what SGLang's cache-aware policy does); one prompt taking a large part of
the traffic is, and its requests spread as the cost decides.

A prefix is keyed by the wire hash of its last block: the hash chains over every block before it, so equal
keys are equal prefixes. Counts decay with a half-life, so a prefix that was hot an hour ago is not hot now,
and the table is bounded: past ``max_prefixes`` keys the least recently seen is dropped (it counts from
nothing if it comes back). Counts are this process's own; in shared mode each proxy judges shares from the
traffic it sees, which is a sample of the group's.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable

from litellm_kv.routing.load import DecayedSum
from litellm_kv.routing.ttft import TtftSettings


class PrefixDemand:
    """Decayed request counts per prefix key and for the whole group (one instance per model group)."""

    def __init__(self, half_life_s: float, prior_requests: float, max_prefixes: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not half_life_s > 0:
            raise ValueError("half_life_s must be positive")
        if max_prefixes < 1:
            raise ValueError("max_prefixes must be >= 1")
        self._rate = math.log(2) / half_life_s
        self.prior_requests = prior_requests
        self.max_prefixes = max_prefixes
        self._clock = clock
        self._fleet = DecayedSum()
        self._prefixes: OrderedDict[int, DecayedSum] = OrderedDict()

    @classmethod
    def for_settings(cls, tc: TtftSettings | None,
                     clock: Callable[[], float] = time.monotonic) -> PrefixDemand | None:
        """The counts a group's TTFT cost needs: None with the block cost or with ``kv.ttft.hold`` off."""
        if tc is None or not tc.hold:
            return None
        return cls(tc.hold_half_life_s, tc.hold_prior_requests, tc.hold_max_prefixes, clock=clock)

    def __len__(self) -> int:
        return len(self._prefixes)

    def share(self, key: int | None) -> float:
        """Count one request (with ``key``, the last block hash of its longest hit; None when it hits nowhere)
        and return the prefix's share of the group's recent requests, this one included. The group's count has
        ``prior_requests`` added, so the first requests of a run do not each look like all of the traffic."""
        now = self._clock()
        self._fleet.add(now, self._rate, 1.0)
        if key is None:
            return 0.0
        entry = self._prefixes.get(key)
        if entry is None:
            entry = self._prefixes[key] = DecayedSum()
            if len(self._prefixes) > self.max_prefixes:
                self._prefixes.popitem(last=False)
        else:
            self._prefixes.move_to_end(key)
        entry.add(now, self._rate, 1.0)
        return entry.v / (self._fleet.v + self.prior_requests)
