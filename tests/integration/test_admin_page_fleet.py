"""The admin page's fleet view in a real headless Chromium, against a real proxy routing to real vLLM CPU replicas.

The proxy runs without a database (keys through ``general_settings.custom_auth``, ``tests/support/custom_auth.py``),
which is also how the page must degrade: looking a key up says there is no database instead of showing nothing.
The figures the page shows are checked against the proxy's own ``/litellm-kv/metrics`` and ``/litellm-kv/health``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import expect

from tests.support.browser import admin_tab, chromium, sign_in
from tools.harness.engines import EngineReplica, reset_prefix_caches
from tools.harness.procs import ARTIFACTS
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxy

pytestmark = [pytest.mark.engine, pytest.mark.proxy]

GROUP = "tiny-kv"
KEYS = {"sk-user": {"key_alias": "user", "metadata": {}}}
SHOTS = ARTIFACTS / "admin-page"


@pytest.fixture(scope="module")
def proxy(engines: list[EngineReplica], engine_model: Any) -> Iterator[Proxy]:
    config = {
        "model_list": [
            {"model_name": GROUP, "model_info": {"id": f"{GROUP}-{i}"},
             "litellm_params": {"model": "hosted_vllm/tiny", "api_base": r.api_base, "api_key": "none"}}
            for i, r in enumerate(engines)
        ],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"], "request_timeout": 60},
        "litellm_kv": {"mode": "embedded", "model_groups": {GROUP: {"routing": "kv", "kv": {
            "tokenizer_path": str(engine_model), "scrape_interval_s": 0.5, "discovery_interval_s": 1.0}}}},
    }
    p = start_proxy(config, name="litellm-admin-fleet", keys=KEYS)
    try:
        p.wait_kv_exact(GROUP, timeout=120)
        yield p
    finally:
        p.stop()


def _metrics(proxy: Proxy) -> dict[str, float]:
    text = httpx.get(f"{proxy.url}/litellm-kv/metrics", headers=proxy.headers(), timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("litellm_kv_") and f'model_group="{GROUP}"' in line:
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    return sum(v for k, v in metrics.items()
               if k.startswith(name + "{") and all(f'{lk}="{lv}"' in k for lk, lv in labels.items()))


def _percent(text: str) -> float:
    m = re.match(r"\s*([0-9.]+)%", text)
    assert m, text
    return float(m.group(1))


def test_fleet_view_shows_replicas_exactness_accuracy_and_hit_rates(
    proxy: Proxy, engines: list[EngineReplica]
) -> None:
    reset_prefix_caches(engines)
    system = "You are a careful assistant who answers briefly. " * 30
    for i in range(6):  # one shared prefix: after the first request it is cached where the router sends it
        body = {"model": GROUP, "max_tokens": 4, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": f"question number {i}"}]}
        r = httpx.post(proxy.url + "/v1/chat/completions", json=body, headers=proxy.headers(), timeout=120)
        assert r.status_code == 200, r.text
    for i in range(3):  # streamed: the proxy sets each one's time to first token against its prediction
        body = {"model": GROUP, "max_tokens": 4, "stream": True, "messages": [
            {"role": "system", "content": system}, {"role": "user", "content": f"streamed question {i}"}]}
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, headers=proxy.headers(),
                          timeout=120) as r:
            assert r.status_code == 200
            r.read()
    m = _metrics(proxy)
    exact = _sum(m, "litellm_kv_prediction_checks_total", outcome="exact")
    compared = sum(_sum(m, "litellm_kv_prediction_checks_total", outcome=o) for o in ("exact", "under", "over"))
    prompt = _sum(m, "litellm_kv_routed_prompt_tokens_total")
    actual = _sum(m, "litellm_kv_actual_cached_tokens_total")
    assert compared >= 6 and prompt > 0 and actual > 0
    health = proxy.kv_health(GROUP)

    with chromium() as browser:
        page = admin_tab(browser, proxy.url, MASTER_KEY, "fleet")
        card = page.locator(f'.group[data-group="{GROUP}"]')
        expect(card).to_be_visible()
        assert page.is_hidden("#fleet-workers")  # one worker: nothing kept per worker to warn of
        expect(card.locator("h3 .badge")).to_have_text("exact")
        rows = card.locator("table.replicas tbody tr")
        expect(rows).to_have_count(len(engines))
        shown = {r.locator("td").first.inner_text(): r.locator("td").nth(1).inner_text() for r in rows.all()}
        assert shown == {rep["replica"]: "ready" for rep in health["replicas"]}
        assert all(row.locator("td").nth(2).inner_text() == "32" for row in rows.all())  # block size
        assert all(row.locator("td").nth(6).inner_text().startswith("connected · ") for row in rows.all())
        accuracy = _percent(card.locator('[data-stat="accuracy"]').inner_text())
        assert abs(accuracy - 100 * exact / compared) < 0.06
        hit_rate = _percent(card.locator('[data-stat="hit_rate"]').inner_text())
        assert abs(hit_rate - 100 * actual / prompt) < 0.06
        assert "cache" in card.locator('[data-stat="decisions"]').inner_text()
        error = health["ttft_error"]
        assert error["recent"] >= 3, error
        shown_error = re.match(r"median ([0-9.]+) ms, p90 ([0-9.]+) ms",
                               card.locator('[data-stat="ttft_error"]').inner_text())
        assert shown_error, card.locator('[data-stat="ttft_error"]').inner_text()
        assert (float(shown_error[1]), float(shown_error[2])) == (error["abs_error_ms"]["p50"],
                                                                  error["abs_error_ms"]["p90"])
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SHOTS / "admin-page-fleet.png"), full_page=True)

        # Without a database there are no stored keys to show or edit: the page says so.
        page.click("#tab-owner")
        page.fill("#lookup-id", "sk-user")
        page.click("#lookup button[type=submit]")
        notice = page.locator("#owner-message")
        expect(notice).to_be_visible()
        assert notice.inner_text().startswith("No database:") and "custom_auth" in notice.inner_text()
        assert page.is_hidden("#owner")


def test_non_admin_key_gets_no_fleet_data(proxy: Proxy) -> None:
    """custom_auth lets any key reach the routes; litellm-kv's own admin check refuses it (403)."""
    for path in ("/litellm-kv/admin/fleet", "/litellm-kv/admin/owner?key=sk-user"):
        r = httpx.get(proxy.url + path, headers=proxy.headers("sk-user"), timeout=10)
        assert r.status_code == 403, (path, r.text)
    with chromium() as browser:
        page = browser.new_page()
        sign_in(page, proxy.url, "sk-user")
        expect(page.locator("#signin-error")).to_have_text("Not signed in: this key is not a proxy admin.")
        assert page.is_hidden("#app")
