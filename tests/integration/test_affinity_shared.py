"""Shared mode: two real ``litellm`` proxy processes share affinity pins through a real redis-server.

Upstreams are the local fake deployments of :mod:`tests.integration.test_affinity_proxy` (no real provider is
reachable here). LiteLLM's built-in ``prompt_caching`` runs the same scenarios with the same Redis
(``router_settings.redis_host/redis_port``) for comparison; its rows are added to the printed table.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.test_affinity_proxy import (
    Fleet,
    affinity_config,
    builtin_config,
    burst,
    print_comparison,
    record,
    run_conversation,
    start_fleet,
)
from tools.harness.proxy import Proxy, start_proxies
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.proxy, pytest.mark.redis]


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def fleet() -> Iterator[Fleet]:
    f = start_fleet()
    yield f
    f.stop()


@pytest.fixture(scope="module")
def pairs(fleet: Fleet, redis_server: RedisServer) -> Iterator[dict[str, list[Proxy]]]:
    started: dict[str, list[Proxy]] = {"affinity": [], "builtin": []}
    try:
        # These tests measure pinning across proxies; a pin lookup past the routing deadline falls back to
        # LiteLLM's choice (tested in test_redis_faults.py), which two proxies on 2 cores can cause.
        ours = affinity_config(fleet, {"mode": "shared", "redis_url": redis_server.url,
                                       "redis_routing": {"deadline_ms": 500}})
        theirs = builtin_config(fleet)
        theirs["router_settings"].update({"redis_host": "127.0.0.1", "redis_port": redis_server.port})
        names = [f"litellm-{kind}-shared-{i}" for i in range(2) for kind in ("affinity", "builtin")]
        a0, b0, a1, b1 = start_proxies([ours, theirs, ours, theirs], names)
        started = {"affinity": [a0, a1], "builtin": [b0, b1]}
        yield started
    finally:
        for group in started.values():
            for p in group:
                p.stop()


KINDS = ("affinity", "builtin")


@pytest.mark.parametrize("kind", KINDS)
async def test_conversation_alternating_between_proxies_stays_on_one_deployment(
    kind: str, fleet: Fleet, pairs: dict[str, list[Proxy]], redis_server: RedisServer
) -> None:
    fleet.reset()
    result = await run_conversation(pairs[kind], 10, seed=11)
    record("shared: 10 turns alternating 2 proxies", kind, result)
    assert all(t.status == 200 for t in result.turns)
    if kind == "affinity":
        assert len(set(result.deployments)) == 1, result.deployments
        assert [t.affinity for t in result.turns] == ["new"] + ["hit"] * 9
        assert any(k.startswith(b"litellm_kv:affinity:{conv}:") for k in redis_server.client().keys("*"))


@pytest.mark.parametrize("kind", KINDS)
async def test_concurrent_first_requests_split_across_proxies_land_on_one_deployment(
    kind: str, fleet: Fleet, pairs: dict[str, list[Proxy]]
) -> None:
    fleet.reset()
    result = await burst(pairs[kind], 20, seed=12)
    record("shared: 20 concurrent first, 2 proxies", kind, result)
    assert all(t.status == 200 for t in result.turns)
    if kind == "affinity":
        assert len(set(result.deployments)) == 1, result.deployments
        assert sorted(t.affinity or "" for t in result.turns) == ["hit"] * 19 + ["new"]


def test_print_shared_comparison() -> None:
    """Prints every scenario recorded in this run, shared ones included (run with -s)."""
    print_comparison()
