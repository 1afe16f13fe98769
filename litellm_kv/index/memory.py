"""The embedded index: plain dicts in the proxy (or indexer) process.

Per model group it keeps two views of the same facts:

* ``counts[replica]``: ``dict[wire_hash, packed]`` with the reference count of each tier packed
  into one int (``gpu | cpu << 21 | storage << 42``). It is the replica's reverse set (purge
  walks only this dict) and the source of truth for refcounts (vllm-contract.md §9: a hash can
  be cached twice and is then evicted twice).
* ``holders``: ``dict[wire_hash, replica_bitmask]`` over all replicas. A lookup is then one
  C-level ``map(dict.get)`` over the chain for *all* replicas, a running AND
  (``itertools.accumulate``), and a binary search per replica for the point where its bit drops
  out: the first miss ends its chain (hashes are chained).

GPU-only groups (no CPU/storage offload events) skip the per-block tier split entirely; with
offload tiers the split reads the matched prefix's packed counts.
Memory per (replica, block) is measured by ``benchmarks/bench_ingest.py`` (docs/engine.md).
"""

from __future__ import annotations

import bisect
import operator
import time
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, repeat

from litellm_kv.index.base import BlockOp, ReplicaMatch, Tier

_SHIFT = 21
_FIELD = (1 << _SHIFT) - 1
_UNIT = (1, 1 << _SHIFT, 1 << (2 * _SHIFT))  # by Tier value


class _GroupEntries:
    __slots__ = ("bits", "counts", "free_bits", "holders", "non_gpu_refs")

    def __init__(self) -> None:
        self.counts: dict[str, dict[int, int]] = {}
        self.bits: dict[str, int] = {}  # replica -> its bit in the masks
        self.free_bits: list[int] = []
        self.holders: dict[int, int] = {}  # hash -> mask of replicas holding it on any tier
        self.non_gpu_refs = 0  # CPU/storage references in the group; 0 enables the fast path

    def bit(self, replica: str) -> int:
        b = self.bits.get(replica)
        if b is None:
            b = self.free_bits.pop() if self.free_bits else 1 << len(self.bits)
            self.bits[replica] = b
            self.counts[replica] = {}
        return b


class InMemoryIndex:
    """:class:`~litellm_kv.index.base.KVIndex` in process memory (one proxy, nothing to run).

    Not thread-safe; use it from one event loop. The ``async`` methods never yield; the
    ``*_sync`` twins serve hot paths (subscribers, benchmarks) without a coroutine.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._groups: dict[str, _GroupEntries] = {}
        self._alive_until: dict[tuple[str, str], float] = {}
        self._clock = clock

    # -- writes --------------------------------------------------------------------------------

    async def apply(self, group: str, replica: str, ops: Iterable[BlockOp]) -> int:
        return self.apply_sync(group, replica, ops)

    def apply_sync(self, group: str, replica: str, ops: Iterable[BlockOp]) -> int:
        g = self._groups.get(group)
        if g is None:
            g = self._groups[group] = _GroupEntries()
        bit = g.bit(replica)
        table = g.counts[replica]
        get = table.get
        holders = g.holders
        touched = 0
        for op in ops:
            hashes = op.hashes
            t = op.tier
            unit = _UNIT[t]
            if op.delta > 0:
                fresh = dict.fromkeys(hashes, unit)
                if len(fresh) == len(hashes) and table.keys().isdisjoint(fresh):
                    # The usual store: distinct hashes the replica does not hold yet; set in C.
                    table.update(fresh)
                    holders.update(zip(hashes, map(bit.__or__, map(holders.get, hashes, repeat(0))), strict=True))
                else:
                    for h in hashes:
                        v = get(h)
                        if v is None:
                            table[h] = unit
                            holders[h] = holders.get(h, 0) | bit
                        else:
                            table[h] = v + unit
                if t:
                    g.non_gpu_refs += len(hashes)
                touched += len(hashes)
            else:
                shift = _SHIFT * t
                for h in hashes:
                    v = get(h)
                    if v is None or not (v >> shift) & _FIELD:
                        continue  # already gone: a replayed or duplicate removal
                    v -= unit
                    if t:
                        g.non_gpu_refs -= 1
                    if v:
                        table[h] = v
                    else:
                        del table[h]
                        _clear(holders, h, bit)
                    touched += 1
        return touched

    async def purge_replica(self, group: str, replica: str) -> int:
        return self.purge_replica_sync(group, replica)

    def purge_replica_sync(self, group: str, replica: str) -> int:
        g = self._groups.get(group)
        if g is None or replica not in g.bits:
            return 0
        bit = g.bits.pop(replica)
        table = g.counts.pop(replica)
        holders = g.holders
        for h, v in table.items():
            _clear(holders, h, bit)
            g.non_gpu_refs -= ((v >> _SHIFT) & _FIELD) + (v >> (2 * _SHIFT))
        g.free_bits.append(bit)
        return len(table)

    # -- reads ---------------------------------------------------------------------------------

    async def lookup(
        self, group: str, block_hashes: Sequence[int], replicas: Sequence[str] | None = None
    ) -> dict[str, ReplicaMatch]:
        return self.lookup_sync(group, block_hashes, replicas)

    def lookup_sync(
        self, group: str, block_hashes: Sequence[int], replicas: Sequence[str] | None = None
    ) -> dict[str, ReplicaMatch]:
        g = self._groups.get(group)
        if g is None or not block_hashes or not g.bits:
            return {}
        n = len(block_hashes)
        running = list(accumulate(map(g.holders.get, block_hashes, repeat(0, n)), operator.and_))
        out: dict[str, ReplicaMatch] = {}
        names = g.bits.items() if replicas is None else [(r, g.bits[r]) for r in replicas if r in g.bits]
        for name, bit in names:
            if not running[0] & bit:
                continue
            # running[i] & bit is true for a prefix of i: binary search its end.
            matched = bisect.bisect_left(running, True, key=_Missing(bit))
            if not g.non_gpu_refs:
                out[name] = ReplicaMatch(gpu=matched)
                continue
            packed = list(map(g.counts[name].__getitem__, block_hashes[:matched]))
            on_gpu = sum(1 for v in packed if v & _FIELD)
            cpu = sum(1 for v in packed if not v & _FIELD and (v >> _SHIFT) & _FIELD)
            out[name] = ReplicaMatch(gpu=on_gpu, cpu=cpu, storage=matched - on_gpu - cpu)
        return out

    async def replicas(self, group: str) -> list[str]:
        g = self._groups.get(group)
        names = {r for r, t in g.counts.items() if t} if g is not None else set()
        now = self._clock()
        names.update(r for (gr, r), until in self._alive_until.items() if gr == group and until > now)
        return sorted(names)

    async def heartbeat(self, group: str, replica: str, ttl_s: float) -> None:
        self._alive_until[(group, replica)] = self._clock() + ttl_s

    async def expire(self) -> list[tuple[str, str]]:
        now = self._clock()
        dead = [key for key, until in self._alive_until.items() if until <= now]
        for group, replica in dead:
            del self._alive_until[(group, replica)]
            self.purge_replica_sync(group, replica)
        return dead

    async def size(self, group: str | None = None) -> int:
        groups = self._groups.values() if group is None else [self._groups[group]] if group in self._groups else []
        return sum(len(t) for g in groups for t in g.counts.values())

    def snapshot(self, group: str, replica: str) -> dict[int, int]:
        """A copy of one replica's entries: hash -> packed tier counts (tests, diagnostics)."""
        g = self._groups.get(group)
        return dict(g.counts.get(replica, {})) if g is not None else {}

    def count(self, group: str, replica: str, block_hash: int, tier: Tier = Tier.GPU) -> int:
        """Reference count of one hash on one tier (tests and diagnostics)."""
        g = self._groups.get(group)
        v = g.counts.get(replica, {}).get(block_hash, 0) if g is not None else 0
        return (v >> (_SHIFT * int(tier))) & _FIELD


class _Missing:
    """Bisect key: True once a replica's bit is gone from the running AND."""

    __slots__ = ("bit",)

    def __init__(self, bit: int) -> None:
        self.bit = bit

    def __call__(self, mask: int) -> bool:
        return not mask & self.bit


def _clear(masks: dict[int, int], h: int, bit: int) -> None:
    m = masks.get(h, 0) & ~bit
    if m:
        masks[h] = m
    else:
        masks.pop(h, None)
