"""Bounded waits on the routing path: the deadline and circuit breaker of :class:`RedisGuard`.

The breaker's state machine is driven alone with an injected clock (its transitions need minutes of
wall time otherwise).
"""

from __future__ import annotations

import asyncio

import pytest

from litellm_kv.config import RedisRoutingSettings, Settings, parse_section
from litellm_kv.errors import ConfigError
from litellm_kv.redis_client import RedisGuard, RedisSkipped, RedisUse


def limits(cooldown_s: float = 60.0) -> RedisRoutingSettings:
    return RedisRoutingSettings(deadline_ms=50.0, breaker_failures=3, breaker_cooldown_s=cooldown_s)


async def test_breaker_transitions_with_an_injected_clock() -> None:
    now = [0.0]
    guard = RedisGuard(RedisUse.INDEX, limits(cooldown_s=2.0), clock=lambda: now[0])

    async def fails() -> None:
        raise ConnectionError("refused")

    async def answers() -> str:
        return "ok"

    for _ in range(2):
        with pytest.raises(ConnectionError):
            await guard.run(fails)
    assert guard.state == "closed"
    assert await guard.run(answers) == "ok"  # a success resets the count of failures in a row
    for _ in range(3):
        with pytest.raises(ConnectionError):
            await guard.run(fails)
    assert guard.state == "open"
    now[0] = 1.9
    with pytest.raises(RedisSkipped):
        await guard.run(answers)
    now[0] = 2.0
    gate = asyncio.Event()

    async def slow_probe() -> str:
        await gate.wait()
        return "ok"

    probe = asyncio.create_task(guard.run(slow_probe))
    await asyncio.sleep(0)
    assert guard.state == "half_open"
    with pytest.raises(RedisSkipped):  # one probe at a time
        await guard.run(answers)
    gate.set()
    assert await probe == "ok" and guard.state == "closed"


def test_redis_routing_settings_are_validated() -> None:
    assert parse_section(Settings, {}, "litellm_kv").redis_routing.deadline_ms == 50.0
    for bad in ({"deadline_ms": 0}, {"breaker_failures": 0}, {"breaker_cooldown_s": -1}):
        with pytest.raises(ConfigError, match="redis_routing"):
            parse_section(Settings, {"redis_routing": bad}, "litellm_kv")
