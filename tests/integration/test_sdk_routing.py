"""KV routing for an application's own ``litellm.Router`` (no proxy): ``enable_kv_routing`` in process, real vLLM
CPU replicas (the session fixture). Each response's ``cached_tokens`` is compared with litellm-kv's prediction
for it (the verification counters the proxy exports, read in process), and follow-up turns must land on the
replica that holds their conversation."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tools.harness.engines import EngineReplica

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network here: LiteLLM's bundled prices

import litellm

from litellm_kv.errors import ConfigError
from litellm_kv.integration.callback import LiteLLMKV
from litellm_kv.integration.sdk import enable_kv_routing

pytestmark = [pytest.mark.engine]

GROUP = "tiny-sdk"


def _count(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"model_group": GROUP, **labels}) or 0.0


def _counters() -> dict[str, float]:
    out = {o: _count("litellm_kv_prediction_checks_total", outcome=o)
           for o in ("exact", "under", "over", "missing", "fallback")}
    out["predicted"] = _count("litellm_kv_predicted_cached_tokens_total")
    out["actual"] = _count("litellm_kv_actual_cached_tokens_total")
    return out


async def _until_indexed(kv: Any, messages: list[dict[str, Any]], timeout_s: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        explained = await kv.explain({"model": GROUP, "messages": messages})
        if max(explained["hit_tokens"].values(), default=0) > 0:
            return
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"the index did not receive the conversation's blocks within {timeout_s} s: {explained}")
        await asyncio.sleep(0.05)


def _why(kv: Any, what: str) -> str:
    """What the decision saw, in full (pytest shortens a tuple's repr): its predicted TTFTs, the engine gauges
    as scraped and as aged, this process's load, the learned rates."""
    g = kv.handler.groups[GROUP]
    replicas = list(g.fleet.replicas)
    seen = {
        "predicted_ttft_s": g.router.last_ttft,
        "gauges": {r: {"scraped": (st.waiting, st.running), "aged": g.fleet.aging.adjust(r, st.waiting, st.running)}
                   for r, st in g.fleet.replicas.items()},
        "load": {r: asdict(ld) for r, ld in g.load.local_snapshot(GROUP, replicas).items()},
        "rates": kv.health()["groups"][GROUP].get("rates"),
    }
    return f"{what}; {json.dumps(seen, default=str)}"


async def test_an_applications_router_follows_the_cache(engines: list[EngineReplica], engine_model: Path) -> None:
    model_list = [{"model_name": GROUP, "litellm_params": {"model": "hosted_vllm/tiny", "api_base": r.api_base,
                                                           "api_key": "none"}} for r in engines]
    router = litellm.Router(model_list=model_list, routing_strategy="simple-shuffle")
    kv = await enable_kv_routing(router, {"model_groups": {GROUP: {"routing": "kv", "kv": {
        "tokenizer_path": str(engine_model), "scrape_interval_s": 0.5, "discovery_interval_s": 1.0}}}})
    try:
        await kv.wait_exact(60)
        assert str(kv.health()["groups"][GROUP]["tokenizer"]).startswith("local (verified")
        before = _counters()
        convs: list[list[dict[str, Any]]] = [
            [{"role": "system", "content": f"conversation {c}: " + " ".join(secrets.token_hex(3) for _ in range(60))},
             {"role": "user", "content": "hello"}]
            for c in range(4)
        ]
        homes: dict[int, str] = {}
        cached_sum = 0
        requests = 0
        for turn in range(3):
            for c, messages in enumerate(convs):
                resp = await router.acompletion(model=GROUP, messages=messages, max_tokens=4, temperature=0.0)
                requests += 1
                base = str(resp._hidden_params.get("api_base"))
                cached = resp.usage.prompt_tokens_details.cached_tokens
                cached_sum += cached
                if turn == 0:
                    homes[c] = base
                else:
                    # The follow-up goes where its conversation's blocks are, and finds them there.
                    assert base == homes[c], _why(kv, f"turn {turn}: conversation {c} went to {base}, not {homes[c]}")
                    assert cached > 0, (turn, c)
                messages += [{"role": "assistant", "content": resp.choices[0].message.content or ""},
                             {"role": "user", "content": f"and then {turn}?"}]
            # The engines publish KV events as they store blocks; the index applies them a moment after the
            # response (longer on a busy machine). Each next turn is sent once the index holds this turn's
            # blocks (bounded), so the routing and its exactness are what is checked, not that race.
            for messages in convs:
                await _until_indexed(kv, messages)
        # Load still spreads new conversations over both replicas.
        assert len(set(homes.values())) == 2, homes
        after = _counters()
        delta = {k: after[k] - before[k] for k in after}
        # Every prediction was checked against the engine's cached_tokens, and every one was exact.
        assert delta["exact"] == requests, delta
        assert delta["under"] == delta["over"] == delta["missing"] == delta["fallback"] == 0, delta
        assert delta["predicted"] == delta["actual"] == cached_sum > 0, (delta, cached_sum)

        # The decision can be asked for without sending: it names the replica holding the conversation.
        explained = await kv.explain({"model": GROUP, "messages": convs[0]})
        assert homes[0].startswith(explained["replica"]) and explained["predicted_hit_tokens"] > 0, explained
    finally:
        await kv.close()
    assert kv.callback not in litellm.callbacks


@pytest.mark.parametrize(("group", "named"), [
    ({"reasoning": {"style": "vllm", "max_budget": 50}}, "model_groups.g.reasoning"),
    ({"vision": {"family": "qwen2_5_vl"}}, "model_groups.g.vision"),
    ({"routing": "kv", "kv": {"tenant_isolation": "team"}}, "model_groups.g.kv.tenant_isolation"),
])
async def test_settings_only_the_proxy_applies_are_refused_not_ignored(group: dict[str, Any], named: str) -> None:
    router = litellm.Router(model_list=[{"model_name": "g", "litellm_params": {
        "model": "hosted_vllm/tiny", "api_base": "http://127.0.0.1:9/v1", "api_key": "none"}}])
    with pytest.raises(ConfigError) as refused:
        await enable_kv_routing(router, {"model_groups": {"g": group}})
    assert named in str(refused.value) and "through the proxy" in str(refused.value)
    assert not any(isinstance(cb, LiteLLMKV) for cb in litellm.callbacks)
