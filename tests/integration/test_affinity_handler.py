"""The affinity handler with the hook arguments LiteLLM 1.110 passes (shapes recorded from a real proxy):
group selection, metrics, retry bookkeeping, and the fallback when the pin store is unreachable."""

from __future__ import annotations

from typing import Any

from prometheus_client import REGISTRY

from litellm_kv.config import Settings as KVSettings
from litellm_kv.config import parse_section
from litellm_kv.integration.affinity_hooks import AffinityHandler
from tests.routing.test_affinity import FakeClock, conversation
from tools.harness.procs import free_port


def settings(group: str = "g", **extra: Any) -> KVSettings:
    return parse_section(
        KVSettings,
        {"model_groups": {group: {"routing": "affinity", "affinity": {"store": "memory"}}, "other": {}}, **extra},
        "litellm_kv",
    )


def deployments() -> list[dict[str, Any]]:
    return [
        {"model_name": "g", "litellm_params": {"model": "openai/gpt-4o", "api_base": f"http://h{i}"},
         "model_info": {"id": f"dep-{i}"}}
        for i in range(3)
    ]


# What LiteLLM writes into the request metadata after authentication (a client's user_api_key_* are dropped):
# an admin with no key hash, the same tenant as the calls above that carry no identity.
ADMIN = {"user_api_key_auth": {"user_role": "proxy_admin"}}


def caller(team: str | None, key: str, role: str = "internal_user") -> dict[str, Any]:
    return {"user_api_key_hash": key, "user_api_key_team_id": team, "user_api_key_auth": {"user_role": role}}


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(f"litellm_kv_{name}_total", labels) or 0.0


async def test_follows_pin_counts_metrics_and_moves_on_retry() -> None:
    h = AffinityHandler(settings("g1"), clock=FakeClock())
    msgs = conversation(1, seed=5)[0]
    before = (metric("affinity_pins_created", group="g1"), metric("affinity_hits", group="g1"),
              metric("affinity_repins", group="g1", reason="failed"))
    first = await h.filter_deployments("g1", deployments(), msgs, {"litellm_call_id": "c1", "metadata": {}})
    assert first is not None and len(first) == 1
    pinned = first[0]["model_info"]["id"]
    again = await h.filter_deployments("g1", deployments(), msgs, {"litellm_call_id": "c2", "metadata": {}})
    assert again is not None and again[0]["model_info"]["id"] == pinned
    assert metric("affinity_pins_created", group="g1") == before[0] + 1
    assert metric("affinity_hits", group="g1") == before[1] + 1
    # a retry: LiteLLM lists the failed attempt in metadata.previous_models
    retry_kwargs = {"litellm_call_id": "c3", "metadata": {"previous_models": [{"deployment_id": pinned}]}}
    moved = await h.filter_deployments("g1", deployments(), msgs, retry_kwargs)
    assert moved is not None and moved[0]["model_info"]["id"] != pinned
    assert metric("affinity_repins", group="g1", reason="failed") == before[2] + 1
    assert await h.response_headers({"litellm_call_id": "c3", "metadata": ADMIN}, None) == {
        "x-litellm-kv-affinity": "repin"}


async def test_other_groups_and_non_chat_requests_get_no_opinion() -> None:
    h = AffinityHandler(settings(), clock=FakeClock())
    msgs = conversation(1)[0]
    assert await h.filter_deployments("other", deployments(), msgs, {}) is None
    assert await h.filter_deployments("unknown", deployments(), msgs, {}) is None
    assert await h.filter_deployments("g", deployments(), None, {"input": "x"}) is None


async def test_in_flight_follows_attempt_hooks_and_failures_mark_deployment() -> None:
    h = AffinityHandler(settings(), clock=FakeClock())
    kwargs = {"litellm_call_id": "c1", "model_info": {"id": "dep-1"}, "metadata": {}}
    await h.pre_deployment(kwargs)
    assert h.load.in_flight("dep-1") == 1  # type: ignore[arg-type]
    await h.post_success_deployment(dict(kwargs), object())
    await h.log_success(dict(kwargs), object())  # idempotent
    assert h.load.in_flight("dep-1") == 0  # type: ignore[arg-type]

    class BadRequest(Exception):
        status_code = 400

    class Unavailable(Exception):
        status_code = 503

    await h.pre_deployment(kwargs)
    await h.post_failure_deployment(kwargs, BadRequest())
    assert not h.load.recently_failed("dep-1", 30)  # type: ignore[arg-type]
    await h.post_failure_deployment(kwargs, Unavailable())
    assert h.load.recently_failed("dep-1", 30)  # type: ignore[arg-type]
    assert h.load.in_flight("dep-1") == 0  # type: ignore[arg-type]


async def test_unreachable_redis_leaves_routing_to_litellm() -> None:
    s = settings("g2", redis_url=f"redis://127.0.0.1:{free_port()}/0")
    s.model_groups["g2"].affinity = {"store": "redis", "redis_timeout_seconds": 0.2}
    h = AffinityHandler(s)
    before = metric("affinity_misses", group="g2", reason="store_error")
    out = await h.filter_deployments("g2", deployments(), conversation(1)[0], {"litellm_call_id": "x"})
    assert out is None
    assert metric("affinity_misses", group="g2", reason="store_error") == before + 1
    await h.shutdown()


async def test_affinity_pins_scoped_to_verified_team_else_key() -> None:
    """Limit protected: tenant isolation of pins. The tenant is read from the metadata LiteLLM writes
    for the authenticated caller: its team, else its key. Another team's request for the same prompt
    does not follow the pin; a second key of the same team does."""
    s = settings()
    s.model_groups["g"].affinity = {"store": "memory", "show_header": "everyone"}
    h = AffinityHandler(s, clock=FakeClock())
    msgs = conversation(1, seed=21)[0]

    async def reason(call: str, md: dict[str, Any]) -> str:
        await h.filter_deployments("g", deployments(), msgs, {"litellm_call_id": call, "metadata": md})
        return (await h.response_headers({"litellm_call_id": call, "metadata": md}, None))["x-litellm-kv-affinity"]

    assert await reason("a1", caller("t-a", "k1")) == "new"
    assert await reason("b1", caller("t-b", "k2")) == "new"
    assert await reason("a2", caller("t-a", "k3")) == "hit"  # same team, another key
    assert await reason("s1", caller(None, "k4")) == "new"  # no team: the key is the tenant
    assert await reason("s2", caller(None, "k4")) == "hit"


async def test_affinity_header_shown_to_admins_only_by_default() -> None:
    """Limit protected: the affinity header reveals pins; by default only admins see it."""
    msgs = conversation(1, seed=22)[0]
    for show, member, admin in (("admins", {}, {"x-litellm-kv-affinity": "new"}),
                                ("everyone", {"x-litellm-kv-affinity": "new"}, {"x-litellm-kv-affinity": "new"}),
                                ("off", {}, {})):
        s = settings()
        s.model_groups["g"].affinity = {"store": "memory", "show_header": show}
        h = AffinityHandler(s, clock=FakeClock())
        seen = []
        for call, md in (("m", caller("t-a", "k1")), ("adm", ADMIN)):
            await h.filter_deployments("g", deployments(), msgs, {"litellm_call_id": call, "metadata": md})
            seen.append(await h.response_headers({"litellm_call_id": call, "metadata": md}, None))
        assert seen == [member, admin], show


async def test_affinity_header_never_given_to_another_tenant_reusing_a_call_id() -> None:
    """Limit protected: tenant isolation of the header. A client can pick its call id
    (x-litellm-call-id); answering another tenant's call id must not hand over that tenant's decision."""
    s = settings()
    s.model_groups["g"].affinity = {"store": "memory", "show_header": "everyone"}
    h = AffinityHandler(s, clock=FakeClock())
    await h.filter_deployments("g", deployments(), conversation(1, seed=31)[0],
                               {"litellm_call_id": "same", "metadata": caller("t-a", "k1")})
    assert await h.response_headers({"litellm_call_id": "same", "metadata": caller("t-b", "k2")}, None) == {}
