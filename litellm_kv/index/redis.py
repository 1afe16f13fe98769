"""Shared KV index in Redis: every proxy process reads it, indexer processes write it.

Layout (one model group ``G``; every key carries the hash tag ``{G}``, so Redis Cluster keeps a
group in one slot and shards by group; scripts only touch keys of one group):

==========================  =====================================================================
``lkv:{G}:blocks``           hash: 8-byte big-endian block hash -> entries ``;<code>:<count>...``
                             where ``code = replica_id * 4 + tier``; one field per block, shared
                             by all replicas holding it (the refcount per (replica, hash, tier))
``lkv:{G}:rev:<id>``         set: block hashes replica ``id`` holds on any tier (what a purge strips)
``lkv:{G}:ids`` / ``names``  hash: replica name <-> small integer id (ids are never reused)
``lkv:{G}:retired``          set: ids of purged replicas whose entries are still being swept
``lkv:{G}:hb``               sorted set: replica -> heartbeat deadline (Redis server time, ms)
``lkv:{G}:streams``          hash: event stream -> ``<last applied seq>|<its ts>`` (HA dedupe)
``lkv:groups``               set of group names (untagged; read by :meth:`expire` and ``size``)
==========================  =====================================================================

Round trips: :meth:`lookup` is **one** ``EVALSHA`` for a whole prompt: the script walks the chain
in chunks of 64 fields and stops when every replica has missed (hashes are chained, so nothing
after a replica's first miss can hit); :meth:`lookup_riding` carries other read-only work of the same
group in that script (the proxy's load snapshot, :class:`ScriptRider`), so a routing decision is one
round trip in all. :meth:`apply_batch` is one ``EVALSHA`` per event batch.
``redis-py`` re-sends the script source once after a server restart (``NOSCRIPT``).

Purges (engine restart, ``AllBlocksCleared``, heartbeat expiry, replica removed) are O(1): the
replica's id is *retired* (unmapped from its name, so lookups ignore its entries at once and its
next write gets a fresh id) and queued; the entries are then stripped from ``blocks`` by a sweep
script, :data:`SWEEP_STEP` entries per call, in a background task of the purging process (any
process finishes a queue left behind). Stripping all at once blocked Redis ~11 µs per entry.

High availability: two indexers may feed the same replicas. Refcounts make a plain double apply
wrong (+2 for one stored block), so batches go through :meth:`apply_batch`, which applies a batch
only if its ``seq`` is the next one of its stream (``last + 1``) and otherwise reports a duplicate
(another indexer was faster) or a gap (replay from ``last + 1``). A batch whose ``seq`` is not
above the last one but whose timestamp is newer starts a new engine lifetime (vLLM restarts its
``seq`` at 0 and sends no ``AllBlocksCleared``): the replica is purged in the same script.

Re-announcements: with ``kv_cache_report_mode: "full"`` the engine re-emits ``BlockStored``
(parent None, from block 0) for the blocks a request hit. Counting those would inflate the
refcounts and over-predict after eviction; the writer marks root stores (:class:`RootStored`) and
the apply script skips one whose whole chain the replica already holds on that tier.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import struct
import sys
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from litellm_kv.index.base import BlockOp, ReplicaMatch, ScriptRider
from litellm_kv.redis_client import RedisUse, connect
from litellm_kv.tasks import cancel_and_wait

KEY_PREFIX = "lkv"
GROUPS_KEY = f"{KEY_PREFIX}:groups"
LOOKUP_CHUNK = 64
SWEEP_STEP = 1000  # entries stripped per cleanup script after a purge (~11 ms of Redis time)
log = logging.getLogger("litellm_kv")
_U64 = (1 << 64) - 1
_Q_IS_8_BYTES = array("Q").itemsize == 8
T = TypeVar("T")

# Shared Lua helpers, prepended to each script (Redis 7 runs Lua 5.1: no goto, no integer type).
_PRELUDE = r"""
local function replica_id(ids, names, name, create)
  local id = redis.call('HGET', ids, name)
  if id then return tonumber(id) end
  if not create then return nil end
  id = redis.call('HINCRBY', names, '#next', 1)
  redis.call('HSET', ids, name, id)
  redis.call('HSET', names, id, name)
  return id
end

local function holds(v, id)
  for t = 0, 2 do
    if string.find(v, ';' .. (id * 4 + t) .. ':', 1, true) then return true end
  end
  return false
end

-- +delta references of hash h by code (replica id * 4 + tier); removing an absent one is a no-op.
local function bump(blocks, rev, h, id, tier, delta)
  local v = redis.call('HGET', blocks, h) or ''
  local code = id * 4 + tier
  local s, e, n = string.find(v, ';' .. code .. ':(%d+)')
  local count = tonumber(n or 0) + delta
  if count < 0 then count = 0 end
  if not s and count == 0 then return 0 end
  local entry = ''
  if count > 0 then entry = ';' .. code .. ':' .. count end
  if s then v = string.sub(v, 1, s - 1) .. entry .. string.sub(v, e + 1) else v = v .. entry end
  if v == '' then redis.call('HDEL', blocks, h) else redis.call('HSET', blocks, h, v) end
  if count > 0 then
    redis.call('SADD', rev, h)
  elseif not holds(v, id) then
    redis.call('SREM', rev, h)
  end
  return 1
end

-- True when every packed hash has a count > 0 for code (replica id * 4 + tier).
local function holds_chain(blocks, packed, code)
  local needle = ';' .. code .. ':'
  for k = 1, #packed, 8 do
    local v = redis.call('HGET', blocks, string.sub(packed, k, k + 7))
    if not v or not string.find(v, needle, 1, true) then return false end
  end
  return true
end

-- Purge in O(1): the replica's id is retired (unmapped from its name: lookups ignore it, the
-- name gets a fresh id on its next write) and queued in the retired set; the entries it leaves in
-- the blocks hash are stripped later in small steps by the sweep script. Returns the entry count.
local function retire(ids, names, retired, rev_prefix, name, id)
  redis.call('HDEL', ids, name)
  redis.call('HDEL', names, id)
  local n = redis.call('SCARD', rev_prefix .. id)
  if n > 0 then redis.call('SADD', retired, id) end
  return n
end

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
"""

# KEYS: blocks, ids, names, streams, groups, retired
# ARGV: group, rev_prefix, replica, stream, seq, ts, force, then ops:
#   'C' (all blocks cleared) | 'o<delta>,<tier>' or 'r<delta>,<tier>' (a root store: skipped when the
#   replica already holds the whole chain on that tier), followed by its hashes packed (8 bytes each,
#   big-endian)
# Returns {status, last_seq, touched, purged, reannounced}; status: applied | duplicate | gap | restart
_APPLY = _PRELUDE + r"""
local blocks, ids, names, streams, retired = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[6]
local rev_prefix, replica, stream = ARGV[2], ARGV[3], ARGV[4]
local seq, ts, force = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7] == '1'
redis.call('SADD', KEYS[5], ARGV[1])
local id = replica_id(ids, names, replica, true)
local rev = rev_prefix .. id
local status, purged = 'applied', 0
-- Drop what the replica held; later ops of the batch go to its fresh id.
local function purge()
  local n = retire(ids, names, retired, rev_prefix, replica, id)
  id = replica_id(ids, names, replica, true)
  rev = rev_prefix .. id
  return n
end
local last = -1
if seq >= 0 then
  local st = redis.call('HGET', streams, stream)
  if st then
    local sep = string.find(st, '|', 1, true)
    last = tonumber(string.sub(st, 1, sep - 1))
    local last_ts = tonumber(string.sub(st, sep + 1))
    if seq <= last then
      if ts <= last_ts then return {'duplicate', last, 0, 0, 0} end
      -- Lower seq, newer time: the engine restarted; its old blocks are gone.
      purged = purge()
      status = 'restart'
      last = -1
      if seq ~= 0 and not force then
        redis.call('HSET', streams, stream, '-1|' .. ARGV[6])
        return {'gap', -1, 0, purged, 0}
      end
    elseif seq > last + 1 and not force then
      return {'gap', last, 0, 0, 0}
    end
  elseif seq ~= 0 and not force then
    return {'gap', -1, 0, 0, 0}
  end
  if force and seq ~= last + 1 then
    -- The missing batches are gone: forget what we knew and re-learn from here.
    purged = purged + purge()
    status = 'restart'
  end
  redis.call('HSET', streams, stream, seq .. '|' .. ARGV[6])
end
local touched, reannounced = 0, 0
local i = 8
while i <= #ARGV do
  if ARGV[i] == 'C' then
    purged = purged + purge()
    i = i + 1
  else
    local kind, d, t = string.match(ARGV[i], '^([or])(-?%d+),(%d+)$')
    d, t = tonumber(d), tonumber(t)
    local packed = ARGV[i + 1]
    -- A root store (parent None, from block 0) of a chain the replica already holds is the engine
    -- re-announcing a prefix-cache hit (kv_cache_report_mode=full), not a new copy.
    if kind == 'r' and holds_chain(blocks, packed, id * 4 + t) then
      reannounced = reannounced + 1
    else
      for k = 1, #packed, 8 do touched = touched + bump(blocks, rev, string.sub(packed, k, k + 7), id, t, d) end
    end
    i = i + 2
  end
end
if seq >= 0 then last = seq end
return {status, last, touched, purged, reannounced}
"""

# lkv_lookup(blocks, ids, names, packed, filter): packed block hashes (8 bytes each) and the replica
# names to consider (an empty table: all). Returns a flat list: name, gpu, cpu, storage, name, ...
_LOOKUP_FN = r"""
local function lkv_lookup(blocks, ids, names, packed, filter)
  local allow = nil
  if #filter > 0 then
    allow = {}
    local any = false
    for i = 1, #filter do
      local id = redis.call('HGET', ids, filter[i])
      if id then allow[tonumber(id)] = true; any = true end
    end
    if not any then return {} end
  end
  -- Replicas still matching: {id, counts per tier, the three entry prefixes to look for}.
  local active = nil
  local alive = 0
  local prev_v, prev_tiers = nil, {}
  local n = #packed / 8
  local chunk = tonumber(__CHUNK__)
  local i = 1
  local stop = false
  while i <= n and not stop do
    local j = math.min(i + chunk - 1, n)
    local fields = {}
    for k = i, j do fields[k - i + 1] = string.sub(packed, 8 * k - 7, 8 * k) end
    local vals = redis.call('HMGET', blocks, unpack(fields))
    for k = 1, #vals do
      local v = vals[k]
      if not v then stop = true; break end
      if active == nil then
        -- First block: every replica holding it starts a match at its fastest tier.
        local best = {}
        for code in string.gmatch(v, ';(%d+):') do
          code = tonumber(code)
          local id, tier = math.floor(code / 4), code % 4
          if (allow == nil or allow[id]) and (best[id] == nil or tier < best[id]) then best[id] = tier end
        end
        active = {}
        for id, tier in pairs(best) do
          -- A purged replica's id has no name any more; its entries await the sweep: skip them.
          local name = redis.call('HGET', names, id)
          if name then
            local c = {0, 0, 0}
            c[tier + 1] = 1
            local b = id * 4
            table.insert(active, {id, c, ';' .. b .. ':', ';' .. (b + 1) .. ':', ';' .. (b + 2) .. ':', true, name})
            alive = alive + 1
          end
        end
      else
        -- Consecutive blocks mostly have the same holders, so the same value string (Lua strings are
        -- interned: comparing them is a pointer test): reuse the tiers found for the previous block.
        if v ~= prev_v then
          prev_v = v
          for x, a in ipairs(active) do
            if a[6] then
              if string.find(v, a[3], 1, true) then prev_tiers[x] = 1
              elseif string.find(v, a[4], 1, true) then prev_tiers[x] = 2
              elseif string.find(v, a[5], 1, true) then prev_tiers[x] = 3
              else prev_tiers[x] = 0 end
            end
          end
        end
        for x, a in ipairs(active) do
          if a[6] then
            local t = prev_tiers[x]
            if t > 0 then a[2][t] = a[2][t] + 1 else a[6] = false; alive = alive - 1 end
          end
        end
      end
      if alive == 0 then stop = true; break end
    end
    i = j + 1
  end
  local out = {}
  for _, a in ipairs(active or {}) do
    table.insert(out, a[7]); table.insert(out, a[2][1]); table.insert(out, a[2][2]); table.insert(out, a[2][3])
  end
  return out
end
""".replace("__CHUNK__", str(LOOKUP_CHUNK))

# KEYS: blocks, ids, names   ARGV: packed block hashes, then replica filter names
_LOOKUP = _LOOKUP_FN + r"""
local filter = {}
for i = 2, #ARGV do filter[i - 1] = ARGV[i] end
return lkv_lookup(KEYS[1], KEYS[2], KEYS[3], ARGV[1], filter)
"""

# The lookup with a rider (see ScriptRider). KEYS: blocks, ids, names, then the rider's keys.
# ARGV: packed hashes, n = number of filter names, the n names, then the rider's args.
# Returns {lookup's flat list, rider's result}.
_LOOKUP_RIDING = r"""
local filter = {}
local n = tonumber(ARGV[2])
for i = 1, n do filter[i] = ARGV[2 + i] end
local rkeys, rargs = {}, {}
for i = 4, #KEYS do rkeys[i - 3] = KEYS[i] end
for i = 3 + n, #ARGV do rargs[i - 2 - n] = ARGV[i] end
local m = lkv_lookup(KEYS[1], KEYS[2], KEYS[3], ARGV[1], filter)
return {m, rider(rkeys, rargs)}
"""

# KEYS: ids, names, hb, streams, retired   ARGV: rev_prefix, replica, forget_streams (0/1)
# Purge and (optionally) forget the replica's stream positions atomically, so no batch can land
# between the two and then be applied again by the replay that follows.
_PURGE = _PRELUDE + r"""
local id = replica_id(KEYS[1], KEYS[2], ARGV[2], false)
redis.call('ZREM', KEYS[3], ARGV[2])
if ARGV[3] == '1' then
  local prefix = ARGV[2] .. '#'
  for _, s in ipairs(redis.call('HKEYS', KEYS[4])) do
    if s == ARGV[2] or string.sub(s, 1, #prefix) == prefix then redis.call('HDEL', KEYS[4], s) end
  end
end
if id == nil then return 0 end
return retire(KEYS[1], KEYS[2], KEYS[5], ARGV[1], ARGV[2], id)
"""

# KEYS: hb, groups   ARGV: group, replica, ttl_ms
_HEARTBEAT = _PRELUDE + r"""
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[1], now_ms() + tonumber(ARGV[3]), ARGV[2])
return 1
"""

# KEYS: ids, names, hb, retired   ARGV: rev_prefix   Returns names purged.
_EXPIRE = _PRELUDE + r"""
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now_ms())
for _, name in ipairs(dead) do
  local id = replica_id(KEYS[1], KEYS[2], name, false)
  if id then retire(KEYS[1], KEYS[2], KEYS[4], ARGV[1], name, id) end
  redis.call('ZREM', KEYS[3], name)
end
return dead
"""

# KEYS: blocks, retired   ARGV: rev_prefix, max entries
# One bounded step of the physical cleanup after purges: strips retired ids' entries from the
# blocks hash. Returns {entries stripped, retired ids still queued}.
_SWEEP = r"""
local blocks, retired, rev_prefix = KEYS[1], KEYS[2], ARGV[1]
local budget = tonumber(ARGV[2])
local done = 0
while budget > 0 do
  local id = redis.call('SRANDMEMBER', retired)
  if not id then break end
  local rev = rev_prefix .. id
  local members = redis.call('SPOP', rev, budget)
  local base = tonumber(id) * 4
  for _, h in ipairs(members) do
    local v = redis.call('HGET', blocks, h)
    if v then
      for t = 0, 2 do v = string.gsub(v, ';' .. (base + t) .. ':%d+', '') end
      if v == '' then redis.call('HDEL', blocks, h) else redis.call('HSET', blocks, h, v) end
    end
  end
  done = done + #members
  budget = budget - #members
  if redis.call('SCARD', rev) == 0 then redis.call('SREM', retired, id) end
end
return {done, redis.call('SCARD', retired)}
"""

# KEYS: names, hb   ARGV: rev_prefix   Returns {name, entries, alive(0/1)} flattened.
_REPLICAS = _PRELUDE + r"""
local out = {}
local seen = {}
local live = redis.call('ZRANGEBYSCORE', KEYS[2], '(' .. now_ms(), '+inf')
for _, name in ipairs(live) do seen[name] = 0 end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if all[i] ~= '#next' then
    local n = redis.call('SCARD', ARGV[1] .. all[i])
    if n > 0 or seen[all[i + 1]] ~= nil then seen[all[i + 1]] = n end
  end
end
for name, n in pairs(seen) do table.insert(out, name); table.insert(out, n) end
return out
"""


class ApplyStatus(enum.Enum):
    """What :meth:`RedisIndex.apply_batch` did with a batch."""

    APPLIED = "applied"  # next seq of the stream: applied
    DUPLICATE = "duplicate"  # already applied (by this or another indexer): skipped
    GAP = "gap"  # batches missing before it: nothing applied, replay from last_seq + 1
    RESTART = "restart"  # new engine lifetime or forced resync: replica purged, batch applied


@dataclass(slots=True, frozen=True)
class ApplyResult:
    status: ApplyStatus
    last_seq: int  # last seq applied for the stream after this call (-1: none)
    touched: int  # hashes whose refcount changed
    purged: int  # (replica, hash) entries dropped by a restart or AllBlocksCleared
    reannounced: int = 0  # root stores skipped because the replica already held their chain


CLEAR = "C"  # marker in an op list: AllBlocksCleared


@dataclass(slots=True, frozen=True)
class RootStored:
    """A ``BlockStored`` op whose event had ``parent_block_hash`` None (its chain starts at block 0).

    With ``kv_cache_report_mode: "full"`` the engine re-announces every prefix-cache hit this way;
    those are not new physical copies, so :meth:`RedisIndex.apply_batch` skips the op when the
    replica already holds its whole chain on the op's tier (the embedded subscriber's rule, checked
    in the same script as the batch, so it sees the batch's earlier ops). Blind spot: a request of
    one block that recomputes its cached first block makes a real second copy, counted once.
    """

    op: BlockOp


ApplyOp = BlockOp | RootStored | str  # str: the CLEAR marker


def group_tag(group: str) -> str:
    """The hash-tag form of a group name (braces would end the tag early)."""
    return group.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


def group_key_prefix(group: str) -> str:
    """``lkv:{<group>}:``: every key of a group starts so (one Redis Cluster slot per group)."""
    return f"{KEY_PREFIX}:{{{group_tag(group)}}}:"


@dataclass(slots=True, frozen=True)
class _GroupKeys:
    blocks: str
    ids: str
    names: str
    hb: str
    streams: str
    rev_prefix: str
    retired: str

    @classmethod
    def of(cls, group: str) -> _GroupKeys:
        base = group_key_prefix(group)
        return cls(base + "blocks", base + "ids", base + "names", base + "hb", base + "streams", base + "rev:",
                   base + "retired")


def _pack(hashes: Sequence[int]) -> bytes:
    """Hashes as 8-byte big-endian fields, in C (a per-hash struct argument was 0.05 ms at 8K tokens);
    values outside 0..2^64-1 (none come from the hasher) are reduced mod 2^64 on the slow path."""
    if _Q_IS_8_BYTES:
        try:
            words = array("Q", hashes)
        except OverflowError:
            pass
        else:
            if sys.byteorder == "little":
                words.byteswap()
            return words.tobytes()
    return struct.pack(f">{len(hashes)}Q", *(h & _U64 for h in hashes))


def _encode_ops(ops: Iterable[ApplyOp]) -> list[bytes | str]:
    args: list[bytes | str] = []
    for item in ops:
        if isinstance(item, str):
            if item != CLEAR:
                raise ValueError(f"unknown op marker {item!r}")
            args.append(CLEAR)
            continue
        kind, op = ("r", item.op) if isinstance(item, RootStored) else ("o", item)
        if not op.hashes or op.delta == 0:
            continue
        if kind == "r" and op.delta < 0:
            raise ValueError("RootStored wraps a BlockStored op (delta > 0)")
        args.append(f"{kind}{op.delta},{int(op.tier)}")
        args.append(_pack(op.hashes))
    return args


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisIndex:
    """:class:`~litellm_kv.index.base.KVIndex` in Redis (``redis://``, ``rediss://`` for TLS,
    password and database number from the URL).

    ``sweep_step``: entries stripped per cleanup script after a purge; ``auto_sweep``: run that
    cleanup in a background task of this process (else only explicit :meth:`sweep` calls).
    """

    def __init__(
        self, url: str, *, client: aioredis.Redis | None = None, socket_timeout_s: float | None = None,
        sweep_step: int = SWEEP_STEP, auto_sweep: bool = True,
    ):
        self.url = url
        self.client: aioredis.Redis = client or connect(url, RedisUse.INDEX, timeout_s=socket_timeout_s)
        self._apply = self.client.register_script(_APPLY)
        self._lookup = self.client.register_script(_LOOKUP)
        self._riding: dict[str, AsyncScript] = {}  # rider Lua -> the lookup script carrying it
        self._purge = self.client.register_script(_PURGE)
        self._heartbeat = self.client.register_script(_HEARTBEAT)
        self._expire = self.client.register_script(_EXPIRE)
        self._replicas = self.client.register_script(_REPLICAS)
        self._sweep = self.client.register_script(_SWEEP)
        self._keys: dict[str, _GroupKeys] = {}
        self._sweepers: dict[str, asyncio.Task[int]] = {}
        self.sweep_step = sweep_step
        self.auto_sweep = auto_sweep  # False: only explicit sweep() calls clean up after purges
        self.round_trips = 0  # client calls sent to Redis (a script or pipeline counts once)

    def _k(self, group: str) -> _GroupKeys:
        keys = self._keys.get(group)
        if keys is None:
            keys = self._keys[group] = _GroupKeys.of(group)
        return keys

    async def close(self) -> None:
        for task in list(self._sweepers.values()):
            await cancel_and_wait(task, RedisError, OSError)
        await self.client.aclose()

    async def ping(self) -> bool:
        self.round_trips += 1
        return bool(await self.client.ping())

    # -- writes ------------------------------------------------------------------------------

    async def apply_batch(
        self,
        group: str,
        replica: str,
        ops: Iterable[ApplyOp],
        *,
        stream: str | None = None,
        seq: int = -1,
        ts: float = 0.0,
        force: bool = False,
    ) -> ApplyResult:
        """Apply one event batch in one round trip, deduplicated by ``(stream, seq)``.

        ``seq < 0`` applies unconditionally. ``force`` accepts a batch after an unrecoverable gap
        (purging the replica first, since the missed batches may have removed blocks).
        A :class:`RootStored` op is skipped when the replica already holds its whole chain.
        """
        k = self._k(group)
        args: list[bytes | str] = [
            group, k.rev_prefix, replica, stream or replica, str(seq), repr(float(ts)), "1" if force else "0"
        ]
        args.extend(_encode_ops(ops))
        self.round_trips += 1
        res = await self._apply(keys=[k.blocks, k.ids, k.names, k.streams, GROUPS_KEY, k.retired], args=args)
        out = ApplyResult(ApplyStatus(_text(res[0])), int(res[1]), int(res[2]), int(res[3]), int(res[4]))
        if out.purged:
            self.start_sweep(group)
        return out

    async def apply(self, group: str, replica: str, ops: Iterable[BlockOp]) -> int:
        return (await self.apply_batch(group, replica, ops)).touched

    async def purge_replica(self, group: str, replica: str, *, forget_streams: bool = False) -> int:
        """Drop a replica's entries in one script; with ``forget_streams`` also its event-stream
        positions (``<replica>#<rank>``), so the next batch asks for a replay from 0."""
        k = self._k(group)
        self.round_trips += 1
        n = int(await self._purge(
            keys=[k.ids, k.names, k.hb, k.streams, k.retired],
            args=[k.rev_prefix, replica, "1" if forget_streams else "0"],
        ))
        if n:
            self.start_sweep(group)
        return n

    async def heartbeat(self, group: str, replica: str, ttl_s: float) -> None:
        k = self._k(group)
        self.round_trips += 1
        await self._heartbeat(keys=[k.hb, GROUPS_KEY], args=[group, replica, str(int(ttl_s * 1000))])

    async def expire(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for group in await self._groups():
            k = self._k(group)
            self.round_trips += 1
            dead = await self._expire(keys=[k.ids, k.names, k.hb, k.retired], args=[k.rev_prefix])
            out.extend((group, _text(name)) for name in dead)
            if dead:
                self.start_sweep(group)
        return out

    # -- physical cleanup after purges ---------------------------------------------------------

    async def sweep_once(self, group: str, max_entries: int | None = None) -> tuple[int, int]:
        """One bounded cleanup step: strip up to ``max_entries`` entries of purged (retired)
        replica ids. Returns ``(entries stripped, retired ids still queued)``."""
        k = self._k(group)
        self.round_trips += 1
        res = await self._sweep(keys=[k.blocks, k.retired], args=[k.rev_prefix, str(max_entries or self.sweep_step)])
        return int(res[0]), int(res[1])

    async def sweep(self, group: str, max_entries: int | None = None) -> int:
        """Strip every retired id's entries of a group, one bounded script per step (other
        clients' commands run between steps). Returns the entries stripped."""
        total = 0
        while True:
            done, left = await self.sweep_once(group, max_entries)
            total += done
            if not left:
                return total
            await asyncio.sleep(0)

    def start_sweep(self, group: str) -> None:
        """Run :meth:`sweep` for a group in the background (one task per group; any process may
        sweep: the queue is in Redis, so leftovers of a process that died are finished by the next
        purge or by the indexer's maintenance pass)."""
        if not self.auto_sweep or group in self._sweepers:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self.sweep(group), name=f"lkv-sweep-{group}")
        self._sweepers[group] = task
        task.add_done_callback(lambda t: self._sweep_done(group, t))

    def _sweep_done(self, group: str, task: asyncio.Task[int]) -> None:
        self._sweepers.pop(group, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("litellm-kv: sweeping purged entries of %s failed (retried on the next purge or "
                        "maintenance pass): %s", group, task.exception())

    async def wait_sweeps(self) -> None:
        """Wait for this process's background sweeps (tests, shutdown)."""
        while self._sweepers:
            await asyncio.gather(*self._sweepers.values(), return_exceptions=True)

    # -- reads -------------------------------------------------------------------------------

    async def lookup(
        self, group: str, block_hashes: Sequence[int], replicas: Sequence[str] | None = None
    ) -> dict[str, ReplicaMatch]:
        if not block_hashes:
            return {}
        k = self._k(group)
        names = list(replicas or ())
        if replicas is not None and not names:
            return {}
        args: list[bytes | str] = [_pack(block_hashes), *names]
        self.round_trips += 1
        flat = await self._lookup(keys=[k.blocks, k.ids, k.names], args=args)
        out: dict[str, ReplicaMatch] = {}
        for i in range(0, len(flat), 4):
            out[_text(flat[i])] = ReplicaMatch(int(flat[i + 1]), int(flat[i + 2]), int(flat[i + 3]))
        return out

    async def lookup_riding(
        self, group: str, block_hashes: Sequence[int], replicas: Sequence[str] | None, rider: ScriptRider[T]
    ) -> tuple[dict[str, ReplicaMatch], T]:
        """:class:`~litellm_kv.index.base.RidingLookup`: :meth:`lookup` and ``rider`` in one script, one
        round trip for both (the router reads the shared load so). Without hashes only the rider runs."""
        script = self._riding.get(rider.lua)
        if script is None:
            if len(self._riding) >= 8:
                self._riding.clear()
            script = self._riding[rider.lua] = self.client.register_script(_LOOKUP_FN + rider.lua + _LOOKUP_RIDING)
        k = self._k(group)
        names = list(replicas or ())
        args: list[Any] = [_pack(block_hashes), len(names), *names, *rider.args]
        self.round_trips += 1
        flat, raw = await script(keys=[k.blocks, k.ids, k.names, *rider.keys], args=args)
        out: dict[str, ReplicaMatch] = {}
        if replicas is None or names:
            for i in range(0, len(flat), 4):
                out[_text(flat[i])] = ReplicaMatch(int(flat[i + 1]), int(flat[i + 2]), int(flat[i + 3]))
        return out, rider.decode(raw)

    async def replica_entries(self, group: str) -> dict[str, int]:
        """Replicas of a group (with entries or a live heartbeat) and their entry counts."""
        k = self._k(group)
        self.round_trips += 1
        flat = await self._replicas(keys=[k.names, k.hb], args=[k.rev_prefix])
        return {_text(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}

    async def replicas(self, group: str) -> list[str]:
        return sorted(await self.replica_entries(group))

    async def size(self, group: str | None = None) -> int:
        groups = [group] if group is not None else await self._groups()
        total = 0
        for g in groups:
            total += sum((await self.replica_entries(g)).values())
        return total

    async def stream_state(self, group: str, stream: str) -> tuple[int, float] | None:
        """Last applied ``(seq, ts)`` of an event stream, or None when Redis has none (fresh or
        lost): the indexer resumes with a replay from ``seq + 1``."""
        self.round_trips += 1
        raw = await self.client.hget(self._k(group).streams, stream)
        if raw is None:
            return None
        seq, ts = _text(raw).split("|", 1)
        return int(seq), float(ts)

    async def _groups(self) -> list[str]:
        self.round_trips += 1
        return sorted(_text(g) for g in await self.client.smembers(GROUPS_KEY))  # type: ignore[misc]

    async def used_memory(self) -> int:
        """Redis ``used_memory`` in bytes (for sizing and the benchmark)."""
        self.round_trips += 1
        info = await self.client.info("memory")
        return int(info["used_memory"])
