"""``litellm-kv doctor --key``: a virtual key's litellm-kv metadata, read from a real LiteLLM proxy on a real
PostgreSQL (``tools.harness.database``: LiteLLM's own ``/key/generate``, ``/team/new``, ``/key/info``,
``/team/info``), resolved against the config with the proxy's own policy resolvers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tools.harness.database import start_db_proxy, unavailable
from tools.harness.procs import ROOT
from tools.harness.proxy import MASTER_KEY, Proxy

pytestmark = [pytest.mark.proxy, pytest.mark.slow]

GROUP = "thinker"
CONFIG: dict[str, Any] = {
    "model_list": [{"model_name": GROUP, "litellm_params": {"model": "hosted_vllm/tiny",
                                                           "api_base": "http://127.0.0.1:9/v1", "api_key": "x"}}],
    "litellm_kv": {"model_groups": {GROUP: {"reasoning": {"max_budget": 1024, "tokens_per_day": 100000}}}},
}


@pytest.fixture(scope="module")
def db_proxy(request: pytest.FixtureRequest) -> Iterator[tuple[Proxy, str]]:
    if (why := unavailable()) is not None:
        pytest.skip(f"the real database path is not set up here: {why}")
    db = request.getfixturevalue("litellm_postgres").database()
    proxy = None
    try:
        cfg = {k: v for k, v in CONFIG.items() if k != "litellm_kv"}
        proxy = start_db_proxy(cfg, db, name="doctor-db-proxy", timeout=240)
        yield proxy, db.url
    finally:
        if proxy is not None:
            proxy.stop()
        db.stop()


def _admin(proxy: Proxy, path: str, body: dict[str, Any]) -> dict[str, Any]:
    r = httpx.post(f"{proxy.url}{path}", json=body, headers=proxy.headers(), timeout=60)
    r.raise_for_status()
    return dict(r.json())


def _doctor(tmp_path: Path, proxy: Proxy, key: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(CONFIG))
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_MASTER_KEY"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, "-m", "litellm_kv.cli", "doctor", "--config", str(path), "--json",
                           "--proxy", proxy.url, "--key", key, *extra],
                          capture_output=True, text=True, timeout=120, cwd=str(ROOT), env=env)
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def test_a_keys_limits_and_where_each_was_set(db_proxy: tuple[Proxy, str], tmp_path: Path) -> None:
    proxy, _ = db_proxy
    team = _admin(proxy, "/team/new", {"team_alias": "research", "metadata": {
        "litellm_kv": {"reasoning": {"tokens_per_day": 5000}}}})
    key = _admin(proxy, "/key/generate", {"key_alias": "bot-a", "team_id": team["team_id"],
                                          "metadata": {"litellm_kv": {"reasoning": {"max_budget": 256}}}})["key"]
    code, report, progress = _doctor(tmp_path, proxy, key, "--admin-key", MASTER_KEY)
    assert code == 0, progress
    (limits,) = [f for f in report["findings"] if f["check"] == "key.limits"]
    assert limits["target"] == f"key 'bot-a' on {GROUP}"
    detail = limits["detail"]
    # The strictest value wins and names where it was set: the key's max_budget, the config's and the team's
    # daily budgets, each on its own scope.
    assert "max_budget=256 (key 'bot-a')" in detail, detail
    assert "tokens_per_day=100000 charged to key 'bot-a' (config model_groups.thinker.reasoning)" in detail, detail
    assert "tokens_per_day=5000 charged to team 'research' (team 'research')" in detail, detail


def test_metadata_that_would_refuse_every_request_is_named(db_proxy: tuple[Proxy, str], tmp_path: Path) -> None:
    proxy, db = db_proxy
    key = _admin(proxy, "/key/generate", {"key_alias": "bot-b"})["key"]
    # Stored without going through the proxy's save-time checks (a key saved before they existed, or edited in
    # the database): the doctor must still catch it.
    bad = json.dumps({"litellm_kv": {"reasoning": {"max_budget": "lots"}}}).replace("'", "''")
    subprocess.run(["psql", db, "-qc", f"""UPDATE "LiteLLM_VerificationToken" SET metadata = '{bad}'::jsonb
                    WHERE key_alias = 'bot-b'"""], check=True, capture_output=True, timeout=30)
    code, report, progress = _doctor(tmp_path, proxy, key)  # the key reads its own info: no admin key needed
    assert code == 1, progress
    (err,) = [f for f in report["findings"] if f["check"] == "key.metadata"]
    assert err["status"] == "error" and "max_budget" in err["detail"], err
    assert "metadata.litellm_kv.reasoning" in err["fix"]


def test_an_unknown_key_is_an_error(db_proxy: tuple[Proxy, str], tmp_path: Path) -> None:
    proxy, _ = db_proxy
    code, report, _ = _doctor(tmp_path, proxy, "sk-not-a-key")
    assert code == 1
    assert [f["status"] for f in report["findings"] if f["check"] == "key.found"] == ["error"]
