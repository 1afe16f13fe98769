"""Leases in Redis: which live indexer follows which replica (``assignment: lease``).

Every indexer of a group runs a *round* every ``lease_renew_interval_s``: one script (``lua/lease.lua``)
that, atomically and on Redis's clock,

* marks the indexer live for ``lease_ttl_s`` (``lkv:{G}:indexers``, a sorted set of deadlines) and drops
  indexers whose deadline passed;
* computes the share: ``ceil(replicas / live indexers)``;
* claims replicas nobody holds (never held, released, or whose lease expired: a dead indexer's) up to the
  share, and any that stayed unclaimed for ``grace`` whatever the share, so no replica is left unfollowed
  because the live count is stale;
* claims leases other indexers *offer* (they hold more than their share) while below the share;
* renews the indexer's own leases (``lkv:{G}:leases``, replica -> ``owner|deadline|offered``), offering
  those past its share. An offered lease stays its owner's until another indexer takes it: the owner keeps
  following the replica, so a hand-over never leaves it unfollowed. It stops only when two of its rounds in a
  row find another holder: two indexers' rounds may answer in either order, so the first may reach the giver
  before the taker has heard of its own claim. Both follow the replica for one to two rounds, which the apply
  script's ``(stream, seq)`` dedupe makes harmless;
* gives up the replicas the indexer names as ones it cannot follow (the service decides: it has failed to
  reach the engine for ``lease_unreachable_handoff_s``). Such a lease is taken by the next round of any live
  indexer that has not given that replica up itself, whatever its share; the giver keeps it (and keeps trying)
  until then, and for ``cooldown`` after it last gave the replica up it claims it neither free nor offered
  while another live indexer has not given it up (``lkv:{G}:unreachable``, replica -> ``indexer|until…``).
  When every live indexer has given a replica up, its holder keeps it: the lease moves again only when a
  cooldown runs out, so an engine nobody reaches changes hands at most once per live indexer and cooldown.

A dead indexer's leases expire ``lease_ttl_s`` after its last round; the next round of a live one (within
``lease_renew_interval_s``) claims them and the indexer replays each engine's buffered batches from the
stream position in Redis (:mod:`litellm_kv.services.indexer.stream`), so the index converges to the
engine's contents. An indexer that stops cleanly releases its leases at once.

All three keys carry the group's hash tag, like the index's keys: on a Redis Cluster a round is served by the
node of the group's slot.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from litellm_kv.index.redis import group_key_prefix
from litellm_kv.redis_client import RedisClient

_LUA = resources.files(__package__).joinpath("lua")
_ROUND = _LUA.joinpath("lease.lua").read_text(encoding="utf-8")
_RELEASE = _LUA.joinpath("lease_release.lua").read_text(encoding="utf-8")


def default_indexer_id() -> str:
    """``<host>-<pid>-<random>``: unique per process, so a restarted indexer never inherits leases it cannot
    know it holds (they expire, or the dead process released them)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(slots=True, frozen=True)
class LeaseRound:
    """What one round left in Redis for a group."""

    live: int  # indexers of the group whose last round is younger than the lease TTL (this one included)
    owners: dict[str, str]  # replica -> the indexer holding its lease ('' : nobody yet)
    claimed: dict[str, str]  # replica -> how this round claimed it: new, takeover, handoff, unreachable
    # replica given up -> offered (a live indexer that has not given it up may take it) or kept (none is left)
    gave_up: dict[str, str] = field(default_factory=dict)

    def owned_by(self, indexer: str) -> set[str]:
        return {r for r, owner in self.owners.items() if owner == indexer}

    @property
    def uncovered(self) -> list[str]:
        """Replicas no live indexer holds after the round (claimed by the next round below its share)."""
        return sorted(r for r, owner in self.owners.items() if not owner)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Leases:
    """One indexer's side of the lease table, over the index's Redis client."""

    def __init__(self, client: RedisClient, indexer: str, *, ttl_s: float, grace_s: float,
                 cooldown_s: float = 60.0) -> None:
        if not indexer or "|" in indexer:
            raise ValueError("an indexer id is a non-empty string without '|'")
        self.indexer = indexer
        self.ttl_ms = max(1, int(ttl_s * 1000))
        self.grace_ms = max(0, int(grace_s * 1000))
        self.cooldown_ms = max(1, int(cooldown_s * 1000))
        self._round = client.register_script(_ROUND)
        self._release = client.register_script(_RELEASE)

    @staticmethod
    def keys(group: str) -> list[str]:
        base = group_key_prefix(group)
        return [base + "leases", base + "indexers", base + "unreachable"]

    async def renew(self, group: str, replicas: Sequence[str], give_up: Collection[str] = ()) -> LeaseRound:
        """One round over ``replicas`` (the replicas of ``group`` this indexer's config lists), giving up those
        of ``give_up`` whose lease it holds (replicas it cannot follow)."""
        args: list[str | int] = [self.indexer, self.ttl_ms, self.grace_ms, self.cooldown_ms, len(replicas), *replicas,
                *(r for r in replicas if r in give_up)]
        res = await self._round(keys=self.keys(group), args=args)
        owners = [_text(o) for o in res[1]]
        kinds = [_text(k) for k in res[2]]
        outs = [_text(o) for o in res[3]]
        return LeaseRound(
            live=int(res[0]),
            owners=dict(zip(replicas, owners, strict=True)),
            claimed={r: k for r, k in zip(replicas, kinds, strict=True) if k},
            gave_up={r: o for r, o in zip(replicas, outs, strict=True) if o},
        )

    async def release(self, group: str, replicas: Sequence[str]) -> int:
        """Free this indexer's leases of ``group`` and leave its live set; returns the leases freed. Its records of
        replicas it gave up stay until their cooldown ends (an indexer restarted under the same id keeps them)."""
        return int(await self._release(keys=self.keys(group)[:2], args=[self.indexer, *replicas]))
