"""Governance that holds against the client, through a real ``litellm`` proxy process (issue 18).

Each test sends what a hostile client can send and checks the limit it names still holds: a crash
while deciding refuses the request, decisions and response headers come from the proxy alone, and
a metric label is a configured model group.

Keys with metadata are presented through ``general_settings.custom_auth`` (the database path cannot
run here). The upstream is the local fake (``tests/support/fake_upstream.py``) standing in for a
reasoning and vision engine: no vision model runs on this machine, and these tests read what the
upstream received (``GET /_requests``), which only a capture server can show.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image

from tests.support.fake_upstream import start_fake_upstream
from tools.harness.proxy import Proxy, start_proxy

pytestmark = pytest.mark.proxy

REASONING_WORDS = 20
FORGED_GROUP = "forged-label-from-the-client"
VICTIM_TEAM = "t-victim"
CEILING_PIXELS = 28 * 28 * 256  # unfetched remote images count at 256 tokens, and the engine is held to it

KEYS: dict[str, dict[str, Any]] = {
    "sk-plain": {"key_alias": "plain", "metadata": {}},
    "sk-capped": {"key_alias": "capped",
                  "metadata": {"litellm_kv": {"reasoning": {"max_budget": 5, "show_reasoning": False}}}},
    # An admin pasted nesting deeper than the JSON reader's stack: json.loads raises RecursionError.
    "sk-deep": {"key_alias": "deep", "metadata": {"litellm_kv": "[" * 100_000 + "]" * 100_000}},
    "sk-victim": {"key_alias": "victim", "metadata": {}, "team_id": VICTIM_TEAM, "team_alias": "victim",
                  "team_metadata": {"litellm_kv": {"vision": {"tokens_per_day": 2000}}}},
    "sk-attacker": {"key_alias": "attacker", "metadata": {}},
}


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    upstream, url = start_fake_upstream("adversarial", "--reasoning-words", str(REASONING_WORDS),
                                        "--report-reasoning-tokens", "--count-reasoning-in-completion")
    dep = {"model": "hosted_vllm/fake-model", "api_base": url + "/v1"}
    config = {
        "model_list": [
            {"model_name": "qwen", "litellm_params": dep},
            {"model_name": "qwen-vl", "litellm_params": dep},
            {"model_name": "qwen-vl-capped", "litellm_params": dep},
            {"model_name": "open", "litellm_params": dep},  # configured without limits: ungoverned
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {
            "qwen": {"reasoning": {"style": "vllm", "max_budget": 50}},
            "qwen-vl": {"vision": {"family": "qwen2_5_vl", "max_visual_tokens_per_request": 1000,
                                   "fetch": {"allow_hosts": ["127.0.0.1"], "timeout_s": 1.0}}},
            "qwen-vl-capped": {"vision": {"family": "qwen2_5_vl", "max_pixels": CEILING_PIXELS}},
            # Over the governed groups' deployment: an entry of its own says it has no limits.
            "open": {},
        }},
    }
    proxy = start_proxy(config, name="litellm-adversarial", keys=KEYS, env={"LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    try:
        yield {"proxy": proxy, "upstream": url}
    finally:
        proxy.stop()
        upstream.stop()


def _chat(proxy: Proxy, key: str, model: str, content: Any = "think about it", **body: Any) -> httpx.Response:
    payload = {"model": model, "messages": [{"role": "user", "content": content}], **body}
    return httpx.post(proxy.url + "/v1/chat/completions", json=payload, headers=proxy.headers(key), timeout=60)


def _upstream_requests(url: str) -> list[dict[str, Any]]:
    return list(httpx.get(url + "/_requests", timeout=5).json())


def _png(w: int, h: int) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 120, 200)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def _image(url: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": "describe this"}, {"type": "image_url", "image_url": {"url": url}}]


def _error(r: httpx.Response) -> dict[str, Any]:
    return dict(r.json()["error"])


# -- fail closed --------------------------------------------------------------------------------------


def test_reasoning_max_budget_holds_against_a_400_digit_budget(stack: dict[str, Any]) -> None:
    """A budget too large for a float used to crash the policy, and the client's own fields went upstream."""
    r = _chat(stack["proxy"], "sk-capped", "qwen", thinking={"type": "enabled", "budget_tokens": int("9" * 400)},
              reasoning_effort="high", chat_template_kwargs={"enable_thinking": True})
    assert r.status_code == 200, r.text
    up = _upstream_requests(stack["upstream"])[-1]["body"]
    assert up["thinking_token_budget"] == 5
    assert "reasoning_effort" not in up and "thinking" not in up
    assert not r.json()["choices"][0]["message"].get("reasoning_content")  # show_reasoning: false holds


def test_reasoning_limits_hold_when_key_metadata_is_nested_too_deeply(stack: dict[str, Any]) -> None:
    """RecursionError while reading the key's metadata is the key's malformed metadata: a 400 naming it."""
    sent = len(_upstream_requests(stack["upstream"]))
    r = _chat(stack["proxy"], "sk-deep", "qwen", reasoning_effort="high")
    assert r.status_code == 400, r.text
    assert _error(r)["param"] == "metadata.litellm_kv"
    assert "key 'deep'" in _error(r)["message"]
    assert len(_upstream_requests(stack["upstream"])) == sent  # never reached the upstream


def test_visual_token_limit_holds_for_an_unfetchable_image_url(stack: dict[str, Any]) -> None:
    """httpx refuses a URL with a NUL byte with InvalidURL (not an HTTPError): the image is refused."""
    sent = len(_upstream_requests(stack["upstream"]))
    r = _chat(stack["proxy"], "sk-plain", "qwen-vl", _image("http://127.0.0.1:9/huge.png#\x00"))
    assert r.status_code == 400, r.text
    assert _error(r)["param"] == "image.invalid_url"
    assert len(_upstream_requests(stack["upstream"])) == sent


# -- decisions live on the server ---------------------------------------------------------------------


def test_visual_token_budget_of_another_team_cannot_be_charged_by_a_forged_decision(stack: dict[str, Any]) -> None:
    proxy = stack["proxy"]
    forged = {"model_group": "qwen-vl", "family": "qwen2_5_vl", "tokens": 1_000_000_000, "images": [],
              "max_pixels": None, "charges": [{"scope": f"team:{VICTIM_TEAM}", "period": "day", "limit": 2000,
                                               "source": "forged"}]}
    attack = _chat(proxy, "sk-attacker", "open", metadata={"litellm_kv_vision": forged})
    assert attack.status_code == 200, attack.text
    assert (attack.json()["usage"].get("prompt_tokens_details") or {}).get("image_tokens") in (None, 0)
    victim = _chat(proxy, "sk-victim", "qwen-vl", _image(_png(28, 28)))
    assert victim.status_code == 200, victim.text  # the team's daily budget is untouched


def test_response_headers_cannot_be_set_by_the_client(stack: dict[str, Any]) -> None:
    forged = {"set-cookie": "session=stolen", "x-litellm-kv-reasoning-budget": "unlimited"}
    for model in ("open", "qwen"):
        r = _chat(stack["proxy"], "sk-plain", model, metadata={"litellm_kv_headers": forged})
        assert r.status_code == 200, r.text
        assert "session=stolen" not in r.headers.get("set-cookie", "")
        if model == "qwen":
            assert r.headers["x-litellm-kv-reasoning-budget"] == "50"  # the proxy's own decision
        else:
            assert "x-litellm-kv-reasoning-budget" not in r.headers


def test_reasoning_show_and_charge_cannot_be_forged_on_an_ungoverned_group(stack: dict[str, Any]) -> None:
    """A forged reasoning decision (naming a model group of its own) neither charges nor becomes a label."""
    forged = {"thinking": True, "budget": None, "show_reasoning": False, "model_group": FORGED_GROUP,
              "charges": [{"scope": f"team:{VICTIM_TEAM}", "period": "day", "limit": 10, "source": "forged"}]}
    vision = {"model_group": FORGED_GROUP, "tokens": 7, "charges": []}
    r = _chat(stack["proxy"], "sk-attacker", "open",
              metadata={"litellm_kv_reasoning": forged, "litellm_kv_vision": vision})
    assert r.status_code == 200, r.text
    metrics = httpx.get(stack["proxy"].url + "/litellm-kv/metrics", headers=stack["proxy"].headers(), timeout=10)
    assert metrics.status_code == 200
    assert FORGED_GROUP not in metrics.text
    # The ungoverned group's answer is what the upstream sent (the forged record hid nothing).
    assert r.json()["choices"][0]["message"].get("reasoning_content")


# -- every endpoint -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/messages", {"max_tokens": 50, "messages": [{"role": "user", "content": "think"}],
                      "thinking": {"type": "enabled", "budget_tokens": 4000}}),
    ("/v1/responses", {"input": "think", "reasoning": {"effort": "high"}}),
], ids=["messages", "responses"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_reasoning_max_budget_is_not_bypassed_through_other_endpoints(
    stack: dict[str, Any], path: str, body: dict[str, Any], stream: bool
) -> None:
    """Their reasoning is neither measured nor hidden yet: a governed group refuses them (400
    `reasoning.endpoint`), streamed or not, naming why, before anything reaches the engine."""
    proxy = stack["proxy"]
    sent = len(_upstream_requests(stack["upstream"]))
    r = httpx.post(proxy.url + path, json={"model": "qwen", "stream": stream, **body},
                   headers=proxy.headers("sk-capped"), timeout=60)
    assert r.status_code == 400, r.text
    assert "/v1/chat/completions only" in r.text and "reasoning.endpoint" in r.text
    assert len(_upstream_requests(stack["upstream"])) == sent



# -- the proxy's own decisions still reach every later hook ----------------------------------------------


def test_visual_token_ceiling_kept_by_the_proxy_reaches_the_engine(stack: dict[str, Any]) -> None:
    """The decision kept under the call's key is what the deployment hook sends (mm_processor_kwargs)."""
    r = _chat(stack["proxy"], "sk-plain", "qwen-vl-capped", _image("http://localhost:9/never-fetched.png"))
    assert r.status_code == 200, r.text
    assert _upstream_requests(stack["upstream"])[-1]["body"]["mm_processor_kwargs"] == {"max_pixels": CEILING_PIXELS}
    assert r.headers["x-litellm-kv-visual-tokens"] == "256"


def test_streamed_visual_tokens_are_charged_from_the_proxy_s_decision(stack: dict[str, Any]) -> None:
    proxy = stack["proxy"]
    body = {"model": "qwen-vl", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": _image(_png(28, 28))}]}
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=60,
                      headers=proxy.headers("sk-plain")) as s:
        assert s.status_code == 200
        chunks = [json.loads(ln[6:]) for ln in s.iter_lines() if ln.startswith("data: {")]
    usage = next(c["usage"] for c in reversed(chunks) if c.get("usage"))
    assert usage["prompt_tokens_details"]["image_tokens"] == 4
