"""The admin's path on LiteLLM's real database: keys and teams created and edited through LiteLLM's own
endpoints (what its admin UI sends), stored in PostgreSQL, and the rows LiteLLM writes to
``LiteLLM_SpendLogs``.

Real parts: PostgreSQL, LiteLLM 1.110.2 with prisma-client-py (its native query engine replaced by Prisma's
WebAssembly build of the same engine: ``tools/litellm_db``), a real Redis for ``coordination_redis``. The
upstream is the local fake (``tests/support/fake_upstream.py``): the reasoning and vision models these limits
are about cannot run on this machine; the engine path is covered by ``test_reasoning_engine.py``.

Marked ``litellm_db`` (PostgreSQL, two proxies; see docs/development.md for its runtime).
"""

from __future__ import annotations

import base64
import io
import json
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from PIL import Image

from litellm_kv.governance.vision import visual_tokens
from tests.support.fake_upstream import start_fake_upstream
from tools.harness.database import Postgres, PostgresServer, start_db_proxy, unavailable
from tools.harness.proxy import MASTER_KEY, Proxy
from tools.harness.redis_server import RedisServer

pytestmark = [pytest.mark.litellm_db, pytest.mark.proxy,
              pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))]

REASONING_WORDS = 20
IN_RATE, OUT_RATE, REASONING_RATE, IMAGE_RATE = 1e-6, 2e-6, 3e-5, 5e-6
#: How soon an edit saved on one proxy applies on another with the recommended settings (docs/admin-workflow.md).
PROPAGATION_S = 5.0
ADMIN = {"Authorization": f"Bearer {MASTER_KEY}"}


@pytest.fixture(scope="module")
def stack(litellm_postgres: PostgresServer) -> Iterator[dict[str, Any]]:
    thinker, thinker_url = start_fake_upstream("db-think", "--reasoning-words", str(REASONING_WORDS))
    seer, seer_url = start_fake_upstream("db-see")
    redis = RedisServer()
    db = litellm_postgres.database()
    prices = {"input_cost_per_token": IN_RATE, "output_cost_per_token": OUT_RATE,
              "output_cost_per_reasoning_token": REASONING_RATE, "input_cost_per_image_token": IMAGE_RATE}
    config = {
        "model_list": [
            {"model_name": "think", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                       "api_base": thinker_url + "/v1", **prices}},
            {"model_name": "see", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                     "api_base": seer_url + "/v1", **prices}},
            {"model_name": "both", "litellm_params": {"model": "hosted_vllm/fake-model",
                                                      "api_base": thinker_url + "/v1", **prices}},
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        # The recommended settings: spend rows written within a second, key-cache invalidation shared.
        "general_settings": {"proxy_batch_write_at": 1,
                             "coordination_redis": {"host": "127.0.0.1", "port": redis.port},
                             "team_metadata_schema": [{"key": "litellm_kv", "label": "litellm-kv limits"}]},
        "litellm_kv": {"model_groups": {
            "think": {"reasoning": {"style": "vllm", "max_budget": 50}},
            # The fake counts an image as one prompt token: visual tokens are added to prompt_tokens.
            "see": {"vision": {"family": "qwen2_5_vl", "prompt_includes_images": False}},
            "both": {"reasoning": {"style": "vllm", "max_budget": 50},
                     "vision": {"family": "qwen2_5_vl", "prompt_includes_images": False}},
        }},
    }
    proxies: list[Proxy] = []
    try:
        # Both at once: each start runs LiteLLM's schema check (a Prisma CLI call), minutes on a busy machine.
        with ThreadPoolExecutor(2) as pool:
            starts = [pool.submit(start_db_proxy, config, db, name=f"litellm-db-{n}", timeout=480) for n in "ab"]
            for f in starts:
                try:
                    proxies.append(f.result())
                except Exception:
                    for g in starts:
                        if g.done() and g.exception() is None:
                            g.result().stop()
                    raise
        yield {"a": proxies[0], "b": proxies[1], "db": db, "thinker": thinker_url, "seer": seer_url}
    finally:
        for p in proxies:
            p.stop()
        db.stop()
        redis.stop()
        seer.stop()
        thinker.stop()


# -- helpers ---------------------------------------------------------------------------------------

def admin_post(proxy: Proxy, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(proxy.url + path, json=body, headers=ADMIN, timeout=60)


def new_key(proxy: Proxy, alias: str, **body: Any) -> str:
    r = admin_post(proxy, "/key/generate", {"key_alias": f"{alias}-{uuid.uuid4().hex[:6]}", **body})
    assert r.status_code == 200, r.text
    return str(r.json()["key"])


def key_metadata(proxy: Proxy, key: str) -> dict[str, Any]:
    r = httpx.get(proxy.url + "/key/info", params={"key": key}, headers=ADMIN, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json()["info"]["metadata"] or {})


def team_metadata(proxy: Proxy, team_id: str) -> dict[str, Any]:
    r = httpx.get(proxy.url + "/team/info", params={"team_id": team_id}, headers=ADMIN, timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json()["team_info"]["metadata"] or {})


def png(w: int, h: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (20, 90, 200)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(proxy: Proxy, key: str, model: str, *, images: int = 0, stream: bool = False,
         **body: Any) -> tuple[httpx.Response, dict[str, Any], str]:
    """One chat call; returns the response, its usage (a stream's usage chunk) and its id (the spend-log
    row's ``request_id``)."""
    content: list[dict[str, Any]] = [{"type": "text", "text": "think about this"}]
    content += [{"type": "image_url", "image_url": {"url": png(640, 480)}} for _ in range(images)]
    payload = {"model": model, "messages": [{"role": "user", "content": content}], "stream": stream, **body}
    headers = {"Authorization": f"Bearer {key}"}
    if not stream:
        r = httpx.post(proxy.url + "/v1/chat/completions", json=payload, headers=headers, timeout=60)
        ok = r.status_code == 200
        return r, (r.json().get("usage") or {}) if ok else {}, str(r.json().get("id")) if ok else ""
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=payload, headers=headers, timeout=60) as s:
        s.read()
        r = s
    chunks = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: {")]
    usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), {})
    return r, usage, str(chunks[0]["id"]) if chunks else ""


def spend_row(db: Postgres, request_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """The ``LiteLLM_SpendLogs`` row of one call, as LiteLLM stored it (written in batches each second)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = db.query(f"""SELECT row_to_json(s) FROM "LiteLLM_SpendLogs" s WHERE s.request_id = '{request_id}'""")
        if rows:
            return dict(rows[0])
        time.sleep(0.3)
    raise AssertionError(f"no LiteLLM_SpendLogs row for {request_id} after {timeout} s")


def upstream_requests(url: str) -> list[dict[str, Any]]:
    return [dict(x["body"]) for x in httpx.get(url + "/_requests", timeout=5).json()]


def error_of(r: httpx.Response) -> str:
    return str(r.json()["error"]["message"])


# -- refused at save, naming the field --------------------------------------------------------------

def test_invalid_key_metadata_is_refused_at_save_naming_the_field(stack: dict[str, Any]) -> None:
    a: Proxy = stack["a"]
    r = admin_post(a, "/key/generate", {"key_alias": "typo", "metadata": {
        "team_note": "x", "litellm_kv": {"reasoning": {"max_budget": "lots"}}}})
    assert r.status_code == 400, r.text
    assert error_of(r) == ("litellm-kv limits not saved: key 'typo': metadata.litellm_kv.reasoning.max_budget "
                           "must be an integer >= 0, got \"lots\"")
    assert r.json()["error"]["param"] == "metadata.litellm_kv.reasoning.max_budget"
    assert stack["db"].query("""SELECT count(*) FROM "LiteLLM_VerificationToken" WHERE key_alias = 'typo'""") == [0]

    key = new_key(a, "edited", metadata={"litellm_kv": {"reasoning": {"max_budget": 5}}})
    r = admin_post(a, "/key/update", {"key": key, "metadata": {"litellm_kv": {
        "reasoning": {"max_budget": 5, "over_max": "sometimes"}, "vison": {"max_images_per_request": 1}}}})
    assert r.status_code == 400, r.text
    fields = sorted(f["field"] for f in r.json()["error"]["fields"])
    assert fields == ["metadata.litellm_kv.reasoning.over_max", "metadata.litellm_kv.vison"]
    assert key_metadata(a, key)["litellm_kv"] == {"reasoning": {"max_budget": 5}}  # nothing stored


def test_invalid_team_metadata_is_refused_at_save_naming_the_field(stack: dict[str, Any]) -> None:
    a: Proxy = stack["a"]
    r = admin_post(a, "/team/new", {"team_alias": "t-bad", "metadata": {
        "litellm_kv": {"vision": {"max_pixels_per_image": 0}}}})
    assert r.status_code == 400, r.text
    assert "team 't-bad': metadata.litellm_kv.vision.max_pixels_per_image must be an integer >= 1, got 0" in error_of(r)
    r = admin_post(a, "/team/new", {"team_alias": "t-ok"})
    assert r.status_code == 200, r.text
    team_id = r.json()["team_id"]
    # LiteLLM's team editor stores each metadata value as typed: litellm_kv arrives as a one-line JSON string.
    r = admin_post(a, "/team/update", {"team_id": team_id, "metadata": {
        "litellm_kv": '{"reasoning": {"tokens_per_day": "many"}}'}})
    assert r.status_code == 400, r.text
    assert "metadata.litellm_kv.reasoning.tokens_per_day must be an integer >= 0" in error_of(r)
    r = admin_post(a, "/team/update", {"team_id": team_id, "metadata": {
        "litellm_kv": '{"reasoning": {"tokens_per_day": 1000}}'}})
    assert r.status_code == 200, r.text
    assert team_metadata(a, team_id)["litellm_kv"] == '{"reasoning": {"tokens_per_day": 1000}}'
    r = httpx.patch(a.url + f"/team/{team_id}", json={"metadata": {"litellm_kv": {"reasoning": []}}},
                    headers=ADMIN, timeout=30)
    assert r.status_code == 400, r.text


def test_schema_is_served(stack: dict[str, Any]) -> None:
    r = httpx.get(stack["a"].url + "/litellm-kv/metadata-schema", headers=ADMIN, timeout=30)
    assert r.status_code == 200
    assert set(r.json()["properties"]) == {"reasoning", "vision"}
    # The team editor's pre-filled row, as docs/key-metadata.md configures it.
    r = httpx.get(stack["a"].url + "/team/metadata_schema", headers=ADMIN, timeout=30)
    assert r.status_code == 200 and r.json()["fields"] == [{"key": "litellm_kv", "label": "litellm-kv limits"}]


# -- limits set through the endpoints apply --------------------------------------------------------

def test_key_limits_set_and_edited_through_the_endpoints(stack: dict[str, Any]) -> None:
    a: Proxy = stack["a"]
    key = new_key(a, "capped", metadata={"litellm_kv": {"reasoning": {"max_budget": 5}}})
    r, _, _ = chat(a, key, "think", extra_body={"thinking_token_budget": 400})
    assert r.status_code == 200, r.text
    assert upstream_requests(stack["thinker"])[-1]["thinking_token_budget"] == 5
    assert "source=key 'capped-" in r.headers["x-litellm-kv-reasoning-clamped"]
    r = admin_post(a, "/key/update", {"key": key, "metadata": {"litellm_kv": {"reasoning": {"max_budget": 3}}}})
    assert r.status_code == 200, r.text
    r, _, _ = chat(a, key, "think", extra_body={"thinking_token_budget": 400})  # same proxy: the next request
    assert r.status_code == 200, r.text
    assert upstream_requests(stack["thinker"])[-1]["thinking_token_budget"] == 3


def test_team_limits_set_through_team_update(stack: dict[str, Any]) -> None:
    a: Proxy = stack["a"]
    r = admin_post(a, "/team/new", {"team_alias": "vision-team"})
    assert r.status_code == 200, r.text
    team_id = r.json()["team_id"]
    key = new_key(a, "member", team_id=team_id)
    r, _, _ = chat(a, key, "see", images=2)
    assert r.status_code == 200, r.text
    r = admin_post(a, "/team/update", {"team_id": team_id, "metadata": {
        "litellm_kv": json.dumps({"vision": {"max_images_per_request": 1}})}})
    assert r.status_code == 200, r.text
    r, _, _ = chat(a, key, "see", images=2)
    assert r.status_code == 400, r.text
    assert "limit is 1 images per request" in error_of(r) and "(set in team 'vision-team')" in error_of(r)


# -- the spend-log row of every request kind --------------------------------------------------------

KINDS = {"reasoning": ("think", 0), "vision": ("see", 1), "both": ("both", 1)}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_spend_log_row_carries_amounts_and_breakdown(stack: dict[str, Any], kind: str, stream: bool) -> None:
    a: Proxy = stack["a"]
    model, images = KINDS[kind]
    key = new_key(a, f"spend-{kind}", metadata={"litellm_kv": {"reasoning": {"max_budget": 7}}})
    extra: dict[str, Any] = {"stream_options": {"include_usage": True}} if stream else {}
    r, usage, request_id = chat(a, key, model, images=images, stream=stream,
                                extra_body={"thinking_token_budget": 400}, **extra)
    assert r.status_code == 200, r.text
    row = spend_row(stack["db"], request_id)
    md = row["metadata"] if isinstance(row["metadata"], dict) else json.loads(row["metadata"])
    ours = (md.get("spend_logs_metadata") or {}).get("litellm_kv")
    assert ours is not None, f"no litellm-kv breakdown in the stored row: {md.get('spend_logs_metadata')!r}"
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    image_tokens = (usage.get("prompt_tokens_details") or {}).get("image_tokens") or 0
    if kind in ("reasoning", "both"):
        assert upstream_requests(stack["thinker"])[-1]["thinking_token_budget"] == 7
        # The fake reports no reasoning_tokens (as vLLM without them): litellm-kv counts and prices them.
        assert ours["reasoning"]["reasoning_tokens"] == reasoning > 0
        assert ours["reasoning"]["measured_by"] == "estimate"
        assert ours["reasoning"]["budget"] == 7 and ours["reasoning"]["clamped_by"].startswith("key 'spend-")
    else:
        assert reasoning == 0 and "reasoning" not in ours
    if kind in ("vision", "both"):
        assert ours["vision"]["visual_tokens"] == image_tokens == visual_tokens("qwen2_5_vl", 640, 480)
    else:
        assert image_tokens == 0 and "vision" not in ours
    expected = ((usage["prompt_tokens"] - image_tokens) * IN_RATE + image_tokens * IMAGE_RATE
                + (usage["completion_tokens"] - reasoning) * OUT_RATE + reasoning * REASONING_RATE)
    assert row["spend"] == pytest.approx(expected, rel=1e-9)
    assert row["prompt_tokens"] == usage["prompt_tokens"] and row["completion_tokens"] == usage["completion_tokens"]


# -- an edit reaches every proxy --------------------------------------------------------------------

def test_edit_reaches_a_second_proxy_within_the_stated_time(stack: dict[str, Any]) -> None:
    a: Proxy = stack["a"]
    b: Proxy = stack["b"]
    key = new_key(a, "shared", metadata={"litellm_kv": {"reasoning": {"max_budget": 6}}})
    r, _, _ = chat(b, key, "think", extra_body={"thinking_token_budget": 400})  # b caches the key
    assert r.status_code == 200, r.text
    assert upstream_requests(stack["thinker"])[-1]["thinking_token_budget"] == 6
    r = admin_post(a, "/key/update", {"key": key, "metadata": {"litellm_kv": {"reasoning": {"max_budget": 2}}}})
    assert r.status_code == 200, r.text
    saved = time.monotonic()
    seen = None
    while time.monotonic() - saved < PROPAGATION_S + 60:
        r, _, _ = chat(b, key, "think", extra_body={"thinking_token_budget": 400})
        assert r.status_code == 200, r.text
        if upstream_requests(stack["thinker"])[-1]["thinking_token_budget"] == 2:
            seen = time.monotonic() - saved
            break
        time.sleep(0.2)
    assert seen is not None and seen <= PROPAGATION_S, f"the edit reached the second proxy after {seen} s"
