"""Batches LiteLLM runs itself, on a real database: a key that may not reach a governed model's engines on
``/v1/batches`` is refused when it creates the batch, whichever way the batch names its model.

LiteLLM 1.110.2 runs a batch for a ``hosted_vllm`` model itself: the client uploads a JSONL file with
``/v1/files`` (``purpose=batch``, ``target_model_names``), LiteLLM keeps it in its database, and
``/v1/batches`` sends each line through its router, without the pre-call hook. The model comes from the file's
id when the batch body names none. This needs LiteLLM's managed files, which its source tree and Docker image
turn on (``enterprise.enterprise_hooks``) and its pip package does not: the proxy gets that one table from
``tests/support/managed_files``; the hook itself is LiteLLM's own (``litellm_enterprise``).

Real parts: PostgreSQL, LiteLLM with prisma-client-py (``tools/litellm_db``), LiteLLM's batch runner and
managed files. The upstreams are the local fake (``tests/support/fake_upstream.py``), which answers 404 on
``/v1/files`` as vLLM does, so LiteLLM runs the batches itself.
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
from tools.harness.proxy import MASTER_KEY, ROOT, Proxy

pytestmark = [pytest.mark.litellm_db, pytest.mark.proxy,
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

ADMIN = {"Authorization": f"Bearer {MASTER_KEY}"}
MANAGED_FILES = ROOT / "tests" / "support" / "managed_files"
LINES = 3


@pytest.fixture(scope="module")
def stack(litellm_postgres: PostgresServer) -> Iterator[dict[str, Any]]:
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
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {
            "think": {"reasoning": {"style": "vllm", "max_budget": 50}},
            "see": {"vision": {"family": "qwen2_5_vl"}},
        }},
    }
    proxy = None
    try:
        path = os.pathsep.join([db_env()["PYTHONPATH"], str(MANAGED_FILES)])
        proxy = start_db_proxy(config, db, name="litellm-batches", env={"PYTHONPATH": path}, timeout=480)
        r = httpx.post(proxy.url + "/key/generate", headers=ADMIN, timeout=60, json={
            "key_alias": f"batches-{uuid.uuid4().hex[:6]}",
            "metadata": {"litellm_kv": {"reasoning": {"max_budget": 10, "tokens_per_day": 100}}}})
        assert r.status_code == 200, r.text
        yield {"proxy": proxy, "key": r.json()["key"],
               "upstreams": {"think": thinker_url, "see": seer_url, "plain": plain_url}}
    finally:
        if proxy is not None:
            proxy.stop()
        db.stop()
        for fake in (plain, seer, thinker):
            fake.stop()


def upload(proxy: Proxy, key: str, model: str) -> str:
    """A batch input file kept by LiteLLM for ``model``; returns its id."""
    lines = "".join(json.dumps({
        "custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": model, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": 20},
    }) + "\n" for i in range(LINES))
    r = httpx.post(proxy.url + "/v1/files", headers={"Authorization": f"Bearer {key}"}, timeout=60,
                   files={"file": ("input.jsonl", lines.encode(), "application/jsonl")},
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
