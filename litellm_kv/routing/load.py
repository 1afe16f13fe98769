"""Router-tracked load per replica: in-flight prefill tokens, decode sequences, recent work.

A request is counted from the routing decision: its uncached prompt tokens as *prefill* until
the first token arrives, then as one *decode* sequence until it ends. Each decision also adds
its prefill tokens to a *recent* sum that decays with a half-life, so the load signal survives
the gaps between turns of paced sessions (when nothing is in flight).

Two implementations of one Protocol: :class:`InMemoryLoadTracker` (one proxy, embedded mode)
and :class:`RedisLoadTracker` (several proxies share the counts). In Redis, each proxy writes
its own fields under one hash per model group and renews a liveness score; a reader sums the
fields of live proxies only, so the counts of a proxy that died fade after ``ttl_s`` instead of
staying forever.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from litellm_kv.config import doc


@dataclass(slots=True)
class LoadConfig:
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


@dataclass(slots=True)
class TrackedLoad:
    prefill_tokens: int = 0
    decode: int = 0
    recent_tokens: float = 0.0


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


@dataclass(slots=True)
class _Flight:
    group: str
    replica: str
    prefill_tokens: int
    decoding: bool = False


class _Decay:
    """A sum that halves every ``half_life`` seconds, stored as (value, time of value)."""

    __slots__ = ("rate", "t", "v")

    def __init__(self) -> None:
        self.v = 0.0
        self.t = 0.0
        self.rate = 0.0

    def at(self, now: float, rate: float) -> float:
        return self.v * math.exp(-rate * max(0.0, now - self.t)) if self.v else 0.0

    def add(self, now: float, rate: float, amount: float) -> None:
        self.v = self.at(now, rate) + amount
        self.t = now


class InMemoryLoadTracker:
    """Load of one proxy process. ``clock`` is injectable so a simulator can drive it."""

    def __init__(self, cfg: LoadConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg or LoadConfig()
        self._clock = clock
        self._rate = math.log(2) / max(1e-9, self.cfg.recent_half_life_s)
        self._flights: dict[str, _Flight] = {}
        self._load: dict[tuple[str, str], TrackedLoad] = {}
        self._recent: dict[tuple[str, str], _Decay] = {}

    def begin_sync(self, group: str, replica: str, request_id: str, prefill_tokens: int) -> None:
        self.end_sync(request_id)
        self._flights[request_id] = _Flight(group, replica, prefill_tokens)
        key = (group, replica)
        load = self._load.setdefault(key, TrackedLoad())
        load.prefill_tokens += prefill_tokens
        self._recent.setdefault(key, _Decay()).add(self._clock(), self._rate, prefill_tokens)

    def first_token_sync(self, request_id: str) -> None:
        f = self._flights.get(request_id)
        if f is None or f.decoding:
            return
        f.decoding = True
        load = self._load[(f.group, f.replica)]
        load.prefill_tokens -= f.prefill_tokens
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
                out[r] = TrackedLoad(load.prefill_tokens, load.decode, recent)
        return out

    async def begin(self, group: str, replica: str, request_id: str, prefill_tokens: int) -> None:
        self.begin_sync(group, replica, request_id, prefill_tokens)

    async def first_token(self, request_id: str) -> None:
        self.first_token_sync(request_id)

    async def end(self, request_id: str) -> None:
        self.end_sync(request_id)

    async def snapshot(self, group: str, replicas: Sequence[str]) -> dict[str, TrackedLoad]:
        return self.snapshot_sync(group, replicas)


# KEYS[1] load hash, KEYS[2] proxy liveness zset. ARGV: proxy, replica, d_prefill, d_decode,
# d_recent, half_life_s, ttl_s. Fields: "<proxy>|<replica>|p|d|r|t" (recent value and its time).
_UPDATE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local base = ARGV[1] .. '|' .. ARGV[2] .. '|'
if tonumber(ARGV[3]) ~= 0 then redis.call('HINCRBY', KEYS[1], base .. 'p', ARGV[3]) end
if tonumber(ARGV[4]) ~= 0 then redis.call('HINCRBY', KEYS[1], base .. 'd', ARGV[4]) end
local add = tonumber(ARGV[5])
if add ~= 0 then
  local v = tonumber(redis.call('HGET', KEYS[1], base .. 'r') or '0')
  local at = tonumber(redis.call('HGET', KEYS[1], base .. 't') or tostring(now))
  local rate = math.log(2) / tonumber(ARGV[6])
  v = v * math.exp(-rate * math.max(0, now - at)) + add
  redis.call('HSET', KEYS[1], base .. 'r', tostring(v), base .. 't', tostring(now))
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[7]), ARGV[1])
redis.call('PEXPIRE', KEYS[1], math.floor(tonumber(ARGV[7]) * 2000))
redis.call('PEXPIRE', KEYS[2], math.floor(tonumber(ARGV[7]) * 2000))
return 1
"""

# Sums live proxies' fields; removes the fields of proxies whose liveness expired.
_SNAPSHOT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1e6
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
local is_dead = {}
for _, p in ipairs(dead) do is_dead[p] = true end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now) end
local rate = math.log(2) / tonumber(ARGV[1])
local flat = redis.call('HGETALL', KEYS[1])
local out = {}
local stale = {}
local times = {}
for i = 1, #flat, 2 do
  local f = flat[i]
  local proxy, rest = string.match(f, '^(.-)|(.*)$')
  if is_dead[proxy] then
    table.insert(stale, f)
  elseif string.sub(f, -2) == '|t' then
    times[string.sub(f, 1, -3)] = tonumber(flat[i + 1])
  end
end
for i = 1, #flat, 2 do
  local f = flat[i]
  local proxy, rest = string.match(f, '^(.-)|(.*)$')
  if not is_dead[proxy] then
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
if #stale > 0 then redis.call('HDEL', KEYS[1], unpack(stale)) end
local res = {}
for k, v in pairs(out) do table.insert(res, k); table.insert(res, tostring(v)) end
return res
"""


class RedisLoadTracker:
    """Load shared by all proxies through Redis (``redis.asyncio`` client).

    Keys carry the hash tag ``{lkv:<group>}`` so a Redis Cluster keeps one group's keys in one
    slot and both scripts stay single-slot. Each proxy remembers its own in-flight requests
    locally (what to decrement) and writes deltas; ``heartbeat`` must be called more often than
    ``ttl_s`` (any write also renews).
    """

    def __init__(self, client: Any, cfg: LoadConfig | None = None, proxy_id: str | None = None,
                 prefix: str = "lkv") -> None:
        self.cfg = cfg or LoadConfig()
        self.proxy_id = proxy_id or uuid.uuid4().hex[:12]
        self._client = client
        self._prefix = prefix
        self._update = client.register_script(_UPDATE)
        self._snapshot = client.register_script(_SNAPSHOT)
        self._flights: dict[str, _Flight] = {}

    def _keys(self, group: str) -> list[str]:
        tag = f"{{{self._prefix}:{group}}}"
        return [f"{tag}:load", f"{tag}:proxies"]

    async def _write(self, group: str, replica: str, dp: int, dd: int, recent: int) -> None:
        await self._update(
            keys=self._keys(group),
            args=[self.proxy_id, replica, dp, dd, recent, self.cfg.recent_half_life_s, self.cfg.ttl_s],
        )

    async def begin(self, group: str, replica: str, request_id: str, prefill_tokens: int) -> None:
        await self.end(request_id)
        self._flights[request_id] = _Flight(group, replica, prefill_tokens)
        await self._write(group, replica, prefill_tokens, 0, prefill_tokens)

    async def first_token(self, request_id: str) -> None:
        f = self._flights.get(request_id)
        if f is None or f.decoding:
            return
        f.decoding = True
        await self._write(f.group, f.replica, -f.prefill_tokens, 1, 0)

    async def end(self, request_id: str) -> None:
        f = self._flights.pop(request_id, None)
        if f is None:
            return
        if f.decoding:
            await self._write(f.group, f.replica, 0, -1, 0)
        else:
            await self._write(f.group, f.replica, -f.prefill_tokens, 0, 0)

    async def heartbeat(self, groups: Sequence[str]) -> None:
        """Renew this proxy's liveness in each group (call every ttl_s / 3 or so)."""
        for g in groups:
            await self._write(g, "", 0, 0, 0)  # zero deltas: only the liveness score moves

    async def snapshot(self, group: str, replicas: Sequence[str]) -> dict[str, TrackedLoad]:
        raw = await self._snapshot(keys=self._keys(group), args=[self.cfg.recent_half_life_s])
        out = {r: TrackedLoad() for r in replicas}
        for i in range(0, len(raw), 2):
            key = raw[i].decode() if isinstance(raw[i], bytes) else str(raw[i])
            replica, _, kind = key.rpartition("|")
            load = out.get(replica)
            if load is None:
                continue
            value = float(raw[i + 1])
            if kind == "p":
                load.prefill_tokens = max(0, int(value))
            elif kind == "d":
                load.decode = max(0, int(value))
            elif kind == "r":
                load.recent_tokens = value
        return out
