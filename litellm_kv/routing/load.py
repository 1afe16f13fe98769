"""Router-tracked load per replica: in-flight prefill requests and tokens, decode sequences, recent work.

A request is counted from the routing decision: as one *prefill* request with its uncached prompt
tokens until the first token arrives, then as one *decode* sequence until it ends. Each decision also adds
its prefill tokens to a *recent* sum that decays with a half-life, so the load signal survives
the gaps between turns of paced sessions (when nothing is in flight).

Two implementations of one Protocol: :class:`InMemoryLoadTracker` (one proxy, embedded mode)
and :class:`RedisLoadTracker` (several proxies share the counts). In Redis, each proxy publishes
its own counts (in the background) to its own fields under one hash per model group and renews a
liveness score; a reader adds the other live proxies' fields to its own counts, so the counts of a
proxy that died fade after ``ttl_s`` instead of staying forever.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from litellm_kv.config import doc
from litellm_kv.index.base import ScriptRider
from litellm_kv.index.redis import group_key_prefix
from litellm_kv.redis_client import RedisGuard, guarded
from litellm_kv.tasks import cancel_and_wait


@dataclass(slots=True)
class LoadSettings:
    """Load-tracking options (``model_groups.<g>.kv.load``)."""

    recent_half_life_s: float = doc(
        "Half-life of the 'recent prefill tokens' signal: how long work sent to a replica keeps "
        "counting after it was sent.",
        default=10.0,
    )
    ttl_s: float = doc(
        "Shared mode: a proxy that has not written or renewed for this long is considered dead and "
        "its in-flight counts are ignored and removed.",
        default=30.0,
    )

    def validate(self) -> None:
        if not self.recent_half_life_s > 0:
            raise ValueError("recent_half_life_s must be positive")
        if not self.ttl_s > 0:
            raise ValueError("ttl_s must be positive")


@dataclass(slots=True)
class TrackedLoad:
    prefill_tokens: int = 0
    decode: int = 0
    recent_tokens: float = 0.0
    prefill_requests: int = 0  # requests counted in prefill_tokens (each pays the engine's per-request overhead)


@runtime_checkable
class LoadTracker(Protocol):
    async def begin(self, group: str, replica: str, request_id: str, prefill_tokens: int) -> None:
        """A request was routed to ``replica`` with ``prefill_tokens`` tokens to compute."""
        ...

    async def first_token(self, request_id: str) -> None:
        """Prefill finished: the request now counts as one decode sequence."""
        ...

    async def end(self, request_id: str) -> None:
        """The request finished or failed; unknown ids are ignored (idempotent)."""
        ...

    async def snapshot(self, group: str, replicas: Sequence[str]) -> dict[str, TrackedLoad]:
        ...

    def local_snapshot(self, group: str, replicas: Sequence[str]) -> dict[str, TrackedLoad]:
        """What this process knows without a round trip (its own requests)."""
        ...


@dataclass(slots=True)
class _Flight:
    group: str
    replica: str
    prefill_tokens: int
    decoding: bool = False


class DecayedSum:
    """A sum that decays at ``rate`` (ln 2 / half-life, per second), stored as (value, time of value)."""

    __slots__ = ("t", "v")

    def __init__(self) -> None:
        self.v = 0.0
        self.t = 0.0

    def at(self, now: float, rate: float) -> float:
        return self.v * math.exp(-rate * max(0.0, now - self.t)) if self.v else 0.0

    def add(self, now: float, rate: float, amount: float) -> None:
        self.v = self.at(now, rate) + amount
        self.t = now


class InMemoryLoadTracker:
    """Load of one proxy process. ``clock`` is injectable so a simulator can drive it."""

    def __init__(self, cfg: LoadSettings | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg or LoadSettings()
        self._clock = clock
        self._rate = math.log(2) / max(1e-9, self.cfg.recent_half_life_s)
        self._flights: dict[str, _Flight] = {}
        self._load: dict[tuple[str, str], TrackedLoad] = {}
        self._recent: dict[tuple[str, str], DecayedSum] = {}

    def begin_sync(self, group: str, replica: str, request_id: str, prefill_tokens: int) -> None:
        self.end_sync(request_id)
        self._flights[request_id] = _Flight(group, replica, prefill_tokens)
        key = (group, replica)
        load = self._load.setdefault(key, TrackedLoad())
        load.prefill_tokens += prefill_tokens
        load.prefill_requests += 1
        self._recent.setdefault(key, DecayedSum()).add(self._clock(), self._rate, prefill_tokens)

    def replicas(self, group: str) -> set[str]:
        """Replicas of ``group`` this tracker has ever counted a request on."""
        return {r for g, r in self._load if g == group}

    def where(self, request_id: str) -> tuple[str, str] | None:
        """(group, replica) of a request in flight, or None."""
        f = self._flights.get(request_id)
        return (f.group, f.replica) if f is not None else None

    def first_token_sync(self, request_id: str) -> None:
        f = self._flights.get(request_id)
        if f is None or f.decoding:
            return
        f.decoding = True
        load = self._load[(f.group, f.replica)]
        load.prefill_tokens -= f.prefill_tokens
        load.prefill_requests -= 1
        load.decode += 1

    def end_sync(self, request_id: str) -> None:
        f = self._flights.pop(request_id, None)
        if f is None:
            return
        load = self._load[(f.group, f.replica)]
        if f.decoding:
            load.decode -= 1
        else:
            load.prefill_tokens -= f.prefill_tokens
            load.prefill_requests -= 1

    def snapshot_sync(self, group: str, replicas: Sequence[str]) -> dict[str, TrackedLoad]:
        now = self._clock()
        out: dict[str, TrackedLoad] = {}
        for r in replicas:
            load = self._load.get((group, r))
            decay = self._recent.get((group, r))
            recent = decay.at(now, self._rate) if decay is not None else 0.0
            if load is None:
                out[r] = TrackedLoad(0, 0, recent)
            else:
                out[r] = TrackedLoad(load.prefill_tokens, load.decode, recent, load.prefill_requests)
        return out

    async def begin(self, group: str, replica: str, request_id: str, prefill_tokens: int) -> None:
        self.begin_sync(group, replica, request_id, prefill_tokens)

    async def first_token(self, request_id: str) -> None:
        self.first_token_sync(request_id)

    async def end(self, request_id: str) -> None:
        self.end_sync(request_id)

    async def snapshot(self, group: str, replicas: Sequence[str]) -> dict[str, TrackedLoad]:
        return self.snapshot_sync(group, replicas)

    def local_snapshot(self, group: str, replicas: Sequence[str]) -> dict[str, TrackedLoad]:
        return self.snapshot_sync(group, replicas)


# KEYS[1] load hash, KEYS[2] proxy liveness zset. ARGV: proxy, ttl_s, then per replica: name, prefill tokens,
# decode, recent, prefill requests. This proxy's own fields "<proxy>|<replica>|p|d|r|q|t" are set to its
# absolute values (t: the time of r, in Redis time). Returns 1 when the proxy was alive before this write, 0
# when it was not (first write, or expired: a reader may have deleted its fields), so the caller rewrites all
# of them.
_WRITE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local proxy = ARGV[1]
local deadline = tonumber(redis.call('ZSCORE', KEYS[2], proxy) or '0')
for i = 3, #ARGV, 5 do
  local base = proxy .. '|' .. ARGV[i] .. '|'
  redis.call('HSET', KEYS[1], base .. 'p', ARGV[i + 1], base .. 'd', ARGV[i + 2], base .. 'r', ARGV[i + 3],
             base .. 'q', ARGV[i + 4], base .. 't', tostring(now))
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[2], now + ttl, proxy)
redis.call('PEXPIRE', KEYS[1], math.floor(ttl * 2000))
redis.call('PEXPIRE', KEYS[2], math.floor(ttl * 2000))
if deadline > now then return 1 end
return 0
"""

# rider(keys, args): keys = load hash, liveness zset; args = half_life_s, the reading proxy. Sums the fields
# of the *other* live proxies (the reader adds its own, which it knows exactly and at once) and deletes the
# fields of proxies whose liveness expired. Returns a flat list: "<replica>|<p|d|r|q>", value, ...
_SNAPSHOT_RIDER = """
local function rider(keys, args)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
  local dead = redis.call('ZRANGEBYSCORE', keys[2], '-inf', now)
  local is_dead = {}
  for _, p in ipairs(dead) do is_dead[p] = true end
  if #dead > 0 then redis.call('ZREMRANGEBYSCORE', keys[2], '-inf', now) end
  local rate = math.log(2) / tonumber(args[1])
  local me = args[2]
  local flat = redis.call('HGETALL', keys[1])
  local out, stale, times = {}, {}, {}
  for i = 1, #flat, 2 do
    local f = flat[i]
    local proxy = string.match(f, '^(.-)|')
    if is_dead[proxy] then
      table.insert(stale, f)
    elseif string.sub(f, -2) == '|t' then
      times[string.sub(f, 1, -3)] = tonumber(flat[i + 1])
    end
  end
  for i = 1, #flat, 2 do
    local f = flat[i]
    local proxy, rest = string.match(f, '^(.-)|(.*)$')
    if proxy ~= me and not is_dead[proxy] then
      local replica, kind = string.match(rest, '^(.*)|(%a)$')
      local v = tonumber(flat[i + 1])
      if kind == 'r' then
        local at = times[string.sub(f, 1, -3)] or now
        v = v * math.exp(-rate * math.max(0, now - at))
      end
      if kind ~= 't' then
        local key = replica .. '|' .. kind
        out[key] = (out[key] or 0) + v
      end
    end
  end
  if #stale > 0 then redis.call('HDEL', keys[1], unpack(stale)) end
  local res = {}
  for k, v in pairs(out) do table.insert(res, k); table.insert(res, tostring(v)) end
  return res
end
"""


class RedisLoadTracker:
    """Load shared by all proxies through Redis (``redis.asyncio`` client).

    Each proxy counts its own requests in process (an :class:`InMemoryLoadTracker`) and publishes its
    absolute counts per replica to its own fields in Redis. A snapshot is this proxy's counts, exact and
    current, plus the other live proxies' published counts. So nothing on the request path waits for a
    write: :meth:`begin`, :meth:`first_token` and :meth:`end` change the local counts and mark the replica
    for publishing, and one background writer sends what changed, one write at a time, the latest values
    each time. A write that fails is retried (``retry_s`` later) with the values of that moment, so counts
    recover by themselves after an outage; ``write_errors`` counts the failures and ``on_error`` is called.

    Keys are ``lkv:{<group>}:load`` and ``lkv:{<group>}:proxies``: the index's hash tag, so the snapshot can
    ride along with the index lookup (:meth:`snapshot_rider`; one round trip per decision) and a Redis
    Cluster keeps a group in one slot. ``heartbeat`` must be called more often than ``ttl_s``.

    ``guard`` bounds every call (deadline, circuit breaker): a snapshot read sits on the request path, and
    writes through a sick Redis would only queue behind each other.
    """

    def __init__(self, client: Any, cfg: LoadSettings | None = None, proxy_id: str | None = None, *,
                 on_error: Callable[[BaseException], None] | None = None, retry_s: float = 0.5,
                 guard: RedisGuard | None = None) -> None:
        self.cfg = cfg or LoadSettings()
        self.proxy_id = proxy_id or uuid.uuid4().hex[:12]
        self._client = client
        self._write_script = client.register_script(_WRITE)
        self._snapshot_script = client.register_script(_SNAPSHOT_RIDER + "return rider(KEYS, ARGV)")
        self._own = InMemoryLoadTracker(self.cfg)
        self._dirty: dict[str, set[str]] = {}  # group -> replicas whose counts changed since published
        self._writer: asyncio.Task[None] | None = None
        self._progress = asyncio.Event()  # set when a write attempt ends (for flush)
        self._on_error = on_error
        self._retry_s = retry_s
        self._guard = guard
        self.write_errors = 0

    def _keys(self, group: str) -> tuple[str, str]:
        base = group_key_prefix(group)
        return base + "load", base + "proxies"

    # -- this proxy's requests: local at once, published in the background ---------------------------------
    def _touch(self, group: str, replica: str) -> None:
        self._dirty.setdefault(group, set()).add(replica)
        self._kick()

    def _kick(self) -> None:
        """Start the background writer if changes wait and it is not running."""
        if self._dirty and (self._writer is None or self._writer.done()):
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # no loop (a synchronous caller): published by the next flush or heartbeat
            self._writer = loop.create_task(self._publish())

    async def begin(self, group: str, replica: str, request_id: str, prefill_tokens: int) -> None:
        prev = self._own.where(request_id)
        self._own.begin_sync(group, replica, request_id, prefill_tokens)
        if prev is not None:
            self._touch(*prev)
        self._touch(group, replica)

    async def first_token(self, request_id: str) -> None:
        where = self._own.where(request_id)
        self._own.first_token_sync(request_id)
        if where is not None:
            self._touch(*where)

    async def end(self, request_id: str) -> None:
        where = self._own.where(request_id)
        self._own.end_sync(request_id)
        if where is not None:
            self._touch(*where)

    async def _publish(self) -> None:
        try:
            while self._dirty:
                dirty, self._dirty = self._dirty, {}
                try:
                    for group in list(dirty):
                        await self._write(group, dirty[group])
                        del dirty[group]
                except Exception as exc:  # Redis down or slow: keep the changes, retry with the values of then
                    for group, replicas in dirty.items():
                        self._dirty.setdefault(group, set()).update(replicas)
                    self.write_errors += 1
                    if self._on_error is not None:
                        self._on_error(exc)
                    self._progress.set()
                    await asyncio.sleep(self._retry_s)
        finally:
            self._progress.set()

    async def _write(self, group: str, replicas: set[str]) -> None:
        args: list[Any] = [self.proxy_id, self.cfg.ttl_s]
        for replica, load in self._own.snapshot_sync(group, sorted(replicas)).items():
            args += [replica, load.prefill_tokens, load.decode, repr(load.recent_tokens), load.prefill_requests]
        was_alive = await guarded(self._guard, lambda: self._write_script(keys=list(self._keys(group)), args=args))
        rest = self._own.replicas(group) - replicas  # the other replicas this proxy has fields for
        if not int(was_alive) and rest:
            # Our other fields may have been deleted while we counted as dead: publish them again.
            self._dirty.setdefault(group, set()).update(rest)

    async def flush(self) -> None:
        """Wait until every change made so far is published, or a write failed (it is then retried in the
        background every ``retry_s``)."""
        errors = self.write_errors
        self._kick()
        while self._writer is not None and not self._writer.done() and self.write_errors == errors:
            self._progress.clear()
            await self._progress.wait()

    async def heartbeat(self, groups: Sequence[str]) -> None:
        """Renew this proxy's liveness in each group (call every ttl_s / 3 or so)."""
        for g in groups:
            await self._write(g, set())
        self._kick()

    async def close(self) -> None:
        """Stop the background writer (pending changes are dropped; the fields fade after ``ttl_s``)."""
        await cancel_and_wait(self._writer, Exception)

    # -- reading ---------------------------------------------------------------------------------------------
    def local_snapshot(self, group: str, replicas: Sequence[str]) -> dict[str, TrackedLoad]:
        """This proxy's own counts only (what is known when Redis cannot be read)."""
        return self._own.snapshot_sync(group, replicas)

    def snapshot_rider(self, group: str, replicas: Sequence[str]) -> ScriptRider[Mapping[str, TrackedLoad]]:
        """The snapshot as Lua that rides along with the index lookup (:meth:`RidingLookup.lookup_riding`)."""
        return ScriptRider(_SNAPSHOT_RIDER, self._keys(group), (self.cfg.recent_half_life_s, self.proxy_id),
                           lambda raw: self._merge(group, replicas, raw), lambda: self.local_snapshot(group, replicas))

    async def snapshot(self, group: str, replicas: Sequence[str]) -> dict[str, TrackedLoad]:
        raw = await guarded(self._guard, lambda: self._snapshot_script(keys=list(self._keys(group)),
                                                             args=[self.cfg.recent_half_life_s, self.proxy_id]))
        return self._merge(group, replicas, raw)

    def _merge(self, group: str, replicas: Sequence[str], raw: Sequence[Any]) -> dict[str, TrackedLoad]:
        out = self._own.snapshot_sync(group, replicas)  # fresh objects: summed into in place
        for i in range(0, len(raw), 2):
            key = raw[i].decode() if isinstance(raw[i], bytes) else str(raw[i])
            replica, _, kind = key.rpartition("|")
            load = out.get(replica)
            if load is None:
                continue
            value = float(raw[i + 1])
            if kind == "p":
                load.prefill_tokens = max(0, load.prefill_tokens + int(value))
            elif kind == "d":
                load.decode = max(0, load.decode + int(value))
            elif kind == "r":
                load.recent_tokens += value
            elif kind == "q":
                load.prefill_requests = max(0, load.prefill_requests + int(value))
        return out
