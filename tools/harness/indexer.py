"""A real ``litellm-kv indexer`` process for shared-mode tests: started from a generated config on a free
loopback port, stopped by PID."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import yaml

from litellm_kv.config import RedisSettings
from tools.harness.procs import ARTIFACTS, PYTHON, ROOT, ManagedProcess, free_port


def redis_config(target: str | RedisSettings) -> dict[str, Any]:
    """``target`` as the config's ``redis`` section (a URL, a cluster or a sentinel setup)."""
    if isinstance(target, str):
        return {"url": target}

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if v is not None}
        return value

    return clean(dataclasses.asdict(target))  # type: ignore[no-any-return]


@contextmanager
def running_indexer(redis_url: str | RedisSettings, groups: Mapping[str, Sequence[str]], name: str) -> Iterator[str]:
    """An indexer feeding ``redis_url`` (a URL, or cluster / sentinel settings) from each group's replicas
    (their ``api_base``); yields its URL once ``/health`` says ok. Short heartbeat, discovery and back-off
    intervals, so tests see changes quickly."""
    port = free_port()
    where = {"redis_url": redis_url} if isinstance(redis_url, str) else {"redis": redis_config(redis_url)}
    cfg = {
        **where, "port": port, "heartbeat_interval_s": 1.0, "heartbeat_ttl_s": 10.0,
        "discovery_interval_s": 1.0, "replay_timeout_s": 3.0, "redis_backoff_max_s": 1.0,
        "model_groups": {g: {"replicas": [{"api_base": b} for b in bases]} for g, bases in groups.items()},
    }
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / f"{name}-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = ManagedProcess(name, [PYTHON, "-m", "litellm_kv.cli", "indexer", "--config", str(path)], cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_until(lambda: httpx.get(url + "/health", timeout=2).json()["status"] == "ok", 90, "indexer ok")
        yield url
    finally:
        proc.stop()
