"""Prompt-cache affinity keeps tenants apart, through a real ``litellm`` proxy process.

Limit protected: tenant isolation of affinity pins and of the ``x-litellm-kv-affinity`` header. A
tenant (the verified key's team, else the key) follows only its own pins, and the header goes to
admins only unless a group shows it to everyone, so tenant B cannot learn whether tenant A sent a
prompt. Keys are presented through ``general_settings.custom_auth`` (tests/support/custom_auth.py), the
way database keys reach the hooks. The deployments are local fakes (``tests.support.fake_upstream``):
real OpenAI providers cannot be reached here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.integration.test_affinity_proxy import Fleet, start_fleet, words
from tools.harness.proxy import Proxy, start_proxy

pytestmark = pytest.mark.proxy

HEADER = "x-litellm-kv-affinity"
KEYS = {
    "sk-a": {"key_alias": "a", "team_id": "t-a", "team_alias": "team a"},
    "sk-a2": {"key_alias": "a2", "team_id": "t-a", "team_alias": "team a"},
    "sk-b": {"key_alias": "b", "team_id": "t-b", "team_alias": "team b"},
}
# group -> its affinity section: defaults, the header shown to everyone (so the test can read every
# decision), and a group that opts in to sharing pins.
GROUPS: dict[str, dict[str, Any]] = {
    "iso": {},
    "iso-open": {"show_header": "everyone"},
    "shared": {"show_header": "everyone", "share_pins_across_tenants": True},
}


def model_list(fleet: Fleet) -> list[dict[str, Any]]:
    return [
        {"model_name": group,
         "litellm_params": {"model": "openai/fake-model", "api_base": f"http://127.0.0.1:{port}/v1",
                            "api_key": "sk-fake"},
         "model_info": {"id": f"{group}-{name}"}}
        for group in GROUPS for name, port in fleet.ports.items()
    ]


@pytest.fixture(scope="module")
def proxy() -> Iterator[Proxy]:
    fleet = start_fleet()
    p = None
    try:
        config = {
            "model_list": model_list(fleet),
            "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
            "router_settings": {"num_retries": 0},
            "litellm_kv": {"model_groups": {g: {"routing": "affinity", "affinity": {"store": "memory", **a}}
                                            for g, a in GROUPS.items()}},
        }
        p = start_proxy(config, name="litellm-affinity-tenants", keys=KEYS)
        yield p
    finally:
        if p is not None:
            p.stop()
        fleet.stop()


def ask(proxy: Proxy, group: str, key: str | None, seed: int) -> httpx.Response:
    """One request whose prompt (long enough to be cacheable) is fixed by ``seed``."""
    messages = [{"role": "system", "content": words(1300, seed)}, {"role": "user", "content": f"question {seed}"}]
    headers = proxy.headers() if key is None else proxy.headers(key)
    r = httpx.post(f"{proxy.url}/v1/chat/completions", headers=headers, timeout=60,
                   json={"model": group, "messages": messages})
    assert r.status_code == 200, r.text
    return r


def test_affinity_tenant_cannot_learn_whether_another_tenant_sent_a_prompt(proxy: Proxy) -> None:
    """Tenant B's answer for a prompt tenant A sent reads exactly as for a prompt nobody sent."""
    never_sent = ask(proxy, "iso-open", "sk-b", seed=101).headers.get(HEADER)
    assert ask(proxy, "iso-open", "sk-a", seed=102).headers.get(HEADER) == "new"
    assert ask(proxy, "iso-open", "sk-a", seed=102).headers.get(HEADER) == "hit"  # A's own pin holds
    after_a = ask(proxy, "iso-open", "sk-b", seed=102).headers.get(HEADER)
    assert (never_sent, after_a) == ("new", "new")
    assert ask(proxy, "iso-open", "sk-b", seed=102).headers.get(HEADER) == "hit"  # B's own pin
    # The tenant is the team: another key of team a follows the team's pin.
    assert ask(proxy, "iso-open", "sk-a2", seed=102).headers.get(HEADER) == "hit"


def test_affinity_header_shown_to_admins_only_by_default(proxy: Proxy) -> None:
    member = ask(proxy, "iso", "sk-a", seed=201)
    assert HEADER not in member.headers
    admin = ask(proxy, "iso", None, seed=201)  # the master key: proxy_admin
    assert admin.headers.get(HEADER) == "new"  # the admin is a tenant of its own


def test_affinity_pins_shared_across_tenants_when_the_group_opts_in(proxy: Proxy) -> None:
    first = ask(proxy, "shared", "sk-a", seed=301)
    other = ask(proxy, "shared", "sk-b", seed=301)
    assert (first.headers.get(HEADER), other.headers.get(HEADER)) == ("new", "hit")
    assert other.headers.get("x-litellm-model-id") == first.headers.get("x-litellm-model-id")
