"""The Kubernetes manifests (``deploy/kubernetes``) build and are valid Kubernetes, and they run what
docker-compose.yml runs.

Each overlay is built with the real ``kubectl kustomize`` and every object is validated, strictly (no
unknown field), against the Kubernetes API schemas ``kubernetes-validate`` ships (offline), for the oldest
and the newest release it knows. Then the built objects are compared with docker-compose.yml: the same
commands and engine flags, a probe for every health check (same path and port, same command), the host
names the configs use resolved by Services, the required secrets taken from the Secret and nothing else.
"""

from __future__ import annotations

import re
import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
SECRET_KEYS = ("LITELLM_MASTER_KEY", "LITELLM_SALT_KEY", "POSTGRES_PASSWORD", "LITELLM_KV_SALT_SECRET",
               "LITELLM_KV_INDEXER_TOKEN")
# docker-compose service -> workload in the manifests (both indexers are the one Deployment's two pods).
WORKLOADS = {"redis": "redis", "postgres": "postgres", "proxy": "litellm-kv-proxy",
             "indexer-a": "litellm-kv-indexer", "indexer-b": "litellm-kv-indexer"}
ENGINES = {"cpu": "vllm-cpu-0", "gpu": "vllm-gpu-0"}


def _kubectl() -> str:
    exe = shutil.which("kubectl")
    assert exe, "kubectl is needed to build the manifests (it ships with this project's machines)"
    return exe


def _build(tmp: Path, overlay: str, with_secrets: bool = True) -> subprocess.CompletedProcess[str]:
    tree = tmp / "kubernetes"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("secrets.env"))
    if with_secrets:
        (tree / "base" / "secrets.env").write_text("".join(f"{k}={secrets.token_hex(16)}\n" for k in SECRET_KEYS))
    return subprocess.run([_kubectl(), "kustomize", str(tree / "overlays" / overlay)], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module", params=["cpu", "gpu"])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    run = _build(tmp_path_factory.mktemp(request.param), request.param)
    assert run.returncode == 0, run.stderr
    return request.param, [d for d in yaml.safe_load_all(run.stdout) if d]


def _find(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _container(docs: list[dict[str, Any]], workload: str) -> dict[str, Any]:
    (obj,) = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet") and d["metadata"]["name"] == workload]
    (c,) = obj["spec"]["template"]["spec"]["containers"]
    return dict(c)


def test_every_object_is_valid_kubernetes(built: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = built
    versions = sorted({str(v) for v in kv_utils.all_versions()}, key=lambda v: tuple(map(int, v.split("."))))
    for version in (versions[0], versions[-1]):
        for doc in docs:
            kubernetes_validate.validate(doc, version, strict=True)  # raises naming the field
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "StatefulSet", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"} <= kinds


def test_the_build_stops_without_the_secrets(tmp_path: Path) -> None:
    run = _build(tmp_path, "cpu", with_secrets=False)
    assert run.returncode != 0 and "secrets.env" in run.stderr


def test_the_configs_are_the_repository_s() -> None:
    for name in ("litellm.yaml", "indexer.yaml"):
        assert (K8S / "base" / "config" / name).read_text() == (ROOT / "config" / name).read_text(), name


def _compose_command(service: dict[str, Any]) -> list[str]:
    return [str(x) for x in service["command"]]


def test_commands_and_engine_flags_are_docker_compose_s(built: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = built
    assert _container(docs, "litellm-kv-proxy")["command"] == _compose_command(COMPOSE["proxy"])
    assert _container(docs, "litellm-kv-indexer")["command"] == _compose_command(COMPOSE["indexer-a"])
    engine_args = [re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", a) for a in _compose_command(COMPOSE[ENGINES[overlay]])]
    assert _container(docs, "vllm")["args"] == engine_args
    assert _find(docs, "StatefulSet", "vllm")["spec"]["replicas"] == 2
    assert _find(docs, "Deployment", "litellm-kv-indexer")["spec"]["replicas"] == 2


def _probe_matches(container: dict[str, Any], check: Any) -> None:
    test = check["test"]
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    for probe_name in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(probe_name)
        if probe is None:
            assert probe_name == "startupProbe" and "start_period" not in check, f"{container['name']}: {probe_name}"
            continue
        url = re.search(r"http://127\.0\.0\.1:(\d+)(/[\w/]*)", " ".join(test))
        if url:
            get = probe["httpGet"]
            assert (ports.get(get["port"], get["port"]), get["path"]) == (int(url.group(1)), url.group(2)), probe
        else:
            command = test[1:] if test[0] == "CMD" else test[1].split()
            assert probe["exec"]["command"] == command, probe


def test_every_compose_health_check_is_a_probe(built: tuple[str, list[dict[str, Any]]]) -> None:
    overlay, docs = built
    for service, workload in {**WORKLOADS, ENGINES[overlay]: "vllm"}.items():
        _probe_matches(_container(docs, workload), COMPOSE[service]["healthcheck"])


def test_the_host_names_the_configs_use_are_services(built: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = built
    services = {d["metadata"]["name"]: {p["port"] for p in d["spec"]["ports"]} for d in docs if d["kind"] == "Service"}
    proxy_cfg = yaml.safe_load((ROOT / "config" / "litellm.yaml").read_text())
    indexer_cfg = yaml.safe_load((ROOT / "config" / "indexer.yaml").read_text())
    env = {e["name"]: e.get("value", "") for e in _container(docs, "litellm-kv-proxy")["env"]}
    urls = [m["litellm_params"]["api_base"] for m in proxy_cfg["model_list"] if "api_base" in m["litellm_params"]]
    urls += [r["api_base"] for g in indexer_cfg["model_groups"].values() for r in g["replicas"]]
    urls += [indexer_cfg["redis_url"], env["LITELLM_KV_REDIS_URL"], env["DATABASE_URL"]]
    for url in urls:
        host, port = re.fullmatch(r"\w+://(?:[^@/]*@)?([\w.-]+):(\d+)(?:/.*)?", url).groups()  # type: ignore[union-attr]
        assert int(port) in services.get(host, set()), f"{url}: no Service {host} with port {port}"


def test_required_secrets_come_from_the_secret(built: tuple[str, list[dict[str, Any]]]) -> None:
    _, docs = built
    secret = next(d for d in docs if d["kind"] == "Secret")
    assert set(secret["data"]) == set(SECRET_KEYS)

    def refs(workload: str) -> dict[str, dict[str, Any]]:
        return {e["name"]: e["valueFrom"]["secretKeyRef"] for e in _container(docs, workload)["env"]
                if "valueFrom" in e}

    for workload, name in (("litellm-kv-proxy", "LITELLM_KV_SALT_SECRET"),
                           ("litellm-kv-indexer", "LITELLM_KV_INDEXER_TOKEN")):
        ref = refs(workload)[name]
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] == name and not ref.get("optional")
    for workload in ("litellm-kv-proxy", "litellm-kv-indexer", "postgres"):
        env = _container(docs, workload)["env"]
        assert not [e for e in env if e["name"] in SECRET_KEYS and "value" in e], f"{workload}: a secret in plain text"
