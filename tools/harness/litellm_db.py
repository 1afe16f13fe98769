"""LiteLLM's real database path for tests: a throwaway PostgreSQL with LiteLLM's schema, and a proxy on it.

It drives the shared ``litellm-db`` tools (``shared/tools/litellm-db/`` beside the repository or above it, or the folder
named by ``LITELLM_DB_TOOLS``): Prisma's native engine cannot be downloaded here, so a stand-in serves its
API through Prisma's own WebAssembly engine; PostgreSQL, LiteLLM and prisma-client-py are the real things.
Keys and teams are then created and edited through LiteLLM's own endpoints, as its admin UI does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from tools.harness.procs import ROOT, free_port
from tools.harness.proxy import Proxy, start_proxy


def tools_dir() -> Path | None:
    """Where the litellm-db tools are, or ``None`` when this checkout has no ``shared/`` beside it."""
    named = os.environ.get("LITELLM_DB_TOOLS")
    candidates = [Path(named)] if named else []
    # shared/ lies beside the checkout (a worktree one level deeper finds it further up).
    candidates += [up / "shared" / "tools" / "litellm-db" for up in (ROOT, *ROOT.parents)]
    return next((c for c in candidates if (c / "pg.sh").exists()), None)


def _venv() -> Path:
    return Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv"))


def prisma_env() -> dict[str, str]:
    """What ``env.sh`` exports for a proxy process: Prisma pointed at the stand-in engine."""
    home = Path(os.environ.get("LITELLM_DB_HOME", Path.home() / ".cache" / "litellm-db"))
    return {
        "PRISMA_QUERY_ENGINE_BINARY": str(home / "query-engine.mjs"),
        "PRISMA_SCHEMA_ENGINE_BINARY": str(home / "schema-engine"),
        "PRISMA_ENGINES_CHECKSUM_IGNORE_MISSING": "1",
        "PRISMA_HIDE_UPDATE_MESSAGE": "1",
        "DISABLE_SCHEMA_UPDATE": "true",
    }


class Database:
    """A started PostgreSQL with LiteLLM's schema applied: ``url``, ``stop()``."""

    def __init__(self, tools: Path, run_dir: Path, url: str) -> None:
        self.tools = tools
        self.run_dir = run_dir
        self.url = url

    def stop(self) -> None:
        subprocess.run(["bash", str(self.tools / "pg.sh"), "stop", str(self.run_dir)], check=False, timeout=30)
        shutil.rmtree(self.run_dir, ignore_errors=True)


def start_database(timeout: float = 300.0) -> Database:
    """Set up the tools (idempotent), start PostgreSQL on a free port and apply LiteLLM's migrations."""
    tools = tools_dir()
    if tools is None:
        raise FileNotFoundError("litellm-db tools not found (shared/tools/litellm-db beside the repository or "
                                "above it, or LITELLM_DB_TOOLS)")
    venv = str(_venv())
    subprocess.run(["bash", str(tools / "setup.sh"), venv], check=True, timeout=timeout, capture_output=True)
    run_dir = Path(tempfile.mkdtemp(prefix="litellm-kv-pg-"))
    out = subprocess.run(["bash", str(tools / "pg.sh"), "start", str(run_dir), str(free_port())], check=True,
                         timeout=60, capture_output=True, text=True).stdout
    url = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("DATABASE_URL="))
    db = Database(tools, run_dir, url)
    try:
        subprocess.run(["bash", str(tools / "migrate.sh"), venv, url], check=True, timeout=timeout,
                       capture_output=True)
    except BaseException:
        db.stop()
        raise
    return db


def start_db_proxy(config: Mapping[str, Any], db: Database, *, name: str = "litellm-db",
                   env: Mapping[str, str] | None = None, timeout: float = 240.0) -> Proxy:
    """A proxy on ``db`` (no ``custom_auth``: keys are LiteLLM's own); waits until it reports the database."""
    cfg = dict(config)
    cfg["general_settings"] = {**dict(config.get("general_settings") or {}), "database_url": db.url}
    proxy = start_proxy(cfg, name=name, env={**prisma_env(), "DATABASE_URL": db.url,
                                             "LITELLM_LOCAL_MODEL_COST_MAP": "True", **dict(env or {})},
                        timeout=timeout)
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        try:
            last = httpx.get(f"{proxy.url}/health/readiness", timeout=10).text
            if '"db":"connected"' in last.replace(" ", ""):
                return proxy
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.5)
    proxy.stop()
    raise TimeoutError(f"proxy never reported its database connected: {last}\n{proxy.proc.log_tail()}")
