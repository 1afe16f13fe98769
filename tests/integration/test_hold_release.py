"""Budget holds are given back at once when the call they were taken for will not run: a later handler
refuses it, a handler fails, the request is cancelled (the client went away), or LiteLLM gives up on
it (``async_post_call_failure_hook``). Before, only LiteLLM's failure event released them, so a hold
taken by vision stayed until ``hold_ttl_s`` when reasoning then refused the request.

The callback is called as LiteLLM 1.110 calls it, with the real vision and reasoning handlers, on
both budget stores: the proxy's memory and a real redis-server (the limit protected throughout is
``vision.tokens_per_day``: a refused request must not make the key's budget look spent).
"""

from __future__ import annotations

import asyncio
import base64
import io
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timezone
from typing import Any

import pytest
from litellm.proxy._types import ProxyException, UserAPIKeyAuth
from PIL import Image

from litellm_kv.config import Settings, parse_section
from litellm_kv.governance.budgets import MemoryPeriodBudgets, Period, PeriodBudgets, RedisPeriodBudgets
from litellm_kv.integration.callback import LiteLLMKV
from litellm_kv.integration.hooks import Handler, ProxyRequest
from litellm_kv.integration.reasoning_hooks import ReasoningHandler
from litellm_kv.integration.vision_hooks import VisionHandler
from tools.harness.redis_server import RedisServer

DAY_LIMIT = 100_000


def _settings() -> Settings:
    groups = {"g": {
        "vision": {"family": "qwen2_5_vl", "tokens_per_day": DAY_LIMIT},
        "reasoning": {"style": "vllm", "max_budget": 5, "over_max": "reject", "tokens_per_day": DAY_LIMIT},
    }}
    return parse_section(Settings, {"model_groups": groups}, "litellm_kv")


def _png(w: int, h: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 10, 10)).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _request(**extra: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": _png(56, 56)}}]
    return {"model": "g", "messages": [{"role": "user", "content": content}],
            "litellm_call_id": uuid.uuid4().hex, **extra}


CALLER = UserAPIKeyAuth(api_key="sk-release", token="tok-release")
SCOPE = f"key:{CALLER.token}"  # the key's budget scope (LiteLLM hashes the token it is given)


class Recording:
    """The store, counting the tokens each reservation was granted (so a test knows a hold was taken)."""

    def __init__(self, inner: PeriodBudgets) -> None:
        self.inner = inner
        self.granted: list[tuple[str, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def reserve(self, scope: str, meter: str, *args: Any, **kwargs: Any) -> Any:
        held = await self.inner.reserve(scope, meter, *args, **kwargs)
        self.granted.append((meter, held.granted))
        return held


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-hold-release")
    yield srv
    srv.stop()


@pytest.fixture(params=["memory", "redis"])
async def budgets(request: pytest.FixtureRequest) -> AsyncIterator[PeriodBudgets]:
    if request.param == "memory":
        yield Recording(MemoryPeriodBudgets())  # type: ignore[misc]
        return
    srv: RedisServer = request.getfixturevalue("redis_server")
    store = RedisPeriodBudgets(srv.url, prefix=f"release-{uuid.uuid4().hex[:8]}")
    yield Recording(store)  # type: ignore[misc]
    await store.close()


async def _held(budgets: PeriodBudgets, meter: str = "visual_tokens") -> int:
    """What is held on the key's day budget, once the spawned releases had their turn."""
    for _ in range(100):
        state = await budgets.check(SCOPE, meter, Period.DAY, DAY_LIMIT, now=datetime.now(timezone.utc))
        if state.held == 0:
            return 0
        await asyncio.sleep(0.01)
    return state.held


class Refuses(Handler):
    """A handler after vision whose pre_call fails with a bug (the callback fails closed on it)."""

    name = "reasoning"
    fails_closed = True

    async def pre_call(self, req: ProxyRequest) -> None:
        raise KeyError("a bug while deciding")


class Waits(Handler):
    """A handler after vision that waits (on a store, say) until the request is cancelled."""

    name = "waits"

    def __init__(self, s: Settings) -> None:
        super().__init__(s)
        self.entered = asyncio.Event()

    async def pre_call(self, req: ProxyRequest) -> None:
        self.entered.set()
        await asyncio.Event().wait()


async def _vision_held_then(budgets: PeriodBudgets, later: Handler) -> tuple[LiteLLMKV, VisionHandler]:
    vision = VisionHandler(_settings(), budgets)
    return LiteLLMKV(settings=_settings(), handlers=[vision, later]), vision


async def test_vision_hold_is_released_when_reasoning_refuses(budgets: PeriodBudgets) -> None:
    """Vision holds the request's visual tokens, then reasoning refuses it (400 reasoning.max_budget)."""
    cb, _ = await _vision_held_then(budgets, ReasoningHandler(_settings(), budgets))
    with pytest.raises(ProxyException) as exc:
        await cb.async_pre_call_hook(CALLER, None, _request(thinking_token_budget=50), "completion")
    assert exc.value.param == "reasoning.max_budget"
    assert [m for m, granted in budgets.granted if granted] == ["visual_tokens"]  # type: ignore[attr-defined]
    assert await _held(budgets) == 0


async def test_vision_hold_is_released_when_a_later_handler_fails(budgets: PeriodBudgets) -> None:
    cb, _ = await _vision_held_then(budgets, Refuses(_settings()))
    with pytest.raises(ProxyException) as exc:
        await cb.async_pre_call_hook(CALLER, None, _request(), "completion")
    assert exc.value.param == "reasoning.internal_error"
    assert [m for m, granted in budgets.granted if granted] == ["visual_tokens"]  # type: ignore[attr-defined]
    assert await _held(budgets) == 0


async def test_vision_hold_is_released_when_the_request_is_cancelled(budgets: PeriodBudgets) -> None:
    waits = Waits(_settings())
    cb, _ = await _vision_held_then(budgets, waits)
    task = asyncio.create_task(cb.async_pre_call_hook(CALLER, None, _request(), "completion"))
    await asyncio.wait_for(waits.entered.wait(), 10)
    state = await budgets.check(SCOPE, "visual_tokens", Period.DAY, DAY_LIMIT, now=datetime.now(timezone.utc))
    assert state.held > 0  # the hold the cancelled request took
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await _held(budgets) == 0


async def test_holds_are_released_when_litellm_gives_up_on_the_call(budgets: PeriodBudgets) -> None:
    """pre_call passed (vision and reasoning both hold), then every deployment failed: LiteLLM calls the
    failure hook, which gives both holds back without waiting for a failure log event."""
    vision, reasoning = VisionHandler(_settings(), budgets), ReasoningHandler(_settings(), budgets)
    cb = LiteLLMKV(settings=_settings(), handlers=[vision, reasoning])
    data = _request(thinking_token_budget=3)
    await cb.async_pre_call_hook(CALLER, None, data, "completion")
    now = datetime.now(timezone.utc)
    assert (await budgets.check(SCOPE, "visual_tokens", Period.DAY, DAY_LIMIT, now=now)).held > 0
    assert (await budgets.check(SCOPE, "reasoning_tokens", Period.DAY, DAY_LIMIT, now=now)).held == 3
    await cb.async_post_call_failure_hook(data, RuntimeError("no deployment answered"), CALLER)
    assert await _held(budgets) == 0
    assert await _held(budgets, "reasoning_tokens") == 0
    # Nothing was charged for the call that never ran.
    assert (await budgets.check(SCOPE, "visual_tokens", Period.DAY, DAY_LIMIT, now=now)).used == 0
