"""Batches LiteLLM runs itself, on a real database: a key that may not reach a governed model's engines on
``/v1/batches`` is refused when it creates the batch, whichever way the batch names its model.

LiteLLM 1.110.2 runs a batch for a ``hosted_vllm`` model itself: the client uploads a JSONL file with
``/v1/files`` (``purpose=batch``, ``target_model_names``), LiteLLM keeps it in its database, and
``/v1/batches`` sends each line through its router, without the pre-call hook. The model comes from the file's
id when the batch body names none. This needs LiteLLM's managed files, which its source tree and Docker image
turn on (``enterprise.enterprise_hooks``) and its pip package does not: the proxy gets that one table from
``tests/support/managed_files``; the hook itself is LiteLLM's own (``litellm_enterprise``).

The lines of a batch on a KV-routed group with tenant isolation get their key's ``cache_salt`` where the router
hands them to the deployment, since the pre-call hook that salts chat calls never sees them.

Real parts: PostgreSQL, LiteLLM with prisma-client-py (``tools/litellm_db``), LiteLLM's batch runner and
managed files, and two real vLLM CPU replicas for the KV-routed group (the session's ``engines``). The governed
groups' upstreams are the local fake (``tests/support/fake_upstream.py``), which answers 404 on ``/v1/files`` as
vLLM does, so LiteLLM runs the batches itself: what is tested there is that nothing reaches them.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.support.fake_upstream import start_fake_upstream
from tools.harness.database import PostgresServer, db_env, start_db_proxy, unavailable
from tools.harness.engines import EngineReplica, reset_prefix_caches
from tools.harness.proxy import MASTER_KEY, ROOT, Proxy

pytestmark = [pytest.mark.litellm_db, pytest.mark.proxy,
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

ADMIN = {"Authorization": f"Bearer {MASTER_KEY}"}
MANAGED_FILES = ROOT / "tests" / "support" / "managed_files"
LINES = 3
ISOLATED = "iso"


@pytest.fixture(scope="module")
def stack(litellm_postgres: PostgresServer, engines: list[EngineReplica],
          engine_model: Any) -> Iterator[dict[str, Any]]:
    thinker, thinker_url = start_fake_upstream("batch-think", "--reasoning-words", "20")
    seer, seer_url = start_fake_upstream("batch-see")
    plain, plain_url = start_fake_upstream("batch-plain")
    db = litellm_postgres.database()
    config = {
        "model_list": [
            {"model_name": "think", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                       "api_base": thinker_url + "/v1"}},
            {"model_name": "see", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                     "api_base": seer_url + "/v1"}},
            # A second name over the reasoning engine, without an entry of its own.
            {"model_name": "think-too", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                           "api_base": thinker_url + "/v1"}},
            {"model_name": "plain", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                       "api_base": plain_url + "/v1"}},
            *({"model_name": ISOLATED, "litellm_params": {"model": "hosted_vllm/tiny", "api_base": r.api_base,
                                                          "api_key": "none"}, "model_info": {"id": f"iso-{i}"}}
              for i, r in enumerate(engines)),
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {
            "think": {"reasoning": {"style": "vllm", "max_budget": 50}},
            "see": {"vision": {"family": "qwen2_5_vl"}},
            ISOLATED: {"routing": "kv", "kv": {"tokenizer_path": str(engine_model), "tenant_isolation": "key"}},
        }},
    }
    proxy = None
    try:
        path = os.pathsep.join([db_env()["PYTHONPATH"], str(MANAGED_FILES)])
        proxy = start_db_proxy(config, db, name="litellm-batches", timeout=480,
                               env={"PYTHONPATH": path, "LITELLM_KV_SALT_SECRET": uuid.uuid4().hex * 2})
        proxy.wait_kv_exact(ISOLATED)
        r = httpx.post(proxy.url + "/key/generate", headers=ADMIN, timeout=60, json={
            "key_alias": f"batches-{uuid.uuid4().hex[:6]}",
            "metadata": {"litellm_kv": {"reasoning": {"max_budget": 10, "tokens_per_day": 100}}}})
        assert r.status_code == 200, r.text
        yield {"proxy": proxy, "key": r.json()["key"], "engines": engines,
               "upstreams": {"think": thinker_url, "see": seer_url, "plain": plain_url}}
    finally:
        if proxy is not None:
            proxy.stop()
        db.stop()
        for fake in (plain, seer, thinker):
            fake.stop()


def upload(proxy: Proxy, key: str, model: str, messages: list[dict[str, Any]] | None = None, lines: int = LINES) -> str:
    """A batch input file kept by LiteLLM for ``model`` (``lines`` lines, each with ``messages`` or a question of its
    own); returns its id."""
    text = "".join(json.dumps({
        "custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": model, "messages": messages or [{"role": "user", "content": f"question {i}"}],
                 "max_tokens": 20},
    }) + "\n" for i in range(lines))
    r = httpx.post(proxy.url + "/v1/files", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                   files={"file": ("input.jsonl", text.encode(), "application/jsonl")},
                   data={"purpose": "batch", "target_model_names": model})
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


def create(proxy: Proxy, key: str, file_id: str, model: str | None) -> httpx.Response:
    body: dict[str, Any] = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    if model is not None:
        body["model"] = model
    return httpx.post(proxy.url + "/v1/batches", headers={"Authorization": f"Bearer {key}"}, json=body, timeout=60)


def finished(proxy: Proxy, key: str, batch_id: str, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = httpx.get(proxy.url + f"/v1/batches/{batch_id}", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        assert r.status_code == 200, r.text
        batch = dict(r.json())
        if batch.get("status") in ("completed", "failed", "expired", "cancelled"):
            return batch
        time.sleep(0.5)
    raise AssertionError(f"batch {batch_id} did not finish within {timeout} s")


def served(url: str) -> int:
    return len(httpx.get(url + "/_requests", timeout=5).json())


def test_a_batch_on_a_model_without_limits_is_run_by_litellm(stack: dict[str, Any]) -> None:
    # The path the refusals below close is open: LiteLLM runs this batch itself, line by line.
    proxy, key, plain = stack["proxy"], stack["key"], stack["upstreams"]["plain"]
    before = served(plain)
    r = create(proxy, key, upload(proxy, key, "plain"), model=None)
    assert r.status_code == 200, r.text
    batch = finished(proxy, key, r.json()["id"])
    assert batch["status"] == "completed", batch
    assert batch["request_counts"] == {"completed": LINES, "failed": 0, "total": LINES}, batch
    assert served(plain) - before == LINES


@pytest.mark.parametrize("named", [False, True], ids=["model-from-the-file", "model-in-the-body"])
@pytest.mark.parametrize(("model", "limit"), [("think", "reasoning.endpoint"), ("see", "vision.endpoint"),
                                              ("think-too", "governance.model_name")])
def test_a_batch_bound_for_governed_engines_is_refused_when_created(
    stack: dict[str, Any], model: str, limit: str, named: bool,
) -> None:
    proxy, key, ups = stack["proxy"], stack["key"], stack["upstreams"]
    before = {name: served(url) for name, url in ups.items()}
    r = create(proxy, key, upload(proxy, key, model), model=model if named else None)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == limit, error
    assert "/v1/batches" in error["message"] or limit == "governance.model_name", error
    time.sleep(1.0)  # a batch that had been accepted would have started its lines by now
    assert {name: served(url) for name, url in ups.items()} == before


def test_a_body_naming_another_model_does_not_hide_the_file_s_model(stack: dict[str, Any]) -> None:
    # LiteLLM runs the lines on the model the file was uploaded for, whatever the body names.
    proxy, key, ups = stack["proxy"], stack["key"], stack["upstreams"]
    before = served(ups["think"])
    r = create(proxy, key, upload(proxy, key, "think"), model="plain")
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "reasoning.endpoint", r.text
    time.sleep(1.0)
    assert served(ups["think"]) == before


def new_key(proxy: Proxy) -> str:
    r = httpx.post(proxy.url + "/key/generate", headers=ADMIN, timeout=60,
                   json={"key_alias": f"iso-{uuid.uuid4().hex[:6]}"})
    assert r.status_code == 200, r.text
    return str(r.json()["key"])


def line_bodies(proxy: Proxy, key: str, batch: dict[str, Any]) -> list[dict[str, Any]]:
    assert batch["status"] == "completed" and batch["request_counts"]["failed"] == 0, batch
    r = httpx.get(proxy.url + f"/v1/files/{batch['output_file_id']}/content",
                  headers={"Authorization": f"Bearer {key}"}, timeout=30)
    assert r.status_code == 200, r.text
    return [json.loads(line)["response"]["body"] for line in r.text.splitlines() if line.strip()]


def cached(body: dict[str, Any]) -> int:
    return int((body["usage"].get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def run_batch(proxy: Proxy, key: str, messages: list[dict[str, Any]], lines: int) -> list[dict[str, Any]]:
    r = create(proxy, key, upload(proxy, key, ISOLATED, messages, lines), model=None)
    assert r.status_code == 200, r.text
    return line_bodies(proxy, key, finished(proxy, key, r.json()["id"]))


def test_batch_lines_on_an_isolated_group_share_the_cache_of_their_key_only(stack: dict[str, Any]) -> None:
    """A batch line carries its key's cache_salt: it reuses what the same key's chat calls cached, and a batch of
    another key reuses none of it. Before, batch lines went to the engines unsalted: another key's batch hit the
    first key's batch blocks, and a key's batch missed its own chat's blocks."""
    proxy: Proxy = stack["proxy"]
    reset_prefix_caches(stack["engines"])
    alice, bob = new_key(proxy), new_key(proxy)
    messages = [{"role": "system", "content": f"private system prompt {uuid.uuid4().hex} " * 60},
                {"role": "user", "content": "the same question"}]
    checks = proxy.metric_by("litellm_kv_prediction_checks_total", "outcome", model_group=ISOLATED)
    chat = httpx.post(proxy.url + "/v1/chat/completions", headers={"Authorization": f"Bearer {alice}"}, timeout=60,
                      json={"model": ISOLATED, "messages": messages, "max_tokens": 8})
    assert chat.status_code == 200, chat.text
    own = run_batch(proxy, alice, messages, lines=1)
    other = run_batch(proxy, bob, messages, lines=1)
    print(f"\ncached tokens: alice's batch {cached(own[0])}, bob's batch {cached(other[0])}")
    assert cached(own[0]) > 0, "a key's batch line reuses the blocks of the same key's chat call"
    assert cached(other[0]) == 0, "another key's batch line must not hit them"
    # Routed with the salt the engine got: every prediction exact.
    after = proxy.metric_by("litellm_kv_prediction_checks_total", "outcome", model_group=ISOLATED)
    assert after.get("exact", 0) - checks.get("exact", 0) == 3, after
    assert sum(after.values()) - sum(checks.values()) == 3, after
    late = proxy.metric_by("litellm_kv_isolated_at_deployment_total", "model_group", model_group=ISOLATED)
    assert late.get(ISOLATED, 0) == 2, late
