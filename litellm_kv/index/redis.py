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
``lkv:groups``               set of group names (untagged: its own slot; read by :meth:`expire` and ``size``)
==========================  =====================================================================

No script touches ``lkv:groups``: it is written by a plain ``SADD`` of its own (a group's first write in
this process, and every heartbeat, so a registry lost in a failover is rebuilt within a heartbeat), so
every script's keys share one hash tag and a Redis Cluster serves each script on one node.

Round trips: :meth:`lookup` is **one** ``EVALSHA`` for a whole prompt: the script walks the chain
in chunks of 64 fields and stops when every replica has missed (hashes are chained, so nothing
after a replica's first miss can hit); :meth:`lookup_riding` carries other read-only work of the same
group in that script (the proxy's load snapshot, :class:`ScriptRider`), so a routing decision is one
round trip in all. :meth:`apply_batch` is one ``EVALSHA`` per event batch, :meth:`apply_batches` one for
several batches of a stream (up to ``apply_call_blocks`` hashes); the script reads the entries an op touches
with one ``HMGET`` and writes them back with one ``HSET``/``HDEL`` and one ``SADD``/``SREM``.
``redis-py`` re-sends the script source once after a server restart (``NOSCRIPT``).

Purges (engine restart, ``AllBlocksCleared``, heartbeat expiry, replica removed) are O(1): the
replica's id is *retired* (unmapped from its name, so lookups ignore its entries at once and its
next write gets a fresh id) and queued; the entries are then stripped from ``blocks`` by a sweep
script, :data:`SWEEP_STEP` entries per call, in a background task of the purging process (any
process finishes a queue left behind). Stripping all at once would block Redis for time proportional to the
replica's cache (docs/indexer.md).

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
from importlib import resources
from typing import Any, TypeVar

from redis.commands.core import AsyncScript
from redis.exceptions import RedisError

from litellm_kv.index.base import BlockOp, ReplicaMatch, ScriptRider
from litellm_kv.redis_client import RedisClient, RedisGuard, RedisTarget, RedisUse, connect, describe, guarded
from litellm_kv.redis_client import used_memory as redis_used_memory
from litellm_kv.tasks import cancel_and_wait

KEY_PREFIX = "lkv"
GROUPS_KEY = f"{KEY_PREFIX}:groups"
LOOKUP_CHUNK = 64
SWEEP_STEP = 1000  # entries stripped per cleanup script after a purge: short enough not to stall other clients
APPLY_CALL_BLOCKS = 256  # hashes per apply script call at most (a call of one larger batch excepted): same reason
log = logging.getLogger("litellm_kv")
_U64 = (1 << 64) - 1
_Q_IS_8_BYTES = array("Q").itemsize == 8
T = TypeVar("T")


def _lua(name: str) -> str:
    """The text of ``lua/<name>.lua``, shipped as package data next to this module."""
    return resources.files(__package__).joinpath("lua", f"{name}.lua").read_text(encoding="utf-8")


# The scripts (their KEYS and ARGV are described at the top of each file). The prelude holds the
# helpers several scripts share; Redis has no includes, so it is prepended to each.
_PRELUDE = _lua("prelude")
_APPLY = _PRELUDE + _lua("apply")
_LOOKUP_FN = _lua("lkv_lookup").replace("__CHUNK__", str(LOOKUP_CHUNK))
_LOOKUP = _LOOKUP_FN + _lua("lookup")
_LOOKUP_RIDING = _lua("lookup_riding")
_PURGE = _PRELUDE + _lua("purge")
_HEARTBEAT = _PRELUDE + _lua("heartbeat")
_EXPIRE = _PRELUDE + _lua("expire")
_SWEEP = _lua("sweep")
_REPLICAS = _PRELUDE + _lua("replicas")


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


CLEAR = "C"  # marker in an op list: AllBlocksCleared (the engine holds nothing from before)
LOST = "L"  # marker: events lost (an undecodable batch, an unreadable removal): purge, and the stream is not whole
SKIPPED = "S"  # marker: a store was skipped (unreadable): the stream is not whole
_MARKERS = (CLEAR, LOST, SKIPPED)


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


ApplyOp = BlockOp | RootStored | str  # str: a marker (CLEAR, LOST, SKIPPED)


@dataclass(slots=True, frozen=True)
class BatchOps:
    """One event batch for :meth:`RedisIndex.apply_batches`: its ops and its place in its stream."""

    ops: Iterable[ApplyOp]
    stream: str | None = None  # None: the replica's name
    seq: int = -1  # < 0: applied unconditionally
    ts: float = 0.0
    force: bool = False


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
    """Hashes as 8-byte big-endian fields, packed in C (one struct argument per hash is slow on long prompts);
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


def _encode_ops(ops: Iterable[ApplyOp]) -> tuple[list[bytes | str], int]:
    """The apply script's op arguments and the number of hashes in them. Consecutive plain ops of the same
    sign and tier are sent as one (the script applies a run's hashes in order, as it would the ops)."""
    args: list[bytes | str] = []
    head: str | None = None  # header of the open run of plain ops
    run: list[int] = []
    n = 0
    for item in ops:
        if isinstance(item, str):
            if item not in _MARKERS:
                raise ValueError(f"unknown op marker {item!r}")
            if head is not None:
                args += (head, _pack(run))
                head = None
            args.append(item)
            continue
        root = isinstance(item, RootStored)
        op = item.op if isinstance(item, RootStored) else item
        if not op.hashes or op.delta == 0:
            continue
        if root and op.delta < 0:
            raise ValueError("RootStored wraps a BlockStored op (delta > 0)")
        n += len(op.hashes)
        h = _HEADERS.get((root, op.delta, op.tier))
        if h is None:
            h = _HEADERS[(root, op.delta, op.tier)] = f"{'r' if root else 'o'}{op.delta},{int(op.tier)}"
        if h == head:
            run += op.hashes
            continue
        if head is not None:
            args += (head, _pack(run))
            head = None
        if root:
            args += (h, _pack(op.hashes))
        else:
            head, run = h, list(op.hashes)
    if head is not None:
        args += (head, _pack(run))
    return args, n


_HEADERS: dict[tuple[bool, int, int], str] = {}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisIndex:
    """:class:`~litellm_kv.index.base.KVIndex` in Redis: ``target`` is a URL (``redis://``, ``rediss://`` for
    TLS, password and database number from the URL) or :class:`~litellm_kv.redis_client.RedisTarget`
    settings (one server, a Redis Cluster, a master through Sentinel).

    ``sweep_step``: entries stripped per cleanup script after a purge; ``auto_sweep``: run that
    cleanup in a background task of this process (else only explicit :meth:`sweep` calls);
    ``apply_call_blocks``: hashes per :meth:`apply_batches` script call at most.
    ``guard``: deadline and circuit breaker of the lookups (the proxy's routing path); writes (the
    indexer's) are not bounded by it.
    """

    def __init__(
        self, target: str | RedisTarget, *, client: RedisClient | None = None,
        socket_timeout_s: float | None = None, sweep_step: int = SWEEP_STEP, auto_sweep: bool = True,
        guard: RedisGuard | None = None, apply_call_blocks: int = APPLY_CALL_BLOCKS,
    ):
        self.url = describe(target)  # where it points, without credentials
        self.client: RedisClient = client or connect(target, RedisUse.INDEX, timeout_s=socket_timeout_s)
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
        self.apply_call_blocks = apply_call_blocks
        self.auto_sweep = auto_sweep  # False: only explicit sweep() calls clean up after purges
        self.round_trips = 0  # client calls sent to Redis (a script or pipeline counts once)
        self.guard = guard
        self._registered: set[str] = set()  # groups this process has added to lkv:groups

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
        (res,) = await self.apply_batches(group, replica, [BatchOps(ops, stream, seq, ts, force)])
        return res

    async def apply_batches(
        self, group: str, replica: str, batches: Iterable[BatchOps], *, max_blocks: int | None = None
    ) -> list[ApplyResult]:
        """Apply several batches of one replica in order, each as :meth:`apply_batch` would, in as few round
        trips as ``max_blocks`` (hashes per script call, :data:`APPLY_CALL_BLOCKS` by default: one script
        blocks Redis's other clients while it runs) allows; one call per batch above that. Returns one result
        per batch, in order. A call that fails raises: the calls before it are applied, the rest are not."""
        k = self._k(group)
        limit = self.apply_call_blocks if max_blocks is None else max_blocks
        if group not in self._registered:
            await self._register(group)
        out: list[ApplyResult] = []
        args: list[bytes | str] = [k.rev_prefix, replica]
        blocks = 0
        for b in batches:
            ops, n = _encode_ops(b.ops)
            if blocks and blocks + n > limit:
                out += await self._apply_call(group, k, args)
                args, blocks = [k.rev_prefix, replica], 0
            args += (b.stream or replica, str(b.seq), repr(float(b.ts)), "1" if b.force else "0", str(len(ops)))
            args += ops
            blocks += n
        if len(args) > 2:
            out += await self._apply_call(group, k, args)
        return out

    async def _apply_call(self, group: str, k: _GroupKeys, args: list[bytes | str]) -> list[ApplyResult]:
        self.round_trips += 1
        flat = await self._apply(keys=[k.blocks, k.ids, k.names, k.streams, k.retired], args=args)
        out = [
            ApplyResult(ApplyStatus(_text(flat[i])), int(flat[i + 1]), int(flat[i + 2]), int(flat[i + 3]),
                        int(flat[i + 4]))
            for i in range(0, len(flat), 5)
        ]
        if any(r.purged for r in out):
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
        await self._heartbeat(keys=[k.hb], args=[replica, str(int(ttl_s * 1000))])
        await self._register(group)

    async def _register(self, group: str) -> None:
        """Add ``group`` to ``lkv:groups`` (a command of its own: that key is in another cluster slot)."""
        self.round_trips += 1
        await self.client.sadd(GROUPS_KEY, group)  # type: ignore[misc]
        self._registered.add(group)

    async def heartbeats(self, group: str) -> dict[str, float]:
        """Seconds left of each replica's heartbeat in ``group`` (negative: expired, not yet swept), as Redis's
        clock counts them: who feeds the index (``litellm-kv doctor``)."""
        k = self._k(group)
        self.round_trips += 1
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.time()
            pipe.zrange(k.hb, 0, -1, withscores=True)
            (secs, micros), entries = await pipe.execute()
        now_ms = int(secs) * 1000 + int(micros) // 1000
        return {_text(name): (float(deadline) - now_ms) / 1000.0 for name, deadline in entries}

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
        flat = await guarded(self.guard, lambda: self._lookup(keys=[k.blocks, k.ids, k.names], args=args))
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
        flat, raw = await guarded(self.guard, lambda: script(keys=[k.blocks, k.ids, k.names, *rider.keys], args=args))
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
        seq, ts = _text(raw).split("|")[:2]
        return int(seq), float(ts)

    async def whole_streams(self, group: str) -> dict[str, bool]:
        """Per event stream of ``group``, whether the indexers followed it whole: from the engine's first batch or
        its last AllBlocksCleared, with no batch lost and no store skipped (the apply script's ``|w`` mark), so
        the index holds every block that engine reported."""
        self.round_trips += 1
        raw = await self.client.hgetall(self._k(group).streams)  # type: ignore[misc]
        return {_text(k): _text(v).endswith("|w") for k, v in raw.items()}

    async def _groups(self) -> list[str]:
        self.round_trips += 1
        return sorted(_text(g) for g in await self.client.smembers(GROUPS_KEY))  # type: ignore[misc]

    async def used_memory(self) -> int:
        """Redis ``used_memory`` in bytes (for sizing and the benchmark)."""
        self.round_trips += 1
        return await redis_used_memory(self.client)
