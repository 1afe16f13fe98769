"""The routing decision without LiteLLM or engines: an in-memory index fed as engine events would, the
real cost model, and every reason a prediction cannot be exact turning into a named load-only choice."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from litellm_kv.config import ModelGroupSettings, Settings
from litellm_kv.index.base import BlockOp, ReplicaMatch, Tier
from litellm_kv.index.memory import InMemoryIndex
from litellm_kv.integration.routing_hooks import KVRoutingHandler, _Route
from litellm_kv.routing.cost import CostModel
from litellm_kv.routing.group import KVGroup
from litellm_kv.routing.load import TrackedLoad
from litellm_kv.routing.router import FALLBACKS, PREFIX_HOLD, SLO_UNMET, KVRouter, RoutingRequest, RoutingResult
from litellm_kv.routing.siblings import SiblingIndex
from litellm_kv.routing.ttft import TtftSettings
from litellm_kv.vllm.hashing import BlockHasher

G = "g"
R = ["http://a:1", "http://b:1"]
HASHER = BlockHasher("sha256", 16)
TOKENS = list(range(200))


def _router(index: InMemoryIndex) -> KVRouter:
    return KVRouter(G, index, CostModel(seed=1), SiblingIndex())


def _decide(router: KVRouter, req: RoutingRequest, hasher: BlockHasher | None = HASHER,
            why: str = "") -> RoutingResult:
    async def no_load() -> dict[str, TrackedLoad]:
        return {}

    return asyncio.run(router.decide(req, hasher, R, no_load, {}, not_exact_why=why))


def _store(index: InMemoryIndex, replica: str, hashes: Sequence[int]) -> None:
    asyncio.run(index.apply(G, replica, [BlockOp(tuple(hashes), Tier.GPU, +1)]))


def test_routes_to_the_replica_holding_the_prefix_and_predicts_the_engine_rule() -> None:
    index = InMemoryIndex()
    hashes = HASHER.wire_hashes(TOKENS)
    _store(index, R[1], hashes[:8])
    res = _decide(_router(index), RoutingRequest(TOKENS))
    assert res.replica == R[1] and res.reason == "cache"
    assert res.predicted_hit_tokens == 8 * 16
    # 200 tokens: at most floor(199/16) = 12 blocks can hit, even when all 12 full blocks are held.
    _store(index, R[0], hashes)
    res = _decide(_router(index), RoutingRequest(TOKENS))
    assert res.replica == R[0] and res.predicted_hit_tokens == 12 * 16


def test_the_result_holds_nothing_that_grows_with_the_prompt() -> None:
    """The proxy keeps each call's result for its late callbacks (up to ``inflight_ttl_s``, 20,000 calls): a
    per-block list there (the wire hashes once were) held ~11 KB per 8K-token call for ten minutes."""
    index = InMemoryIndex()
    tokens = list(range(16 * 512))
    _store(index, R[1], HASHER.wire_hashes(tokens)[:100])
    res = _decide(_router(index), RoutingRequest(tokens))
    assert res.replica == R[1] and res.predicted_hit_tokens == 100 * 16
    for name in res.__slots__:
        value = getattr(res, name)
        assert not (hasattr(value, "__len__") and not isinstance(value, str) and len(value) > len(R)), name


@pytest.mark.parametrize(("req", "hasher", "why", "expected"), [
    (RoutingRequest(TOKENS, has_unhashable_media=True), HASHER, "", "multimodal"),
    (RoutingRequest(TOKENS, skip_prefix_cache=True), HASHER, "", "skip_prefix_cache"),
    (RoutingRequest(TOKENS), None, "", "no_hasher"),
    (RoutingRequest(TOKENS), HASHER, "not_exact", "not_exact"),
])
def test_unpredictable_requests_are_load_only_with_a_reason(
    req: RoutingRequest, hasher: BlockHasher | None, why: str, expected: str
) -> None:
    index = InMemoryIndex()
    _store(index, R[1], HASHER.wire_hashes(TOKENS))
    before = FALLBACKS.labels(G, expected)._value.get()
    res = _decide(_router(index), req, hasher, why)
    assert res.reason == "fallback" and res.fallback_why == expected and not res.exact
    assert res.predicted_hit_tokens == 0
    assert FALLBACKS.labels(G, expected)._value.get() == before + 1


def test_a_ttft_target_no_replica_can_meet_is_counted_and_shown() -> None:
    index = InMemoryIndex()
    _store(index, R[1], HASHER.wire_hashes(TOKENS)[:8])
    before = SLO_UNMET.labels(G)._value.get()
    for target, met in ((1.0, True), (1e-4, False)):
        router = KVRouter(G, index, CostModel(seed=1, ttft=TtftSettings(slo_ttft_s=target)), SiblingIndex())
        res = _decide(router, RoutingRequest(TOKENS))
        assert (res.replica, res.slo_met) == (R[1], met)
    assert SLO_UNMET.labels(G)._value.get() == before + 1
    assert _decide(_router(index), RoutingRequest(TOKENS)).slo_met is None


def test_the_prefix_hold_keeps_a_shared_prompt_at_its_holder_and_is_counted() -> None:
    """R[1] holds the prompt's first 8 blocks but was recently sent 200K tokens of work: the TTFT cost alone sends
    the request to R[0]; the hold (on by default) keeps it at R[1] until the prefix draws more than its fair share."""
    index = InMemoryIndex()
    _store(index, R[1], HASHER.wire_hashes(TOKENS)[:8])

    async def loads() -> dict[str, TrackedLoad]:
        return {R[1]: TrackedLoad(recent_tokens=200_000.0)}

    def decide(router: KVRouter, n: int = 0) -> RoutingResult:
        prompt = TOKENS[:128] + [1000 + n] * 72  # the 8 shared blocks, then a question of its own
        return asyncio.run(router.decide(RoutingRequest(prompt), HASHER, R, loads, {}))

    assert decide(KVRouter(G, index, CostModel(seed=1, ttft=TtftSettings(hold=False)), SiblingIndex())).replica == R[0]
    router = KVRouter(G, index, CostModel(seed=1, ttft=TtftSettings(hold_prior_requests=10)), SiblingIndex())
    held, hot = PREFIX_HOLD.labels(G, "held")._value.get(), PREFIX_HOLD.labels(G, "hot")._value.get()
    results = [decide(router, n) for n in range(6)]
    replicas = [r.replica for r in results]
    assert [r.hold for r in results] == ["held"] * 4 + ["hot", "held"]  # shown on /litellm-kv/route
    # Shares × 2 replicas ÷ 1 holder: 1/11 × 2 ... 4/14 × 2 = 0.57 held; 5/15 × 2 = 0.67 hot, and the cost sends it
    # to R[0]. R[0] then holds it too (sibling prediction): 6/16 × 2 ÷ 2 = 0.375 is held again, at the cheaper R[0].
    assert replicas == [R[1]] * 4 + [R[0]] * 2
    assert PREFIX_HOLD.labels(G, "held")._value.get() == held + 5
    assert PREFIX_HOLD.labels(G, "hot")._value.get() == hot + 1


def test_a_shadow_decision_records_no_sibling_prediction() -> None:
    """Shadow mode: LiteLLM routes, so the blocks of a request are computed where LiteLLM sent it, not where the
    decision would have. Were the decision recorded as a sibling prediction, the next decision would credit the
    would-have replica with blocks it never receives, prefer it over the one that holds them (here slightly
    busier), and the trial would report nothing would have been cached."""
    def run(followed: bool) -> RoutingResult:
        index = InMemoryIndex()
        router = KVRouter(G, index, CostModel(seed=1), SiblingIndex(), followed=followed)
        first = _decide(router, RoutingRequest(TOKENS))
        litellms = next(r for r in R if r != first.replica)  # LiteLLM sent it to the other replica
        _store(index, litellms, HASHER.wire_hashes(TOKENS))

        async def loads() -> dict[str, TrackedLoad]:
            return {litellms: TrackedLoad(decode=1)}

        return asyncio.run(router.decide(RoutingRequest(TOKENS), HASHER, R, loads, {}))

    followed = run(followed=True)  # a routing decision: its replica is about to hold the blocks too
    assert followed.predicted_hit_tokens == 0 and followed.expected_hit_tokens == 12 * 16
    shadow = run(followed=False)
    assert shadow.predicted_hit_tokens == 12 * 16 and shadow.reason == "cache"


def test_a_shadow_group_s_router_is_not_followed() -> None:
    from litellm_kv.routing.options import KVRoutingSettings

    for shadow in (False, True):
        g = KVGroup(G, KVRoutingSettings(shadow=shadow), InMemoryIndex(), None, True, "memory")
        assert g.router.followed is not shadow


def test_index_failure_is_a_load_only_choice() -> None:
    class Down(InMemoryIndex):
        async def lookup(self, group: str, block_hashes: Sequence[int],
                         replicas: Sequence[str] | None = None) -> dict[str, ReplicaMatch]:
            raise ConnectionError("redis down")

    res = _decide(_router(Down()), RoutingRequest(TOKENS))
    assert res.fallback_why == "index_unavailable" and res.replica in R


def test_the_riding_lookup_is_a_declared_capability_of_the_redis_index() -> None:
    from litellm_kv.index.base import RidingLookup
    from litellm_kv.index.redis import RedisIndex

    redis_index = RedisIndex("redis://127.0.0.1:1/0")  # never contacted
    assert KVRouter(G, redis_index, CostModel(), SiblingIndex()).riding is redis_index
    assert not isinstance(InMemoryIndex(), RidingLookup) and _router(InMemoryIndex()).riding is None


def test_the_group_names_a_request_it_cannot_tokenize() -> None:
    """KVGroup.decide finds the tokenizer's reason itself: not a chat request, or no replica to tokenize with."""
    from litellm_kv.routing.group import ChatRequest
    from litellm_kv.routing.options import KVRoutingSettings

    async def run() -> list[RoutingResult]:
        g = KVGroup(G, KVRoutingSettings(), InMemoryIndex(), None, True, "memory")
        return [await g.decide(ChatRequest(messages=None), R),
                await g.decide(ChatRequest(messages=[{"role": "user", "content": "hi"}]), R)]

    before = FALLBACKS.labels(G, "tokenize_failed")._value.get()
    for res in asyncio.run(run()):
        assert res.fallback_why == "tokenize_failed" and res.tokenizer == "none" and res.replica in R
    assert FALLBACKS.labels(G, "tokenize_failed")._value.get() == before + 2


def test_routes_older_than_the_inflight_ttl_release_their_load() -> None:
    settings = Settings(model_groups={G: ModelGroupSettings(routing="kv", kv={"inflight_ttl_s": 5.0})})
    handler = KVRoutingHandler(settings)

    async def run() -> tuple[int, int]:
        g = KVGroup(G, handler.options[G], InMemoryIndex(), None, True, "memory")
        handler.groups[G] = g
        now = time.time()
        result = RoutingResult(replica=R[0], reason="cache", predicted_hit_tokens=0, prompt_tokens=100)
        await g.load.begin(G, R[0], "old", 100)
        handler._remember("old", _Route(G, R[0], "d0", result, False, now - 10))
        before = (await g.load.snapshot(G, R))[R[0]].prefill_tokens
        handler._remember("new", _Route(G, R[0], "d0", result, False, now))
        await asyncio.sleep(0)
        await asyncio.gather(*handler._tasks)
        after = (await g.load.snapshot(G, R))[R[0]].prefill_tokens
        return before, after

    before, after = asyncio.run(run())
    assert before == 100 and after == 0
    assert "old" not in handler.routes and "new" in handler.routes


def test_fleet_adapter_resolution() -> None:
    """What a served model name is hashed with (the e2e side is tests/integration/test_lora_e2e.py): a configured path
    wins over /v1/models; a listed base model has no LoRA key; a name no replica lists is 'unknown_model'
    (and /v1/models is re-read at most once per discovery interval, a failed re-read keeping the lists);
    with no model list ever read nothing is judged."""
    from litellm_kv.routing.fleet import Fleet, ReplicaState
    from litellm_kv.routing.options import KVRoutingSettings
    from litellm_kv.vllm.engine import EngineClient

    async def run() -> None:
        fleet = Fleet(G, KVRoutingSettings(lora_paths={"pinned": "/cfg/pinned"}, discovery_interval_s=60),
                      InMemoryIndex(), embedded=True)
        client = EngineClient("http://127.0.0.1:9")  # nothing answers: re-reads fail, and are counted
        reads = 0

        async def models() -> list[dict[str, object]]:
            nonlocal reads
            reads += 1
            raise RuntimeError("engine down")

        client.models = models  # type: ignore[method-assign]
        st = ReplicaState(R[0], "d0", R[0], client)
        fleet.replicas[R[0]] = st
        assert fleet.adapter("hosted_vllm/tiny") == (None, "")  # no model list read: not judged
        st.base_models = {"tiny", "org/big"}
        st.lora_roots = {"sql": "/adapters/sql", "pinned": "/engine/pinned"}
        assert fleet.adapter("hosted_vllm/tiny") == (None, "")
        assert fleet.adapter("hosted_vllm/org/big") == (None, "")  # the served name after the provider
        assert fleet.adapter("org/big") == (None, "")  # or the whole string
        assert fleet.adapter("hosted_vllm/sql") == (("sql", "/adapters/sql"), "")
        assert fleet.adapter("hosted_vllm/pinned") == (("pinned", "/cfg/pinned"), "")  # kv.lora_paths wins
        assert fleet.adapter("hosted_vllm/late") == (None, "unknown_model")
        assert fleet.adapter("hosted_vllm/late") == (None, "unknown_model")
        await asyncio.sleep(0.05)
        assert reads == 1  # one background re-read within the discovery interval
        # A failed re-read keeps what was read before: the adapter keeps its path, 'late' stays unknown.
        assert fleet.adapter("hosted_vllm/sql") == (("sql", "/adapters/sql"), "")
        assert fleet.adapter("hosted_vllm/late") == (None, "unknown_model")
        await client.aclose()

    asyncio.run(run())


def test_group_learns_rates_from_scrapes_and_streamed_ttfts_and_shows_them() -> None:
    """The TTFT model's plumbing in a group: the fleet hands each scrape's timing histograms to the group's
    RateBook, a streamed response's measured TTFT corrects its replica, and the error histogram, the rate
    gauges and the health view all show it."""
    from prometheus_client import REGISTRY

    from litellm_kv.routing.options import KVRoutingSettings
    from litellm_kv.routing.ttft import EngineTimings

    def run() -> KVGroup:
        return KVGroup(G, KVRoutingSettings(ttft={"prefill_s_per_token": 1e-4}), InMemoryIndex(), None, True,
                       "memory")

    g = run()
    assert g.router.cost.kind == "ttft"
    # A purge of a replica's cache (the subscriber's on_purge) voids the sibling predictions there.
    g.router.siblings.record(R[0], [1, 2])
    g.router.siblings.record(R[1], [1])
    g.fleet._purged(R[0])
    assert g.router.siblings.lookup([1, 2]) == {R[1]: 1}
    assert g.fleet.on_timings is not None
    g.fleet.on_timings(R[0], EngineTimings())
    g.fleet.on_timings(R[0], EngineTimings(prefill_s_sum=0.005 * 50 + 2e-5 * 50_000, prefill_count=50,
                                           prefill_tokens_sum=50_000))
    learned = g.rates.rates(R[0]).prefill_s_per_token
    assert 2e-5 < learned < 1e-4  # moved from the default toward the engine's 2e-5
    assert REGISTRY.get_sample_value("litellm_kv_replica_rate", {"model_group": G, "replica": R[0],
                                                                 "rate": "prefill_seconds_per_token"}) == learned
    count = lambda: REGISTRY.get_sample_value("litellm_kv_ttft_prediction_error_seconds_count",  # noqa: E731
                                              {"model_group": G}) or 0.0
    before = count()
    res = RoutingResult(replica=R[0], reason="cache", predicted_hit_tokens=0, prompt_tokens=1000,
                        predicted_ttft_s={R[0]: 0.1, R[1]: 0.3}, raw_ttft_s=0.1)
    for _ in range(20):
        g.observe_ttft(res, 0.2)
    assert count() == before + 20
    assert g.rates.rates(R[0]).offset_s == pytest.approx(0.1)
    # Every error exactly, on /litellm-kv/health: measured 0.2 s against the chosen replica's predicted 0.1 s.
    assert g.status()["ttft_error"] == {"responses": 20, "recent": 20, "abs_error_ms": {"p50": 100.0, "p90": 100.0},
                                        "signed_error_ms_p50": 100.0}
    assert g.status(ttft_errors_since=17)["ttft_error"]["since"] == {"count": 17, "errors_ms": [100.0] * 3,
                                                                     "dropped": 0}
    status = g.status()
    assert status["cost_model"] == "ttft" and status["rates"][R[0]]["calibrated"]
    assert status["rates"][R[0]]["ttft_offset_ms"] == pytest.approx(100.0)
    assert status["slo_ttft_s"] is None
    target = KVGroup(G, KVRoutingSettings(ttft={"slo_ttft_s": 1.5}), InMemoryIndex(), None, True, "memory")
    assert target.router.cost.ttft is not None and target.router.cost.ttft.slo_ttft_s == 1.5
    assert target.status()["slo_ttft_s"] == 1.5
    blocks = KVGroup(G, KVRoutingSettings(cost_model="blocks"), InMemoryIndex(), None, True, "memory")
    assert blocks.router.cost.kind == "blocks" and blocks.status()["cost_model"] == "blocks"


def test_image_requests_fall_back_with_a_named_reason() -> None:
    """An image request routes by load, and says why, when its images cannot be hashed as the engine does:
    no verified local tokenizer (multimodal), or after the engine's visual-token counts disagreed with ours
    (multimodal_mismatch: image routing is switched off for the group, and /health says so)."""
    from litellm_kv.routing.group import IMAGE_MISMATCH_LIMIT, ChatRequest
    from litellm_kv.routing.options import KVRoutingSettings
    from litellm_kv.vllm.multimodal import ImageItem

    image_req = ChatRequest(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                            images=(ImageItem("sha256:" + "0" * 64, 64),))

    async def run() -> tuple[RoutingResult, RoutingResult, dict[str, object]]:
        g = KVGroup(G, KVRoutingSettings(), InMemoryIndex(), None, True, "memory")
        first = await g.decide(image_req, R)
        g.check_image_tokens(64, 64)
        for _ in range(IMAGE_MISMATCH_LIMIT):
            g.check_image_tokens(64, 70)
        return first, await g.decide(image_req, R), g.status()

    first, after, status = asyncio.run(run())
    assert first.fallback_why == "multimodal" and first.replica in R
    assert after.fallback_why == "multimodal_mismatch"
    assert "70 vs 64" in str(status["images"])


def test_the_group_ages_the_scraped_queue_by_its_own_requests() -> None:
    """KVGroup's begin/end and the fleet's scrape feed the fleet's GaugeAging: a request the scrape caught queued
    is off the waiting count once it ended, unless kv.scrape_aging is false."""
    from litellm_kv.routing.fleet import ReplicaState
    from litellm_kv.routing.options import KVRoutingSettings
    from litellm_kv.vllm.engine import EngineClient, EngineMetrics

    async def run(aging: bool) -> list[tuple[int | None, int | None]]:
        g = KVGroup(G, KVRoutingSettings(scrape_aging=aging), InMemoryIndex(), None, True, "memory")
        client = EngineClient("http://127.0.0.1:9")

        async def metrics() -> EngineMetrics:
            return EngineMetrics(waiting=1, running=0, block_size=16, hash_algo="sha256")

        client.metrics = metrics  # type: ignore[method-assign]
        st = g.fleet.replicas[R[0]] = ReplicaState(R[0], "d0", R[0], client)
        result = RoutingResult(replica=R[0], reason="cache", predicted_hit_tokens=0, prompt_tokens=100)
        await g.begin(result, "r1")
        await g.fleet._scrape(st)  # the engine counts r1 as waiting
        seen = [g._gauges(R[0], st.waiting, st.running)]
        await g.end("r1")  # a non-streaming response: it left the queue
        seen.append(g._gauges(R[0], st.waiting, st.running))
        await g.fleet._scrape(st)  # a newer scrape's figures stand as they are
        seen.append(g._gauges(R[0], st.waiting, st.running))
        await client.aclose()
        return seen

    assert asyncio.run(run(True)) == [(1, 0), (0, 0), (1, 0)]
    assert asyncio.run(run(False)) == [(1, 0), (1, 0), (1, 0)]


def test_a_decision_times_its_stages_and_its_cpu(engine_model: Path) -> None:
    """Through ``filter_deployments`` with the tiny model's real tokenizer: each decision observes its tokenize and
    hash stages and the event-loop thread's CPU time, which cannot exceed the decision's wall time by more than the
    skew between the two clocks."""
    from prometheus_client import REGISTRY

    from litellm_kv.routing.fleet import ReplicaState, replica_id
    from litellm_kv.vllm.engine import EngineClient
    from litellm_kv.vllm.tokenization import LocalChatTokenizer

    group = "stages"
    bases = ["http://127.0.0.1:9/v1", "http://127.0.0.1:10/v1"]
    deployments = [{"model_name": group, "litellm_params": {"model": "hosted_vllm/tiny", "api_base": b},
                    "model_info": {"id": f"dep-{i}"}} for i, b in enumerate(bases)]
    handler = KVRoutingHandler(Settings(model_groups={group: ModelGroupSettings(routing="kv",
                                                                               kv={"verify_every": 0})}))

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, {"model_group": group, **labels}) or 0.0

    async def run() -> None:
        g = KVGroup(group, handler.options[group], InMemoryIndex(), None, True, "memory")
        for d in deployments:
            base = d["litellm_params"]["api_base"].removesuffix("/v1")
            g.fleet.replicas[replica_id(base)] = ReplicaState(
                replica_id(base), d["model_info"]["id"], base, EngineClient(base), block_size=16, hash_algo="sha256",
                prefix_caching=True, ready=True)
        g.fleet._refresh_exactness()
        g.deployment_ids = frozenset(str(d["model_info"]["id"]) for d in deployments)
        g.tokenizer = LocalChatTokenizer(engine_model)
        handler.groups[group] = g
        for i in range(2):
            msgs = [{"role": "user", "content": f"question {i}: " + "why is the sky blue? " * 60}]
            kwargs: dict[str, Any] = {"model": group, "messages": msgs, "litellm_call_id": f"c{i}", "metadata": {}}
            assert await handler.filter_deployments(group, deployments, msgs, kwargs)
            assert kwargs["metadata"]["litellm_kv_route"]["fallback"] is None

    asyncio.run(run())
    assert sample("litellm_kv_routing_stage_seconds_count", stage="tokenize") == 2
    assert sample("litellm_kv_routing_stage_seconds_count", stage="hash") == 2
    assert sample("litellm_kv_routing_decision_cpu_seconds_count") == 2
    cpu = sample("litellm_kv_routing_decision_cpu_seconds_sum")
    wall = sum(sample("litellm_kv_routing_decision_seconds_sum", tokenizer=t) for t in ("local", "engine", "none"))
    # The thread's CPU clock and the wall clock are different kernel clocks; in a VM they drift by a few per cent
    # (CI measured CPU 5 % above wall), so the bound catches a wrong clock or unit, not a sub-millisecond skew.
    assert 0 < cpu <= 1.5 * wall + 1e-3
    stages = sample("litellm_kv_routing_stage_seconds_sum", stage="tokenize") + sample(
        "litellm_kv_routing_stage_seconds_sum", stage="hash")
    assert 0 < stages < wall
