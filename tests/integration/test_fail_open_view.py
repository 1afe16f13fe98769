"""A budget store that stops answering does not unlock a budget the proxy saw spent (`on_store_error:
fail_open`), for visual tokens. The callback is called as LiteLLM 1.110 calls it, with the real vision
handler on a real redis-server paused with SIGSTOP (reasoning: `test_adversarial_budgets.py`, through a
real proxy).
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from datetime import datetime, timezone

import pytest
from litellm.proxy._types import ProxyException

from litellm_kv.governance.budgets import FAIL_OPEN_NOTE, Period, RedisPeriodBudgets
from litellm_kv.integration.callback import LiteLLMKV
from litellm_kv.integration.vision_hooks import VisionHandler
from litellm_kv.redis_client import GuardSettings, RedisGuard, RedisUse
from tests.integration.test_hold_release import CALLER, DAY_LIMIT, SCOPE, _request, _settings
from tools.harness.redis_server import RedisServer

pytestmark = pytest.mark.redis

M = "visual_tokens"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-fail-open-view")
    yield srv
    srv.stop()


async def _refused(cb: LiteLLMKV) -> ProxyException:
    with pytest.raises(ProxyException) as exc:
        await cb.async_pre_call_hook(CALLER, None, _request(), "completion")
    return exc.value


async def test_a_paused_redis_does_not_unlock_a_spent_visual_budget(redis_server: RedisServer) -> None:
    """The limit `vision.tokens_per_day`: while Redis is paused a request gets at most what this proxy
    knows is left (the usage Redis last reported, less its own requests' holds), so one that did not
    fit before the pause does not fit during it, and two that each fit alone cannot both take the rest."""
    store = RedisPeriodBudgets(redis_server.url, prefix=f"fov-{uuid.uuid4().hex[:6]}",
                               guard=RedisGuard(RedisUse.BUDGETS, GuardSettings(50, 2, 30.0)))
    cb = LiteLLMKV(settings=_settings(), handlers=[VisionHandler(_settings(), store)])
    try:
        first = _request()
        await cb.async_pre_call_hook(CALLER, None, first, "completion")
        now = datetime.now(timezone.utc)
        need = (await store.check(SCOPE, M, Period.DAY, DAY_LIMIT, now=now)).held  # one request's tokens
        assert need > 1
        await store.charge(SCOPE, M, Period.DAY, DAY_LIMIT - need - need // 2, now=now)
        metered = await _refused(cb)  # Redis answers: the proxy sees the usage
        assert int(metered.code) == 429, metered.message
        assert FAIL_OPEN_NOTE not in metered.message
        assert redis_server.proc is not None
        redis_server.proc.signal(signal.SIGSTOP)
        try:
            paused = await _refused(cb)
            assert int(paused.code) == 429 and FAIL_OPEN_NOTE in paused.message, paused.message
            # The first request ends (LiteLLM gave up on it): its hold is given back, here at once.
            await cb.async_post_call_failure_hook(first, RuntimeError("no deployment answered"), CALLER)
            await cb.async_pre_call_hook(CALLER, None, _request(), "completion")  # fits what is left alone
            again = await _refused(cb)  # and takes it: the next one does not fit
            assert int(again.code) == 429 and FAIL_OPEN_NOTE in again.message, again.message
        finally:
            redis_server.proc.signal(signal.SIGCONT)
    finally:
        await store.close()
