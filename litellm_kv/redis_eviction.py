"""Whether a Redis deletes litellm-kv's keys on its own: its ``maxmemory-policy`` once ``maxmemory`` is reached.

A Redis with ``maxmemory`` set and any policy but ``noeviction`` makes room, when full, by deleting keys:

* ``volatile-*`` policies delete keys that carry a TTL. litellm-kv's period budgets (counters and holds), the
  shared load and the affinity pins all carry one. In a Redis that also holds the KV index (whose entries do
  not), the budgets are what a full Redis deletes first: a deleted counter is a budget reset, and the key
  spends it again. Managed services (ElastiCache, Memorystore, Azure Cache) start with ``volatile-lru``.
* ``allkeys-*`` policies delete any key, the index's entries too: the index then misses blocks the engines
  hold, and its predictions are short of what the engines report.

With ``noeviction`` (Redis's own default) a full Redis refuses writes instead, which the stores see as errors and
handle as such. Each store's Redis is read with ``INFO`` (``maxmemory``, ``maxmemory_policy``, and the
``evicted_keys`` Redis counts since it started), which managed services allow where ``CONFIG`` is renamed.

:class:`EvictionWatch` reads one Redis at start-up and then every ``interval_s``. The proxy keeps one per Redis
it uses (:func:`watch`), reports them on ``/litellm-kv/health`` (``redis_eviction``), in the log and in the
metrics ``litellm_kv_redis_may_evict`` and ``litellm_kv_redis_evicted_keys``, and the period-budget store asks
:func:`problem` before every reservation: once a Redis that may delete budget counters has deleted keys, the
budgets it keeps can no longer be trusted, and requests that need one are refused until its policy is
``noeviction`` (or its ``maxmemory`` unset).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio.cluster import RedisCluster

from litellm_kv.observability import gauge
from litellm_kv.redis_client import RedisClient, RedisTarget, RedisUse, connect, describe

log = logging.getLogger("litellm_kv")

#: How often a watched Redis is read again.
INTERVAL_S = 60.0
#: The longest one reading may take (connection included); a Redis that does not answer is left as last read.
READ_TIMEOUT_S = 2.0

MAY_EVICT = gauge(
    "redis_may_evict",
    "1 when the Redis a store uses may delete that store's keys once full (maxmemory set and maxmemory-policy "
    "not noeviction: volatile-* deletes keys with a TTL, which budgets, load and pins have; allkeys-* any key, "
    "the index's too), by use.",
    ["use"],
)
EVICTED_KEYS = gauge(
    "redis_evicted_keys",
    "Keys the Redis a store uses has evicted since it started (INFO evicted_keys, summed over a cluster's "
    "masters), by use.",
    ["use"],
)

#: Uses whose keys carry a TTL (deleted under volatile-* and allkeys-*); the index's keys carry none.
TTL_USES = frozenset({RedisUse.BUDGETS.value, RedisUse.LOAD.value, RedisUse.PINS.value})

#: What each use loses when Redis deletes its keys.
LOSS = {
    RedisUse.BUDGETS.value: "a deleted budget counter resets that budget, and the key spends it again",
    RedisUse.LOAD.value: "the shared load counts are lost until each proxy writes them again",
    RedisUse.PINS.value: "deleted pins send conversations to other deployments",
    RedisUse.INDEX.value: "deleted index entries leave predictions short of what the engines hold",
}


#: What to do about a Redis that may delete litellm-kv's keys.
FIX = ("Set its maxmemory-policy to noeviction (or unset maxmemory), or give period budgets a Redis of their own "
       "that does (litellm_kv.budgets.redis)")


@dataclass(frozen=True, slots=True)
class Eviction:
    """What ``INFO`` says of a Redis's eviction (for a cluster: its masters', the worst policy kept)."""

    maxmemory: int
    policy: str
    evicted_keys: int

    def may_evict(self, use: str) -> bool:
        """Whether, once full, this Redis deletes keys of ``use``."""
        if self.maxmemory <= 0 or self.policy == "noeviction":
            return False
        return use in TTL_USES or self.policy.startswith("allkeys")


def _worst(nodes: Iterable[tuple[dict[str, Any], dict[str, Any]]]) -> Eviction:
    """One :class:`Eviction` of a cluster's masters: an evicting node's policy over a non-evicting one's."""
    found: list[Eviction] = []
    for memory, stats in nodes:
        found.append(Eviction(int(memory.get("maxmemory") or 0), str(memory.get("maxmemory_policy") or "noeviction"),
                              int(stats.get("evicted_keys") or 0)))
    if not found:
        return Eviction(0, "noeviction", 0)
    evicting = [e for e in found if e.maxmemory > 0 and e.policy != "noeviction"]
    pick = max(evicting, key=lambda e: e.policy.startswith("allkeys")) if evicting else found[0]
    return Eviction(pick.maxmemory, pick.policy, sum(e.evicted_keys for e in found))


async def read_eviction(client: RedisClient) -> Eviction:
    """The eviction settings and count of the Redis behind ``client`` (one server, a Sentinel master, a cluster)."""
    if isinstance(client, RedisCluster):
        memory = await client.info("memory", target_nodes=RedisCluster.PRIMARIES)
        stats = await client.info("stats", target_nodes=RedisCluster.PRIMARIES)
        if "maxmemory_policy" in memory:  # one master answers its own dict; several answer {node: dict}
            return _worst([(memory, stats)])
        return _worst((memory[node], stats.get(node) or {}) for node in memory)
    return _worst([(await client.info("memory"), await client.info("stats"))])


@dataclass(slots=True)
class EvictionWatch:
    """One Redis and the stores that use it (``uses``), as last read."""

    target: str | RedisTarget
    uses: set[str] = field(default_factory=set)
    last: Eviction | None = None
    error: str = ""
    read_at: float = 0.0
    _reported: tuple[str, tuple[str, ...], bool] | None = None

    @property
    def where(self) -> str:
        return describe(self.target)

    async def refresh(self) -> Eviction | None:
        """Read the Redis now (bounded by :data:`READ_TIMEOUT_S`); the last reading stays when it does not answer."""
        client = connect(self.target, RedisUse.INDEX, timeout_s=READ_TIMEOUT_S)
        try:
            self.last = await asyncio.wait_for(read_eviction(client), READ_TIMEOUT_S)
            self.error = ""
        except Exception as exc:  # unreachable, INFO refused: said on /health, the stores handle their own errors
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.read_at = time.time()
            try:
                await client.aclose()
            except Exception:
                log.debug("litellm-kv: closing the eviction check's connection failed", exc_info=True)
        self._report()
        return self.last

    def _report(self) -> None:
        e = self.last
        if e is None:
            return
        for use in self.uses:
            MAY_EVICT.labels(use).set(1 if e.may_evict(use) else 0)
            EVICTED_KEYS.labels(use).set(e.evicted_keys)
        at_risk = tuple(sorted(u for u in self.uses if e.may_evict(u)))
        evicted = e.evicted_keys > 0
        state = (e.policy, at_risk, evicted)
        if not at_risk or state == self._reported:
            return  # said once per policy and per first eviction, not at every reading of a growing count
        self._reported = state
        log.log(logging.ERROR if evicted else logging.WARNING,
                "litellm-kv: Redis %s has maxmemory-policy %s with maxmemory %d bytes (%d keys evicted so far): "
                "once full it deletes keys of %s: %s. %s (docs/operations.md, \"A Redis that evicts keys\").",
                self.where, e.policy, e.maxmemory, e.evicted_keys, ", ".join(at_risk),
                "; ".join(LOSS[u] for u in at_risk), FIX)

    def problem(self, use: str) -> str:
        """Why the keys of ``use`` in this Redis cannot be trusted (it may delete them and has deleted keys), or
        ``""``."""
        e = self.last
        if e is None or not e.may_evict(use) or e.evicted_keys <= 0:
            return ""
        # No count in the text: it would change at every reading, and every change is logged by those who show it.
        return (f"the Redis at {self.where} deletes keys when full (maxmemory-policy {e.policy}) and has evicted "
                f"keys (evicted_keys on /litellm-kv/health): {LOSS[use]}. {FIX}")

    def status(self) -> dict[str, Any]:
        e = self.last
        return {
            "redis": self.where, "uses": sorted(self.uses),
            "maxmemory": e.maxmemory if e else None, "policy": e.policy if e else None,
            "evicted_keys": e.evicted_keys if e else None,
            "may_evict": sorted(u for u in self.uses if e and e.may_evict(u)),
            "problems": {u: p for u in sorted(self.uses) if (p := self.problem(u))},
            "error": self.error or None, "read_at": self.read_at or None,
        }


_WATCHES: dict[str, EvictionWatch] = {}


def watch(target: str | RedisTarget, use: str) -> EvictionWatch:
    """The process's watch of ``target`` (one per Redis, whatever the stores that use it), now also for ``use``."""
    key = describe(target)
    w = _WATCHES.get(key)
    if w is None:
        w = _WATCHES[key] = EvictionWatch(target)
    w.uses.add(use)
    return w


def problem(target: str | RedisTarget | None, use: str) -> str:
    """Why the keys of ``use`` in ``target`` cannot be trusted (see :meth:`EvictionWatch.problem`), or ``""``
    (also when nothing watches it)."""
    if target is None:
        return ""
    w = _WATCHES.get(describe(target))
    return w.problem(use) if w is not None else ""


def status() -> list[dict[str, Any]]:
    """Every watched Redis of this process (``redis_eviction`` on ``/litellm-kv/health``)."""
    return [w.status() for _, w in sorted(_WATCHES.items())]


async def refresh_all() -> None:
    """Read every watched Redis once (concurrently, each bounded)."""
    await asyncio.gather(*(w.refresh() for w in list(_WATCHES.values())))


async def keep_watching(interval_s: float = INTERVAL_S) -> None:
    """Read every watched Redis now and then every ``interval_s`` (a task the proxy starts once)."""
    while True:
        try:
            await refresh_all()
        except Exception:  # a reading never stops the watch
            log.exception("litellm-kv: reading the Redis eviction settings failed")
        await asyncio.sleep(interval_s)
