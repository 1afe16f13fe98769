"""Which configured group a name is governed as, asked of a real ``litellm.Router`` in this process.

The proxy-level cases are in ``tests/integration/test_adversarial_names.py``; these reach what a proxy
test cannot set up cheaply: no router at all, providers without an ``api_base``, and a router that
raises (a stand-in registry, since a real one does not fail on demand).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from typing import Any

import litellm
import pytest
from litellm.proxy import proxy_server

from litellm_kv.config import Settings, parse_section
from litellm_kv.errors import PolicyViolation
from litellm_kv.integration import litellm_data
from litellm_kv.integration.governance import GroupNames
from litellm_kv.integration.litellm_data import DeploymentTarget

VLLM = {"model": "hosted_vllm/fake-model", "api_base": "http://10.0.0.1:8000/v1"}
MODEL_LIST = [
    {"model_name": "qwen", "litellm_params": VLLM},
    {"model_name": "qwen-twin", "litellm_params": {**VLLM, "api_base": "http://10.0.0.1:8000"}},
    {"model_name": "qwen-lora", "litellm_params": {**VLLM, "model": "hosted_vllm/my-adapter"}},
    {"model_name": "wild/*", "litellm_params": {**VLLM, "model": "hosted_vllm/*"}},
    {"model_name": "other", "litellm_params": {**VLLM, "api_base": "http://10.0.0.2:8000/v1"}},
    {"model_name": "gpt-4o", "litellm_params": {"model": "openai/gpt-4o", "api_key": "x"}},
    {"model_name": "gpt-4o-mini", "litellm_params": {"model": "openai/gpt-4o-mini", "api_key": "x"}},
    {"model_name": "gpt-4o-again", "litellm_params": {"model": "openai/gpt-4o", "api_key": "x"}},
]
GROUPS = {
    "qwen": {"reasoning": {"style": "vllm", "max_budget": 50}},
    "gpt-4o": {"vision": {"family": "openai"}},
    "open": {},
}


def names() -> GroupNames:
    return GroupNames(parse_section(Settings, {"model_groups": GROUPS}, "litellm_kv"))


@pytest.fixture
def router(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    r = litellm.Router(model_list=MODEL_LIST, model_group_alias={"qwen-alias": "qwen", "stray": "other"})
    monkeypatch.setattr(proxy_server, "llm_router", r, raising=False)
    yield r


def _refused(name: str) -> PolicyViolation:
    with pytest.raises(PolicyViolation) as exc:
        names().resolve(name)
    return exc.value


def test_reasoning_limits_follow_an_alias_to_its_group(router: Any) -> None:
    assert names().resolve("qwen-alias") == "qwen"
    assert names().resolve("qwen") == "qwen"


@pytest.mark.parametrize("name", ["qwen-twin", "qwen-lora", "wild/fake-model"])
def test_reasoning_limits_hold_for_other_names_of_a_governed_vllm_server(router: Any, name: str) -> None:
    """Another path on the same server, another served model (a LoRA adapter) and a wildcard."""
    err = _refused(name)
    assert (err.status_code, err.limit_name, err.value) == (400, "governance.model_name", name)
    assert "'qwen'" in err.message and "reasoning limits" in err.message


def test_vision_limits_hold_for_a_second_name_of_a_provider_model(router: Any) -> None:
    err = _refused("gpt-4o-again")
    assert err.limit_name == "governance.model_name" and "'gpt-4o'" in err.message


def test_ungoverned_names_stay_ungoverned(router: Any) -> None:
    # Another server, another provider model without an api_base, an explicit empty entry, an alias of one.
    for name in ("other", "gpt-4o-mini", "open", "unknown-name"):
        assert names().resolve(name) == name
    assert names().resolve("stray") == "other"


def test_without_a_router_the_name_is_used_as_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy_server, "llm_router", None, raising=False)
    assert names().resolve("qwen-twin") == "qwen-twin"


class _BrokenRegistry:
    def resolve(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("router internals changed")


class _BrokenRouter:
    def registry(self) -> _BrokenRegistry:
        return _BrokenRegistry()


def test_governance_fails_closed_when_the_router_cannot_be_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proxy_server, "llm_router", _BrokenRouter(), raising=False)
    err = _refused("qwen-twin")
    assert (err.status_code, err.limit_name) == (500, "governance.internal_error")
    assert names().resolve("qwen") == "qwen"  # a configured name needs no router
    ungoverned = GroupNames(parse_section(Settings, {"model_groups": {"open": {}}}, "litellm_kv"))
    assert ungoverned.resolve("qwen-twin") == "qwen-twin"  # no limit at stake: fails open


async def test_a_tenant_isolated_group_is_governed_for_names_and_upstreams_not_for_unchecked_calls(router: Any) -> None:
    """Its engines get the tenant's cache_salt only under its own name: a second name over them and a client's
    own upstream to them are refused; calls the router sends there without the pre-call hook are salted where
    they are routed, so they are not among the groups such calls must not reach."""
    isolated = GroupNames(parse_section(Settings, {"model_groups": {
        "qwen": {"routing": "kv", "kv": {"tenant_isolation": "team"}},
        "other": {"routing": "kv"},  # KV-routed without isolation: no section
    }}, "litellm_kv"))
    assert isolated.governed == {"qwen": ["cache isolation"]} and isolated.limited == set()
    assert isolated.resolve("qwen") == "qwen" and isolated.resolve("qwen-alias") == "qwen"
    with pytest.raises(PolicyViolation) as refused:
        isolated.resolve("qwen-twin")
    assert refused.value.limit_name == "governance.model_name" and "cache isolation" in refused.value.message
    with pytest.raises(PolicyViolation) as upstream:
        await isolated.check_client_upstreams(["http://10.0.0.1:8000/v1"])
    assert upstream.value.limit_name == "governance.client_upstream"
    await isolated.check_client_upstreams(["http://10.0.0.2:8000/v1"])  # the group without isolation


async def test_client_upstreams_are_matched_by_address_and_an_unresolvable_engine_is_not_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's upstream and the governed deployments are compared by address (``10.0.0.1`` written as
    ``[::ffff:10.0.0.1]``); where a governed deployment's own host name cannot be resolved, a client upstream that
    needs the comparison is refused, and the refusal does not tell the client the operator's host name."""
    governed = GroupNames(parse_section(Settings, {"model_groups": GROUPS}, "litellm_kv"))
    engines = [(DeploymentTarget("http://10.0.0.1:8000/v1", "m", "hosted_vllm", True), "qwen"),
               (DeploymentTarget("http://engine.invalid:8000/v1", "m", "hosted_vllm", True), "gpt-4o")]
    monkeypatch.setattr(governed, "_governed_engines", lambda: engines)
    with pytest.raises(PolicyViolation) as spelled:
        await governed.check_client_upstreams(["http://[::ffff:10.0.0.1]:8000/v1"])
    assert spelled.value.limit_name == "governance.client_upstream" and "'qwen'" in spelled.value.message
    with pytest.raises(PolicyViolation) as unknown:
        await governed.check_client_upstreams(["http://10.0.0.3:8000/v1"])
    assert unknown.value.limit_name == "governance.client_upstream"
    assert "model 'gpt-4o' cannot be resolved" in unknown.value.message
    assert "engine.invalid" not in unknown.value.message
    engines.pop()
    await governed.check_client_upstreams(["http://10.0.0.3:8000/v1"])  # elsewhere: served


DNS_LIST = [
    {"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/m", "api_base": "http://engine-a.example:8000/v1"}},
    # The same Service under a second name (its short name, a CNAME): one address.
    {"model_name": "qwen-dns", "litellm_params": {"model": "hosted_vllm/m", "api_base": "http://engine-b.example:8000"}},
    {"model_name": "elsewhere", "litellm_params": {"model": "hosted_vllm/m", "api_base": "http://engine-c.example:8000"}},
    {"model_name": "gone", "litellm_params": {"model": "hosted_vllm/m", "api_base": "http://engine-d.example:8000"}},
]
DNS = {"engine-a.example": "10.0.0.1", "engine-b.example": "10.0.0.1", "engine-c.example": "10.0.0.2"}


async def test_a_second_name_over_another_dns_name_of_the_engine_is_refused_once_resolved(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Deployments are matched by address once :meth:`GroupNames.prepare` resolved their host names (this machine's
    resolver answers from the table above): a second name over another DNS name of the governed engine is refused,
    one over another address served, and one whose host does not resolve is compared as written, with a warning."""
    def answer(host: str, *args: Any, **kw: Any) -> list[Any]:
        if host not in DNS:
            raise OSError(-2, "Name or service not known")
        return [(2, 1, 6, "", (DNS[host], 0))]

    monkeypatch.setattr(socket, "getaddrinfo", answer)
    monkeypatch.setattr(proxy_server, "llm_router", litellm.Router(model_list=DNS_LIST))
    governed = names()
    assert governed.resolve("qwen-dns") == "qwen-dns"  # not resolved yet: host names differ as written
    await governed.prepare(["qwen-dns", "elsewhere", "gone"])
    with pytest.raises(PolicyViolation) as refused:
        governed.resolve("qwen-dns")
    assert refused.value.limit_name == "governance.model_name" and "'qwen'" in refused.value.message
    assert governed.groups_reached("qwen-dns") == ["qwen"]
    assert governed.resolve("elsewhere") == "elsewhere" and governed.resolve("gone") == "gone"
    assert any("engine-d.example" in r.getMessage() for r in caplog.records)


def test_a_client_s_own_router_is_read_for_every_upstream_it_may_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """``client_upstreams`` of a ``user_config``: its ``default_litellm_params``, each deployment's own upstream, and
    where neither names one, LiteLLM's default for the model (``HOSTED_VLLM_API_BASE`` for ``hosted_vllm/``; none for
    a provider's public endpoint). A deployment of the proxy's own without an api_base is placed by the same default."""
    monkeypatch.setenv("HOSTED_VLLM_API_BASE", "http://10.0.0.1:8000/v1")
    vllm = {"model_name": "free", "litellm_params": {"model": "hosted_vllm/m"}}
    public = {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o"}}
    own = {"model_name": "own", "litellm_params": {"model": "hosted_vllm/m", "base_url": "http://10.0.0.7/v1"}}
    assert litellm_data.client_upstreams({"user_config": {"model_list": [vllm, public, own]}}) == [
        "http://10.0.0.1:8000/v1", "http://10.0.0.7/v1"]
    assert litellm_data.client_upstreams({"user_config": {
        "default_litellm_params": {"api_base": "http://10.0.0.5/v1"}, "model_list": [vllm, "junk"]}}) == [
        "http://10.0.0.5/v1"]
    assert litellm_data.client_upstreams({"api_base": "http://a/v1", "extra_body": {"base_url": "http://b/v1"},
                                          "user_config": "junk"}) == ["http://a/v1", "http://b/v1"]
    assert litellm_data.deployment_target(vllm).api_base == "http://10.0.0.1:8000/v1"
    assert litellm_data.deployment_target(public).api_base is None


async def test_names_a_client_sprays_do_not_hold_the_lookups_of_the_deployments(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Client-named hosts are looked up apart from the deployments': while every client lookup hangs, a deployment's
    host name is still resolved, so a second name over it is still matched by address."""
    release = threading.Event()

    def answer(host: str, *args: Any, **kw: Any) -> list[Any]:
        if host.startswith("spray"):
            release.wait(10)
            raise OSError(-2, "Name or service not known")
        return [(2, 1, 6, "", (DNS[host], 0))]

    monkeypatch.setattr(socket, "getaddrinfo", answer)
    monkeypatch.setattr(proxy_server, "llm_router", litellm.Router(model_list=DNS_LIST))
    governed = names()
    try:
        sprayed = await asyncio.gather(*(governed.check_client_upstreams([f"http://spray{i}.example/v1"])
                                         for i in range(8)), return_exceptions=True)
        assert all(isinstance(r, PolicyViolation) for r in sprayed)
        await governed.prepare(["qwen-dns"])
        with pytest.raises(PolicyViolation, match="same deployments"):
            governed.resolve("qwen-dns")
    finally:
        release.set()


def test_a_litellm_credential_s_upstream_counts_where_a_deployment_or_a_client_names_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A deployment may name a LiteLLM credential instead of an api_base (LiteLLM merges its values into the call):
    the deployment is placed at the credential's upstream, and a client's request or router naming the credential
    names that upstream (an ``os.environ/`` value read as LiteLLM reads it)."""
    from litellm.types.utils import CredentialItem

    monkeypatch.setenv("ENGINE_URL", "http://10.0.0.9:8000/v1")
    monkeypatch.setattr(litellm, "credential_list", [
        CredentialItem(credential_name="engine", credential_values={"api_base": "http://10.0.0.1:8000/v1"},
                       credential_info={}),
        CredentialItem(credential_name="by-env", credential_values={"api_base": "os.environ/ENGINE_URL"},
                       credential_info={})])
    dep = {"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/m", "litellm_credential_name": "engine"}}
    assert litellm_data.deployment_target(dep).api_base == "http://10.0.0.1:8000/v1"
    assert litellm_data.client_upstreams({"model": "x", "litellm_credential_name": "by-env"}) == [
        "http://10.0.0.9:8000/v1"]
    assert litellm_data.client_upstreams({"user_config": {"model_list": [dep]}}) == ["http://10.0.0.1:8000/v1"]
    assert litellm_data.client_upstreams({"model": "x", "litellm_credential_name": "unknown"}) == []
