"""Domain tests of prompt-cache affinity: keys, minimum cacheable length, TTL (with a test clock),
atomic claim and re-pin on both pin stores (in-process and a real redis-server)."""

from __future__ import annotations

import asyncio
import copy
import itertools
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest

from litellm_kv.config import parse_section
from litellm_kv.errors import ConfigError
from litellm_kv.routing.affinity import (
    AffinityRouter,
    AffinitySettings,
    CacheProfile,
    Candidates,
    DeploymentId,
    EstimateMeter,
    InFlightCounter,
    MemoryPinStore,
    PinStore,
    RedisPinStore,
    Resolution,
    TiktokenMeter,
    conversation_prefixes,
    make_meter,
    parse_ttl,
    request_ttl,
    select_keys,
)
from tools.harness.redis_server import RedisServer

WORDS = [
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima",
    "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey",
    "xray", "yankee", "zulu",
]


def text(n: int, seed: int) -> str:
    return " ".join(WORDS[(i * 7 + seed * 13 + i // 26) % len(WORDS)] for i in range(n))


class FakeClock:
    """A clock the test moves: TTLs are checked against it, never against the wall."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def conversation(turns: int, seed: int = 1, marked: bool = False) -> list[list[dict[str, Any]]]:
    """The message lists a client sends for turns 1..turns (each repeats the earlier ones)."""
    system: dict[str, Any] = {"role": "system", "content": text(1200, seed)}
    if marked:
        system = {"role": "system", "content": [{"type": "text", "text": system["content"],
                                                 "cache_control": {"type": "ephemeral"}}]}
    history: list[dict[str, Any]] = [system]
    out = []
    for t in range(turns):
        history.append({"role": "user", "content": text(40, seed * 100 + t)})
        sent = copy.deepcopy(history)
        if marked:  # automatic injection: the mark sits on the last message, so it moves every turn
            last = sent[-1]
            last["content"] = [{"type": "text", "text": last["content"], "cache_control": {"type": "ephemeral"}}]
        out.append(sent)
        history.append({"role": "assistant", "content": f"answer {t}"})
    return out


METER = EstimateMeter(4.0)


def digests(messages: list[dict[str, Any]], tools: Any = None, ns: str = "g") -> list[str]:
    return [p.digest for p in conversation_prefixes(messages, tools, namespace=ns, meter=METER)]


# -- keys -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("marked", [False, True])
def test_turn_n_prompt_is_a_boundary_of_turn_n_plus_1(marked: bool) -> None:
    turns = conversation(4, marked=marked)
    for prev, nxt in itertools.pairwise(turns):
        assert digests(prev)[-1] in digests(nxt)


def test_cache_control_marks_do_not_change_keys() -> None:
    plain = conversation(3)[-1]
    marked = conversation(3, marked=True)[-1]
    # the marked system block adds no boundary (it is the last block of its message)
    assert digests(plain) == digests(marked)


def test_marked_inner_block_adds_a_boundary_and_string_equals_text_block() -> None:
    msgs = [{"role": "system", "content": [{"type": "text", "text": "a " * 50, "cache_control": {"type": "ephemeral"}},
                                           {"type": "text", "text": "b " * 50}]},
            {"role": "user", "content": "hi"}]
    assert len(digests(msgs)) == 3
    as_string = [{"role": "user", "content": "hello there"}]
    as_block = [{"role": "user", "content": [{"type": "text", "text": "hello there"}]}]
    assert digests(as_string) == digests(as_block)


def test_namespace_tools_and_content_separate_keys() -> None:
    msgs = conversation(1)[0]
    assert digests(msgs, ns="a") != digests(msgs, ns="b")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with_tools = digests(msgs, tools=[tool])
    assert len(with_tools) == len(msgs) + 1
    assert set(with_tools).isdisjoint(digests(msgs))
    other = copy.deepcopy(msgs)
    other[-1]["content"] += " x"
    assert digests(other)[:-1] == digests(msgs)[:-1] and digests(other)[-1] != digests(msgs)[-1]


def test_assistant_message_extra_fields_do_not_change_keys() -> None:
    a = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r"}]
    b = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "r", "refusal": None,
                                             "annotations": None}]
    assert digests(a) == digests(b)


# -- what the provider caches -----------------------------------------------------------------------
def test_openai_profile_minimum_and_increments() -> None:
    p = CacheProfile(1024, 128)
    assert [p.cacheable(n) for n in (0, 1023, 1024, 1151, 1152, 5000)] == [0, 0, 1024, 1024, 1152, 4992]


def test_tiktoken_counts_offline_and_short_prompts_create_no_keys() -> None:
    meter = make_meter("auto", AffinitySettings(), "openai", "gpt-4o")
    assert isinstance(meter, TiktokenMeter) and meter.name == "tiktoken:o200k_base"
    assert meter.count("hello world") == 2
    assert make_meter("auto", AffinitySettings(), "openai", "gpt-4-0613").name == "tiktoken:cl100k_base"
    opts = AffinitySettings()
    short = [{"role": "system", "content": text(300, 1)}, {"role": "user", "content": "hi"}]
    long = [{"role": "system", "content": text(1500, 1)}, {"role": "user", "content": "hi"}]
    profile = CacheProfile(1024, 128)
    assert select_keys(conversation_prefixes(short, None, namespace="g", meter=meter), profile, opts) == []
    keys = select_keys(conversation_prefixes(long, None, namespace="g", meter=meter), profile, opts)
    assert len(keys) == 2 and keys[0].tokens > keys[1].tokens >= 1024


def test_follow_shared_prefix_off_drops_system_only_keys() -> None:
    msgs = conversation(1)[0]
    prefixes = conversation_prefixes(msgs, None, namespace="g", meter=METER)
    opts = parse_section(AffinitySettings, {"follow_shared_prefix": False}, "t")
    keys = select_keys(prefixes, CacheProfile(16), opts)
    assert [k.shared for k in keys] == [False]


def test_max_keys_keeps_longest_and_the_shared_prefix() -> None:
    msgs = conversation(30)[-1]
    prefixes = conversation_prefixes(msgs, None, namespace="g", meter=METER)
    opts = parse_section(AffinitySettings, {"max_keys": 5}, "t")
    keys = select_keys(prefixes, CacheProfile(16), opts)
    assert len(keys) == 5 and keys[0] == prefixes[-1] and keys[-1].shared


def test_ttl_parsing_and_request_ttl() -> None:
    assert parse_ttl("5m") == 300 and parse_ttl("1h") == 3600 and parse_ttl("24h") == 86400
    assert parse_ttl("soon") is None and parse_ttl(True) is None and parse_ttl(0) is None
    assert request_ttl(conversation(1)[0], None) is None
    assert request_ttl(conversation(1, marked=True)[0], None) == 300  # a mark without ttl: 5 minutes
    msgs = [{"role": "system", "content": [{"type": "text", "text": "x",
                                            "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}]
    assert request_ttl(msgs, None) == 3600
    assert request_ttl(None, None, retention="24h") == 86400


def test_options_are_typed_and_checked() -> None:
    with pytest.raises(ConfigError, match="ttl_secs"):
        parse_section(AffinitySettings, {"ttl_secs": 3}, "litellm_kv.model_groups.g.affinity")
    with pytest.raises(ConfigError, match="tokenizer"):
        parse_section(AffinitySettings, {"tokenizer": "bpe"}, "g")
    with pytest.raises(ConfigError, match="positive"):
        parse_section(AffinitySettings, {"ttl_seconds": 0}, "g")


# -- stores ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    yield server
    server.stop()


class _GroupTagged:
    """A pin store seen through one group's hash tag, as the affinity router names its keys
    (``<prefix>:{<group>}:<digest>``): on a Redis Cluster the keys of one resolve must share a slot."""

    def __init__(self, inner: RedisPinStore, tag: str = "litellm_kv:affinity:{g}:") -> None:
        self.inner, self.tag = inner, tag

    async def resolve(self, keys: Sequence[str], candidates: Candidates) -> Resolution:
        return await self.inner.resolve([self.tag + k for k in keys], candidates)

    async def get(self, key: str) -> str | None:
        return await self.inner.get(self.tag + key)

    async def close(self) -> None:
        await self.inner.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis),
                        pytest.param("cluster", marks=pytest.mark.redis),
                        pytest.param("sentinel", marks=pytest.mark.redis)])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[PinStore]:
    if request.param == "memory":
        yield MemoryPinStore()
        return
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        server.client().flushall()
        s = RedisPinStore(server.url, timeout=2.0)
        yield s
        await s.close()
        return
    setup = request.getfixturevalue("redis_cluster" if request.param == "cluster" else "redis_sentinel")
    setup.flushall()
    tagged = _GroupTagged(RedisPinStore(setup.settings(), timeout=2.0))
    yield tagged
    await tagged.close()


TTL = {"a": 60_000, "b": 60_000, "c": 60_000}


async def test_concurrent_first_claims_agree(store: PinStore) -> None:
    keys = ["k:long", "k:short"]
    results = await asyncio.gather(*(store.resolve(keys, Candidates(TTL, "abc"[i % 3])) for i in range(20)))
    assert len({r.deployment for r in results}) == 1
    assert sorted(r.outcome for r in results).count("new") == 1


async def test_longest_live_pin_wins_and_longer_keys_follow(store: PinStore) -> None:
    await store.resolve(["k1"], Candidates(TTL, "a"))
    r = await store.resolve(["k3", "k2", "k1"], Candidates(TTL, "b"))
    assert (r.deployment, r.outcome, r.hit_index) == ("a", "hit", 2)
    assert await store.get("k3") == "a" and await store.get("k2") == "a"


async def test_shorter_prefix_pinned_elsewhere_keeps_its_pin(store: PinStore) -> None:
    await store.resolve(["shared"], Candidates(TTL, "a"))
    await store.resolve(["conv", "shared"], Candidates(TTL, "b", busy=frozenset({"a"})))  # bypass a
    assert await store.get("shared") == "a"  # a bypass never moves a pin
    await store.resolve(["conv"], Candidates(TTL, "b"))
    r = await store.resolve(["conv2", "conv", "shared"], Candidates(TTL, "c"))
    assert r.deployment == "b" and await store.get("shared") == "a"


async def test_repin_when_pinned_deployment_failed_or_unhealthy(store: PinStore) -> None:
    await store.resolve(["x2", "x1"], Candidates(TTL, "a"))
    r = await store.resolve(["x3", "x2", "x1"], Candidates(TTL, "b", failed=frozenset({"a"})))
    assert (r.deployment, r.outcome, r.stale) == ("b", "repin", "failed")
    assert [await store.get(k) for k in ("x3", "x2", "x1")] == ["b", "b", "b"]
    only_c = {"c": 60_000}  # b cooled down: not among the healthy deployments
    r = await store.resolve(["x3"], Candidates(only_c, "c"))
    assert (r.deployment, r.outcome, r.stale) == ("c", "repin", "unhealthy")


async def test_overloaded_pin_is_bypassed_not_moved(store: PinStore) -> None:
    await store.resolve(["o1"], Candidates(TTL, "a"))
    r = await store.resolve(["o2", "o1"], Candidates(TTL, "b", busy=frozenset({"a"})))
    assert (r.deployment, r.outcome) == ("b", "overloaded")
    assert await store.get("o1") == "a" and await store.get("o2") is None


async def test_redis_hit_refreshes_ttl(redis_server: RedisServer) -> None:
    redis_server.client().flushall()
    s = RedisPinStore(redis_server.url, timeout=2.0)
    try:
        await s.resolve(["t1"], Candidates({"a": 5_000}, "a"))
        assert 0 < redis_server.client().pttl("t1") <= 5_000
        await s.resolve(["t1"], Candidates({"a": 3_600_000}, "a"))
        assert redis_server.client().pttl("t1") > 3_500_000
    finally:
        await s.close()


# -- the router with a test clock -------------------------------------------------------------------
DEPS = [("dep-a", "openai", "gpt-4o", {}), ("dep-b", "openai", "gpt-4o", {})]


def make_router(clock: FakeClock, **opts: Any) -> AffinityRouter:
    options = parse_section(AffinitySettings, opts, "t")
    return AffinityRouter("g", options, MemoryPinStore(clock), InFlightCounter(clock))


async def test_pin_survives_20_minutes_of_inactivity_with_1h_ttl() -> None:
    clock = FakeClock()
    router = make_router(clock)  # group TTL: the 5-minute default
    msgs = conversation(2)[0]
    msgs[0] = {"role": "system", "content": [{"type": "text", "text": msgs[0]["content"],
                                              "cache_control": {"type": "ephemeral", "ttl": "1h"}}]}
    first = await router.choose(msgs, None, DEPS)
    assert first.reason == "new"
    clock.advance(20 * 60)
    nxt = [*msgs, {"role": "assistant", "content": "answer 0"}, {"role": "user", "content": "more"}]
    again = await router.choose(nxt, None, DEPS)
    assert (again.reason, again.deployment) == ("hit", first.deployment)
    clock.advance(59 * 60)  # the hit refreshed the hour
    assert (await router.choose(nxt, None, DEPS)).reason == "hit"
    clock.advance(61 * 60)
    assert (await router.choose(nxt, None, DEPS)).reason == "new"


async def test_default_ttl_expires_after_inactivity_but_hits_refresh_it() -> None:
    clock = FakeClock()
    router = make_router(clock, ttl_seconds=300)
    msgs = conversation(1)[0]
    first = await router.choose(msgs, None, DEPS)
    for _ in range(10):  # a hit every 4 minutes keeps it for 40 minutes
        clock.advance(240)
        assert (await router.choose(msgs, None, DEPS)).deployment == first.deployment
    clock.advance(301)
    assert (await router.choose(msgs, None, DEPS)).reason == "new"


async def test_deployment_ttl_overrides_group_ttl() -> None:
    clock = FakeClock()
    router = make_router(clock, ttl_seconds=300)
    deps = [("dep-a", "openai", "gpt-4o", {"affinity_ttl_seconds": 3600})]
    await router.choose(conversation(1)[0], None, deps)
    clock.advance(1800)
    assert (await router.choose(conversation(1)[0], None, deps)).reason == "hit"


async def test_load_cap_bypasses_and_failure_repins() -> None:
    clock = FakeClock()
    router = make_router(clock, max_in_flight=2)
    msgs = conversation(1)[0]
    first = await router.choose(msgs, None, DEPS)
    pinned = DeploymentId(str(first.deployment))
    router.load.start("r1", pinned)
    router.load.start("r2", pinned)
    bypass = await router.choose(msgs, None, DEPS)
    assert bypass.reason == "overloaded" and bypass.deployment != pinned
    router.load.finish("r1")
    assert (await router.choose(msgs, None, DEPS)).deployment == pinned
    router.load.failed(pinned)
    moved = await router.choose(msgs, None, DEPS)
    assert (moved.reason, moved.stale) == ("repin", "failed") and moved.deployment != pinned
    clock.advance(31)  # past avoid_failed_seconds: the new pin holds, nothing moves back
    assert (await router.choose(msgs, None, DEPS)).deployment == moved.deployment


async def test_too_short_prompt_gives_no_opinion() -> None:
    router = make_router(FakeClock())
    d = await router.choose([{"role": "user", "content": "hello"}], None, DEPS)
    assert d.deployment is None and d.reason == "too_short"


# -- tenants ----------------------------------------------------------------------------------------
async def test_affinity_pins_scoped_to_tenant_by_default() -> None:
    """Limit protected: tenant isolation of pins. A second tenant sending the same prompt gets a pin
    of its own ('new'), as if the first had never sent it; the first tenant still hits its pin."""
    router = make_router(FakeClock())
    msgs = conversation(1, seed=7)[0]
    assert (await router.choose(msgs, None, DEPS, tenant="team:a")).reason == "new"
    assert (await router.choose(msgs, None, DEPS, tenant="team:b")).reason == "new"
    assert (await router.choose(msgs, None, DEPS, tenant="team:a")).reason == "hit"
    assert (await router.choose(msgs, None, DEPS, tenant="team:b")).reason == "hit"


async def test_affinity_prompt_cache_key_cannot_name_another_tenant() -> None:
    """Limit protected: tenant isolation of pins. ``prompt_cache_key`` is the client's: whatever it
    holds, it cannot make a request's keys those of another tenant."""
    router = make_router(FakeClock())
    msgs = conversation(1, seed=8)[0]
    await router.choose(msgs, None, DEPS, tenant="team:a", namespace_extra="k")
    for forged in ("k", '", "team:a", "k', "team:a\x00k", "\x00team:a\x00k"):
        assert (await router.choose(msgs, None, DEPS, tenant="team:b", namespace_extra=forged)).reason == "new"


async def test_affinity_pins_shared_across_tenants_when_the_group_opts_in() -> None:
    router = make_router(FakeClock(), share_pins_across_tenants=True)
    msgs = conversation(1, seed=9)[0]
    first = await router.choose(msgs, None, DEPS, tenant="team:a")
    other = await router.choose(msgs, None, DEPS, tenant="team:b")
    assert (other.reason, other.deployment) == ("hit", first.deployment)


def test_docs_list_every_option_and_metric() -> None:
    import dataclasses

    from litellm_kv.observability import declared_metrics
    from tools.harness.procs import ROOT

    page = (ROOT / "docs" / "affinity.md").read_text()
    for f in dataclasses.fields(AffinitySettings):
        assert f"| `{f.name}` |" in page, f.name
    import litellm_kv.integration.affinity_hooks  # noqa: F401  (declares the metrics)

    affinity_metrics = [name for name in declared_metrics() if name.startswith("litellm_kv_affinity_")]
    assert affinity_metrics, "no affinity metric declared"
    for name in affinity_metrics:
        assert f"`{name}_total`" in page, name
