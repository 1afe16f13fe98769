"""``os.environ/NAME`` values in the ``litellm_kv`` section (and the indexer's file) read as LiteLLM reads
them in its own config: compared here with LiteLLM 1.110.2's own resolver (``ProxyConfig``'s walk and
``get_secret``) on the same section and the same real environment, then through litellm-kv's typed
parsing, the proxy callback and the indexer's loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from litellm.proxy.proxy_server import ProxyConfig
from litellm.secret_managers.main import get_secret

from litellm_kv.config import env_secret, load_settings, resolve_env_refs
from litellm_kv.errors import ConfigError
from litellm_kv.integration.callback import LiteLLMKV
from litellm_kv.services.indexer.config import load_indexer_config

ENV = {
    "KVT_URL": "redis://127.0.0.1:6390/2",
    "KVT_MODE": "shared",
    "KVT_TRUE": "True",
    "KVT_FALSE": " false ",
    "KVT_NUMBER": "75",
    "KVT_EMPTY": "",
    "KVT_WORDS": "yes",
}

SECTION: dict[str, Any] = {
    "mode": "os.environ/KVT_MODE",
    "redis_url": "os.environ/KVT_URL",
    "plain": "not a reference: os.environ/KVT_URL",
    "missing": "os.environ/KVT_NOT_SET",
    "empty": "os.environ/KVT_EMPTY",
    "flags": {"on": "os.environ/KVT_TRUE", "off": "os.environ/KVT_FALSE", "words": "os.environ/KVT_WORDS"},
    "deep": {"a": {"b": {"c": "os.environ/KVT_NUMBER", "n": 3, "none": None}}},
    "items": [{"url": "os.environ/KVT_URL"}, "os.environ/KVT_URL", 7, ["os.environ/KVT_URL"]],
}


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("KVT_NOT_SET", raising=False)


def test_the_section_resolves_as_litellm_resolves_it(env: None) -> None:
    litellm_view = ProxyConfig()._check_for_os_environ_vars(config={"litellm_kv": SECTION})["litellm_kv"]
    ours = resolve_env_refs(SECTION)
    assert ours == litellm_view
    # Spelled out, so a change on either side shows what moved.
    assert ours["redis_url"] == "redis://127.0.0.1:6390/2" and ours["missing"] is None and ours["empty"] == ""
    assert ours["flags"] == {"on": True, "off": False, "words": "yes"}
    assert ours["deep"]["a"]["b"] == {"c": "75", "n": 3, "none": None}
    assert ours["items"] == [{"url": "redis://127.0.0.1:6390/2"}, "os.environ/KVT_URL", 7, ["os.environ/KVT_URL"]]
    assert ours["plain"] == SECTION["plain"]


def test_one_reference_reads_as_litellm_s_get_secret(env: None) -> None:
    for name in [*ENV, "KVT_NOT_SET"]:
        ref = f"os.environ/{name}"
        assert env_secret(ref) == get_secret(ref), ref


def _write(tmp_path: Path, section: dict[str, Any]) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"model_list": [], "litellm_kv": section}))
    return path


def test_typed_options_read_from_the_environment(env: None, tmp_path: Path) -> None:
    section = {"mode": "os.environ/KVT_MODE", "redis_url": "os.environ/KVT_URL",
               "redis_routing": {"deadline_ms": "os.environ/KVT_NUMBER", "breaker_failures": "os.environ/KVT_NUMBER"},
               "freeze_startup_heap": "os.environ/KVT_FALSE",
               "model_groups": {"g": {"routing": "kv", "kv": {"engine_timeout_s": "os.environ/KVT_NUMBER"}}}}
    s = load_settings(_write(tmp_path, section))
    assert s.mode == "shared" and type(s.mode) is str
    assert s.redis_url == "redis://127.0.0.1:6390/2" and type(s.redis_url) is str
    assert s.redis_routing.deadline_ms == 75.0 and s.redis_routing.breaker_failures == 75
    assert s.freeze_startup_heap is False
    assert s.model_groups["g"].kv["engine_timeout_s"] == "75"  # parsed (as a number) by the KV handler


def test_an_unset_variable_reads_as_null_and_the_error_names_it(env: None, tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    # Optional option: null, as LiteLLM reads it (then LITELLM_KV_REDIS_URL applies, as for an absent option).
    s = load_settings(_write(tmp_path, {"redis_url": "os.environ/KVT_NOT_SET"}))
    assert s.redis_url is None or s.redis_url == __import__("os").environ.get("LITELLM_KV_REDIS_URL")
    assert "litellm_kv.redis_url (os.environ/KVT_NOT_SET) is unset" in caplog.text
    # Required value: the error names the option and the variable.
    with pytest.raises(ConfigError) as exc:
        load_settings(_write(tmp_path, {"redis_routing": {"deadline_ms": "os.environ/KVT_NOT_SET"}}))
    assert "litellm_kv.redis_routing.deadline_ms" in str(exc.value)
    assert "litellm_kv.redis_routing.deadline_ms (os.environ/KVT_NOT_SET)" in str(exc.value)


def test_text_that_is_not_a_number_names_the_reference(env: None, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"litellm_kv\.budgets\.deadline_ms: os\.environ/KVT_URL is "
                                          r"'redis://127\.0\.0\.1:6390/2', not a number"):
        load_settings(_write(tmp_path, {"budgets": {"deadline_ms": "os.environ/KVT_URL"}}))
    with pytest.raises(ConfigError, match=r"litellm_kv\.mode: 'yes' is not one of"):
        load_settings(_write(tmp_path, {"mode": "os.environ/KVT_WORDS"}))


def test_the_proxy_callback_reads_references_through_litellm(env: None, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_KV_CONFIG", str(_write(tmp_path, {"redis_url": "os.environ/KVT_URL"})))
    assert LiteLLMKV().settings.redis_url == "redis://127.0.0.1:6390/2"


def test_the_indexer_config_resolves_references(env: None, tmp_path: Path) -> None:
    path = tmp_path / "indexer.yaml"
    path.write_text(yaml.safe_dump({"redis_url": "os.environ/KVT_URL", "port": "os.environ/KVT_NUMBER",
                                    "model_groups": {}}))
    try:
        cfg = load_indexer_config(path)
    except ConfigError as exc:  # the file's other required options are not the point here
        pytest.fail(f"indexer config with references did not load: {exc}")
    assert cfg.redis_url == "redis://127.0.0.1:6390/2" and cfg.port == 75
