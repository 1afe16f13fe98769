"""The docker-compose stack is consistent with the code and with what the tests run.

No Docker engine runs here, so the stack itself is not started; instead:

* ``docker-compose config`` validates the file for every profile (the binary must be installed:
  ``apt-get install -y docker-compose``; the test fails, naming that command, when it is not);
* the configs the stack mounts are the repository's ``config/litellm.yaml`` and
  ``config/indexer.yaml``, they parse with litellm-kv's own parsers, and they agree with each other
  and with the compose engines (group, replica addresses, served model name);
* the CPU engines run the same launcher and base flags as the tests and the demo
  (``tools/engine/serve.py`` — its real argument handling is run to get the engine command line),
  and the GPU engines carry the same contract flags and the same KV-events configuration;
* ``config/litellm.yaml`` starts a real LiteLLM proxy with litellm-kv (database removed: Prisma
  cannot run here; the two vLLM replicas replaced by local OpenAI-compatible upstreams because the
  compose hosts do not resolve here; a real redis-server for shared mode) and a request through
  the KV-routed group succeeds.
"""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from litellm_kv.config import ModelGroupSettings, Settings, load_settings, parse_section
from litellm_kv.services.indexer.config import load_indexer_config

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
LITELLM_CONFIG = ROOT / "config" / "litellm.yaml"
INDEXER_CONFIG = ROOT / "config" / "indexer.yaml"
PROFILES = ("cpu", "gpu", "observability")
CONTRACT_FLAGS = ("--enable-prefix-caching", "--enable-prompt-tokens-details")
# Secrets the compose file has no default for: `docker-compose config` refuses without them.
REQUIRED_SECRETS = {"LITELLM_KV_SALT_SECRET": "compose-test-salt-secret",
                    "LITELLM_KV_INDEXER_TOKEN": "compose-test-indexer-token"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return data


def _services(compose: dict[str, Any], profile: str | None) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items()
            if not s.get("profiles") or (profile is not None and profile in s["profiles"])}


def _aliases(service: dict[str, Any]) -> set[str]:
    nets = service.get("networks") or {}
    if isinstance(nets, list):
        return set()
    return {a for net in nets.values() if net for a in net.get("aliases", [])}


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path (relative to the repository) of the bind mounts."""
    out = {}
    for v in service.get("volumes", []):
        host, container = v.split(":")[:2]
        if host.startswith("./"):
            out[container] = host[2:]
    return out


def _kv_deployments(settings: Settings, raw: dict[str, Any]) -> dict[str, list[str]]:
    """KV-routed group -> the replica ids of its deployments (scheme://host:port)."""
    groups: dict[str, list[str]] = {}
    for dep in raw["model_list"]:
        g = settings.group(dep["model_name"])
        if g is not None and g.routing == "kv":
            u = urlsplit(dep["litellm_params"]["api_base"])
            groups.setdefault(dep["model_name"], []).append(f"{u.scheme}://{u.netloc}")
    return groups


# -- docker-compose config ------------------------------------------------------------------------
def _compose_bin() -> str:
    found = shutil.which("docker-compose")
    if found is None:
        pytest.fail("docker-compose is not installed: `apt-get install -y docker-compose` (CI installs it in "
                    "scripts/setup.sh) — it validates docker-compose.yml for every profile")
    return found


@pytest.mark.parametrize("profiles", [(), *((p,) for p in PROFILES), ("cpu", "observability"),
                                      ("gpu", "observability")], ids=lambda p: "+".join(p) or "default")
def test_docker_compose_config_passes(profiles: tuple[str, ...]) -> None:
    argv = [_compose_bin(), "-f", str(COMPOSE)]
    for p in profiles:
        argv += ["--profile", p]
    r = subprocess.run([*argv, "config", "-q"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**os.environ, "COMPOSE_PROJECT_NAME": "litellm-kv-ci", **REQUIRED_SECRETS})
    assert r.returncode == 0, f"{shlex.join(argv)} config: {r.stderr}"


@pytest.mark.parametrize("secret", sorted(REQUIRED_SECRETS))
def test_compose_ships_no_default_secret_for(secret: str, compose: dict[str, Any]) -> None:
    """Limit protected: tenant isolation needs secrets nobody else knows. Without the variable
    `docker-compose config` fails, and its error names the variable."""
    values = [v for s in compose["services"].values() for k, v in (s.get("environment") or {}).items()
              if k == secret]
    assert values and all(str(v).startswith(f"${{{secret}:?") for v in values), values
    env = {k: v for k, v in os.environ.items() if k not in REQUIRED_SECRETS}
    env.update({k: v for k, v in REQUIRED_SECRETS.items() if k != secret})
    r = subprocess.run([_compose_bin(), "-f", str(COMPOSE), "--profile", "cpu", "config", "-q"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT,
                       env={**env, "COMPOSE_PROJECT_NAME": "litellm-kv-ci"})
    assert r.returncode != 0 and secret in r.stderr, r.stderr


# -- structure ------------------------------------------------------------------------------------
def test_every_service_has_a_healthcheck(compose: dict[str, Any]) -> None:
    missing = [n for n, s in compose["services"].items() if not s.get("healthcheck", {}).get("test")]
    assert not missing, f"services without healthcheck: {missing}"


def test_published_ports_are_loopback_only(compose: dict[str, Any]) -> None:
    published = {}
    for name, s in compose["services"].items():
        for port in s.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} beyond loopback"
            published[name] = port
    assert set(published) == {"proxy", "prometheus", "grafana"}, published


def test_profiles_give_each_engine_name_once(compose: dict[str, Any]) -> None:
    """vllm-0 / vllm-1 resolve to exactly one engine in the cpu and in the gpu profile."""
    for profile in ("cpu", "gpu"):
        names = [a for s in _services(compose, profile).values() for a in _aliases(s)]
        assert sorted(names) == ["vllm-0", "vllm-1"], (profile, names)


# -- the mounted configs are the repository's, and they agree -----------------------------------
def test_proxy_and_indexers_mount_the_repository_configs(compose: dict[str, Any]) -> None:
    proxy = compose["services"]["proxy"]
    cfg_path = proxy["command"][proxy["command"].index("--config") + 1]
    assert _mounts(proxy)[cfg_path] == "config/litellm.yaml"
    indexers = [s for n, s in compose["services"].items() if n.startswith("indexer")]
    assert len(indexers) >= 2, "high availability needs two indexers"
    for s in indexers:
        path = s["command"][s["command"].index("--config") + 1]
        assert _mounts(s)[path] == "config/indexer.yaml"
        assert s["command"][:2] == ["litellm-kv", "indexer"]
    prom = compose["services"]["prometheus"]
    assert _mounts(prom)["/etc/prometheus/prometheus.yml"] == "deploy/prometheus/prometheus.yml"
    graf = _mounts(compose["services"]["grafana"])
    assert graf["/etc/grafana/provisioning"] == "deploy/grafana/provisioning"
    assert list((ROOT / graf["/var/lib/grafana/dashboards"]).glob("*.json"))


def test_litellm_config_parses_with_every_feature_parser() -> None:
    from litellm_kv.governance import reasoning, vision_policy
    from litellm_kv.governance.policy import config_layer, metadata_layer
    from litellm_kv.routing.affinity import AffinitySettings
    from litellm_kv.routing.cost import CostSettings
    from litellm_kv.routing.options import KVRoutingSettings

    settings = load_settings(LITELLM_CONFIG)
    assert settings.model_groups, "no litellm-kv groups in config/litellm.yaml"
    routings = {g.routing for g in settings.model_groups.values()}
    assert {"kv", "affinity"} <= routings
    for name, g in settings.model_groups.items():
        assert isinstance(g, ModelGroupSettings)
        base = f"litellm_kv.model_groups.{name}"
        if g.routing == "kv":
            opts = parse_section(KVRoutingSettings, g.kv, base + ".kv")
            parse_section(CostSettings, opts.cost, base + ".kv.cost")
        if g.routing == "affinity":
            parse_section(AffinitySettings, g.affinity, base + ".affinity")
        for feature, module, group_cls in (("reasoning", reasoning, reasoning.GroupReasoningSettings),
                                           ("vision", vision_policy, vision_policy.GroupVisionSettings)):
            values = getattr(g, feature)
            if not values:
                continue
            layer = config_layer(values, group=name, feature=feature)
            module.resolve_policy(metadata_layer({}, feature, where="key 'k'"), None, layer,
                                  key_scope="key:k", team_scope=None)
            group_only = {k: v for k, v in values.items() if k in group_cls.__dataclass_fields__}
            parse_section(group_cls, group_only, f"{base}.{feature}")
    raw = yaml.safe_load(LITELLM_CONFIG.read_text())
    assert "litellm_kv.integration.callback.proxy_handler" in raw["litellm_settings"]["callbacks"]


def test_indexer_config_matches_the_proxy_config() -> None:
    settings = load_settings(LITELLM_CONFIG)
    kv_groups = _kv_deployments(settings, yaml.safe_load(LITELLM_CONFIG.read_text()))
    cfg = load_indexer_config(INDEXER_CONFIG)
    assert settings.mode == "shared", "the compose stack runs indexers: the proxy must read their index"
    assert set(cfg.model_groups) == set(kv_groups)
    for name, group in cfg.model_groups.items():
        ids = [f"{urlsplit(r.api_base).scheme}://{urlsplit(r.api_base).netloc}" for r in group.replicas]
        assert sorted(ids) == sorted(kv_groups[name]), name


def test_config_hosts_are_the_compose_engines(compose: dict[str, Any]) -> None:
    settings = load_settings(LITELLM_CONFIG)
    hosts = {urlsplit(u).hostname for ids in _kv_deployments(settings, yaml.safe_load(LITELLM_CONFIG.read_text()))
             .values() for u in ids}
    for profile in ("cpu", "gpu"):
        aliases = {a for s in _services(compose, profile).values() for a in _aliases(s)}
        assert hosts <= aliases, (profile, hosts, aliases)
    redis_url = yaml.safe_load(INDEXER_CONFIG.read_text())["redis_url"]
    assert urlsplit(redis_url).hostname in compose["services"]
    env = compose["services"]["proxy"]["environment"]
    assert urlsplit(env["LITELLM_KV_REDIS_URL"]).hostname in compose["services"]


# -- engine flags ---------------------------------------------------------------------------------
_SERVE_PROBE = """
import json, sys
from tools.engine import serve
serve.patch_vllm_version = lambda: None
try:
    serve.main(json.loads(sys.argv[1]))
except ImportError:  # no vLLM in this venv: serve.py has built the command line by then
    pass
print("ARGV " + json.dumps(sys.argv))
"""


def _serve_argv(args: list[str]) -> list[str]:
    """The vLLM command line tools/engine/serve.py builds from ``args``: its real parser and
    ``vllm_argv``, run in a child process (it sets engine environment variables)."""
    r = subprocess.run([sys.executable, "-c", _SERVE_PROBE, json.dumps(args)], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("ARGV ")), None)
    assert line is not None, f"serve.py built no command line: {r.stdout}{r.stderr}"
    argv: list[str] = json.loads(line.removeprefix("ARGV "))
    return argv


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def _events_config(argv: list[str]) -> dict[str, Any]:
    cfg: dict[str, Any] = json.loads(_flag(argv, "--kv-events-config"))
    return cfg


def _served_model() -> str:
    raw = yaml.safe_load(LITELLM_CONFIG.read_text())
    settings = load_settings(LITELLM_CONFIG)
    names = {d["litellm_params"]["model"].split("/", 1)[1] for d in raw["model_list"]
             if (g := settings.group(d["model_name"])) is not None and g.routing == "kv"}
    assert len(names) == 1, names
    return names.pop()


def _cpu_engine_argv(compose: dict[str, Any]) -> Iterator[list[str]]:
    for s in _services(compose, "cpu").values():
        if _aliases(s):
            yield _cpu_vllm_argv(s)


def _cpu_vllm_argv(service: dict[str, Any]) -> list[str]:
    return _serve_argv([str(a) for a in service["command"]])


def test_cpu_engines_run_the_test_launcher_with_its_base_flags(compose: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["python", "tools/engine/serve.py"]' in dockerfile
    from tools.engine import serve

    engines = list(_cpu_engine_argv(compose))
    assert len(engines) == 2
    for argv in engines:
        for flag in serve.BASE_FLAGS:
            assert flag in argv
        assert _flag(argv, "--served-model-name") == _served_model()
        ev = _events_config(argv)
        assert ev["enable_kv_cache_events"] is True
        # Indexers connect to the engines: the publisher must bind (tcp://*:P), as must replay.
        assert ev["endpoint"].startswith("tcp://*:") and ev["replay_endpoint"].startswith("tcp://*:")


def test_gpu_engines_carry_the_same_contract(compose: dict[str, Any]) -> None:
    cpu = next(iter(_cpu_engine_argv(compose)))
    gpus = [s for s in _services(compose, "gpu").values() if _aliases(s)]
    assert len(gpus) == 2
    for s in gpus:
        argv = [str(a) for a in s["command"]]
        for flag in CONTRACT_FLAGS:
            assert flag in argv
        assert _flag(argv, "--served-model-name") == _served_model()
        assert _events_config(argv) == _events_config(cpu), "GPU and CPU engines publish KV events differently"
        assert _flag(argv, "--prefix-caching-hash-algo") == _flag(cpu, "--prefix-caching-hash-algo")
        devices = s["deploy"]["resources"]["reservations"]["devices"]
        assert devices and "gpu" in devices[0]["capabilities"]


def test_indexer_api_is_loopback_by_default_and_token_guarded_in_the_stack(compose: dict[str, Any]) -> None:
    """Limit protected: the indexer's HTTP API (every tenant's prompt placement). The config binds
    loopback; the compose file widens it explicitly, and only together with the required token,
    which Prometheus is given for the scrape."""
    assert load_indexer_config(INDEXER_CONFIG).host == "127.0.0.1"
    indexers = {n: s for n, s in compose["services"].items() if n.startswith("indexer")}
    for name, s in indexers.items():
        assert s["command"][s["command"].index("--host") + 1] == "0.0.0.0", name
        token_var = load_indexer_config(INDEXER_CONFIG).api_token_env
        assert str(s["environment"][token_var]).startswith(f"${{{token_var}:?"), name
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"]
               if any(t.startswith("indexer") for sc in j["static_configs"] for t in sc["targets"]))
    assert job["authorization"]["type"] == "Bearer"
    token_file = job["authorization"]["credentials_file"]
    assert token_file in " ".join(compose["services"]["prometheus"]["command"])


def test_prometheus_scrapes_proxy_indexers_and_engines(compose: dict[str, Any]) -> None:
    prom = yaml.safe_load((ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = {t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    names = set(compose["services"]) | {a for s in compose["services"].values() for a in _aliases(s)}
    for t in targets:
        assert t.split(":")[0] in names, t
    hosts = {t.split(":")[0] for t in targets}
    assert {"proxy", "vllm-0", "vllm-1"} <= hosts
    assert {n for n in compose["services"] if n.startswith("indexer")} <= hosts
    port = yaml.safe_load(INDEXER_CONFIG.read_text())["port"]
    assert all(t.endswith(f":{port}") for t in targets if t.startswith("indexer"))


# -- the same file starts a real proxy --------------------------------------------------------------
@pytest.mark.proxy
@pytest.mark.redis
def test_litellm_config_starts_a_real_proxy_with_litellm_kv() -> None:
    from tools.harness.procs import ManagedProcess, free_port
    from tools.harness.proxy import MASTER_KEY, start_proxy
    from tools.harness.redis_server import RedisServer

    raw = yaml.safe_load(LITELLM_CONFIG.read_text())
    # The only changes: no database (Prisma's engine download cannot run here) and the vLLM
    # hosts of the compose network replaced by local OpenAI-compatible upstreams.
    raw["general_settings"].pop("database_url")
    raw["general_settings"]["master_key"] = MASTER_KEY
    served = _served_model()
    upstreams: list[ManagedProcess] = []
    redis = RedisServer()
    proxy = None
    try:
        for dep in raw["model_list"]:
            if dep["model_name"] == "chat":
                port = free_port()
                up = ManagedProcess(f"compose-upstream-{port}", [
                    sys.executable, "-m", "tests.support.fake_upstream", "--port", str(port),
                    "--name", dep["model_info"]["id"], "--served-model", served], cwd=ROOT)
                up.wait_http(f"http://127.0.0.1:{port}/v1/models", timeout=30)
                upstreams.append(up)
                dep["litellm_params"]["api_base"] = f"http://127.0.0.1:{port}/v1"
        proxy = start_proxy(raw, name="compose-config-proxy",
                            env={"LITELLM_KV_REDIS_URL": redis.url, "OPENAI_API_KEY": "sk-unused",
                                 "LITELLM_KV_SALT_SECRET": "test", "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
        started = time.monotonic()
        r = httpx.post(f"{proxy.url}/v1/chat/completions", headers=proxy.headers(), timeout=60,
                       json={"model": "chat", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        h = httpx.get(f"{proxy.url}/litellm-kv/health", headers=proxy.headers(), timeout=30)
        assert h.status_code == 200, h.text
        handlers = set(h.json()["handlers"])
        assert {"kv", "affinity", "reasoning", "vision"} <= handlers, handlers
        print(f"config/litellm.yaml: proxy up, request served in {time.monotonic() - started:.1f}s; "
              f"handlers {sorted(handlers)}")
    finally:
        if proxy is not None:
            proxy.stop()
        for up in upstreams:
            up.stop()
        redis.stop()


def test_profile_combinations_are_covered() -> None:
    """Every profile named in the compose file is validated above."""
    data = yaml.safe_load(COMPOSE.read_text())
    named = set(itertools.chain.from_iterable(s.get("profiles", []) for s in data["services"].values()))
    assert named == set(PROFILES)
