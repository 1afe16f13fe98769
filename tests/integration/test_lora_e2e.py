"""LoRA end to end: a real vLLM CPU engine serving a real (tiny, locally built) LoRA adapter behind a real
``litellm`` proxy with litellm-kv, embedded mode.

vLLM keys every block of a LoRA request with the adapter's name *and path* (vllm-contract.md §2) and
publishes only the name in its KV events, so the router must learn the path (here from the engine's
``/v1/models``, as the engine resolved ``--lora-modules``) and hash with it. Checked against the engine's own
``cached_tokens``:

* the adapter never reuses the base model's blocks of the same prompt, nor the base model the adapter's,
  and the router predicts exactly that (0), not a hit;
* repeated adapter requests hit, and the prediction equals what the engine reports;
* a group told a wrong adapter path (``kv.lora_paths``) predicts no hit where the engine has one: the
  negative control that shows the exactness check can fail;
* an adapter loaded at runtime (``/v1/load_lora_adapter``), unknown to the router until it reads
  ``/v1/models`` again, is routed by load (``why=unknown_model``), never hashed as the base model.

One engine (its own, with ``--enable-lora``) serves both the base model and the adapter; routing among
replicas is covered in test_routing_e2e, this file is about the hashes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tools.harness.engines import SERVED_NAME, EngineReplica, ensure_lora, start_replicas, stop_replicas
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxy

pytestmark = [pytest.mark.engine, pytest.mark.proxy]

ADAPTER, LATE = "tiny-sql", "tiny-late"
BASE, LORA, WRONG, LATE_GROUP = "lora-base", "lora-adapter", "lora-wrong-path", "lora-late"
HEADERS = {"Authorization": f"Bearer {MASTER_KEY}"}


@pytest.fixture(scope="module")
def lora_dir(engine_model: Path) -> Path:
    return ensure_lora(engine_model)


@pytest.fixture(scope="module")
def lora_engine(lora_dir: Path) -> Iterator[EngineReplica]:
    reps = start_replicas(1, kv_cache_bytes="8M", name_prefix="lora", extra_args=[
        "--enable-lora", "--max-lora-rank", "8", "--max-loras", "1", "--lora-modules", f"{ADAPTER}={lora_dir}",
    ], env={"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"})
    try:
        yield reps[0]
    finally:
        stop_replicas(reps)


@pytest.fixture(scope="module")
def proxy(lora_engine: EngineReplica, engine_model: Path) -> Iterator[Proxy]:
    def deployment(group: str, served: str) -> dict[str, Any]:
        return {"model_name": group, "model_info": {"id": f"{group}-0"},
                "litellm_params": {"model": f"hosted_vllm/{served}", "api_base": lora_engine.api_base,
                                   "api_key": "none"}}

    kv = {"tokenizer_path": str(engine_model), "scrape_interval_s": 0.5, "discovery_interval_s": 1.0}
    config = {
        "model_list": [deployment(BASE, SERVED_NAME), deployment(LORA, ADAPTER), deployment(WRONG, ADAPTER),
                       deployment(LATE_GROUP, LATE)],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"], "request_timeout": 60},
        "litellm_kv": {"mode": "embedded", "model_groups": {
            BASE: {"routing": "kv", "kv": kv},
            LORA: {"routing": "kv", "kv": kv},
            WRONG: {"routing": "kv", "kv": {**kv, "lora_paths": {ADAPTER: "/not/where/the/engine/loaded/it"}}},
            LATE_GROUP: {"routing": "kv", "kv": kv},
        }},
    }
    p = start_proxy(config, name="lora-e2e")
    try:
        for group in (BASE, LORA, WRONG, LATE_GROUP):
            p.wait_kv_exact(group, timeout=60)
        yield p
    finally:
        p.stop()


def _outcomes(proxy: Proxy, group: str) -> dict[str, float]:
    """Prediction checks by outcome (exact, under, over, fallback, missing)."""
    return proxy.metric_by("litellm_kv_prediction_checks_total", "outcome", model_group=group)


def _fallbacks(proxy: Proxy, group: str) -> dict[str, float]:
    return proxy.metric_by("litellm_kv_routing_fallbacks_total", "why", model_group=group)


def _chat(proxy: Proxy, group: str, messages: list[dict[str, Any]]) -> tuple[int, str]:
    """One request: the engine's cached tokens and how litellm-kv's prediction for it compared
    (the outcome counter this request moved)."""
    before = _outcomes(proxy, group)
    r = httpx.post(f"{proxy.url}/v1/chat/completions", headers=HEADERS, timeout=120,
                   json={"model": group, "messages": messages, "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    cached = int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)
    deadline = time.monotonic() + 10  # the check runs in the success hook, right after the response
    while True:
        after = _outcomes(proxy, group)
        moved = [k for k in after if after[k] > before.get(k, 0)]
        if moved or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(moved) == 1, (before, after)
    return cached, moved[0]


def _prompt(tag: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": f"{tag}: you translate questions into SQL. " + "schema notes " * 60},
            {"role": "user", "content": "count the orders"}]


def test_the_engine_serves_the_adapter_and_the_router_knows_its_path(
        proxy: Proxy, lora_engine: EngineReplica, lora_dir: Path) -> None:
    models = httpx.get(f"{lora_engine.api_base}/models", timeout=10).json()["data"]
    adapter = next(m for m in models if m["id"] == ADAPTER)
    assert adapter["parent"] == SERVED_NAME and adapter["root"] == str(lora_dir)
    assert proxy.kv_health(LORA)["exact"]


def test_adapter_and_base_model_blocks_apart_and_predicted_exactly(proxy: Proxy) -> None:
    msgs = _prompt("apart")
    base1, base2 = _chat(proxy, BASE, msgs), _chat(proxy, BASE, msgs)
    lora1, lora2 = _chat(proxy, LORA, msgs), _chat(proxy, LORA, msgs)
    base3 = _chat(proxy, BASE, msgs)
    print(f"\n(cached tokens, prediction): base {base1} {base2}; adapter {lora1} {lora2}; base again {base3}")
    assert base1 == (0, "exact") and base2[0] > 0 and base2[1] == "exact"
    # The adapter's first request reuses none of the base model's blocks of the same prompt, and the router
    # (hashing with the adapter's name and path) predicted exactly that: hashed as the base model it would
    # have predicted base2[0] tokens ("over").
    assert lora1 == (0, "exact")
    assert lora2 == (base2[0], "exact")
    assert base3 == (base2[0], "exact")


def test_the_route_explainer_hashes_like_the_request(proxy: Proxy) -> None:
    """POST /litellm-kv/route answers for the adapter as a real request would be routed: a prompt only the
    base model has seen is predicted as a hit for the base group and not for the adapter's."""
    msgs = _prompt("explain")
    assert _chat(proxy, BASE, msgs) == (0, "exact")

    def predicted(group: str) -> int:
        r = httpx.post(f"{proxy.url}/litellm-kv/route", headers=HEADERS, timeout=30,
                       json={"model": group, "messages": msgs})
        assert r.status_code == 200, r.text
        return int(r.json()["predicted_hit_tokens"])

    assert predicted(BASE) > 0
    assert predicted(LORA) == 0


def test_a_wrong_adapter_path_is_caught_by_the_engines_report(proxy: Proxy) -> None:
    """Negative control: the group configured with another path hashes the adapter's blocks differently
    from the engine, so the engine reports a hit it did not predict."""
    msgs = _prompt("wrong path")
    assert _chat(proxy, LORA, msgs) == (0, "exact")  # stores the adapter's blocks
    cached, outcome = _chat(proxy, WRONG, msgs)
    assert cached > 0 and outcome == "under", (cached, outcome)


def test_an_adapter_loaded_at_runtime_is_routed_by_load_until_its_path_is_known(
        proxy: Proxy, lora_engine: EngineReplica, lora_dir: Path) -> None:
    """An adapter no replica listed at start-up (loaded later through /v1/load_lora_adapter) is not hashed
    as the base model: load-only with why=unknown_model, /v1/models is read again, then exact."""
    r = httpx.post(f"{lora_engine.api_base}/load_lora_adapter", timeout=60,
                   json={"lora_name": LATE, "lora_path": str(lora_dir)})
    assert r.status_code == 200, r.text
    msgs = _prompt("late adapter")
    before = _fallbacks(proxy, LATE_GROUP)
    first = _chat(proxy, LATE_GROUP, msgs)
    assert first == (0, "fallback")
    assert _fallbacks(proxy, LATE_GROUP).get("unknown_model", 0) == before.get("unknown_model", 0) + 1
    deadline = time.monotonic() + 15
    while True:  # the re-read of /v1/models runs in the background
        cached, outcome = _chat(proxy, LATE_GROUP, msgs)
        if outcome != "fallback" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert cached > 0 and outcome == "exact", (cached, outcome)
