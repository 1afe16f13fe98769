"""The sibling index: predictions from the router's own decisions, expiring by themselves."""

from __future__ import annotations

import gc

from litellm_kv.retire import free_some
from litellm_kv.routing.siblings import SiblingIndex


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_lookup_counts_leading_blocks_and_expires() -> None:
    clock = Clock()
    s = SiblingIndex(ttl_s=5.0, clock=clock)
    s.record("a", [1, 2, 3, 4])
    s.record("b", [1, 2])
    assert s.lookup([1, 2, 3, 9]) == {"a": 3, "b": 2}
    assert s.lookup([7, 1, 2]) == {}
    clock.t += 4.0
    s.record("b", [1, 2, 3])  # rotates: the first records move to the previous generation
    assert s.lookup([1, 2, 3]) == {"a": 3, "b": 3}
    clock.t += 2.0  # a's records are now past their ttl
    assert s.lookup([1, 2, 3]) == {"b": 3}
    clock.t += 6.0
    assert s.lookup([1, 2, 3]) == {}


def test_a_purged_replica_loses_its_predictions_until_routed_to_again() -> None:
    clock = Clock()
    s = SiblingIndex(ttl_s=5.0, clock=clock)
    s.record("a", [1, 2, 3])
    s.record("b", [1, 2])
    clock.t += 1.0
    s.forget("a")  # its cache was cleared: the blocks routed there are gone
    assert s.lookup([1, 2, 3]) == {"b": 2}
    clock.t += 1.0
    s.record("a", [1, 2])  # routed there again after the purge
    assert s.lookup([1, 2, 3]) == {"a": 2, "b": 2}
    clock.t += 4.5  # b's records expire; a's new ones still hold
    assert s.lookup([1, 2, 3]) == {"a": 2}


def test_dropped_generation_is_freed_a_slice_per_record() -> None:
    """A generation dropped by rotation is not freed in one go (6 ms at 100K blocks, inside a
    decision) but a slice per record, at least as fast as blocks are recorded."""
    clock = Clock()
    s = SiblingIndex(ttl_s=5.0, max_entries=2 * 1000, clock=clock)  # rotation every 1000 blocks
    peak = 0
    for i in range(100):
        s.record("a", range(i * 50, i * 50 + 50))
        retired = sum(len(g) for g in s._retiring)
        peak = max(peak, retired)
        assert len(s._retiring) <= 1
        assert len(s) <= 2 * 1000
    assert 0 < peak <= 1000  # a whole generation went to the retiring list, then drained
    for i in range(100, 120):
        s.record("a", range(i * 50, i * 50 + 50))
    assert s._retiring == [] or sum(len(g) for g in s._retiring) < peak


def test_free_some_respects_its_budget() -> None:
    gens = [{i: i for i in range(10)}, {i: i for i in range(5)}]
    free_some(gens, 7)
    assert [len(g) for g in gens] == [8]  # the newest (last) one went first, then 2 of the next
    free_some(gens, 100)
    assert gens == []


def test_record_allocates_nothing_per_block() -> None:
    """A generation keeps one dict per replica of block hash -> expiry: recording a long prompt's blocks
    allocates no object per block. (A dict per block did: ~236 bytes an entry, and each one counted toward
    the collector's generation-0 threshold, so an 8K-token decision set off a collection every few calls.)"""
    s = SiblingIndex(ttl_s=5.0, clock=Clock())
    s.record("a", range(-10, 0))
    s.record("b", range(-10, 0))
    gc.collect()
    gc.disable()
    try:
        before = gc.get_count()[0]
        for i in range(20):
            s.record("ab"[i % 2], range(1000 * i, 1000 * i + 512))
        allocated = gc.get_count()[0] - before
    finally:
        gc.enable()
    assert allocated <= 2 * 20  # a temporary or two per record, none per block
    assert len(s) == 20 + 20 * 512  # (block, replica) entries
    assert s.lookup(list(range(1000, 1512))) == {"b": 512}
