"""Redis faults in shared mode, through a real ``litellm`` proxy process: a real redis-server fed by a real
``litellm-kv indexer`` from the two real vLLM CPU replicas (session fixture), paused with SIGSTOP (it accepts
connections and never answers: the case that used to hold every KV-routed request for the 5 s socket
timeout), then resumed; stopped, then restarted.

What a user would notice, per phase: no request fails because of the extension, each request's added
latency stays within ``redis_routing.deadline_ms`` (most add nothing: the breaker skips Redis after
``breaker_failures`` late answers), and routing reads Redis again soon after it is back. The figures are
printed (docs/troubleshooting.md keeps them, with the command). Requests ask for one token, so the engines
do little work.
"""

from __future__ import annotations

import asyncio
import os
import signal
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.test_routing_e2e import HEADERS, KV, _config, _health, _metric
from tests.integration.test_routing_shared import _wait_indexer
from tools.harness.engines import EngineReplica
from tools.harness.indexer import running_indexer
from tools.harness.proxy import Proxy, start_proxy
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.engine, pytest.mark.proxy, pytest.mark.redis]

DEADLINE_MS = 50.0  # litellm_kv.redis_routing.deadline_ms: the documented default, not set in the config
# Headroom for a machine whose cores are shared with the engines and other work; far below the 5 s a
# paused Redis added to every request before the deadline.
SLACK_S = 1.0
N = 12


@pytest.fixture(scope="module")
def redis_srv() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-faults")
    try:
        yield srv
    finally:
        if srv.proc is not None and srv.proc.alive():
            os.kill(srv.proc.pid, signal.SIGCONT)  # never leave it stopped: stop() would wait on it
        srv.stop()


@pytest.fixture(scope="module")
def indexer(redis_srv: RedisServer, engines: list[EngineReplica]) -> Iterator[str]:
    with running_indexer(redis_srv.url, {KV: [e.api_base for e in engines]}, "indexer-redis-faults") as url:
        yield url


@pytest.fixture(scope="module")
def proxy(engines: list[EngineReplica], engine_model: Any, redis_srv: RedisServer, indexer: str) -> Iterator[Proxy]:
    cfg = _config(engines, str(engine_model), groups=(KV,))
    cfg["litellm_kv"]["mode"] = "shared"
    cfg["litellm_kv"]["redis_url"] = redis_srv.url
    p = start_proxy(cfg, name="redis-faults-proxy")
    try:
        p.wait_kv_exact(KV, 90)
        yield p
    finally:
        p.stop()


def _send(proxy: Proxy, n: int, tag: str) -> list[tuple[int, float]]:
    """(status, seconds) of ``n`` requests sent one after another (each latency is its own)."""

    async def go() -> list[tuple[int, float]]:
        out = []
        async with httpx.AsyncClient(timeout=60) as c:
            for i in range(n):
                body = {"model": KV, "max_tokens": 1, "temperature": 0, "messages": [
                    {"role": "system", "content": "redis fault drill " * 60},
                    {"role": "user", "content": f"{tag} {i % 3}"}]}
                t0 = time.perf_counter()
                r = await c.post(f"{proxy.url}/v1/chat/completions", json=body, headers=HEADERS)
                out.append((r.status_code, time.perf_counter() - t0))
        return out

    return asyncio.run(go())


def _breakers(proxy: Proxy) -> dict[str, dict[str, Any]]:
    return {f"{s['use']}:{s['scope']}": s for s in _health(proxy).get("redis", [])}


def _fallbacks(proxy: Proxy) -> float:
    return sum(v for k, v in _metric(proxy, "litellm_kv_routing_fallbacks_total").items()
               if 'why="index_unavailable"' in k)


def _recovery(proxy: Proxy, since: float, timeout: float = 30.0) -> float:
    """Seconds from ``since`` until a request's lookup is answered by Redis again (index breaker closed and
    no new index_unavailable fallback), with requests flowing meanwhile (only they probe)."""
    deadline = since + timeout
    while time.monotonic() < deadline:
        before = _fallbacks(proxy)
        assert [code for code, _ in _send(proxy, 1, "recovery")] == [200]
        if _breakers(proxy)["index:"]["state"] == "closed" and _fallbacks(proxy) == before:
            return time.monotonic() - since
        time.sleep(0.1)
    raise AssertionError(f"routing did not read Redis again within {timeout}s: {_breakers(proxy)}")


def _row(phase: str, timings: list[tuple[int, float]], base_p50: float) -> str:
    secs = [s for _, s in timings]
    p50, worst = statistics.median(secs), max(secs)
    return (f"{phase:<18} n={len(secs):>3}  p50 {p50 * 1000:7.1f} ms  max {worst * 1000:7.1f} ms  "
            f"added p50 {(p50 - base_p50) * 1000:+7.1f} ms  added max {(worst - base_p50) * 1000:+7.1f} ms")


def _check(timings: list[tuple[int, float]], base: list[tuple[int, float]]) -> None:
    assert [code for code, _ in timings] == [200] * len(timings), "a request failed during the Redis fault"
    base_max = max(s for _, s in base)
    worst = max(s for _, s in timings)
    assert worst <= base_max + DEADLINE_MS / 1000 + SLACK_S, (
        f"a request took {worst:.3f}s (baseline max {base_max:.3f}s)")


def test_paused_redis_adds_at_most_the_deadline_and_recovery_after_resume(
    proxy: Proxy, redis_srv: RedisServer, indexer: str,
) -> None:
    _send(proxy, 3, "warm-up")
    base = _send(proxy, N, "baseline")
    base_p50 = statistics.median(s for _, s in base)
    assert redis_srv.proc is not None
    before = _fallbacks(proxy)
    os.kill(redis_srv.proc.pid, signal.SIGSTOP)
    try:
        paused = _send(proxy, N, "paused")
        breakers = _breakers(proxy)
    finally:
        os.kill(redis_srv.proc.pid, signal.SIGCONT)
        resumed_at = time.monotonic()
    print("\n" + _row("baseline", base, base_p50) + "\n" + _row("redis paused", paused, base_p50))
    _check(paused, base)
    took = _recovery(proxy, resumed_at)
    print(f"index breaker while paused: {breakers['index:']}")
    print(f"lookups answered by Redis again {took:.2f}s after SIGCONT")
    assert _fallbacks(proxy) - before >= N, "paused decisions must be counted as load-only fallbacks"
    assert breakers["index:"]["deadline_exceeded"] >= 1 and breakers["index:"]["skipped"] >= 1
    _wait_indexer(indexer)


def test_stopped_redis_adds_at_most_the_deadline_and_recovery_after_restart(
    proxy: Proxy, redis_srv: RedisServer, indexer: str,
) -> None:
    base = _send(proxy, N, "baseline-2")
    base_p50 = statistics.median(s for _, s in base)
    redis_srv.stop()
    try:
        stopped = _send(proxy, N, "stopped")
        breakers = _breakers(proxy)
    finally:
        redis_srv.start()
        restarted_at = time.monotonic()
    print("\n" + _row("baseline", base, base_p50) + "\n" + _row("redis stopped", stopped, base_p50))
    _check(stopped, base)
    took = _recovery(proxy, restarted_at)
    indexer_took = _wait_indexer(indexer)
    print(f"index breaker while stopped: {breakers['index:']}")
    print(f"lookups answered by Redis again {took:.2f}s after restart; indexer healthy {indexer_took:.1f}s later")
    assert breakers["index:"]["state"] in ("open", "half_open")
