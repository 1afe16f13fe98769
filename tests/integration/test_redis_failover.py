"""Shared mode through a Redis Cluster (3 masters + 3 replicas) and through a Sentinel-managed master, with
the master holding the group's keys killed mid-run: real vLLM CPU replicas, a real ``litellm-kv indexer``
and a real ``litellm`` proxy, all talking to real redis-servers.

What must hold: routing is exact through either before the kill; no request fails while the replica is
promoted (decisions fall back to load-only meanwhile, ``index_unavailable``); routing is exact again
within a bounded time after the kill, on what the replica held (a prefix cached before the kill) and on
what the indexer writes after it (a new prefix, sent twice). The times printed here are the figures of
docs/operations.md ("Redis Cluster and Sentinel").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from litellm_kv.config import RedisSettings
from litellm_kv.index.redis import group_key_prefix
from tests.integration.test_routing_e2e import KV, _config, _metric
from tools.harness.engines import EngineReplica
from tools.harness.indexer import redis_config, running_indexer
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxy
from tools.harness.redis_cluster import Node, RedisClusterServers, RedisSentinelServers

pytestmark = [pytest.mark.engine, pytest.mark.proxy, pytest.mark.redis, pytest.mark.slow]
HEADERS = {"Authorization": f"Bearer {MASTER_KEY}"}
RECOVERY_LIMIT_S = 60.0
USERS = 3  # other users sending one request after another during the failover


@contextmanager
def _shared_stack(target: RedisSettings, engines: list[EngineReplica], engine_model: Any,
                  name: str) -> Iterator[Proxy]:
    with running_indexer(target, {KV: [e.api_base for e in engines]}, f"indexer-{name}"):
        cfg = _config(engines, str(engine_model))
        cfg["litellm_kv"]["mode"] = "shared"
        cfg["litellm_kv"]["redis"] = redis_config(target)
        # Two engines, an indexer, a proxy and six redis-servers share 2 cores: a lookup may take longer than
        # the default 50 ms deadline with Redis healthy (that path is tested in test_redis_faults.py).
        cfg["litellm_kv"]["redis_routing"] = {"deadline_ms": 500, "breaker_cooldown_s": 1.0}
        proxy = start_proxy(cfg, name=f"proxy-{name}")
        try:
            assert proxy.wait_kv_exact(KV, 90)["mode"] == "shared"
            yield proxy
        finally:
            proxy.stop()


def _counts(proxy: Proxy) -> tuple[float, float, float, float]:
    """(exact prediction checks, predicted cached tokens, engine-reported cached tokens, index_unavailable
    fallbacks) so far."""
    checks = _metric(proxy, "litellm_kv_prediction_checks_total")
    predicted = _metric(proxy, "litellm_kv_predicted_cached_tokens_total")
    actual = _metric(proxy, "litellm_kv_actual_cached_tokens_total")
    fallbacks = _metric(proxy, "litellm_kv_routing_fallbacks_total")
    return (sum(v for k, v in checks.items() if 'outcome="exact"' in k), sum(predicted.values()),
            sum(actual.values()), sum(v for k, v in fallbacks.items() if 'why="index_unavailable"' in k))


def _ask(proxy: Proxy, prefix: str, tag: str) -> tuple[int, bool]:
    """One chat request; (status, whether it was routed on a predicted hit that the engine confirmed).

    Other requests may run meanwhile; their prompts differ from their first block on (no cached tokens,
    none predicted), so the token counters' deltas are this request's."""
    before = _counts(proxy)
    body = {"model": KV, "max_tokens": 2, "temperature": 0, "messages": [
        {"role": "system", "content": prefix}, {"role": "user", "content": tag}]}
    r = httpx.post(f"{proxy.url}/v1/chat/completions", json=body, headers=HEADERS, timeout=120)
    if r.status_code != 200:
        return r.status_code, False
    cached = int((r.json().get("usage") or {}).get("prompt_tokens_details", {}).get("cached_tokens") or 0)
    if cached == 0:
        return 200, False
    deadline = time.monotonic() + 3.0  # the check is counted after the response went out
    after = _counts(proxy)
    while after[2] - before[2] < cached and time.monotonic() < deadline:
        time.sleep(0.05)
        after = _counts(proxy)
    return 200, after[0] > before[0] and after[1] - before[1] == cached


def _until_exact(proxy: Proxy, prefix: str, limit_s: float, codes: list[int]) -> float | None:
    """Send requests with ``prefix`` until one is an exact predicted hit; seconds it took, or None."""
    t0 = time.monotonic()
    i = 0
    while time.monotonic() - t0 < limit_s:
        code, exact = _ask(proxy, prefix, f"question {i}")
        codes.append(code)
        i += 1
        if exact:
            return time.monotonic() - t0
        time.sleep(0.1)
    return None


def _drill(proxy: Proxy, kill: Callable[[], None], failed_over: Callable[[], float], label: str) -> None:
    prefix = f"{label} failover drill, shared prefix. " * 40
    codes: list[int] = []
    assert _until_exact(proxy, prefix, 60, codes) is not None, "routing never exact before the kill"
    fallbacks_before = _counts(proxy)[3]

    # Other users' traffic goes on meanwhile (its own prompts, one request at a time).
    background: list[int] = []
    stop = threading.Event()

    def other_users(user: int) -> None:
        with httpx.Client(timeout=120) as c:
            i = 0
            while not stop.is_set():
                body = {"model": KV, "max_tokens": 2, "temperature": 0,
                        "messages": [{"role": "user", "content": f"{label} user {user} request {i} " * 20}]}
                background.append(c.post(f"{proxy.url}/v1/chat/completions", json=body, headers=HEADERS).status_code)
                i += 1

    promoted: list[float] = []
    senders = [threading.Thread(target=other_users, args=(u,), daemon=True) for u in range(USERS)]
    for sender in senders:
        sender.start()
    kill()
    t_kill = time.monotonic()
    watcher = threading.Thread(target=lambda: promoted.append(failed_over()), daemon=True)
    watcher.start()
    during: list[int] = []
    fresh: list[int] = []
    try:
        took = _until_exact(proxy, prefix, RECOVERY_LIMIT_S, during)
        watcher.join(RECOVERY_LIMIT_S)
        fallbacks = _counts(proxy)[3] - fallbacks_before
        # What the indexer writes after the failover reaches the new master: a new prefix is predicted.
        took_new = _until_exact(proxy, f"{label} after the failover, new prefix. " * 40, 30, fresh)
    finally:
        stop.set()
        for sender in senders:
            sender.join(130)
    print(f"\n{label}: replica promoted {promoted[0] if promoted else float('nan'):.1f}s after the kill; "
          f"routing exact again {took if took is not None else float('nan'):.1f}s after the kill "
          f"({len(during)} probe and {len(background)} other requests meanwhile, {fallbacks:.0f} load-only "
          f"index_unavailable decisions); "
          f"a new prefix exact after {len(fresh)} requests ({took_new}s); status codes {sorted(set(during + fresh))}; "
          f"measured from the kill at t={t_kill:.1f}")
    assert set(codes + during + fresh + background) == {200}, "a user request failed during the failover"
    assert promoted, "the replica was never promoted"
    assert took is not None, f"routing not exact within {RECOVERY_LIMIT_S}s of the kill"
    assert took_new is not None, "blocks stored after the failover were never predicted"


def test_cluster_master_killed(engines: list[EngineReplica], engine_model: Any,
                               redis_cluster: RedisClusterServers) -> None:
    redis_cluster.flushall()
    victim: list[Node] = []

    def kill() -> None:
        node = redis_cluster.master_for(group_key_prefix(KV) + "blocks")
        victim.append(node)
        node.kill()

    try:
        with _shared_stack(redis_cluster.settings(), engines, engine_model, "cluster") as proxy:
            _drill(proxy, kill, lambda: redis_cluster.wait_healthy(RECOVERY_LIMIT_S, masters=3), "cluster")
    finally:
        for node in victim:  # back as a replica of the promoted one: the session's cluster is whole again
            node.start()
        redis_cluster.wait_healthy(60, masters=3, replicas=3)


def test_sentinel_master_killed(engines: list[EngineReplica], engine_model: Any,
                                redis_sentinel: RedisSentinelServers) -> None:
    redis_sentinel.flushall()
    victim: list[Node] = []

    def kill() -> None:
        node = redis_sentinel.master()
        victim.append(node)
        node.kill()

    try:
        with _shared_stack(redis_sentinel.settings(), engines, engine_model, "sentinel") as proxy:
            _drill(proxy, kill, lambda: redis_sentinel.wait_failover(victim[0], RECOVERY_LIMIT_S), "sentinel")
    finally:
        for node in victim:  # the sentinels turn it into a replica of the new master
            node.start()
        redis_sentinel.wait_replicated(60)
