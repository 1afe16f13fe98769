"""The worker count read from the environment and what a configuration keeps per worker (in process; the
proxy-level cases, with three real workers, are in ``test_proxy_workers.py``)."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

import pytest

from litellm_kv.config import Settings, parse_section
from litellm_kv.governance.budgets import (
    BudgetStoreUnfit,
    MemoryPeriodBudgets,
    Period,
    RedisPeriodBudgets,
    UnsharedPeriodBudgets,
    make_period_budgets,
)
from litellm_kv.integration.workers import Workers, budgets_not_shared_why, proxy_workers, unshared_state


@pytest.mark.parametrize(("env", "count", "source"), [
    ({}, 1, ""),
    ({"NUM_WORKERS": "1"}, 1, "NUM_WORKERS"),
    ({"NUM_WORKERS": "4"}, 4, "NUM_WORKERS"),
    ({"NUM_WORKERS": " 3 "}, 3, "NUM_WORKERS"),
    # LiteLLM's command line sets NUM_WORKERS for the server it starts: it decides over WEB_CONCURRENCY.
    ({"NUM_WORKERS": "1", "WEB_CONCURRENCY": "8"}, 1, "NUM_WORKERS"),
    ({"WEB_CONCURRENCY": "8"}, 8, "WEB_CONCURRENCY"),
    ({"NUM_WORKERS": "", "WEB_CONCURRENCY": "2"}, 2, "WEB_CONCURRENCY"),
    # Unreadable or absurd: counted as several, since what depends on it is a limit that must not multiply.
    ({"NUM_WORKERS": "four"}, 2, "NUM_WORKERS"),
    ({"NUM_WORKERS": "0"}, 2, "NUM_WORKERS"),
    ({"NUM_WORKERS": "-3"}, 2, "NUM_WORKERS"),
])
def test_the_worker_count_comes_from_the_environment(env: dict[str, str], count: int, source: str) -> None:
    w = proxy_workers(env)
    assert (w.count, w.source) == (count, source)
    if source:
        assert w.describe().endswith(f"({source}={env[source].strip()})")


def _settings(**section: Any) -> Settings:
    return parse_section(Settings, section, "litellm_kv")


REASONING = {"reasoning": {"style": "vllm"}}
VISION = {"vision": {"family": "qwen2_vl"}}
KV = {"routing": "kv"}
AFFINITY = {"routing": "affinity"}
SEVERAL = Workers(4, "NUM_WORKERS")


@pytest.mark.parametrize(("section", "expected"), [
    ({"model_groups": {"r": REASONING}}, ["period_budgets"]),
    ({"model_groups": {"v": VISION}}, ["period_budgets"]),
    ({"redis_url": "redis://127.0.0.1:1/0", "model_groups": {"r": REASONING}}, []),
    ({"budgets": {"redis": {"url": "redis://127.0.0.1:1/0"}}, "model_groups": {"r": REASONING}}, []),
    ({"model_groups": {"q": KV}}, ["kv_load"]),
    # Embedded mode counts the load in the process even with a Redis configured.
    ({"redis_url": "redis://127.0.0.1:1/0", "model_groups": {"q": KV}}, ["kv_load"]),
    ({"mode": "shared", "redis_url": "redis://127.0.0.1:1/0", "model_groups": {"q": KV}}, []),
    ({"model_groups": {"a": AFFINITY}}, ["affinity_pins"]),
    ({"redis_url": "redis://127.0.0.1:1/0", "model_groups": {"a": AFFINITY}}, []),
    ({"redis_url": "redis://127.0.0.1:1/0", "model_groups": {"a": {**AFFINITY, "affinity": {"store": "memory"}}}},
     ["affinity_pins"]),
    ({"model_groups": {"q": {**KV, **REASONING}, "a": AFFINITY}}, ["period_budgets", "kv_load", "affinity_pins"]),
    ({"model_groups": {"plain": {"routing": "none"}}}, []),
])
def test_what_several_workers_keep_for_themselves(section: dict[str, Any], expected: list[str]) -> None:
    settings = _settings(**section)
    assert unshared_state(settings, SEVERAL) == expected
    assert unshared_state(settings, Workers(1)) == []


def test_period_budgets_of_several_workers_without_a_redis_refuse_every_call() -> None:
    """Whatever on_store_error says: this is not an outage to fail open through."""
    why = budgets_not_shared_why(SEVERAL)
    store = make_period_budgets(None, unshared_why=why)
    assert isinstance(store, UnsharedPeriodBudgets)
    now = datetime.now(timezone.utc)

    async def calls() -> None:
        for call in (store.check("key:a", "reasoning_tokens", Period.DAY, 100, now=now),
                     store.reserve("key:a", "reasoning_tokens", Period.DAY, 100, 10, "h", now=now),
                     store.charge("key:a", "reasoning_tokens", Period.DAY, 10, now=now),
                     store.settle("key:a", "reasoning_tokens", Period.DAY, "h", 10, now=now),
                     store.release("key:a", "reasoning_tokens", Period.DAY, "h", now=now)):
            with pytest.raises(BudgetStoreUnfit, match="4 worker processes"):
                await call

    asyncio.run(calls())
    with pytest.raises(BudgetStoreUnfit):
        store.fail_open_hold("key:a", "reasoning_tokens", Period.DAY, 100, 10, "h", now)
    # One worker, or a Redis: the stores as before.
    assert isinstance(make_period_budgets(None), MemoryPeriodBudgets)
    shared = make_period_budgets("redis://127.0.0.1:1/0", unshared_why=why)
    assert isinstance(shared, RedisPeriodBudgets)
    asyncio.run(shared.close())


def test_where_each_store_keeps_its_state() -> None:
    """``Settings.stores()``: what the worker report and the Redis eviction watch are built from."""
    url = "redis://127.0.0.1:1/0"
    budgets_own = {"url": "redis://127.0.0.1:2/0"}
    settings = _settings(mode="shared", redis_url=url, budgets={"redis": budgets_own}, model_groups={
        "q": {**KV, **REASONING}, "a": AFFINITY, "m": {**AFFINITY, "affinity": {"store": "memory"}}})
    places = [(p.use, p.redis.url if p.redis else None) for p in settings.stores()]
    assert places == [("budgets", "redis://127.0.0.1:2/0"), ("index", url), ("load", url), ("pins", None),
                      ("pins", url)]
    embedded = _settings(model_groups={"q": KV})
    assert [(p.use, p.redis) for p in embedded.stores()] == [("index", None), ("load", None)]
    assert _settings(model_groups={"plain": {"routing": "none"}}).stores() == []
