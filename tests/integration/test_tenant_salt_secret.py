"""Limit protected: tenant cache isolation (``kv.tenant_isolation``). Its ``cache_salt`` is an HMAC
keyed by the secret in ``LITELLM_KV_SALT_SECRET``; with an empty or published secret anyone could
compute another tenant's salt, so a proxy with isolation on refuses to start, naming the variable."""

from __future__ import annotations

import pytest

from litellm_kv.config import Settings, parse_section, salt_secret
from litellm_kv.errors import ConfigError
from litellm_kv.integration.routing_hooks import KVRoutingHandler
from tools.harness.proxy import start_proxy

SHIPPED_DEFAULT = "litellm-kv-salt-local-only"  # what docker-compose.yml used to default to


def isolated(**extra: str) -> Settings:
    return parse_section(
        Settings, {"model_groups": {"iso-group": {"routing": "kv", "kv": {"tenant_isolation": "team"}}}, **extra},
        "litellm_kv",
    )


@pytest.mark.parametrize("value", [None, "", "   ", SHIPPED_DEFAULT])
def test_tenant_isolation_refuses_empty_or_default_salt_secret(value: str | None,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    if value is None:
        monkeypatch.delenv("LITELLM_KV_SALT_SECRET", raising=False)
    else:
        monkeypatch.setenv("LITELLM_KV_SALT_SECRET", value)
    with pytest.raises(ConfigError, match="LITELLM_KV_SALT_SECRET") as exc:
        salt_secret(isolated())
    assert "iso-group" in str(exc.value)  # the group that needs it
    with pytest.raises(ConfigError, match="LITELLM_KV_SALT_SECRET"):
        KVRoutingHandler(isolated())  # settings built in code, not through load_settings


def test_tenant_isolation_salt_secret_variable_is_the_configured_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_KV_SALT_SECRET", "a-real-secret-0123456789abcdef")
    monkeypatch.delenv("MY_SALT", raising=False)
    with pytest.raises(ConfigError, match="MY_SALT"):
        salt_secret(isolated(salt_secret_env="MY_SALT"))
    monkeypatch.setenv("MY_SALT", "another-secret-0123456789abcdef")
    assert salt_secret(isolated(salt_secret_env="MY_SALT")) == b"another-secret-0123456789abcdef"


def test_without_tenant_isolation_no_salt_secret_is_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LITELLM_KV_SALT_SECRET", raising=False)
    s = parse_section(Settings, {"model_groups": {"t": {"routing": "kv"}}}, "litellm_kv")
    handler = KVRoutingHandler(s)  # no ConfigError although LITELLM_KV_SALT_SECRET is unset
    assert handler.options["t"].tenant_isolation == "none"


@pytest.mark.proxy
def test_tenant_isolation_proxy_refuses_to_start_without_a_real_salt_secret() -> None:
    """A real proxy process: it does not come up, and its log names the variable. (Every refused value is
    checked in process above; one is enough to show the process acts on the check.)"""
    cfg = {
        "model_list": [{"model_name": "t", "litellm_params": {"model": "hosted_vllm/x",
                                                              "api_base": "http://127.0.0.1:9/v1"}}],
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"]},
        "litellm_kv": {"model_groups": {"t": {"routing": "kv", "kv": {"tenant_isolation": "team"}}}},
    }
    with pytest.raises(RuntimeError, match="LITELLM_KV_SALT_SECRET"):
        start_proxy(cfg, name="salt-default", timeout=90, env={"LITELLM_KV_SALT_SECRET": SHIPPED_DEFAULT})
