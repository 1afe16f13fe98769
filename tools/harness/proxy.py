"""Run a real ``litellm`` proxy process (LiteLLM 1.110.2) with a given config, for tests and the demo."""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tools.harness.procs import ROOT, ManagedProcess, free_port, start_all

MASTER_KEY = "sk-litellm-kv-test-master"


def litellm_bin() -> str:
    venv_bin = Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "bin" / "litellm"
    return str(venv_bin) if venv_bin.exists() else "litellm"


class Proxy:
    """A started proxy: ``url``, ``headers(key)``, ``stop()``."""

    def __init__(self, proc: ManagedProcess, port: int, config_path: Path) -> None:
        self.proc = proc
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.config_path = config_path

    def headers(self, key: str = MASTER_KEY) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def stop(self) -> None:
        self.proc.stop()

    def kv_health(self, group: str, **params: str) -> dict[str, Any]:
        """litellm-kv's view of one KV-routed group (``GET /litellm-kv/health``, with ``params`` as its query)."""
        r = httpx.get(f"{self.url}/litellm-kv/health", headers=self.headers(), timeout=10, params=params)
        r.raise_for_status()
        return dict(((r.json().get("routing") or {}).get("groups") or {}).get(group) or {})

    def metric_by(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """The samples called ``name`` (as exposed: ``litellm_kv_x_total``) on ``GET /litellm-kv/metrics`` whose
        labels include ``labels``, summed by their value of ``label``."""
        r = httpx.get(f"{self.url}/litellm-kv/metrics", headers=self.headers(), timeout=30)
        r.raise_for_status()
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(r.text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    key = sample.labels.get(label, "")
                    out[key] = out.get(key, 0.0) + sample.value
        return out

    def wait_kv_exact(self, group: str, timeout: float = 60) -> dict[str, Any]:
        """Wait until the group routes exactly with every replica ready; returns its health."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] = {}
        while time.monotonic() < deadline:
            try:
                last = self.kv_health(group)
            except httpx.TransportError:  # a proxy still starting on a loaded machine: ask again
                time.sleep(0.5)
                continue
            if last.get("exact") and last.get("replicas") and all(r.get("ready") for r in last["replicas"]):
                return last
            time.sleep(0.5)
        raise TimeoutError(f"litellm-kv routing of {group} never became exact: {last}")


def start_proxy(
    config: Mapping[str, Any],
    *,
    name: str = "litellm",
    keys: Mapping[str, Mapping[str, Any]] | None = None,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    timeout: float = 120.0,
    workers: int = 1,
) -> Proxy:
    """Write ``config`` to a temp file and start ``litellm --config`` on 127.0.0.1.

    ``keys``: api key -> fields of ``UserAPIKeyAuth`` (key_alias, metadata, team_id, team_alias,
    team_metadata, ...). When given, ``general_settings.custom_auth`` presents those keys exactly
    as database keys would be presented to hooks (the database path cannot run here: Prisma's
    engine binary is downloaded at start-up from a host these machines cannot reach).
    """
    fixed_port = port is not None
    port = port or free_port()
    cfg = json.loads(json.dumps(config))  # deep copy
    gs = cfg.setdefault("general_settings", {})
    gs.setdefault("master_key", MASTER_KEY)
    run_env = {
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "LITELLM_LOG": "INFO",
        "LITELLM_TELEMETRY": "False",
        "DISABLE_SCHEMA_UPDATE": "true",
        "NO_DOCS": "True",
    }
    tmp = Path(tempfile.mkdtemp(prefix="litellm-kv-proxy-"))
    if keys is not None:
        keys_file = tmp / "keys.json"
        keys_file.write_text(json.dumps(keys))
        gs["custom_auth"] = "tests.support.custom_auth.user_api_key_auth"
        run_env["LITELLM_KV_TEST_KEYS"] = str(keys_file)
    if env:
        run_env.update(env)
    config_path = tmp / "config.yaml"
    config_path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    for attempt in (1, 2):
        proc = ManagedProcess(
            name,
            [litellm_bin(), "--config", str(config_path), "--host", "127.0.0.1", "--port", str(port),
             "--num_workers", str(workers)],
            env=run_env,
            cwd=str(tmp),
        )
        try:
            proc.wait_http(f"http://127.0.0.1:{port}/health/liveliness", timeout)
        except Exception as exc:
            proc.stop()
            # The free port can be taken between picking it and the proxy binding it: retry once.
            if attempt == 1 and not fixed_port and "address already in use" in str(exc).lower():
                port = free_port()
                continue
            raise
        return Proxy(proc, port, config_path)
    raise AssertionError("unreachable")


def start_proxies(configs: Sequence[Mapping[str, Any]], names: Sequence[str], **kwargs: Any) -> list[Proxy]:
    """Start one proxy per config at once (``start_proxy``'s keyword arguments, the same for each): a proxy's
    start is mostly LiteLLM's import, which overlaps well with another's. If any fails, those that
    started are stopped and the error raised."""
    starts = [functools.partial(start_proxy, cfg, name=name, **kwargs)
              for cfg, name in zip(configs, names, strict=True)]
    return start_all(starts, stop=Proxy.stop)
