"""LiteLLM on a real PostgreSQL, for tests of the admin's path (keys and teams in LiteLLM's database, rows of
``LiteLLM_SpendLogs``).

Prisma's native query engine is downloaded by LiteLLM at start-up from a host these machines cannot reach;
``tools/litellm_db/`` (see its README) stands in for that one binary with Prisma's own WebAssembly build of the
same engine, so LiteLLM, prisma-client-py and PostgreSQL are the real ones. ``scripts/setup.sh`` installs it.
"""

from __future__ import annotations

import contextlib
import itertools
import json
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

TOOL = ROOT / "tools" / "litellm_db"
DB_HOME = Path(os.environ.get("LITELLM_DB_HOME", Path.home() / ".cache" / "litellm-db"))


def unavailable() -> str | None:
    """Why the database path cannot run on this machine (``None``: it can)."""
    if not list(Path("/usr/lib/postgresql").glob("*/bin/initdb")):
        return "PostgreSQL is not installed (scripts/setup.sh installs it)"
    if shutil.which("psql") is None or shutil.which("node") is None:
        return "psql or node missing (scripts/setup.sh installs them)"
    if not (DB_HOME / "node_modules" / "@prisma" / "query-engine-wasm").is_dir():
        return f"the query-engine stand-in is not set up in {DB_HOME} (scripts/setup.sh)"
    if not (client_dir() / ".generated").exists():
        return f"prisma generate has not run into {client_dir()} (scripts/setup.sh)"
    return None


def client_dir() -> Path:
    """Where ``tools/litellm_db/setup.sh`` generated LiteLLM's Prisma client: on ``PYTHONPATH`` only for the
    processes that use a database, since its generated types make every LiteLLM start that imports them slower."""
    return Path(os.environ.get("VIRTUAL_ENV", ROOT / ".venv")) / "litellm-db-client"


def db_env() -> dict[str, str]:
    """What ``tools/litellm_db/env.sh`` exports: the generated client first on the path, prisma-client-py pointed at
    the stand-in, and a 1 s bound on the ``prisma migrate diff`` LiteLLM runs at start-up (with the stub schema
    engine it can only fail, after ~15 s of CPU importing the generated client)."""
    return {
        "PYTHONPATH": os.pathsep.join([str(client_dir()), str(ROOT), os.environ.get("PYTHONPATH", "")]),
        "PRISMA_QUERY_ENGINE_BINARY": str(DB_HOME / "query-engine.mjs"),
        "PRISMA_SCHEMA_ENGINE_BINARY": str(DB_HOME / "schema-engine"),
        "PRISMA_ENGINES_CHECKSUM_IGNORE_MISSING": "1",
        "PRISMA_HIDE_UPDATE_MESSAGE": "1",
        "DISABLE_SCHEMA_UPDATE": "true",
        "LITELLM_PRISMA_COMMAND_TIMEOUT": "1",
    }


class PostgresServer:
    """A throwaway PostgreSQL whose database ``litellm`` holds LiteLLM's schema, applied once (``migrate.sh``, the
    slow step: ~30 s quiet, a minute on a busy machine). ``database()`` hands out a fresh copy of it: PostgreSQL
    copies a template database's files, well under a second. The template itself is never connected to, as
    ``CREATE DATABASE … TEMPLATE`` requires."""

    def __init__(self) -> None:
        self.run_dir = Path(tempfile.mkdtemp(prefix="litellm-kv-pg-"))
        port = free_port()
        out = subprocess.run(["bash", str(TOOL / "pg.sh"), "start", str(self.run_dir), str(port)],
                             capture_output=True, text=True, timeout=120, check=False)
        line = next((x for x in out.stdout.splitlines() if x.startswith("DATABASE_URL=")), None)
        if out.returncode != 0 or line is None:
            self.stop()
            raise RuntimeError(f"postgres did not start: {out.stdout[-2000:]} {out.stderr[-2000:]}")
        self.template_url = line.removeprefix("DATABASE_URL=")
        venv = os.environ.get("VIRTUAL_ENV", str(ROOT / ".venv"))
        mig = subprocess.run(["bash", str(TOOL / "migrate.sh"), venv, self.template_url],
                             capture_output=True, text=True, timeout=600, check=False)
        if mig.returncode != 0:
            self.stop()
            raise RuntimeError(f"LiteLLM's migrations failed: {mig.stdout[-2000:]} {mig.stderr[-2000:]}")
        self._count = itertools.count(1)

    def database(self) -> Postgres:
        """A new database with LiteLLM's schema and no rows: dropped by its ``stop()``."""
        name = f"litellm_{next(self._count)}"
        self._psql("postgres", f'CREATE DATABASE "{name}" TEMPLATE litellm')
        return Postgres(self, name)

    def _url(self, database: str) -> str:
        return self.template_url.rsplit("/", 1)[0] + "/" + database

    def _psql(self, database: str, sql: str, timeout: float = 60.0) -> str:
        out = subprocess.run(["psql", self._url(database), "-v", "ON_ERROR_STOP=1", "-tAc", sql],
                             capture_output=True, text=True, timeout=timeout, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"psql {sql!r}: {out.stderr.strip()[-2000:]}")
        return out.stdout

    def stop(self) -> None:
        subprocess.run(["bash", str(TOOL / "pg.sh"), "stop", str(self.run_dir)], timeout=30, check=False)
        shutil.rmtree(self.run_dir, ignore_errors=True)


class Postgres:
    """One database of a ``PostgresServer`` with LiteLLM's schema: ``url``, ``query(sql)``, ``stop()``."""

    def __init__(self, server: PostgresServer, name: str) -> None:
        self.server, self.name = server, name
        self.url = server._url(name)

    def query(self, sql: str) -> list[Any]:
        """Rows of one statement, each the JSON value of its single column (write ``SELECT row_to_json(...)``
        or ``SELECT json_agg(...)`` style queries)."""
        out = self.server._psql(self.name, sql, timeout=30.0)
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def stop(self) -> None:
        """Drops the database (closing what is still connected to it); the server goes on."""
        # A database that cannot be dropped (the server gone or stopping) goes with the server's files at its stop.
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.server._psql("postgres", f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def start_db_proxy(
    config: Mapping[str, Any], db: Postgres, *, name: str = "litellm-db", env: Mapping[str, str] | None = None,
    workers: int = 1, timeout: float = 180.0,
) -> Proxy:
    """``litellm --config`` with ``DATABASE_URL``: keys and teams live in ``db``; returns once LiteLLM
    reports the database connected."""
    cfg = json.loads(json.dumps(config))
    cfg.setdefault("general_settings", {})["database_url"] = db.url
    run_env = {**db_env(), "DATABASE_URL": db.url, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **(env or {})}
    proxy = start_proxy(cfg, name=name, env=run_env, timeout=timeout, workers=workers)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = httpx.get(proxy.url + "/health/readiness", timeout=5)
            if r.status_code == 200 and r.json().get("db") == "connected":
                return proxy
        except (httpx.HTTPError, ValueError):
            pass
        if not proxy.proc.alive():
            break
        time.sleep(0.3)
    tail = proxy.proc.log_tail()
    proxy.stop()
    raise RuntimeError(f"{name}: the database never connected\n{tail}")
