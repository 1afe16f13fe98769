"""The admin page (``/litellm-kv/ui``) in a real headless Chromium, on LiteLLM's real database path.

A real ``litellm`` proxy on a real PostgreSQL (``tools/harness/database.py``; Prisma's engine is the
``tools/litellm_db`` stand-in, everything else is LiteLLM's own): the team and keys are created with ``/team/new`` and
``/key/generate``, requests are real, edits go through LiteLLM's ``/key/update``. The upstream is the local fake
(``tests/support/fake_upstream.py``) standing in for a reasoning and vision model: no engine is needed to
count reasoning and visual tokens against budgets. The fleet half of the page runs against real vLLM
replicas in ``test_admin_page_fleet.py``.
"""

from __future__ import annotations

import base64
import io
import re
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image
from playwright.sync_api import expect

from tests.support.browser import chromium, sign_in
from tests.support.fake_upstream import start_fake_upstream
from tools.harness.database import start_db_proxy, unavailable
from tools.harness.procs import ARTIFACTS, ROOT
from tools.harness.proxy import MASTER_KEY, Proxy

pytestmark = [pytest.mark.proxy, pytest.mark.litellm_db]

IMAGE_TOKENS = 64
SHOTS = ARTIFACTS / "admin-page"


def _admin(proxy: Proxy, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(proxy.url + path, json=body, headers=proxy.headers(), timeout=60)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (64, 64), (30, 90, 200)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Iterator[dict[str, Any]]:
    if unavailable() is not None:  # set up once per machine and venv (idempotent)
        subprocess.run(["bash", str(ROOT / "tools" / "litellm_db" / "setup.sh"), str(ROOT / ".venv")], check=False,
                       timeout=600, capture_output=True)
    why = unavailable()
    assert why is None, f"LiteLLM's database path cannot run here: {why}"
    fake, url = start_fake_upstream("admin-page-up", "--reasoning-words", "20", "--report-reasoning-tokens",
                                    "--count-reasoning-in-completion", "--image-tokens-each", str(IMAGE_TOKENS),
                                    "--mm-tokens-format", "dict", "--image-prompt-tokens", str(IMAGE_TOKENS))
    db = request.getfixturevalue("litellm_postgres").database()
    config = {
        "model_list": [
            {"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/fake-model", "api_base": url + "/v1"}},
            {"model_name": "qwen-vl", "litellm_params": {"model": "hosted_vllm/fake-model", "api_base": url + "/v1"}},
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {
            "qwen": {"reasoning": {"style": "vllm", "max_budget": 50}},
            "qwen-vl": {"vision": {"family": "qwen2_5_vl"}},
        }},
    }
    proxy = None
    try:
        proxy = start_db_proxy(config, db, name="litellm-admin-page", timeout=480)  # 2 shared cores: slow starts
        team = _admin(proxy, "/team/new", {"team_alias": "research", "metadata": {
            "litellm_kv": {"reasoning": {"tokens_per_week": 1000}}}})
        key = _admin(proxy, "/key/generate", {"key_alias": "bot-a", "team_id": team["team_id"], "metadata": {
            "owner": "analytics",
            "litellm_kv": {"reasoning": {"max_budget": 8, "tokens_per_day": 30},
                           "vision": {"max_images_per_request": 2, "tokens_per_day": 1000}}}})
        plain = _admin(proxy, "/key/generate", {"key_alias": "plain-user"})
        yield {"proxy": proxy, "team_id": team["team_id"], "key": key["key"], "key_id": key["token"],
               "user_key": plain["key"], "upstream": url}
    finally:
        if proxy is not None:
            proxy.stop()
        db.stop()
        fake.stop()


def _chat(proxy: Proxy, key: str, content: Any, model: str = "qwen") -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 16}
    return httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=proxy.headers(key), timeout=60)


def _owner(proxy: Proxy, **query: str) -> dict[str, Any]:
    r = httpx.get(proxy.url + "/litellm-kv/admin/owner", params=query, headers=proxy.headers(), timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _used(view: dict[str, Any], meter: str, period: str, scope_prefix: str) -> int | None:
    rows = [u for u in view["usage"] if u["meter"] == meter and u["period"] == period
            and u["scope"].startswith(scope_prefix)]
    return rows[0].get("used") if rows else None


@pytest.fixture(scope="module")
def traffic(stack: dict[str, Any]) -> dict[str, Any]:
    """Real requests with the key until its daily reasoning budget refuses one; one image request."""
    proxy, key = stack["proxy"], stack["key"]
    reasoning = 0
    refused: httpx.Response | None = None
    for _ in range(8):
        r = _chat(proxy, key, "think about it")
        if r.status_code == 429:
            refused = r
            break
        assert r.status_code == 200, r.text
        reasoning += r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"]
    assert refused is not None and reasoning > 0, "the daily budget never refused a request"
    r = _chat(proxy, key, [{"type": "text", "text": "describe"}, {"type": "image_url", "image_url": {"url": _png()}}],
              model="qwen-vl")
    assert r.status_code == 200, r.text
    # What was charged: the engine's own count, written into usage (billing.set_image_tokens).
    visual = int(r.json()["usage"]["prompt_tokens_details"]["image_tokens"])
    assert visual > 0
    # Charges settle just after each response: wait until the store has them all.
    deadline = time.monotonic() + 30
    view: dict[str, Any] = {}
    while time.monotonic() < deadline:
        view = _owner(proxy, key=key)
        if (_used(view, "reasoning_tokens", "day", "key:") == reasoning
                and _used(view, "visual_tokens", "day", "key:") == visual):
            break
        time.sleep(0.3)
    return {"reasoning": reasoning, "visual": visual, "refusal": refused.json()["error"]["message"], "view": view}


def _sign_in(page: Any, proxy: Proxy, key: str = MASTER_KEY) -> None:
    sign_in(page, proxy.url, key)


def _show(page: Any, kind: str, ident: str) -> None:
    page.select_option("#lookup-kind", kind)
    page.fill("#lookup-id", ident)
    page.click("#lookup button[type=submit]")
    page.wait_for_selector("#owner:not([hidden])")


def _usage_row(page: Any, tokens: str, period: str, owner: str) -> list[str]:
    for row in page.locator("#usage tbody tr").all():
        cells = [c.strip() for c in row.locator("td").all_inner_texts()]
        if cells[0] == tokens and cells[1] == period and cells[2] == owner:
            return cells
    raise AssertionError(f"no usage row {tokens}/{period}/{owner}: {page.inner_text('#usage')}")


def test_admin_routes_need_a_proxy_admin(stack: dict[str, Any]) -> None:
    proxy = stack["proxy"]
    page = httpx.get(proxy.url + "/litellm-kv/ui", timeout=10)
    assert page.status_code == 200 and "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert "bot-a" not in page.text  # the page itself carries no data
    calls = [("GET", "/litellm-kv/admin/owner", {"params": {"key": stack["key"]}}),
             ("GET", "/litellm-kv/admin/fleet", {}),
             ("POST", "/litellm-kv/admin/check", {"json": {"litellm_kv": {}}})]
    for method, path, kw in calls:
        anonymous = httpx.request(method, proxy.url + path, timeout=10, **kw)
        assert anonymous.status_code == 401, (path, anonymous.text)
        user = httpx.request(method, proxy.url + path, headers=proxy.headers(stack["user_key"]), timeout=10, **kw)
        # LiteLLM's own route check answers first on the database path (401, "Only proxy admin ..."); ours
        # answers 403 where LiteLLM lets the key through (custom_auth: test_admin_page_fleet.py).
        assert user.status_code in (401, 403) and "admin" in user.text, (path, user.text)
        assert httpx.request(method, proxy.url + path, headers=proxy.headers(), timeout=30, **kw).status_code == 200


def test_page_without_admin_credentials_shows_no_data(stack: dict[str, Any]) -> None:
    proxy = stack["proxy"]
    with chromium() as browser:
        page = browser.new_page()
        page.goto(proxy.url + "/litellm-kv/ui")
        page.wait_for_selector("#signin:not([hidden])")
        assert page.is_hidden("#app")
        _sign_in(page, proxy, stack["user_key"])
        expect(page.locator("#signin-error")).not_to_have_text("")
        assert "proxy admin" in page.inner_text("#signin-error")
        assert page.is_hidden("#app")


def test_page_lists_a_keys_limits_usage_and_refusals(stack: dict[str, Any], traffic: dict[str, Any]) -> None:
    proxy = stack["proxy"]
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        _sign_in(page, proxy)
        page.wait_for_selector("#app:not([hidden])")
        _show(page, "key", stack["key"])
        assert page.inner_text("#owner-title") == "key 'bot-a'"
        assert stack["key_id"] in page.inner_text("#owner-sub") and "team 'research'" in page.inner_text("#owner-sub")
        assert page.input_value("#f-reasoning-max_budget") == "8"
        assert page.input_value("#f-reasoning-tokens_per_day") == "30"
        assert page.input_value("#f-vision-max_images_per_request") == "2"
        assert page.input_value("#f-reasoning-over_max") == ""  # not set on this key
        assert "team: 1000" in page.inner_text("#f-reasoning-tokens_per_week >> xpath=..")
        day = _usage_row(page, "reasoning", "day", "key 'bot-a'")
        assert day[3] == f"{traffic['reasoning']:,}" and day[5] == "30" and day[7] == "key 'bot-a'"
        week = _usage_row(page, "reasoning", "week", "team 'research'")
        assert week[3] == f"{traffic['reasoning']:,}" and week[5] == "1,000"
        visual = _usage_row(page, "visual", "day", "key 'bot-a'")
        assert visual[3] == f"{traffic['visual']:,}" and visual[5] == "1,000"
        refusals = page.inner_text("#refusals tbody")
        assert "reasoning.tokens_per_day" in refusals and "429" in refusals
        assert traffic["refusal"][:60] in refusals
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "admin-page-key.png"), full_page=True)

        _show(page, "team", stack["team_id"])
        expect(page.locator("#owner-title")).to_have_text("team 'research'")
        assert page.input_value("#f-reasoning-tokens_per_week") == "1000"
        assert _usage_row(page, "reasoning", "week", "team 'research'")[3] == f"{traffic['reasoning']:,}"


def _key_metadata(stack: dict[str, Any]) -> dict[str, Any]:
    r = httpx.get(stack["proxy"].url + "/key/info", params={"key": stack["key"]}, headers=stack["proxy"].headers(),
                  timeout=30)
    assert r.status_code == 200, r.text
    return dict(r.json()["info"]["metadata"])


def test_valid_edit_is_saved_through_key_update_and_applies(stack: dict[str, Any], traffic: dict[str, Any]) -> None:
    proxy = stack["proxy"]
    assert _chat(proxy, stack["key"], "once more").status_code == 429  # the day's budget is spent
    with chromium() as browser:
        page = browser.new_page()
        _sign_in(page, proxy)
        page.wait_for_selector("#app:not([hidden])")
        _show(page, "key", stack["key_id"])  # by its Key ID, as LiteLLM's UI shows it
        page.fill("#f-reasoning-max_budget", "12")
        page.fill("#f-reasoning-tokens_per_day", "200")
        page.select_option("#f-reasoning-over_max", "clamp")
        page.click("#save")
        expect(page.locator("#save-status")).to_have_text(re.compile("^Saved"), timeout=30_000)
        assert page.input_value("#f-reasoning-tokens_per_day") == "200"  # shown again as the database has it
    md = _key_metadata(stack)
    assert md["owner"] == "analytics"  # the rest of the metadata survives the edit
    assert md["litellm_kv"] == {"reasoning": {"max_budget": 12, "tokens_per_day": 200, "over_max": "clamp"},
                                "vision": {"max_images_per_request": 2, "tokens_per_day": 1000}}
    r = _chat(proxy, stack["key"], "think again")
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] == 12


def test_invalid_edit_shows_the_fields_error_and_saves_nothing(stack: dict[str, Any]) -> None:
    proxy = stack["proxy"]
    before = _key_metadata(stack)
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        _sign_in(page, proxy)
        page.wait_for_selector("#app:not([hidden])")
        _show(page, "key", stack["key"])
        page.fill("#f-reasoning-max_budget", "lots")
        page.fill("#f-vision-max_images_per_request", "-1")
        page.click("#save")
        expect(page.locator("#save-status")).to_have_text(re.compile("^Not saved"), timeout=30_000)
        budget_error = page.inner_text('[data-error-for="reasoning.max_budget"]')
        assert 'metadata.litellm_kv.reasoning.max_budget must be an integer >= 0, got "lots"' in budget_error
        assert "key 'bot-a'" in budget_error
        images_error = page.inner_text('[data-error-for="vision.max_images_per_request"]')
        assert "metadata.litellm_kv.vision.max_images_per_request must be an integer >= 0, got -1" in images_error
        assert page.inner_text('[data-error-for="reasoning.tokens_per_day"]') == ""
        assert "invalid" in (page.get_attribute("#f-reasoning-max_budget", "class") or "")
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "admin-page-invalid.png"), full_page=True)
    assert _key_metadata(stack) == before


def test_litellm_admin_ui_session_signs_the_page_in(stack: dict[str, Any]) -> None:
    """An admin signed in to LiteLLM's own UI (its /login, as the UI's form posts it) opens the page signed in."""
    proxy = stack["proxy"]
    with chromium() as browser:
        context = browser.new_context()
        login = context.request.post(proxy.url + "/login", form={"username": "admin", "password": MASTER_KEY},
                                     max_redirects=0)
        assert login.status == 303, login.text()
        assert any(c["name"] == "token" for c in context.cookies())
        page = context.new_page()
        page.goto(proxy.url + "/litellm-kv/ui")
        page.wait_for_selector("#app:not([hidden])")
        assert page.inner_text("#whoami") == "signed in with LiteLLM admin UI session"
        _show(page, "key", stack["key"])
        assert page.inner_text("#owner-title") == "key 'bot-a'"
