"""Checks of what shared mode adds: Redis reachable, and an indexer feeding every replica (its heartbeat in
Redis, and each ``--indexer`` URL's ``/health``); and of every Redis the stores use, whether it deletes their
keys when full (:mod:`litellm_kv.redis_eviction`)."""

from __future__ import annotations

import httpx
from redis.exceptions import RedisError

from litellm_kv.config import REDIS_SOURCES, RedisSettings
from litellm_kv.doctor.deployment import DeploymentPlan
from litellm_kv.doctor.report import Report, Status
from litellm_kv.index.redis import RedisIndex
from litellm_kv.redis_eviction import FIX, watch

FIX_INDEXER = ("run `litellm-kv indexer --config indexer.yaml` with this replica's api_base under the group "
               "(docs/indexer.md); at least two for availability")


async def check_redis(plan: DeploymentPlan, report: Report, *, timeout_s: float) -> None:
    settings = plan.settings
    redis = settings.redis_for("index")
    shared = settings.mode == "shared"
    if redis is None:
        if shared:
            report.add("redis.configured", "redis", Status.ERROR, "mode: shared but no Redis configured",
                       f"set {REDIS_SOURCES}")
        return
    url = _describe(redis)
    index = RedisIndex(redis, socket_timeout_s=timeout_s, auto_sweep=False)
    try:
        try:
            await index.ping()
        except (RedisError, OSError) as exc:
            report.add("redis.reachable", "redis", Status.ERROR, f"{url}: {type(exc).__name__}: {exc}",
                       "check litellm_kv.redis, that Redis runs and that this host may reach it")
            return
        report.add("redis.reachable", "redis", Status.OK, f"{url} answers PING")
        if not shared:
            return
        for group in plan.groups:
            beats = await index.heartbeats(group.name)
            for rid in group.replicas():
                target = f"{group.name}/{rid}"
                left = beats.get(rid)
                if left is None:
                    report.add("indexer.heartbeat", target, Status.ERROR,
                               "no indexer heartbeat in Redis: no indexer follows this replica", FIX_INDEXER)
                elif left <= 0:
                    report.add("indexer.heartbeat", target, Status.ERROR,
                               f"the last indexer heartbeat expired {-left:.0f}s ago (indexer down, or the engine "
                               "does not answer it)", FIX_INDEXER)
                else:
                    report.add("indexer.heartbeat", target, Status.OK,
                               f"fed by an indexer (heartbeat valid {left:.0f}s)")
    finally:
        await index.close()


async def check_indexers(urls: list[str], report: Report, *, timeout_s: float) -> None:
    async with httpx.AsyncClient(timeout=timeout_s) as http:
        for url in urls:
            base = url.rstrip("/")
            try:
                resp = await http.get(base + "/health")
                status = resp.json().get("status") if resp.headers.get("content-type", "").startswith(
                    "application/json") else None
            except (httpx.HTTPError, ValueError) as exc:
                report.add("indexer.health", base, Status.ERROR, f"GET /health failed: {type(exc).__name__}: {exc}",
                           "check the indexer's address and that it runs")
                continue
            if resp.status_code == 200 and status == "ok":
                report.add("indexer.health", base, Status.OK, "status ok")
            else:
                report.add("indexer.health", base, Status.ERROR, f"HTTP {resp.status_code}, status {status!r}",
                           "read the indexer's /health with its token (replicas not exact or not connected) and "
                           "its log")


def _describe(target: RedisSettings) -> str:
    """Where the Redis is, for a report line (no password)."""
    if target.url:
        return _safe(target.url)
    if target.cluster_nodes:
        return "cluster " + ",".join(target.cluster_nodes)
    if target.sentinel is not None:
        return f"sentinel master {target.sentinel.master}"
    return "redis"


def _safe(url: str) -> str:
    """A Redis URL without its password."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return scheme + sep + rest


async def check_eviction(plan: DeploymentPlan, report: Report) -> None:
    """Each Redis a store of the config keeps its state in: whether it may delete that state when full (a
    warning) and whether it has (an error: the proxy then refuses the budgets kept there, and routes a shared
    index there by load)."""
    # One watch per Redis, however many stores use it, as the proxy keeps them.
    watches = {id(w): w for w in (watch(p.redis, p.use) for p in plan.settings.stores() if p.redis is not None)}
    for w in watches.values():
        where = _describe(w.target) if isinstance(w.target, RedisSettings) else w.where
        e = await w.refresh()
        if e is None:
            report.add("redis.eviction", where, Status.WARN, f"INFO could not be read: {w.error}",
                       "check that the proxy's Redis user may run INFO")
            continue
        uses = ", ".join(sorted(w.uses))
        at_risk = sorted(u for u in w.uses if e.may_evict(u))
        problems = [w.problem(u) for u in sorted(w.uses) if w.problem(u)]
        if problems:
            report.add("redis.eviction", where, Status.ERROR, "; ".join(problems), FIX)
        elif at_risk:
            report.add("redis.eviction", where, Status.WARN,
                       f"maxmemory-policy {e.policy} with maxmemory {e.maxmemory} bytes: once full it deletes keys of "
                       f"{', '.join(at_risk)} (none evicted yet)", FIX)
        else:
            limit = f"maxmemory {e.maxmemory} bytes" if e.maxmemory else "no maxmemory"
            report.add("redis.eviction", where, Status.OK, f"keeps the keys of {uses}: maxmemory-policy {e.policy}, "
                       f"{limit}")
