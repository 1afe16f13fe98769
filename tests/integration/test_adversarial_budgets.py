"""Period budgets held against a hostile client, through a real ``litellm`` proxy process and a real
redis-server.

Keys with metadata are presented through ``general_settings.custom_auth`` (the database path cannot
run here). The upstream is the local fake (``tests/support/fake_upstream.py``): it stands in for a
reasoning model (no reasoning model can be driven twenty times in parallel on this machine), honours
``thinking_token_budget`` and answers slowly enough for concurrent requests to overlap. The fault tests
pause the real redis-server with SIGSTOP (connections stay open, nothing answers) and resume it.
"""

from __future__ import annotations

import asyncio
import signal
import statistics
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import httpx
import pytest
from litellm.proxy._types import UserAPIKeyAuth

from litellm_kv.governance.budgets import Period
from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import Proxy, start_proxy
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.proxy, pytest.mark.redis]

REASONING_WORDS = 40
DAY_LIMIT = 1000


def _reasoning_key(alias: str, reasoning: dict[str, Any]) -> dict[str, Any]:
    return {"key_alias": alias, "metadata": {"litellm_kv": {"reasoning": reasoning}}}


KEYS: dict[str, dict[str, Any]] = {
    "sk-burst": _reasoning_key("burst", {"tokens_per_day": DAY_LIMIT}),
    "sk-flaky": _reasoning_key("flaky", {"tokens_per_day": DAY_LIMIT}),
    "sk-steady": _reasoning_key("steady", {"tokens_per_day": 10**9}),
    "sk-spent": _reasoning_key("spent", {"tokens_per_day": DAY_LIMIT}),
    "sk-nearly": _reasoning_key("nearly", {"tokens_per_day": DAY_LIMIT}),
    "sk-many": _reasoning_key("many", {"tokens_per_day": DAY_LIMIT, "max_budget": 30}),
}
#: The budget store's settings in the fault tests: a 100 ms deadline and a breaker that opens after
#: three failures for one second.
BUDGETS = {"deadline_ms": 100, "breaker_failures": 3, "breaker_open_s": 1.0}
#: What a paused Redis may add to one request: one deadline (the reserve before the call; settling
#: happens off the response path) and room for a loaded two-core test machine.
ADDED_LATENCY_BOUND_S = 0.4
#: The concurrency tests run with the store's defaults (a 50 ms deadline, on_store_error: fail_open):
#: twenty requests arriving at once keep the proxy's event loop busy far longer than that, which must
#: not make a healthy Redis look failed (budget calls run on a loop of their own, docs/security/budgets.md).
DEFAULTS: dict[str, Any] = {}


def _usage_key(api_key: str) -> str:
    """The Redis counter of a test key's reasoning budget today (the key's token as LiteLLM hashes it)."""
    token = UserAPIKeyAuth(api_key=api_key, token=f"hashed-{api_key}").token  # what custom_auth presents
    day = Period.DAY.window_id(datetime.now(timezone.utc))
    return f"litellm_kv:budget:{{key:{token}}}:reasoning_tokens:day:{day}"


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    srv = RedisServer(name="redis-adversarial-budgets")
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def upstreams() -> Iterator[dict[str, str]]:
    slow, slow_url = start_fake_upstream(
        "slow-reasoner", "--reasoning-words", str(REASONING_WORDS), "--report-reasoning-tokens",
        "--count-reasoning-in-completion", "--delay-ms", "300",
    )
    fast, fast_url = start_fake_upstream(
        "fast-reasoner", "--reasoning-words", str(REASONING_WORDS), "--report-reasoning-tokens",
        "--count-reasoning-in-completion",
    )
    try:
        yield {"slow": slow_url, "fast": fast_url}
    finally:
        slow.stop()
        fast.stop()


def _proxy(redis_server: RedisServer, upstreams: dict[str, str], name: str, budgets: dict[str, Any]) -> Proxy:
    config = {
        "model_list": [
            {"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                      "api_base": upstreams["slow"] + "/v1"}},
            {"model_name": "qwen-fast", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                           "api_base": upstreams["fast"] + "/v1"}},
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {
            "redis_url": redis_server.url,
            "budgets": budgets,
            "model_groups": {"qwen": {"reasoning": {"style": "vllm"}}, "qwen-fast": {"reasoning": {"style": "vllm"}}},
        },
    }
    return start_proxy(config, name=f"litellm-budgets-{name}", keys=KEYS,
                       env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer, upstreams: dict[str, str]) -> Iterator[dict[str, Any]]:
    proxy = _proxy(redis_server, upstreams, "holds", DEFAULTS)
    try:
        yield {"proxy": proxy, "upstream": upstreams["slow"], "redis": redis_server}
    finally:
        proxy.stop()


@pytest.fixture
def open_proxy(redis_server: RedisServer, upstreams: dict[str, str]) -> Iterator[Proxy]:
    proxy = _proxy(redis_server, upstreams, "fail-open", {**BUDGETS, "on_store_error": "fail_open"})
    try:
        yield proxy
    finally:
        proxy.stop()


@pytest.fixture
def closed_proxy(redis_server: RedisServer, upstreams: dict[str, str]) -> Iterator[Proxy]:
    proxy = _proxy(redis_server, upstreams, "fail-closed", {**BUDGETS, "on_store_error": "fail_closed"})
    try:
        yield proxy
    finally:
        proxy.stop()


def _settled(r: Any, key: str) -> None:
    """Holds are settled off the response path: wait until none is left."""
    for _ in range(40):
        if r.hlen(key + ":holds") == 0:
            return
        time.sleep(0.25)
    raise AssertionError(f"holds of {key} were never settled: {r.hgetall(key + ':holds')}")


async def _parallel_chats(proxy: Proxy, key: str, n: int) -> list[httpx.Response]:
    payload = {"model": "qwen", "messages": [{"role": "user", "content": "think hard"}]}
    async with httpx.AsyncClient(timeout=120) as client:
        return list(await asyncio.gather(*[
            client.post(proxy.url + "/v1/chat/completions", json=payload, headers=proxy.headers(key))
            for _ in range(n)
        ]))


def _store_failures(proxy: Proxy) -> float:
    """Budget-store calls that failed open so far (a request then ran without its hold)."""
    return proxy.metric_by("litellm_kv_budget_store_errors_total", "outcome").get("fail_open", 0.0)


def _budget_store_guard(proxy: Proxy) -> list[dict[str, Any]]:
    """The budget store's deadline and breaker counters (``/litellm-kv/health`` → ``redis``), for failure messages."""
    r = httpx.get(proxy.url + "/litellm-kv/health", headers=proxy.headers(), timeout=10)
    return [g for g in (r.json().get("redis") or []) if g.get("use") == "budgets"]


def test_tokens_per_day_is_not_overspent_by_concurrent_requests(stack: dict[str, Any]) -> None:
    """The limit `reasoning.tokens_per_day`: twenty parallel requests on a budget with 50 tokens left,
    with the budget store's default deadline and `on_store_error: fail_open` on a healthy Redis.

    Each one is granted only what neither usage nor the others' holds take, so together they think at
    most 50 tokens (the fake, like vLLM, stops thinking at ``thinking_token_budget``: the documented
    overshoot is what requests use beyond their hold, here none). No budget call may fail open: with
    the deadline measured on the proxy's busy loop, the burst made a healthy Redis miss it and those
    requests ran without a hold."""
    r = stack["redis"].client()
    key = _usage_key("sk-burst")
    r.set(key, DAY_LIMIT - 50, ex=3 * 86400)
    failed_before = _store_failures(stack["proxy"])
    responses = asyncio.run(_parallel_chats(stack["proxy"], "sk-burst", 20))
    assert {resp.status_code for resp in responses} <= {200, 429}, [resp.text for resp in responses]
    assert any(resp.status_code == 200 for resp in responses)
    _settled(r, key)
    used = int(r.get(key) or 0)
    failed = _store_failures(stack["proxy"]) - failed_before
    guard = _budget_store_guard(stack["proxy"])
    assert used <= DAY_LIMIT, f"{used - DAY_LIMIT} tokens over the tokens_per_day limit ({failed} failed open; {guard})"
    assert used > DAY_LIMIT - 50  # what was left was used, not lost to holds
    assert failed == 0, f"budget calls failed open on a healthy Redis: {guard}"
    for resp in responses:
        if resp.status_code == 429:
            assert "reasoning.tokens_per_day" in resp.text or "Reasoning token budget spent" in resp.text


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_many_sequences_in_one_request_do_not_multiply_the_budget(stack: dict[str, Any], stream: bool) -> None:
    """The limits `reasoning.max_budget` and `reasoning.tokens_per_day` against ``n``: vLLM applies
    ``thinking_token_budget`` to each of a request's ``n`` sequences, so before, one request with ``n: 8`` on a
    budget with 40 tokens left was granted 40 and thought 8 × 40 (the fake, like vLLM, thinks per sequence).
    The request's budget is now shared by its sequences: 30 at most (``max_budget``) in all, within what is left."""
    r = stack["redis"].client()
    key = _usage_key("sk-many")
    r.set(key, DAY_LIMIT - 40, ex=3 * 86400)
    proxy = stack["proxy"]
    body = {"model": "qwen-fast", "n": 8, "stream": stream, "messages": [{"role": "user", "content": "think"}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    resp = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=proxy.headers("sk-many"), timeout=60)
    assert resp.status_code == 200, resp.text
    _settled(r, key)
    used = int(r.get(key) or 0) - (DAY_LIMIT - 40)
    assert 0 < used <= 30, f"one request thought {used} reasoning tokens with max_budget 30"
    assert int(r.get(key) or 0) <= DAY_LIMIT


def test_tokens_per_day_hold_is_released_when_the_call_fails(stack: dict[str, Any]) -> None:
    """The limit `reasoning.tokens_per_day`: a failed call gives its hold back, so the budget it held
    is not lost to the key."""
    r = stack["redis"].client()
    key = _usage_key("sk-flaky")
    httpx.post(stack["upstream"] + "/_fail", json={"status": 500}, timeout=5)
    try:
        failed = httpx.post(stack["proxy"].url + "/v1/chat/completions", timeout=60,
                            headers=stack["proxy"].headers("sk-flaky"),
                            json={"model": "qwen", "messages": [{"role": "user", "content": "x"}]})
    finally:
        httpx.post(stack["upstream"] + "/_fail", json={"status": 0}, timeout=5)
    assert failed.status_code >= 500
    _settled(r, key)  # the failure is logged (and the hold released) after the response
    assert int(r.get(key) or 0) == 0


def _timed_chat(proxy: Proxy, key: str = "sk-steady") -> tuple[float, httpx.Response]:
    t = time.perf_counter()
    r = httpx.post(proxy.url + "/v1/chat/completions", headers=proxy.headers(key), timeout=60,
                   json={"model": "qwen-fast", "messages": [{"role": "user", "content": "quick"}]})
    return time.perf_counter() - t, r


def _baseline(proxy: Proxy) -> float:
    return statistics.median(_timed_chat(proxy)[0] for _ in range(5))


def _paused(redis_server: RedisServer, proxy: Proxy, n: int) -> list[tuple[float, httpx.Response]]:
    assert redis_server.proc is not None
    redis_server.proc.signal(signal.SIGSTOP)
    try:
        return [_timed_chat(proxy) for _ in range(n)]
    finally:
        redis_server.proc.signal(signal.SIGCONT)


def test_paused_redis_adds_at_most_the_deadline_and_fails_open(open_proxy: Proxy, redis_server: RedisServer) -> None:
    """Bounded waits of `reasoning.tokens_per_day` (`budgets.deadline_ms`, `on_store_error: fail_open`):
    with Redis paused every request is served, unmetered, each slower by at most the deadline, and
    metering resumes once Redis answers again."""
    proxy, srv = open_proxy, redis_server
    base = _baseline(proxy)
    paused = _paused(srv, proxy, 8)
    assert [r.status_code for _, r in paused] == [200] * 8, [r.text for _, r in paused]
    added = [t - base for t, _ in paused]
    print(f"baseline {base * 1000:.0f} ms; added while paused (ms): {[round(a * 1000) for a in added]}")
    assert max(added) < ADDED_LATENCY_BOUND_S, added
    key, r = _usage_key("sk-steady"), srv.client()
    before, resumed = int(r.get(key) or 0), time.monotonic()
    while time.monotonic() - resumed < 15 and int(r.get(key) or 0) == before:
        _timed_chat(proxy)
        time.sleep(0.1)
    print(f"metered again {time.monotonic() - resumed:.2f} s after resume")
    assert int(r.get(key) or 0) > before


def test_paused_redis_fails_closed_with_503_naming_the_store(
    closed_proxy: Proxy, redis_server: RedisServer
) -> None:
    """Bounded waits of `reasoning.tokens_per_day` with `budgets.on_store_error: fail_closed`: a
    request the budget applies to is refused with 503 (limit `reasoning.store`, Retry-After) within
    the deadline, not served unmetered; once Redis answers again requests are served."""
    base = _baseline(closed_proxy)
    paused = _paused(redis_server, closed_proxy, 5)
    for t, r in paused:
        assert r.status_code == 503, r.text
        assert r.headers.get("retry-after") == "5"
        msg = r.json()["error"]["message"]
        assert "Reasoning budgets cannot be checked" in msg and "on_store_error is fail_closed" in msg
        assert t - base < ADDED_LATENCY_BOUND_S, [round(x - base, 3) for x, _ in paused]
    resumed = time.monotonic()
    while time.monotonic() - resumed < 15 and _timed_chat(closed_proxy)[1].status_code != 200:
        time.sleep(0.1)
    assert _timed_chat(closed_proxy)[1].status_code == 200


def _reasoning_tokens(resp: httpx.Response) -> int:
    return int(((resp.json().get("usage") or {}).get("completion_tokens_details") or {}).get("reasoning_tokens") or 0)


def test_a_paused_redis_does_not_unlock_a_spent_budget(open_proxy: Proxy, redis_server: RedisServer) -> None:
    """The limit `reasoning.tokens_per_day` with `on_store_error: fail_open`, against a client that can make
    Redis stop answering (or waits until it does): a key this proxy saw spend its day budget is refused
    (429, naming the proxy's own view) rather than served unmetered; a key it saw with 10 tokens left
    thinks at most those 10 in all, however many requests it sends at once while Redis is paused.
    Keys the proxy has never seen are served as before (`test_paused_redis_adds_at_most_the_deadline...`)."""
    r = redis_server.client()
    spent, nearly = _usage_key("sk-spent"), _usage_key("sk-nearly")
    r.set(spent, DAY_LIMIT, ex=3 * 86400)
    r.set(nearly, DAY_LIMIT - 50, ex=3 * 86400)
    chat = {"model": "qwen", "messages": [{"role": "user", "content": "think"}]}
    seen = httpx.post(open_proxy.url + "/v1/chat/completions", headers=open_proxy.headers("sk-spent"),
                      json=chat, timeout=60)
    assert seen.status_code == 429, seen.text
    first = httpx.post(open_proxy.url + "/v1/chat/completions", headers=open_proxy.headers("sk-nearly"),
                       json=chat, timeout=60)
    assert first.status_code == 200 and _reasoning_tokens(first) == REASONING_WORDS, first.text
    _settled(r, nearly)
    assert int(r.get(nearly) or 0) == DAY_LIMIT - 10  # what the proxy saw when it settled
    failed_before = _store_failures(open_proxy)
    assert redis_server.proc is not None
    redis_server.proc.signal(signal.SIGSTOP)
    try:
        refused = httpx.post(open_proxy.url + "/v1/chat/completions", headers=open_proxy.headers("sk-spent"),
                             json=chat, timeout=60)
        burst = asyncio.run(_parallel_chats(open_proxy, "sk-nearly", 8))
    finally:
        redis_server.proc.signal(signal.SIGCONT)
    assert _store_failures(open_proxy) > failed_before  # Redis really was not answering
    assert refused.status_code == 429, refused.text
    message = refused.json()["error"]["message"]
    assert "as this proxy last saw it" in message and "fail_open" in message, message
    assert {resp.status_code for resp in burst} <= {200, 429}, [resp.text for resp in burst]
    thought = sum(_reasoning_tokens(resp) for resp in burst if resp.status_code == 200)
    assert 0 < thought <= 10, [resp.text for resp in burst]
