"""Run a real Prometheus server on 127.0.0.1 for tests: it scrapes the given targets every second, keeps its data
in a temporary folder, and answers PromQL over its HTTP API. Stopped by PID."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import yaml

from tools.harness.procs import ManagedProcess, free_port


class PrometheusServer:
    """``jobs``: job name -> (metrics path, ``host:port`` targets, bearer token or None)."""

    def __init__(self, jobs: Mapping[str, tuple[str, Sequence[str], str | None]], name: str = "prometheus") -> None:
        exe = shutil.which("prometheus")
        if exe is None:
            raise RuntimeError("prometheus is not installed (scripts/setup.sh installs it: apt-get install prometheus)")
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="litellm-kv-prometheus-"))
        scrape = []
        for job, (path, targets, token) in jobs.items():
            cfg: dict[str, Any] = {"job_name": job, "metrics_path": path, "scrape_interval": "1s",
                                   "scrape_timeout": "1s", "static_configs": [{"targets": list(targets)}]}
            if token:
                cfg["authorization"] = {"type": "Bearer", "credentials": token}
            scrape.append(cfg)
        config = self.dir / "prometheus.yml"
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                                          "scrape_configs": scrape}))
        self.proc = ManagedProcess(name, [exe, f"--config.file={config}", f"--storage.tsdb.path={self.dir / 'data'}",
                                          f"--web.listen-address=127.0.0.1:{self.port}"])
        self.proc.wait_until(self._ready, 30, "prometheus /-/ready")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_scraped(self, timeout: float = 30) -> None:
        """Until every target has been scraped successfully at least once."""
        def up() -> bool:
            targets = httpx.get(f"{self.url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
            return bool(targets) and all(t["health"] == "up" for t in targets)
        self.proc.wait_until(up, timeout, "every prometheus target up")

    def query(self, expr: str) -> dict[str, Any]:
        """The API's answer to an instant query (``status``, ``data`` or ``error``), whatever the status code."""
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr, "time": str(time.time())}, timeout=10)
        return dict(r.json())

    def stop(self) -> None:
        self.proc.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
