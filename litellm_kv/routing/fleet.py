"""The replicas of one KV-routed model group, as the proxy knows them.

For each replica (a LiteLLM deployment whose ``api_base`` is a vLLM server) the fleet learns the
engine's block size and hash algorithm from ``vllm:cache_config_info`` (never assumed), keeps its
load gauges fresh by scraping ``/metrics``, and — in embedded mode — runs the KV-event subscriber
that feeds the index. It also decides whether predictions can be exact right now, and says why not:
that state is what ``/litellm-kv/health`` and ``litellm_kv_group_exact`` show.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from litellm_kv.index.base import KVIndex
from litellm_kv.observability import gauge
from litellm_kv.routing.gauges import GaugeAging
from litellm_kv.routing.options import KVRoutingSettings
from litellm_kv.routing.ttft import EngineTimings
from litellm_kv.tasks import cancel_and_wait, spawn_held
from litellm_kv.vllm.engine import TIMING_SAMPLES, EngineClient
from litellm_kv.vllm.hashing import BlockHasher

log = logging.getLogger("litellm_kv")

GROUP_EXACT = gauge(
    "group_exact",
    "1 when every ready replica of the group agrees on block size and hash algorithm and no exactness "
    "check failed; 0 means routing for the group is load-only (see /litellm-kv/health for why).",
    ["model_group"],
)
REANNOUNCE = gauge(
    "reannounce_requested",
    "1 while the group's requests ask the engines to re-announce their cache hits (kv_cache_report_mode=full): "
    "always with report_mode_full true; with 'auto' while the index may lack blocks a replica holds.",
    ["model_group"],
)
REPLICA_READY = gauge(
    "replica_ready", "1 when the replica's cache config is known and (embedded mode) its subscriber runs.",
    ["model_group", "replica"],
)


def replica_id(api_base: str) -> str:
    """A replica's id in the index: ``scheme://host:port`` of its api_base (shared by proxies and indexers)."""
    parts = urlsplit(api_base.strip())
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme or 'http'}://{host}:{port}"


@dataclass(slots=True)
class ReplicaState:
    replica: str
    deployment_id: str
    api_base: str
    client: EngineClient
    block_size: int | None = None
    hash_algo: str | None = None
    prefix_caching: bool | None = None
    waiting: int | None = None
    running: int | None = None
    kv_usage: float | None = None
    last_scrape: float = 0.0
    ready: bool = False
    reachable: bool = True  # False while its /metrics does not answer (engine not started yet, crashed)
    error: str = ""
    not_exact: str = ""
    prompt_details_missing: bool = False
    subscriber: Any = None
    lora_roots: dict[str, str] = field(default_factory=dict)  # adapter name -> path, from /v1/models
    base_models: set[str] = field(default_factory=set)  # served names that are not adapters
    model_root: str | None = None  # the base model as the engine was given it (/v1/models 'root')
    max_model_len: int | None = None  # the longest prompt + output the engine accepts (/v1/models)

    def status(self) -> dict[str, Any]:
        sub = None
        if self.subscriber is not None:
            stats = getattr(self.subscriber, "stats", None)
            sub = stats() if callable(stats) else stats
            if sub is not None and not isinstance(sub, dict):
                sub = getattr(sub, "__dict__", None) or {
                    k: getattr(sub, k) for k in getattr(sub, "__slots__", ()) if hasattr(sub, k)
                }
        return {
            "replica": self.replica, "deployment_id": self.deployment_id, "ready": self.ready,
            "block_size": self.block_size, "hash_algo": self.hash_algo, "prefix_caching": self.prefix_caching,
            "waiting": self.waiting, "running": self.running, "kv_usage": self.kv_usage,
            "last_scrape_age_s": round(time.time() - self.last_scrape, 3) if self.last_scrape else None,
            "error": self.error or None, "not_exact": self.not_exact or None,
            "prompt_tokens_details_missing": self.prompt_details_missing, "max_model_len": self.max_model_len,
            "subscriber": sub,
        }


class Fleet:
    """Replicas of one model group, their engine facts and load, and the group's exactness."""

    def __init__(self, group: str, options: KVRoutingSettings, index: KVIndex, *, embedded: bool) -> None:
        self.group = group
        self.options = options
        self.index = index
        self.embedded = embedded
        self.replicas: dict[str, ReplicaState] = {}
        self._hasher: BlockHasher | None = None
        self._hasher_key: tuple[str, int, str | None] | None = None
        self._task: asyncio.Task[None] | None = None
        self.not_exact_why = "starting"
        self._models_read = 0.0  # last /v1/models re-read for a model name no replica listed
        self._refreshes: set[asyncio.Task[None]] = set()
        self._unknown_logged: set[str] = set()
        # The scraped waiting/running counts less this process's requests that have left them since the scrape.
        self.aging = GaugeAging()
        # Receives each scrape's timing histograms (KVGroup's RateBook learns the TTFT model's rates from them).
        self.on_timings: Callable[[str, EngineTimings], None] | None = None
        # Told when a replica's cache was purged (AllBlocksCleared, a restart, lost events): KVGroup's sibling
        # predictions there are void.
        self.on_purge: Callable[[str], None] | None = None
        # Why the index itself may be missing entries (a shared index in a Redis that deletes keys), or "".
        self.index_problem: Callable[[], str] | None = None
        # Shared mode: per replica, whether the indexers followed its KV-event streams whole (read from the index).
        self.streams_complete: dict[str, bool] = {}

    def reannounce_needed(self) -> bool:
        """Whether the index may lack blocks that a replica holds, which only the engines' re-announcements of
        their cache hits (``kv_cache_report_mode: "full"``) would bring back: a replica whose KV-event stream was
        not followed whole (from the engine's start or last cache clear, nothing lost or skipped), or one not
        known to be, and an index that may lose entries itself. ``report_mode_full: "auto"`` asks for the
        re-announcements only then."""
        if self.index_problem is not None and self.index_problem():
            return True
        # A replica that is not ready is not routed to; its stream is judged again when it is brought up.
        return any(not self._stream_complete(st) for st in self.replicas.values() if st.ready)

    def reannounce_requested(self) -> bool:
        """Whether the group's requests carry ``kv_cache_report_mode: "full"`` now (kv.report_mode_full)."""
        mode = self.options.report_mode_full
        return self.reannounce_needed() if mode == "auto" else bool(mode)

    async def _read_whole_streams(self) -> None:
        """Shared mode: which replicas' event streams the indexers followed whole (every ``<replica>#<rank>``
        stream they have applied). Unknown (a Redis error, an index without the marks) reads as not whole."""
        read = getattr(self.index, "whole_streams", None)
        if read is None:
            return
        try:
            streams: dict[str, bool] = await asyncio.wait_for(read(self.group), timeout=1.0)
        except Exception as exc:  # a Redis error or a hung Redis: as unknown, bounded
            log.debug("litellm-kv: %s: reading the indexers' stream marks failed: %s", self.group, exc)
            self.streams_complete = {}
            return
        out: dict[str, bool] = {}
        for name, whole in streams.items():
            replica = name.rpartition("#")[0] or name
            out[replica] = out.get(replica, True) and whole
        self.streams_complete = out

    def _stream_complete(self, st: ReplicaState) -> bool:
        if self.embedded:
            return bool(getattr(st.subscriber, "complete", False))
        return self.streams_complete.get(st.replica, False)

    # -- membership ---------------------------------------------------------------------------
    async def sync(self, deployments: list[dict[str, Any]]) -> None:
        """Add replicas for new deployments; purge and stop replicas that left the group."""
        seen: set[str] = set()
        for d in deployments:
            params = d.get("litellm_params") or {}
            api_base = params.get("api_base")
            if not api_base:
                continue
            rid = replica_id(api_base)
            seen.add(rid)
            if rid not in self.replicas:
                dep_id = str((d.get("model_info") or {}).get("id") or rid)
                base = api_base.rstrip("/")
                base = base[:-3] if base.endswith("/v1") else base
                st = ReplicaState(rid, dep_id, base, EngineClient(base, timeout=self.options.engine_timeout_s))
                self.replicas[rid] = st
                await self._bring_up(st, d)
        for rid in [r for r in self.replicas if r not in seen]:
            await self._remove(rid)
        self._refresh_exactness()

    async def _remove(self, rid: str) -> None:
        st = self.replicas.pop(rid)
        self.aging.forget(rid)
        if st.subscriber is not None:
            await st.subscriber.stop()
        await st.client.aclose()
        if self.embedded:
            await self.index.purge_replica(self.group, rid)
        REPLICA_READY.labels(self.group, rid).set(0)
        log.info("litellm-kv: replica %s left group %s; purged", rid, self.group)

    async def _bring_up(self, st: ReplicaState, deployment: dict[str, Any] | None = None) -> None:
        try:
            await self._scrape(st)
        except Exception as exc:
            st.error = f"metrics unreachable: {exc}"
            st.reachable = False
            st.ready = False
            REPLICA_READY.labels(self.group, st.replica).set(0)
            return
        if self.embedded and st.subscriber is None:
            try:
                await self._start_subscriber(st, deployment)
            except Exception as exc:
                st.error = f"no KV event source: {exc}"
                st.ready = False
                REPLICA_READY.labels(self.group, st.replica).set(0)
                log.warning("litellm-kv: %s: %s", st.replica, st.error)
                return
        await self._read_models(st)
        st.error = ""
        st.ready = True
        REPLICA_READY.labels(self.group, st.replica).set(1)

    async def _start_subscriber(self, st: ReplicaState, deployment: dict[str, Any] | None) -> None:
        from litellm_kv.vllm.subscriber import start_replica_subscribers

        info = ((deployment or {}).get("model_info") or {}).get("litellm_kv") or {}
        st.subscriber = await start_replica_subscribers(
            group=self.group,
            replica=st.replica,
            index=self.index,
            client=st.client,
            endpoint=info.get("kv_events_endpoint"),
            replay_endpoint=info.get("replay_endpoint"),
            topic=info.get("topic"),
            bind=bool(info.get("bind", False)),
            hasher_factory=self.hasher_for_checks,
            sample_every=self.options.exactness_sample_every,
            on_not_exact=functools.partial(self._mark_not_exact, st),
            on_purge=functools.partial(self._purged, st.replica),
        )

    def _purged(self, replica: str) -> None:
        if self.on_purge is not None:
            self.on_purge(replica)

    def _mark_not_exact(self, st: ReplicaState, why: str) -> None:
        if not st.not_exact:
            log.error("litellm-kv: replica %s of %s is not exact: %s", st.replica, self.group, why)
        st.not_exact = why
        self._refresh_exactness()

    # -- engine facts and load -------------------------------------------------------------------
    async def _scrape(self, st: ReplicaState) -> None:
        token = self.aging.scrape_started(st.replica)
        m = await st.client.metrics()
        st.block_size = m.block_size
        st.hash_algo = m.hash_algo
        st.prefix_caching = m.prefix_caching
        st.waiting = m.waiting
        st.running = m.running
        self.aging.scraped(st.replica, token)
        st.kv_usage = m.kv_usage
        st.last_scrape = time.time()
        st.reachable = True
        if m.timings and self.on_timings is not None:
            self.on_timings(st.replica, EngineTimings(*(m.timings.get(name, 0.0) for name in TIMING_SAMPLES)))
        if self.embedded:
            await self.index.heartbeat(self.group, st.replica, self.options.heartbeat_ttl_s)

    async def run(self) -> None:
        """Background loop: scrape load, retry replicas that are not ready, expire dead ones."""
        last_retry = 0.0
        while True:
            now = time.monotonic()
            for st in list(self.replicas.values()):
                if st.ready:
                    try:
                        await self._scrape(st)
                        st.error = ""
                    except Exception as exc:
                        # Engine down: leave it out of the choice until it answers again (retried below).
                        st.error = f"metrics unreachable: {exc}"
                        st.reachable = False
                        st.ready = False
                        REPLICA_READY.labels(self.group, st.replica).set(0)
                elif now - last_retry >= self.options.discovery_interval_s:
                    await self._bring_up(st)
            if now - last_retry >= self.options.discovery_interval_s:
                last_retry = now
                if self.embedded:
                    try:
                        await self.index.expire()
                    except Exception:
                        log.exception("litellm-kv: index expiry failed")
            if not self.embedded:
                await self._read_whole_streams()
            self._refresh_exactness()
            REANNOUNCE.labels(self.group).set(1 if self.reannounce_requested() else 0)
            await asyncio.sleep(self.options.scrape_interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name=f"litellm-kv-fleet-{self.group}")

    async def stop(self) -> None:
        await cancel_and_wait(self._task, Exception)
        for st in self.replicas.values():
            if st.subscriber is not None:
                await st.subscriber.stop()
            await st.client.aclose()

    # -- exactness ---------------------------------------------------------------------------------
    def _refresh_exactness(self) -> None:
        ready = [st for st in self.replicas.values() if st.ready]
        why = ""
        if not ready:
            why = "no ready replica"
        else:
            sizes = {st.block_size for st in ready}
            algos = {st.hash_algo for st in ready}
            want_bs, want_algo = self.options.block_size, self.options.hash_algo
            if None in sizes or None in algos:
                why = "a replica does not report vllm:cache_config_info"
            elif len(sizes) > 1 or len(algos) > 1:
                why = f"replicas disagree: block sizes {sorted(map(str, sizes))}, algorithms {sorted(map(str, algos))}"
            elif want_bs is not None and sizes != {want_bs}:
                why = f"configured block_size {want_bs} but engines report {sizes.pop()}"
            elif want_algo is not None and algos != {want_algo}:
                why = f"configured hash_algo {want_algo} but engines report {algos.pop()}"
            elif any(st.prefix_caching is False for st in ready):
                why = "prefix caching is off on a replica"
            else:
                bad = [f"{st.replica}: {st.not_exact}" for st in ready if st.not_exact]
                if bad:
                    why = "exactness check failed (" + "; ".join(bad) + ")"
        if why == "" and self._make_hasher() is None:
            why = "hash settings cannot be reproduced (xxhash without a hash_seed)"
        if why == "" and self.index_problem is not None:
            why = self.index_problem()
        if why != self.not_exact_why:
            if why:
                log.warning("litellm-kv: group %s routes load-only: %s", self.group, why)
            else:
                log.info("litellm-kv: group %s routes exactly", self.group)
        self.not_exact_why = why
        GROUP_EXACT.labels(self.group).set(0 if why else 1)

    def _make_hasher(self) -> BlockHasher | None:
        ready = [st for st in self.replicas.values() if st.ready and st.block_size and st.hash_algo]
        if not ready:
            return None
        algo = str(ready[0].hash_algo)
        bs = int(ready[0].block_size or 0)
        key = (algo, bs, self.options.hash_seed)
        if key != self._hasher_key:
            h = BlockHasher(algo=algo, block_size=bs, hash_seed=self.options.hash_seed)
            self._hasher = h if h.exact_possible else None
            self._hasher_key = key
        return self._hasher

    def hasher(self) -> BlockHasher | None:
        """The hasher for routing, or None when predictions cannot be exact (see ``not_exact_why``)."""
        return None if self.not_exact_why else self._make_hasher()

    def hasher_for_checks(self, block_size: int | None = None) -> BlockHasher | None:
        """A hasher for the exactness checker (ignores the group's current state)."""
        h = self._make_hasher()
        if h is not None and block_size is not None and block_size != h.block_size:
            return BlockHasher(algo=h.algo, block_size=block_size, hash_seed=self.options.hash_seed)
        return h

    def lora_path(self, name: str) -> str | None:
        if name in self.options.lora_paths:
            return self.options.lora_paths[name]
        for st in self.replicas.values():
            if name in st.lora_roots:
                return st.lora_roots[name]
        return None

    async def _read_models(self, st: ReplicaState) -> None:
        """Served names and LoRA adapters (with the path the engine resolved) from ``/v1/models``."""
        try:
            models = await st.client.models()
        except Exception as exc:
            # What was read before stays (a blip must not make an adapter look like the base model).
            log.warning("litellm-kv: %s: /v1/models unreadable (%s); keeping the %d models read before",
                        st.replica, exc, len(st.base_models) + len(st.lora_roots))
            return
        st.lora_roots = {m["id"]: m["root"] for m in models if m.get("parent") and isinstance(m.get("root"), str)}
        st.base_models = {str(m["id"]) for m in models if not m.get("parent") and m.get("id")}
        roots = {m["root"] for m in models if not m.get("parent") and isinstance(m.get("root"), str)}
        st.model_root = roots.pop() if len(roots) == 1 else None
        lengths = [m["max_model_len"] for m in models if isinstance(m.get("max_model_len"), int)
                   and not isinstance(m.get("max_model_len"), bool) and m["max_model_len"] > 0]
        st.max_model_len = max(lengths) if lengths else None

    def max_model_len(self) -> int | None:
        """The longest sequence any replica accepts (``None`` until one has said): a prompt with more tokens is
        refused by every engine, so there is no cache to route it to."""
        lengths = [st.max_model_len for st in self.replicas.values() if st.max_model_len]
        return max(lengths) if lengths else None

    def model_root(self) -> str | None:
        """The model path every replica's engine was started with (vLLM hashes image identifiers with it
        when a request carries processor kwargs); None unless the replicas that listed one agree."""
        roots = {st.model_root for st in self.replicas.values() if st.model_root is not None}
        return roots.pop() if len(roots) == 1 else None

    def adapter(self, model: str) -> tuple[tuple[str, str] | None, str]:
        """What the engine hashes a request for a deployment's LiteLLM ``model`` (``hosted_vllm/<served
        name>``) with: ``((name, path), "")`` for a LoRA adapter, ``(None, "")`` for a base model,
        ``(None, "unknown_model")`` when no replica lists the served name (an adapter loaded after start-up,
        a typo): hashing it as the base model could predict hits the engine will not have, so the caller
        routes by load, it is logged once, and ``/v1/models`` is read again (at most once per
        ``discovery_interval_s``). When no replica's model list could be read, nothing is judged."""
        names = list(dict.fromkeys((model.split("/", 1)[-1], model)))  # served name after the provider, or whole
        for name in names:
            path = self.lora_path(name)
            if path is not None:
                return (name, path), ""
        listed = [st for st in self.replicas.values() if st.base_models]
        if not listed or any(name in st.base_models for st in listed for name in names):
            return None, ""
        if names[0] not in self._unknown_logged:
            self._unknown_logged.add(names[0])
            log.warning("litellm-kv: %s: model %r is neither a base model nor a LoRA adapter that a replica's "
                        "/v1/models lists; its requests are routed by load until it is listed (or set "
                        "kv.lora_paths)", self.group, names[0])
        now = time.monotonic()
        if now - self._models_read >= self.options.discovery_interval_s:
            self._models_read = now
            for st in listed:
                spawn_held(self._refreshes, self._read_models(st))
        return None, "unknown_model"

    def status(self) -> dict[str, Any]:
        return {
            "model_group": self.group,
            "exact": not self.not_exact_why,
            "not_exact_why": self.not_exact_why or None,
            "mode": "embedded" if self.embedded else "shared",
            "reannounce": self.reannounce_requested(),
            "replicas": [{**st.status(), "stream_complete": self._stream_complete(st)}
                         for st in self.replicas.values()],
        }
