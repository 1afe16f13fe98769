"""``litellm-kv doctor`` as an operator runs it (the installed command, as a subprocess), against real vLLM CPU
replicas: the demo's fleet is all green; an engine started with prefix caching, KV events and prompt-token
details off has each problem named with its fix; shared mode finds a replica no indexer follows, on a real
Redis, until a real ``litellm-kv indexer`` feeds it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from litellm_kv.doctor.deployment import names_over_guarded_engines, read_deployment
from tools.harness.engines import EngineReplica, start_replicas, stop_replicas
from tools.harness.indexer import running_indexer
from tools.harness.procs import ROOT
from tools.harness.redis_server import RedisServer
from tools.harness.testbed import KV as KV_GROUP
from tools.harness.testbed import proxy_config as demo_config

pytestmark = [pytest.mark.engine]


def _doctor(config: dict[str, Any], tmp_path: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    """Run ``litellm-kv doctor --json`` on ``config``; returns the exit code, the JSON report and the progress."""
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "litellm_kv.cli", "doctor", "--config", str(path), "--json",
                           "--timeout", "30", *extra],
                          capture_output=True, text=True, timeout=300, cwd=str(ROOT), env=env)
    assert proc.stdout, f"no JSON on stdout; stderr:\n{proc.stderr}"
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def proxy_config(replicas: list[EngineReplica], model_dir: str) -> dict[str, Any]:
    """The demo's proxy config (its three groups) over ``replicas``, tokenizer from ``model_dir``."""
    config = demo_config(replicas)
    config["litellm_kv"]["model_groups"][KV_GROUP]["kv"]["tokenizer_path"] = model_dir
    return config


def _by(report: dict[str, Any], check: str, target_end: str = "") -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["check"] == check and f["target"].endswith(target_end)]


def _replica_target(r: EngineReplica) -> str:
    return f"/http://127.0.0.1:{r.port}"


@pytest.fixture(scope="module")
def misconfigured(engine_model: Path) -> Iterator[EngineReplica]:
    """One replica as a hurried operator starts it: no KV events, prefix caching and prompt-token details off."""
    reps = start_replicas(1, kv_cache_bytes="8M", block_size=32, events="off", name_prefix="doctor-bad",
                          extra_args=["--no-enable-prefix-caching", "--no-enable-prompt-tokens-details"])
    try:
        yield reps[0]
    finally:
        stop_replicas(reps)


def test_the_demo_fleet_is_all_green(engines: list[EngineReplica], engine_model: Path, tmp_path: Path) -> None:
    code, report, progress = _doctor(proxy_config(engines, str(engine_model)), tmp_path)
    assert code == 0, progress
    assert report["ok"] and report["errors"] == 0, progress
    for r in engines:
        for check in ("engine.reachable", "engine.hash_settings", "engine.prefix_caching", "engine.kv_events",
                      "events.stream", "engine.prompt_tokens_details", "events.flow", "events.hashes",
                      "routing.prediction"):
            found = _by(report, check, _replica_target(r))
            assert [f["status"] for f in found] == ["ok"], (check, found)
        # The prediction check compared a real number: what litellm-kv predicted is what the engine reported.
        (pred,) = _by(report, "routing.prediction", _replica_target(r))
        assert "predicted 0 " not in pred["detail"], pred
    assert [f["status"] for f in _by(report, "routing.exact", KV_GROUP)] == ["ok"]
    (tok,) = _by(report, "tokenizer", KV_GROUP)
    assert tok["status"] == "ok" and tok["detail"].startswith("local (verified"), tok
    # Progress is shown while it runs (one heading per replica, one line per check) and ends in a summary.
    assert progress.count(f"== group {KV_GROUP}, replica") == len(engines)
    assert "all" in progress.splitlines()[-1] and "checks passed" in progress


def test_a_misconfigured_engine_has_each_problem_named(engines: list[EngineReplica], misconfigured: EngineReplica,
                                                       engine_model: Path, tmp_path: Path) -> None:
    config = proxy_config([engines[0], misconfigured], str(engine_model))
    code, report, progress = _doctor(config, tmp_path)
    assert code == 1, progress
    bad = _replica_target(misconfigured)
    errors = {f["check"]: f for f in report["findings"] if f["status"] == "error" and f["target"].endswith(bad)}
    assert {"engine.prefix_caching", "engine.kv_events", "engine.prompt_tokens_details"} <= set(errors), progress
    assert "--enable-prefix-caching" in errors["engine.prefix_caching"]["fix"]
    assert "--kv-events-config" in errors["engine.kv_events"]["fix"]
    assert "--enable-prompt-tokens-details" in errors["engine.prompt_tokens_details"]["fix"]
    # The good replica beside it is not blamed, and the group still routes exactly over it.
    good = _replica_target(engines[0])
    assert not [f for f in report["findings"] if f["status"] == "error" and f["target"].endswith(good)], progress
    assert [f["status"] for f in _by(report, "routing.prediction", good)] == ["ok"], progress
    assert [f["status"] for f in _by(report, "routing.exact", KV_GROUP)] == ["warn"], progress
    # The text an operator reads names each problem and its fix.
    assert "ERROR engine.prefix_caching" in progress and "fix: start vLLM with --enable-prefix-caching" in progress


def test_hash_settings_that_disagree_with_the_engines(engines: list[EngineReplica], engine_model: Path,
                                                      tmp_path: Path) -> None:
    config = proxy_config(engines[:1], str(engine_model))
    config["litellm_kv"]["model_groups"][KV_GROUP]["kv"]["block_size"] = 16  # the engines use 32
    code, report, progress = _doctor(config, tmp_path)
    assert code == 1, progress
    (found,) = _by(report, "engine.hash_settings", _replica_target(engines[0]))
    assert found["status"] == "error" and "kv.block_size is 16 but the engine uses 32" in found["detail"]
    assert [f["status"] for f in _by(report, "routing.exact", KV_GROUP)] == ["error"]


def test_an_invalid_config_is_named_without_touching_engines(tmp_path: Path) -> None:
    config = {"model_list": [], "litellm_kv": {"mode": "embedded", "model_groups": {
        "g": {"routing": "kv", "kv": {"block_sise": 16}}}}}
    code, report, _ = _doctor(config, tmp_path)
    assert code == 1
    (found,) = _by(report, "config.parse")
    assert found["status"] == "error" and "block_sise" in found["detail"]


@pytest.mark.redis
def test_shared_mode_needs_an_indexer_per_replica(engines: list[EngineReplica], engine_model: Path,
                                                  tmp_path: Path) -> None:
    redis = RedisServer(name="doctor-redis")
    try:
        config = proxy_config(engines, str(engine_model))
        config["litellm_kv"].update(mode="shared", redis_url=redis.url)
        code, report, progress = _doctor(config, tmp_path)
        assert code == 1, progress
        assert [f["status"] for f in _by(report, "redis.reachable")] == ["ok"]
        beats = _by(report, "indexer.heartbeat")
        assert len(beats) == len(engines) and all(f["status"] == "error" for f in beats), beats
        assert "litellm-kv indexer" in beats[0]["fix"]

        with running_indexer(redis.url, {KV_GROUP: [r.api_base for r in engines]}, "doctor-indexer") as url:
            code, report, progress = _doctor(config, tmp_path, "--indexer", url)
        assert code == 0, progress
        assert [f["status"] for f in _by(report, "indexer.heartbeat")] == ["ok"] * len(engines)
        assert [f["status"] for f in _by(report, "indexer.health")] == ["ok"]
    finally:
        redis.stop()


def test_an_unreachable_redis_is_an_error(engines: list[EngineReplica], engine_model: Path, tmp_path: Path) -> None:
    config = proxy_config(engines[:1], str(engine_model))
    config["litellm_kv"].update(mode="shared", redis_url="redis://127.0.0.1:1/0")
    code, report, progress = _doctor(config, tmp_path)
    assert code == 1
    (found,) = _by(report, "redis.reachable")
    assert found["status"] == "error" and "127.0.0.1:1" in found["detail"], progress


@pytest.mark.redis
def test_a_redis_that_deletes_budget_counters_is_named(tmp_path: Path) -> None:
    """``redis.eviction``: ok with Redis's default policy, a warning once ``maxmemory-policy`` may delete the
    budgets' keys, an error (exit 1) once it has deleted keys, as the proxy would then refuse those budgets."""
    from tests.index.test_redis_eviction import cap_memory, fill_until_evicted

    redis = RedisServer(name="doctor-redis-eviction")
    try:
        config = {"model_list": [{"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/q",
                                                                           "api_base": "http://127.0.0.1:9/v1"}}],
                  "litellm_kv": {"redis_url": redis.url, "model_groups": {"qwen": {"reasoning": {"style": "vllm"}}}}}
        code, report, progress = _doctor(config, tmp_path)
        (found,) = _by(report, "redis.eviction")
        assert code == 0 and found["status"] == "ok" and "noeviction" in found["detail"], progress
        r = redis.client()
        cap_memory(r, "volatile-lru")
        code, report, progress = _doctor(config, tmp_path)
        (found,) = _by(report, "redis.eviction")
        assert code == 0 and found["status"] == "warn", progress
        assert "deletes keys of budgets (none evicted yet)" in found["detail"] and "noeviction" in found["fix"]
        fill_until_evicted(r, ttl=True)
        code, report, progress = _doctor(config, tmp_path)
        (found,) = _by(report, "redis.eviction")
        assert code == 1 and found["status"] == "error", progress
        assert "maxmemory-policy volatile-lru" in found["detail"] and "budget counter" in found["detail"]
    finally:
        redis.stop()


def test_budgets_kept_in_memory_are_a_warning(tmp_path: Path) -> None:
    """``config.budgets``: period budgets without a Redis work for one proxy with one worker only."""
    config = {"model_list": [{"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/q",
                                                                       "api_base": "http://127.0.0.1:9/v1"}}],
              "litellm_kv": {"model_groups": {"qwen": {"reasoning": {"style": "vllm"}}}}}
    code, report, progress = _doctor(config, tmp_path)
    (found,) = _by(report, "config.budgets")
    assert code == 0 and found["status"] == "warn" and "--num_workers" in found["detail"], progress
    assert not _by(report, "redis.eviction")


def test_a_name_the_proxy_would_refuse_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``config.names``: a second model_name over the vLLM server of a group with limits or tenant isolation, with
    no entry of its own, is refused by the proxy at request time; the doctor says so before traffic arrives, whatever
    spelling of the server's address the second name uses."""
    def vllm(name: str, port: int, host: str = "127.0.0.1") -> dict[str, Any]:
        return {"model_name": name, "litellm_params": {"model": "hosted_vllm/q", "api_base": f"http://{host}:{port}/v1"}}

    config = {
        "model_list": [vllm("think", 9), vllm("think-too", 9, "LOCALHOST"), vllm("iso", 10), vllm("iso-plain", 10),
                       vllm("iso-configured", 10), vllm("iso-alias-name", 10), vllm("elsewhere", 11)],
        "router_settings": {"model_group_alias": {"iso-alias-name": "iso"}},
        "litellm_kv": {"model_groups": {"think": {"reasoning": {"style": "vllm"}}, "iso-configured": {},
                                        "iso": {"routing": "kv", "kv": {"tenant_isolation": "team"}}}},
    }
    monkeypatch.setenv("LITELLM_KV_SALT_SECRET", "doctor-test-secret-" + "d" * 24)  # the subprocess inherits it
    code, report, progress = _doctor(config, tmp_path, "--timeout", "2")
    found = {f["target"]: f for f in _by(report, "config.names")}
    assert set(found) == {"think-too", "iso-plain"}, progress
    assert "'think' (reasoning)" in found["think-too"]["detail"] and found["think-too"]["status"] == "error"
    assert "'iso' (tenant isolation)" in found["iso-plain"]["detail"]
    assert code != 0


async def test_a_second_name_over_another_dns_name_of_a_guarded_engine_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``config.names`` resolves host names as the proxy does (this test's resolver answers from a table): a second
    name over another DNS name of the guarded engine's address is named, one over another address is not, and one
    whose host does not resolve is compared as written."""
    def answer(host: str, *args: Any, **kw: Any) -> list[Any]:
        table = {"engine-a.example": "10.0.0.1", "engine-b.example": "10.0.0.1", "engine-c.example": "10.0.0.2"}
        if host not in table:
            raise OSError(-2, "Name or service not known")
        return [(2, 1, 6, "", (table[host], 0))]

    def vllm(name: str, host: str) -> dict[str, Any]:
        return {"model_name": name, "litellm_params": {"model": "hosted_vllm/q", "api_base": f"http://{host}:8000/v1"}}

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "model_list": [vllm("think", "engine-a.example"), vllm("think-dns", "engine-b.example"),
                       vllm("think-ip", "10.0.0.1"), vllm("other", "engine-c.example"),
                       vllm("gone", "engine-d.example")],
        "litellm_kv": {"model_groups": {"think": {"reasoning": {"style": "vllm"}}}},
    }))
    monkeypatch.setattr(socket, "getaddrinfo", answer)
    found = await names_over_guarded_engines(read_deployment(path))
    assert found == {"think-dns": {"think": ["reasoning"]}, "think-ip": {"think": ["reasoning"]}}


def test_a_deployment_that_names_a_litellm_credential_is_read_at_the_credential_s_api_base(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A KV-routed group whose deployments name their engines through LiteLLM credentials (``credential_list``,
    ``litellm_credential_name``, an ``os.environ/`` value resolved) has its replicas there, and one that also names a
    ``base_url`` of its own at that, as the proxy finds them."""
    monkeypatch.setenv("ENGINE_B", "http://10.0.0.2:8000/v1")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "credential_list": [
            {"credential_name": "a", "credential_values": {"api_base": "http://10.0.0.1:8000/v1"}},
            {"credential_name": "b", "credential_values": {"api_base": "os.environ/ENGINE_B"}}],
        "model_list": [*({"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/q",
                                                                   "litellm_credential_name": c}} for c in ("a", "b")),
                       {"model_name": "qwen", "litellm_params": {"model": "hosted_vllm/q",
                                                                 "base_url": "http://10.0.0.3:8000/v1",
                                                                 "litellm_credential_name": "a"}}],
        "litellm_kv": {"model_groups": {"qwen": {"routing": "kv"}}},
    }))
    plan = read_deployment(path)
    assert plan.unrouted == [] and [g.replicas() for g in plan.groups] == [
        ["http://10.0.0.1:8000", "http://10.0.0.2:8000", "http://10.0.0.3:8000"]]
