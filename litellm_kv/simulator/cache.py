"""A vLLM-like prefix cache for one simulated replica (the model of ``v1/core/block_pool.py``).

What is modelled, because it decides which prompt tokens hit:
* a fixed pool of physical blocks; a cached block keeps its hash until its slot is reused;
* lookups walk the prompt's chained block ids and stop at the first miss, over at most
  ⌊(L−1)/block_size⌋ blocks (the last token is always recomputed);
* a free queue: freed blocks *with* a hash go to the back in the order given (a request's tail
  first, so its head survives longest: LRU per prefix), blocks *without* a hash go to the front
  (reused first); new blocks are taken from the front and evict the hash they held;
* blocks in use (reference count > 0) are never evicted; a hit takes a reference;
* recomputing an already cached block (the last full block of a repeated prompt) caches a
  second copy under the same hash, evicted on its own (vllm-contract.md §9).

Every cache change is reported as vLLM reports it: one ``BlockStored`` per admission for the
newly full blocks, one ``BlockRemoved`` per evicted hash, so the simulator can feed the
project's real event decoder and index.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

_UNIQUE_BASE = 1 << 63


@dataclass(slots=True)
class Allocation:
    """The physical blocks a running request holds, in order."""

    phys: list[int]
    hit_blocks: int
    n_full_prompt: int
    stored: list[int] = field(default_factory=list)  # ids newly cached at admission
    removed: list[int] = field(default_factory=list)  # ids evicted at admission


class BlockCache:
    def __init__(self, capacity_blocks: int, block_size: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity_blocks
        self.block_size = block_size
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(capacity_blocks))
        self._id: list[int | None] = [None] * capacity_blocks
        self._ref = [0] * capacity_blocks
        self._by_id: dict[int, list[int]] = {}  # block id -> physical copies
        self._unique = _UNIQUE_BASE

    @property
    def used_fraction(self) -> float:
        """vLLM's kv_cache_usage_perc: blocks not in the free queue."""
        return 1.0 - len(self._free) / self.capacity

    def cached_blocks(self) -> int:
        return sum(len(v) for v in self._by_id.values())

    def match(self, blocks: list[int], prompt_tokens: int) -> int:
        """Leading blocks of the prompt that would hit now (max-hit rule applied)."""
        limit = min(len(blocks), max(0, (prompt_tokens - 1) // self.block_size))
        by_id = self._by_id
        n = 0
        while n < limit and blocks[n] in by_id:
            n += 1
        return n

    def admit(self, blocks: list[int], prompt_tokens: int, output_tokens: int) -> Allocation | None:
        """Take references on the hit prefix and allocate the rest; ``None`` when the pool
        cannot hold the request now (it waits, like vLLM's waiting queue)."""
        bs = self.block_size
        hit = self.match(blocks, prompt_tokens)
        total = -(-(prompt_tokens + output_tokens - 1) // bs)
        need = total - hit
        hit_phys = [self._by_id[b][0] for b in blocks[:hit]]
        free = self._free
        reclaimable = len(free) - sum(1 for p in hit_phys if p in free)
        if need > reclaimable:
            return None
        ref = self._ref
        for p in hit_phys:
            if ref[p] == 0:
                del free[p]
            ref[p] += 1
        removed: list[int] = []
        new_phys: list[int] = []
        ids = self._id
        by_id = self._by_id
        for _ in range(need):
            p, _none = free.popitem(last=False)
            old = ids[p]
            if old is not None:
                copies = by_id[old]
                copies.remove(p)
                if not copies:
                    del by_id[old]
                removed.append(old)
                ids[p] = None
            ref[p] = 1
            new_phys.append(p)
        n_full = prompt_tokens // bs
        stored = blocks[hit:n_full]
        for b, p in zip(stored, new_phys, strict=False):
            ids[p] = b
            copies_b = by_id.get(b)
            if copies_b is None:
                by_id[b] = [p]
            else:
                copies_b.append(p)
        return Allocation(hit_phys + new_phys, hit, n_full, stored, removed)

    def release(self, alloc: Allocation, prompt_tokens: int, output_tokens: int,
                output_blocks: list[int]) -> list[int]:
        """The request finished: blocks completed by generated tokens become cached (ids from
        ``output_blocks`` or fresh unique ids), then every block is freed, tail first.
        Returns the ids newly cached."""
        bs = self.block_size
        n_full = (prompt_tokens + output_tokens - 1) // bs
        stored: list[int] = []
        ids = self._id
        by_id = self._by_id
        for k in range(alloc.n_full_prompt, min(n_full, len(alloc.phys))):
            j = k - alloc.n_full_prompt
            if j < len(output_blocks):
                b = output_blocks[j]
            else:
                self._unique += 1
                b = self._unique
            p = alloc.phys[k]
            ids[p] = b
            by_id.setdefault(b, []).append(p)
            stored.append(b)
        ref = self._ref
        free = self._free
        front: list[int] = []
        for p in reversed(alloc.phys):
            ref[p] -= 1
            if ref[p] == 0:
                if ids[p] is None:
                    front.append(p)
                else:
                    free[p] = None
        for p in reversed(front):  # unhashed blocks go to the front, in the given order
            free[p] = None
            free.move_to_end(p, last=False)
        return stored
