"""The index Protocol every backend implements.

Data model: per model group, for each replica, a reference count per (block hash, tier).
Hashes are the 64-bit *wire* form vLLM publishes in KV events by default
(:meth:`litellm_kv.vllm.hashing.BlockHasher.to_wire`); events that carry raw digests are converted
to that form before they reach an index. A block is present on a replica while its count
on some tier is > 0: the engine can hold several physical copies of one hash, each announced
by its own ``BlockStored`` and evicted by its own ``BlockRemoved`` (vllm-contract.md §9), so a
set would under-predict.

A backend may also implement :class:`RidingLookup` (the Redis index does): a lookup that carries other
read-only work in its own round trip. Callers check for it once, with ``isinstance``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import msgspec

T = TypeVar("T")


class Tier(enum.IntEnum):
    """Where a cached block lives; lower is faster. Matches vLLM's ``medium`` strings."""

    GPU = 0
    CPU = 1
    STORAGE = 2


def tier_of_medium(medium: str | None) -> Tier:
    """Map a KV event's ``medium`` to a tier; ``None`` (older engines) means GPU."""
    tier = _TIER_OF.get(medium)
    if tier is not None:
        return tier
    if medium is None:
        return Tier.GPU
    try:
        return Tier[medium.upper()]
    except KeyError:
        return Tier.STORAGE


_TIER_OF: dict[str | None, Tier] = {None: Tier.GPU, "GPU": Tier.GPU, "CPU": Tier.CPU, "STORAGE": Tier.STORAGE}


@dataclass(slots=True, frozen=True)
class ReplicaMatch:
    """Leading blocks of a prompt one replica holds, split by the fastest tier holding each."""

    gpu: int = 0
    cpu: int = 0
    storage: int = 0

    @property
    def blocks(self) -> int:
        return self.gpu + self.cpu + self.storage


class BlockOp(msgspec.Struct, frozen=True, gc=False):
    """One index mutation, derived from a KV event: +1/-1 reference of ``hashes`` on ``tier``.

    A frozen ``msgspec`` struct rather than a frozen dataclass: one is made per event, and a frozen
    dataclass's constructor costs several times more (benchmarks/bench_ingest.py)."""

    hashes: tuple[int, ...]
    tier: Tier
    delta: int  # +1 for BlockStored, -1 for BlockRemoved


@runtime_checkable
class KVIndex(Protocol):
    """Which replica of a model group holds which block on which tier."""

    async def apply(self, group: str, replica: str, ops: Iterable[BlockOp]) -> int:
        """Apply stored/removed operations for one replica; returns the number of hashes touched.

        Removing a hash whose count is already 0 is a no-op (events can be replayed twice).
        """
        ...

    async def purge_replica(self, group: str, replica: str) -> int:
        """Drop every entry of one replica in one step (engine restart, AllBlocksCleared,
        replica removed). Returns the number of entries dropped."""
        ...

    async def lookup(
        self, group: str, block_hashes: Sequence[int], replicas: Sequence[str] | None = None
    ) -> dict[str, ReplicaMatch]:
        """Leading matched blocks of the chain ``block_hashes`` for each replica (all known
        replicas of the group when ``replicas`` is None). Chained hashes: the walk stops at a
        replica's first missing block. Replicas with no match may be omitted."""
        ...

    async def replicas(self, group: str) -> list[str]:
        """Replicas of a group that have entries or a live heartbeat."""
        ...

    async def heartbeat(self, group: str, replica: str, ttl_s: float) -> None:
        """Mark a replica alive for ``ttl_s`` seconds; entries of replicas whose heartbeat
        expired are dropped by :meth:`expire`."""
        ...

    async def expire(self) -> list[tuple[str, str]]:
        """Purge replicas whose heartbeat expired; returns the (group, replica) pairs purged."""
        ...

    async def size(self, group: str | None = None) -> int:
        """Number of (replica, hash) entries held."""
        ...


@dataclass(slots=True, frozen=True)
class ScriptRider(Generic[T]):
    """Read-only Lua work that rides along in another script's round trip (:meth:`RidingLookup.lookup_riding`).

    ``lua`` defines ``local function rider(keys, args)`` and returns a Redis reply; ``keys`` must be in the
    carrying script's cluster slot (start them with :func:`litellm_kv.index.redis.group_key_prefix`);
    ``decode`` turns the reply into the rider's value, and ``fallback`` gives the value to use when the round
    trip failed. The same work alone is ``lua + "return rider(KEYS, ARGV)"``.
    """

    lua: str
    keys: tuple[str, ...]
    args: tuple[bytes | str | int | float, ...]
    decode: Callable[[Any], T]
    fallback: Callable[[], T]


@runtime_checkable
class RidingLookup(Protocol):
    """Optional capability of an index: :meth:`KVIndex.lookup` with a :class:`ScriptRider` in the same round
    trip (the router reads the shared load so: one round trip per decision)."""

    async def lookup_riding(
        self, group: str, block_hashes: Sequence[int], replicas: Sequence[str] | None, rider: ScriptRider[T]
    ) -> tuple[dict[str, ReplicaMatch], T]:
        """What :meth:`KVIndex.lookup` answers, and the rider's decoded reply. Without hashes only the rider
        runs (the matches are then empty). Raises when the round trip fails (the caller then uses
        ``rider.fallback()``)."""
        ...
