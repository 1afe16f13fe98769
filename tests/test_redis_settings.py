"""Which Redis each store uses: ``litellm_kv.redis`` (url | cluster_nodes | sentinel), the short form
``redis_url``, LITELLM_KV_REDIS_URL, a budgets-only Redis, and LiteLLM's own cache Redis as the fallback;
and that every form reaches a real server through the one factory."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import yaml

from litellm_kv.config import (
    REDIS_SOURCES,
    RedisSentinelSettings,
    RedisSettings,
    Settings,
    load_settings,
    parse_section,
)
from litellm_kv.doctor.deployment import DeploymentPlan
from litellm_kv.doctor.report import Report, Status
from litellm_kv.doctor.shared import check_redis
from litellm_kv.errors import ConfigError
from litellm_kv.integration.affinity_hooks import AffinityHandler
from litellm_kv.integration.routing_hooks import KVRoutingHandler
from litellm_kv.redis_client import RedisUse, connect, describe
from litellm_kv.services.indexer.config import IndexerSettings
from tools.harness.redis_cluster import RedisClusterServers, RedisSentinelServers
from tools.harness.redis_server import RedisServer

_LITELLM_ENV = ("LITELLM_KV_REDIS_URL", "REDIS_URL", "REDIS_HOST", "REDIS_PORT", "REDIS_PASSWORD", "REDIS_USERNAME",
                "REDIS_SSL", "REDIS_CLUSTER_NODES", "REDIS_SENTINEL_NODES", "REDIS_SERVICE_NAME",
                "REDIS_SENTINEL_PASSWORD")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _LITELLM_ENV:
        monkeypatch.delenv(name, raising=False)


def _load(tmp_path: Path, doc: dict[str, object]) -> Settings:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_settings(path)


def test_exactly_one_target_and_node_syntax() -> None:
    with pytest.raises(ConfigError, match="exactly one of url, cluster_nodes, sentinel"):
        parse_section(RedisSettings, {"url": "redis://a:1", "cluster_nodes": ["a:1"]}, "litellm_kv.redis")
    with pytest.raises(ConfigError, match="exactly one"):
        parse_section(RedisSettings, {}, "litellm_kv.redis")
    with pytest.raises(ConfigError, match="not host:port"):
        parse_section(RedisSettings, {"cluster_nodes": ["a"]}, "litellm_kv.redis")
    with pytest.raises(ConfigError, match="only database 0"):
        parse_section(RedisSettings, {"cluster_nodes": ["a:1"], "db": 2}, "litellm_kv.redis")
    with pytest.raises(ConfigError, match="sentinel"):
        parse_section(RedisSettings, {"sentinel": {"master": "m", "nodes": []}}, "litellm_kv.redis")
    with pytest.raises(ConfigError, match="either redis_url or redis"):
        parse_section(Settings, {"redis_url": "redis://a:1", "redis": {"url": "redis://b:1"}}, "litellm_kv")
    with pytest.raises(ConfigError, match="one of redis_url or redis"):
        parse_section(IndexerSettings, {}, "indexer")


def test_precedence_and_budgets_of_their_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    litellm = {"litellm_settings": {"cache": True, "cache_params": {"type": "redis", "host": "cache", "port": 7}}}
    # litellm_kv.redis wins over LiteLLM's cache Redis; budgets may have their own.
    s = _load(tmp_path, {**litellm, "litellm_kv": {"redis": {"cluster_nodes": ["n1:7000", "n2:7001"]},
                                                   "budgets": {"redis": {"url": "redis://durable:6379/2"}}}})
    assert s.redis_for("index") == s.redis_for("pins") == s.redis
    assert s.redis is not None and s.redis.kind == "cluster"
    budgets = s.redis_for("budgets")
    assert budgets is not None and budgets.url == "redis://durable:6379/2"
    # redis_url is the short form; then LITELLM_KV_REDIS_URL; then LiteLLM's cache Redis.
    s = _load(tmp_path, {**litellm, "litellm_kv": {"redis_url": "redis://kv:1/0"}})
    assert s.redis_for("budgets") == RedisSettings(url="redis://kv:1/0")
    monkeypatch.setenv("LITELLM_KV_REDIS_URL", "redis://env:2/0")
    assert _load(tmp_path, {**litellm, "litellm_kv": {}}).redis_for() == RedisSettings(url="redis://env:2/0")
    monkeypatch.delenv("LITELLM_KV_REDIS_URL")
    assert _load(tmp_path, {**litellm, "litellm_kv": {}}).redis_for() == RedisSettings(url="redis://cache:7")
    # No Redis anywhere: in memory.
    assert _load(tmp_path, {"litellm_kv": {}}).redis_for() is None
    off = {"litellm_settings": {"cache": False, "cache_params": {"host": "cache", "port": 7}}}
    assert _load(tmp_path, {**off, "litellm_kv": {}}).redis_for() is None
    local = {"litellm_settings": {"cache": True, "cache_params": {"type": "local"}}}
    assert _load(tmp_path, {**local, "litellm_kv": {}}).redis_for() is None


def test_litellm_cache_redis_forms(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def cache(params: dict[str, object]) -> RedisSettings | None:
        doc = {"litellm_settings": {"cache": True, "cache_params": params}, "litellm_kv": {}}
        return _load(tmp_path, doc).redis_for()

    cluster = cache({"redis_startup_nodes": [{"host": "a", "port": 7000}, {"host": "b", "port": 7001}],
                     "password": "os.environ/CACHE_PW"})
    assert cluster is not None and cluster.cluster_nodes == ["a:7000", "b:7001"] and cluster.password is None
    monkeypatch.setenv("CACHE_PW", "s3cret")
    cluster = cache({"redis_startup_nodes": [{"host": "a", "port": 7000}], "password": "os.environ/CACHE_PW"})
    assert cluster is not None and cluster.password == "s3cret"
    sentinel = cache({"sentinel_nodes": [["s1", 26379], ["s2", 26380]], "service_name": "mymaster",
                      "sentinel_password": "sp"})
    assert sentinel is not None and sentinel.sentinel == RedisSentinelSettings(
        master="mymaster", nodes=["s1:26379", "s2:26380"], password="sp")
    # Nothing in cache_params: LiteLLM reads the REDIS_* variables.
    monkeypatch.setenv("REDIS_HOST", "envhost")
    monkeypatch.setenv("REDIS_PORT", "6390")
    monkeypatch.setenv("REDIS_PASSWORD", "pw")
    monkeypatch.setenv("REDIS_SSL", "True")
    env = cache({})
    assert env is not None and (env.url, env.password, env.ssl) == ("rediss://envhost:6390", "pw", True)
    monkeypatch.setenv("REDIS_CLUSTER_NODES", '[{"host": "c1", "port": 7100}]')
    env = cache({})
    assert env is not None and env.cluster_nodes == ["c1:7100"]
    monkeypatch.setenv("REDIS_CLUSTER_NODES", "[not json")
    with pytest.raises(ConfigError, match="REDIS_CLUSTER_NODES is not JSON"):
        cache({})


async def test_without_any_redis_each_user_names_every_place_to_set_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Shared mode, an affinity store 'redis' and the doctor, with no Redis anywhere (LiteLLM's cache included)."""
    shared = _load(tmp_path, {"litellm_kv": {"mode": "shared", "model_groups": {"g": {"routing": "kv"}}}})
    assert shared.redis_for() is None
    with pytest.raises(RuntimeError, match=re.escape(f"shared needs a Redis: {REDIS_SOURCES}")):
        await KVRoutingHandler(shared, deployments=list).startup()
    report = Report()
    await check_redis(DeploymentPlan(tmp_path / "config.yaml", shared, [], []), report, timeout_s=1)
    [finding] = report.findings
    assert (finding.check, finding.status) == ("redis.configured", Status.ERROR)
    assert finding.fix == f"set {REDIS_SOURCES}"
    pinned = _load(tmp_path, {"litellm_kv": {"model_groups": {"g": {"routing": "affinity",
                                                                    "affinity": {"store": "redis"}}}}})
    with caplog.at_level(logging.ERROR, logger="litellm_kv"):
        assert AffinityHandler(pinned).router("g") is None  # affinity off for the group; LiteLLM routes
    assert f"affinity store 'redis' needs a Redis: {REDIS_SOURCES}" in caplog.text


def test_describe_hides_credentials() -> None:
    assert describe("redis://user:pw@host:1/0") == "redis://host:1/0"
    assert describe(RedisSettings(url="rediss://:pw@h:2", password="x")) == "rediss://h:2"
    assert describe(RedisSettings(cluster_nodes=["a:1"], password="x")) == "cluster a:1"


@pytest.mark.redis
async def test_every_form_reaches_a_real_server(redis_cluster: RedisClusterServers,
                                                redis_sentinel: RedisSentinelServers) -> None:
    single = RedisServer(name="redis-settings")
    try:
        for target in (single.url, RedisSettings(url=single.url), redis_cluster.settings(),
                       redis_sentinel.settings()):
            client = connect(target, RedisUse.INDEX)
            try:
                await client.set("lkv:{settings}:probe", "1")
                assert await client.get("lkv:{settings}:probe") == b"1"
            finally:
                await client.aclose()
    finally:
        single.stop()
