"""The indexer: every configured replica's KV events into the shared Redis index.

Per replica it learns the engine's block size and hash algorithm from ``vllm:cache_config_info``
and its event endpoints from ``GET /kv_event_sources`` (or takes them from the config), follows
each data-parallel rank's stream (:mod:`litellm_kv.services.indexer.stream`), writes a heartbeat to Redis
every ``heartbeat_interval_s`` and checks sampled ``BlockStored`` events for exactness. Any number
of indexers may run for the same replicas: Redis applies each batch once.

With ``assignment: lease`` it follows only the replicas whose lease it holds
(:mod:`litellm_kv.services.indexer.lease`): a lease loop renews and claims them every
``lease_renew_interval_s``, starting the streams of a replica it gains (they replay the engine's buffer from
the position in Redis) and stopping those of one it hands over. Starting and stopping run in tasks of their
own, so a slow engine never delays a renewal. A replica it has failed to follow for
``lease_unreachable_handoff_s`` (:meth:`ReplicaRuntime.unreached_since` says what counts) is given up in the
round, for another live indexer to take.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import asdict, dataclass, field
from typing import Any

import zmq.asyncio
from redis.exceptions import RedisError

from litellm_kv.index.redis import RedisIndex
from litellm_kv.observability import counter, gauge, histogram
from litellm_kv.routing.fleet import replica_id
from litellm_kv.services.indexer.config import IndexerReplicaSettings, IndexerSettings
from litellm_kv.services.indexer.lease import LeaseRound, Leases, default_indexer_id
from litellm_kv.services.indexer.stream import EventStream
from litellm_kv.tasks import cancel_and_wait
from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.exactness import ExactnessChecker
from litellm_kv.vllm.hashing import BlockHasher, predicted_hit_tokens
from litellm_kv.vllm.wire import connectable

log = logging.getLogger("litellm_kv.services.indexer")

REPLICA_EXACT = gauge(
    "indexer_replica_exact",
    "1 while a replica's engine facts are known and agree with the config and no exactness check failed.",
    ["model_group", "replica"],
)
PURGES = counter(
    "indexer_purges", "Replicas purged by this indexer, by reason (removed, expired, engine_restart).",
    ["model_group", "reason"],
)
INDEX_ENTRIES = gauge("indexer_index_entries", "(replica, block) entries in Redis per group.", ["model_group"])
REDIS_UP = gauge("indexer_redis_up", "1 when the last Redis call of the maintenance loop succeeded.")
OWNED = gauge(
    "indexer_lease_owned_replicas", "Replicas whose lease this indexer holds (assignment: lease).", ["model_group"]
)
LIVE_INDEXERS = gauge(
    "indexer_lease_live_indexers", "Indexers of the group renewing leases, as this indexer's last round saw them.",
    ["model_group"],
)
UNCOVERED = gauge(
    "indexer_lease_uncovered_replicas",
    "Replicas no live indexer held after this indexer's last round (the next round below its share claims them).",
    ["model_group"],
)
CLAIMS = counter(
    "indexer_lease_claims",
    "Leases this indexer claimed, by kind: new (never held or released), takeover (expired: its indexer "
    "stopped renewing), handoff (offered by an indexer over its share), unreachable (given up by an indexer "
    "that could not follow the replica).",
    ["model_group", "kind"],
)
DROPS = counter(
    "indexer_lease_drops",
    "Leases this indexer stopped holding: handed over to an indexer below its share, given up because it could "
    "not follow the replica, or taken after expiring.",
    ["model_group"],
)
GIVE_UPS = counter(
    "indexer_lease_unreachable",
    "Times this indexer gave up a lease because it had failed to follow the replica for "
    "lease_unreachable_handoff_s, by outcome: offered (to the live indexers that have not given it up), kept (none "
    "is left: it keeps the lease and keeps trying).",
    ["model_group", "outcome"],
)
UNREACHABLE = gauge(
    "indexer_lease_unreachable_replicas",
    "Replicas whose lease this indexer holds and has failed to follow for lease_unreachable_handoff_s or longer "
    "(given up and not taken yet, or kept because no other indexer is left to take them).",
    ["model_group"],
)
LOOKUP_SECONDS = histogram(
    "indexer_lookup_seconds", "POST /lookup latency (hashing + one Redis round trip).", ["model_group"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
)


@dataclass(slots=True)
class ReplicaRuntime:
    """Everything the indexer knows about one replica."""

    group: str
    replica: str
    cfg: IndexerReplicaSettings
    client: EngineClient
    streams: list[EventStream] = field(default_factory=list)
    block_size: int | None = None
    hash_algo: str | None = None
    prefix_caching: bool | None = None
    engine_started: float | None = None
    error: str = ""
    not_exact: str = ""
    checker: ExactnessChecker | None = None
    last_heartbeat: float = 0.0
    owned: bool = True  # assignment: lease: this indexer holds the replica's lease (static: always)
    owner: str | None = None  # assignment: lease: who holds it, as the last round saw ('' : nobody)
    gave_up: str = ""  # assignment: lease: offered or kept when the last round gave it up, else ''
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # streams start and stop one at a time
    engine_failing_since: float | None = None  # monotonic: first failed engine HTTP call since the last that worked
    engine_failure: str = ""

    def engine_failed(self, why: str) -> None:
        self.engine_failure = why
        if self.engine_failing_since is None:
            self.engine_failing_since = time.monotonic()

    def engine_answered(self) -> None:
        self.engine_failing_since, self.engine_failure = None, ""

    def unreached_since(self) -> float | None:
        """Since when (monotonic) this indexer has failed to follow the replica; None while it follows it.

        Failed to follow, from what the indexer observes: a call to the engine's HTTP API (``/metrics`` for its
        facts and heartbeat, ``/kv_event_sources``, starting the streams) failed and none has worked since, or a
        stream's replay request got no answer at all and no batch came after it (the stream asks again every
        ``discovery_interval_s``). Silence alone is not a failure: an idle engine publishes nothing.
        """
        starts = [self.engine_failing_since, *(s.unreached_since for s in self.streams)]
        return min((t for t in starts if t is not None), default=None)

    def unreached_why(self) -> str:
        if self.engine_failing_since is not None:
            return self.engine_failure
        return next((str(s.stats.last_error) for s in self.streams if s.unreached_since is not None), "")

    def health(self) -> dict[str, Any]:
        streams = [s.health() for s in self.streams]
        since = self.unreached_since()
        return {
            "model_group": self.group,
            "replica": self.replica,
            "owned": self.owned,
            "owner": self.owner,
            "connected": bool(streams) and all(s["connected"] for s in streams),
            "last_seq": max((int(s["last_seq"]) for s in streams), default=-1),  # type: ignore[call-overload]
            "events_applied": sum(int(s["events_applied"]) for s in streams),  # type: ignore[call-overload]
            "gaps": sum(int(s["gaps"]) for s in streams),  # type: ignore[call-overload]
            "replays": sum(int(s["replays"]) for s in streams),  # type: ignore[call-overload]
            "resyncs": sum(int(s["resyncs"]) for s in streams),  # type: ignore[call-overload]
            "block_size": self.block_size,
            "hash_algo": self.hash_algo,
            "exact": not self.not_exact and not self.error,
            "not_exact": self.not_exact or None,
            "error": self.error or None,
            "unreachable_s": None if since is None else round(time.monotonic() - since, 3),
            "unreachable_error": (self.unreached_why() or None) if since is not None else None,
            "exactness": asdict(self.checker.stats) if self.checker is not None else None,
            "streams": streams,
        }


class Indexer:
    """Runs the streams, heartbeats and expiry for an :class:`IndexerSettings`."""

    def __init__(self, cfg: IndexerSettings, index: RedisIndex | None = None) -> None:
        self.cfg = cfg
        self.index = index or RedisIndex(cfg.redis_target(), apply_call_blocks=cfg.apply_call_blocks)
        self.ctx = zmq.asyncio.Context()
        self.replicas: dict[tuple[str, str], ReplicaRuntime] = {}
        self._hashers: dict[tuple[str, int, str], BlockHasher] = {}
        self._task: asyncio.Task[None] | None = None
        self.redis_ok = False
        self.started = time.time()
        self.leases: Leases | None = None
        self._lease_task: asyncio.Task[None] | None = None
        self._changes: set[asyncio.Task[None]] = set()  # streams starting or stopping after a lease change
        self.lease_ok = False
        self.last_round: float | None = None  # monotonic time of the last lease round that reached Redis
        self.rounds: dict[str, LeaseRound] = {}
        if cfg.assignment == "lease":
            self.leases = Leases(self.index.client, cfg.indexer_id or default_indexer_id(),
                                 ttl_s=cfg.lease_ttl_s, grace_s=cfg.lease_renew_interval_s,
                                 cooldown_s=cfg.unreachable_cooldown_s())
        for group, gcfg in cfg.model_groups.items():
            for rc in gcfg.replicas:
                rid = replica_id(rc.api_base)
                base = rc.api_base.rstrip("/")
                base = base[:-3] if base.endswith("/v1") else base
                rt = ReplicaRuntime(group, rid, rc, EngineClient(base, timeout=cfg.engine_timeout_s))
                rt.owned = self.leases is None  # with leases, a replica is followed once its lease is held
                rt.checker = self._checker(rt)
                self.replicas[(group, rid)] = rt

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if not self.cfg.split_replicas:  # with a split, the replicas not listed here are another indexer's
            with contextlib.suppress(RedisError, OSError):
                await self._purge_unconfigured()
        loop = asyncio.get_running_loop()
        if self.leases is not None:
            for rt in self.replicas.values():
                await self._learn_facts(rt)  # /lookup hashes for every replica, followed here or not
            await self._lease_round()  # the first claims, before /health answers
            self._lease_task = loop.create_task(self._lease_loop(), name="kv-indexer-leases")
        else:
            for rt in self.replicas.values():
                await self._bring_up(rt)
        self._task = loop.create_task(self._maintain(), name="kv-indexer-maintain")

    async def stop(self) -> None:
        await cancel_and_wait(self._lease_task, Exception)
        await cancel_and_wait(self._task, Exception)
        for task in list(self._changes):
            await cancel_and_wait(task, Exception)
        if self.leases is not None:
            await self._release_leases()
        for rt in self.replicas.values():
            for s in rt.streams:
                await s.stop()
            await rt.client.aclose()
        self.ctx.term()
        await self.index.close()

    async def _purge_unconfigured(self) -> None:
        """Replicas of configured groups that left the config are purged (and their dedupe state)."""
        for group in self.cfg.model_groups:
            configured = {rid for (g, rid) in self.replicas if g == group}
            for rid in await self.index.replicas(group):
                if rid not in configured:
                    n = await self.index.purge_replica(group, rid, forget_streams=True)
                    PURGES.labels(group, "removed").inc()
                    log.info("indexer: replica %s left group %s: purged %d entries", rid, group, n)

    async def _bring_up(self, rt: ReplicaRuntime) -> None:
        async with rt.lock:
            await self._bring_up_locked(rt)

    async def _bring_up_locked(self, rt: ReplicaRuntime) -> None:
        """Read engine facts and event endpoints; start the streams. Failures are retried later."""
        if not rt.owned:
            return
        try:
            await self._read_facts(rt)
            if not rt.streams:
                for stream in await self._streams_of(rt):
                    stream.start()
                    rt.streams.append(stream)
            rt.error = ""
            rt.engine_answered()
        except Exception as exc:
            rt.error = f"{type(exc).__name__}: {exc}"
            rt.engine_failed(rt.error)
            log.warning("indexer: replica %s of %s not ready: %s", rt.replica, rt.group, rt.error)
        self._refresh_exact(rt)

    async def _learn_facts(self, rt: ReplicaRuntime) -> None:
        """Block size and hash algorithm of a replica this indexer does not follow (yet): no restart check,
        which is its owner's; a failure is left for when the replica is followed."""
        try:
            m = await rt.client.metrics()
        except Exception as exc:
            log.info("indexer: facts of %s not read yet: %s", rt.replica, exc)
            return
        rt.block_size, rt.hash_algo, rt.prefix_caching = m.block_size, m.hash_algo, m.prefix_caching

    async def _read_facts(self, rt: ReplicaRuntime) -> None:
        m = await rt.client.metrics()
        rt.block_size, rt.hash_algo, rt.prefix_caching = m.block_size, m.hash_algo, m.prefix_caching
        started = getattr(m, "process_start_time", None)
        if rt.engine_started is not None and started is not None and started != rt.engine_started:
            # A restarted engine (new process) lost its cache; its events restart at seq 0.
            await self._engine_restarted(rt)
        rt.engine_started = started

    async def _engine_restarted(self, rt: ReplicaRuntime) -> None:
        n = await self.index.purge_replica(rt.group, rt.replica, forget_streams=True)
        PURGES.labels(rt.group, "engine_restart").inc()
        log.warning("indexer: engine %s restarted: purged %d entries; re-learning", rt.replica, n)

    async def _streams_of(self, rt: ReplicaRuntime) -> list[EventStream]:
        cfg = rt.cfg
        endpoints: list[tuple[str, str | None, str]] = []
        if cfg.event_endpoints:
            for i, ep in enumerate(cfg.event_endpoints):
                replay = cfg.replay_endpoints[i] if i < len(cfg.replay_endpoints) else None
                endpoints.append((ep, replay, cfg.topic or ""))
        else:
            sources = await rt.client.kv_event_sources()
            if not sources:
                raise RuntimeError("GET /kv_event_sources lists no publisher (KV events disabled?)")
            for src in sources:
                replay = src.replay_endpoint
                endpoints.append((
                    connectable(src.endpoint, cfg.api_base),
                    connectable(replay, cfg.api_base) if replay else None,
                    cfg.topic if cfg.topic is not None else src.topic,
                ))
        out = []
        for rank, (ep, replay, topic) in enumerate(endpoints):
            out.append(EventStream(
                self.index, self.ctx, group=rt.group, replica=rt.replica, stream=f"{rt.replica}#{rank}",
                endpoint=ep, replay_endpoint=replay, topic=topic, bind=cfg.bind,
                check=rt.checker.observe if rt.checker is not None else None,
                replay_timeout_s=self.cfg.replay_timeout_s, backoff_max_s=self.cfg.redis_backoff_max_s,
                retry_s=self.cfg.discovery_interval_s,
            ))
        return out

    # -- exactness -------------------------------------------------------------------------------

    def hasher(self, group: str, block_size: int | None = None) -> BlockHasher | None:
        """The group's hasher (engine-reported algorithm and block size, configured seed)."""
        facts = [rt for (g, _), rt in self.replicas.items() if g == group and rt.block_size and rt.hash_algo]
        if not facts:
            return None
        bs = block_size or int(facts[0].block_size or 0)
        algo = str(facts[0].hash_algo)
        seed = self.cfg.seed_of(group) or ""
        key = (algo, bs, seed)
        h = self._hashers.get(key)
        if h is None:
            h = self._hashers[key] = BlockHasher(algo=algo, block_size=bs, hash_seed=self.cfg.seed_of(group))
        return h if h.exact_possible else None

    def _checker(self, rt: ReplicaRuntime) -> ExactnessChecker:
        rate = self.cfg.exactness_sample_rate
        return ExactnessChecker(
            lambda bs: self.hasher(rt.group, bs),
            sample_every=0 if rate <= 0 else max(1, round(1 / rate)),
            group=rt.group,
            replica=rt.replica,
            on_mismatch=lambda why: self._mismatch(rt, why),
        )

    def _mismatch(self, rt: ReplicaRuntime, why: str) -> None:
        # The checker has counted and logged it; the replica stays not exact until restart.
        rt.not_exact = f"exactness check failed: {why}"
        self._refresh_exact(rt)

    def _refresh_exact(self, rt: ReplicaRuntime) -> None:
        g = self.cfg.model_groups[rt.group]
        why = rt.not_exact if rt.not_exact.startswith("exactness") else ""
        if not why:
            if rt.block_size is None or rt.hash_algo is None:
                why = "engine does not report vllm:cache_config_info"
            elif g.block_size is not None and g.block_size != rt.block_size:
                why = f"configured block_size {g.block_size}, engine reports {rt.block_size}"
            elif g.hash_algo is not None and g.hash_algo != rt.hash_algo:
                why = f"configured hash_algo {g.hash_algo}, engine reports {rt.hash_algo}"
            elif rt.prefix_caching is False:
                why = "prefix caching is off"
            elif self.hasher(rt.group) is None:
                why = "hash chain cannot be reproduced (xxhash without hash_seed)"
        rt.not_exact = why
        REPLICA_EXACT.labels(rt.group, rt.replica).set(0 if why or rt.error else 1)

    # -- maintenance -----------------------------------------------------------------------------

    async def _maintain(self) -> None:
        """Heartbeats, engine facts, expiry of dead replicas, retries; survives Redis outages."""
        last_retry = 0.0
        while True:
            now = time.monotonic()
            try:
                for rt in self.replicas.values():
                    async with rt.lock:  # a lease change waits: never heartbeat or resync a stopped replica
                        await self._maintain_replica(rt, retry=now - last_retry >= self.cfg.discovery_interval_s)
                if now - last_retry >= self.cfg.discovery_interval_s:
                    last_retry = now
                for group, rid in await self.index.expire():
                    PURGES.labels(group, "expired").inc()
                    log.warning("indexer: replica %s of %s expired (no heartbeat): purged", rid, group)
                for group in self.cfg.model_groups:
                    INDEX_ENTRIES.labels(group).set(await self.index.size(group))
                    # Finish purges whose sweep another process left unfinished (it died, or Redis blipped).
                    self.index.start_sweep(group)
                self.redis_ok = True
            except (RedisError, OSError) as exc:
                if self.redis_ok:
                    log.warning("indexer: Redis unavailable: %s", exc)
                self.redis_ok = False
            REDIS_UP.set(1 if self.redis_ok else 0)
            await asyncio.sleep(self.cfg.heartbeat_interval_s)

    async def _maintain_replica(self, rt: ReplicaRuntime, *, retry: bool) -> None:
        if not rt.owned:
            return
        if rt.error or not rt.streams:
            if retry:
                await self._bring_up_locked(rt)
            return
        try:
            await self._read_facts(rt)
        except (RedisError, OSError):
            raise
        except Exception as exc:
            rt.engine_failed(f"{type(exc).__name__}: {exc}")
            log.warning("indexer: %s metrics unreachable: %s", rt.replica, exc)
            return  # no heartbeat: the replica expires if this lasts
        rt.engine_answered()
        await self.index.heartbeat(rt.group, rt.replica, self.cfg.heartbeat_ttl_s)
        for stream in rt.streams:
            await stream.verify()
        rt.last_heartbeat = time.time()
        self._refresh_exact(rt)

    # -- leases (assignment: lease) ----------------------------------------------------------------

    async def _lease_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.lease_renew_interval_s)
            try:
                await self._lease_round()
            except Exception:  # a bug here must not stop the renewals: the leases would pass to others
                self.lease_ok = False
                log.exception("indexer: lease round failed")

    async def _lease_round(self) -> None:
        """Renew, claim and hand over every group's leases; start or stop streams as ownership changed.
        While Redis is unreachable nothing is stopped: a replica followed twice is harmless, one followed by
        nobody is not."""
        assert self.leases is not None
        try:
            for group in self.cfg.model_groups:
                rids = [rid for (g, rid) in self.replicas if g == group]
                rnd = await self.leases.renew(group, rids, self._unreachable(group))
                self.rounds[group] = rnd
                self._apply_round(group, rnd)
            if not self.lease_ok:
                log.info("indexer %s: lease rounds reach Redis", self.leases.indexer)
            self.lease_ok = True
            self.last_round = time.monotonic()
        except (RedisError, OSError) as exc:
            if self.lease_ok:
                log.warning("indexer %s: lease round failed (keeping the replicas it follows): %s",
                            self.leases.indexer, exc)
            self.lease_ok = False

    def _unreachable(self, group: str) -> list[str]:
        """Replicas of ``group`` this indexer holds and has failed to follow for the hand-off time."""
        now, handoff = time.monotonic(), self.cfg.unreachable_handoff_s()
        out = []
        for (g, rid), rt in self.replicas.items():
            since = rt.unreached_since()
            if g == group and rt.owned and since is not None and now - since >= handoff:
                out.append(rid)
        return out

    def _note_give_up(self, rt: ReplicaRuntime, outcome: str) -> None:
        """Count and log a replica given up, once per change of outcome."""
        if outcome == rt.gave_up:
            return
        rt.gave_up = outcome
        if not outcome:
            return
        assert self.leases is not None
        since = rt.unreached_since()
        failed_s = 0.0 if since is None else time.monotonic() - since
        GIVE_UPS.labels(rt.group, outcome).inc()
        if outcome == "offered":
            log.warning("indexer %s: gives up %s of %s: failed to follow it for %.1fs (%s); offered to the other "
                        "live indexers, not taken back for %.0fs", self.leases.indexer, rt.replica, rt.group,
                        failed_s, rt.unreached_why(), self.cfg.unreachable_cooldown_s())
        else:
            log.warning("indexer %s: cannot follow %s of %s for %.1fs (%s), and no live indexer that has not given it "
                        "up is left to take it: keeps it and keeps trying", self.leases.indexer, rt.replica,
                        rt.group, failed_s, rt.unreached_why())

    def _apply_round(self, group: str, rnd: LeaseRound) -> None:
        assert self.leases is not None
        me = self.leases.indexer
        owned = 0
        for rid, owner in rnd.owners.items():
            rt = self.replicas[(group, rid)]
            before, rt.owner = rt.owner, owner
            mine = owner == me
            owned += mine
            self._note_give_up(rt, rnd.gave_up.get(rid, "") if mine else "")
            if mine and not rt.owned:
                rt.owned = True
                rt.engine_started = None  # its restarts so far were its previous owner's to handle
                rt.engine_answered()  # failures so far were another time's
                kind = rnd.claimed.get(rid, "new")
                CLAIMS.labels(group, kind).inc()
                log.info("indexer %s: follows %s of %s (%s lease)", me, rid, group, kind)
                self._change(self._bring_up(rt))
            elif not mine and rt.owned and owner == before:
                # Stopped only when the previous round saw the same holder: its new holder may not have heard of
                # its own claim yet (rounds answer in any order), so a hand-over never leaves the replica unfollowed.
                rt.owned = False
                DROPS.labels(group).inc()
                log.info("indexer %s: hands %s of %s over to %s", me, rid, group, owner or "nobody")
                self._change(self._stop_streams(rt))
        OWNED.labels(group).set(owned)
        UNREACHABLE.labels(group).set(len(rnd.gave_up))
        LIVE_INDEXERS.labels(group).set(rnd.live)
        UNCOVERED.labels(group).set(len(rnd.uncovered))

    def _change(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._changes.add(task)
        task.add_done_callback(self._changes.discard)

    async def _stop_streams(self, rt: ReplicaRuntime) -> None:
        async with rt.lock:
            if rt.owned:  # claimed back meanwhile
                return
            rt.error = ""  # its owner's to report now
            rt.engine_answered()
            for s in rt.streams:  # left in the list until stopped: a cancelled stop is finished by stop()
                await s.stop()
            rt.streams = []

    async def _release_leases(self) -> None:
        """Shutdown: free the leases at once, so the others take the replicas within one round."""
        assert self.leases is not None
        for group in self.cfg.model_groups:
            try:
                n = await self.leases.release(group, [rid for (g, rid) in self.replicas if g == group])
            except (RedisError, OSError) as exc:
                log.warning("indexer %s: leases of %s not released (they expire in %.0fs): %s",
                            self.leases.indexer, group, self.cfg.lease_ttl_s, exc)
                continue
            log.info("indexer %s: released %d leases of %s", self.leases.indexer, n, group)

    # -- API -------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        reps = [rt.health() for rt in self.replicas.values()]
        ok = self.redis_ok and all(r["connected"] and r["exact"] and r["unreachable_s"] is None
                                   for r in reps if r["owned"])
        out: dict[str, Any] = {"redis": self.redis_ok, "replicas": reps}
        if self.leases is not None:
            uncovered = {g: rnd.uncovered for g, rnd in self.rounds.items() if rnd.uncovered}
            ok = ok and self.lease_ok and not uncovered
            out["assignment"] = {
                "mode": "lease",
                "indexer_id": self.leases.indexer,
                "lease_ok": self.lease_ok,
                "last_round_age_s": None if self.last_round is None else round(time.monotonic() - self.last_round, 3),
                "live_indexers": {g: rnd.live for g, rnd in self.rounds.items()},
                "owned": {g: sorted(rnd.owned_by(self.leases.indexer)) for g, rnd in self.rounds.items()},
                "uncovered": uncovered,
                "unreachable_handoff_s": self.cfg.unreachable_handoff_s(),
                "given_up": {g: rnd.gave_up for g, rnd in self.rounds.items() if rnd.gave_up},
            }
        else:
            out["assignment"] = {"mode": "static", "split_replicas": self.cfg.split_replicas}
        return {"status": "ok" if ok else "degraded", **out}

    async def lookup(self, group: str, token_ids: list[int]) -> dict[str, Any]:
        """Predicted hit tokens per replica for a prompt's token ids (the max-hit rule applied)."""
        t0 = time.perf_counter()
        hasher = self.hasher(group)
        if hasher is None:
            raise LookupError(f"model group {group!r}: block size / hash algorithm not known yet")
        hashes = hasher.wire_hashes(token_ids)
        matches = await self.index.lookup(group, hashes)
        out = {}
        for rt in (rt for (g, _), rt in self.replicas.items() if g == group):
            m = matches.get(rt.replica)
            blocks = m.blocks if m else 0
            out[rt.replica] = {
                "hit_tokens": predicted_hit_tokens(blocks, len(token_ids), hasher.block_size),
                "blocks": {"gpu": m.gpu if m else 0, "cpu": m.cpu if m else 0, "storage": m.storage if m else 0},
                "exact": not rt.not_exact and not rt.error,
            }
        LOOKUP_SECONDS.labels(group).observe(time.perf_counter() - t0)
        return {"model_group": group, "prompt_tokens": len(token_ids), "block_size": hasher.block_size,
                "replicas": out}
