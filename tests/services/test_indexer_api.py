"""The indexer's HTTP API keeps the index to those who hold its token, and bounds what one request costs.

Limits protected: ``indexer.api_token_env`` / ``indexer.api_token`` (no token → 401, another token →
403; an address other than loopback without a token refuses to start), ``indexer.max_request_bytes``
and ``indexer.max_lookup_tokens`` (413), malformed lookups (422). The app is the real one
(:func:`litellm_kv.services.indexer.app.create_app`, driven by FastAPI's TestClient, lifespan included)
over a real redis-server; its one replica is an address nothing listens on (no engine runs here), so
the engine facts a lookup needs (block size, hash algorithm) are set on the replica as discovery would.
"""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from litellm_kv.config import parse_section
from litellm_kv.errors import ConfigError
from litellm_kv.services.indexer.app import create_app
from litellm_kv.services.indexer.config import IndexerSettings
from litellm_kv.services.indexer.service import Indexer
from tools.harness.procs import PYTHON, ROOT, ManagedProcess, free_port
from tools.harness.redis_server import RedisServer

TOKEN = "indexer-test-token-0123456789"
# The server's wait for open requests (5 s) and the lifespan's stop, with room for a busy machine.
SHUTDOWN_BOUND_S = 12.0
GROUP = "g"


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(name="redis-indexer-api")
    yield server
    server.stop()


def settings(redis_url: str, **extra: Any) -> IndexerSettings:
    raw = {
        "redis_url": redis_url,
        "engine_timeout_s": 0.5,
        "heartbeat_interval_s": 60.0,
        "heartbeat_ttl_s": 600.0,
        "discovery_interval_s": 60.0,
        "model_groups": {GROUP: {"replicas": [{"api_base": f"http://127.0.0.1:{free_port()}"}]}},
        **extra,
    }
    return parse_section(IndexerSettings, raw, "indexer")


@contextmanager
def client(cfg: IndexerSettings) -> Iterator[TestClient]:
    indexer = Indexer(cfg)
    with TestClient(create_app(indexer)) as c:
        for rt in indexer.replicas.values():  # what discovery reads from a running engine's /metrics
            rt.block_size, rt.hash_algo, rt.prefix_caching = 16, "sha256", True
        yield c


@pytest.fixture
def guarded(redis_server: RedisServer) -> Iterator[TestClient]:
    with client(settings(redis_server.url, api_token=TOKEN, max_request_bytes=4096, max_lookup_tokens=256)) as c:
        yield c


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


LOOKUP = {"model_group": GROUP, "token_ids": list(range(40))}


def test_indexer_api_token_no_token_is_401(guarded: TestClient) -> None:
    for method, path in (("POST", "/lookup"), ("GET", "/replicas"), ("GET", "/metrics")):
        r = guarded.request(method, path, json=LOOKUP if method == "POST" else None)
        assert r.status_code == 401, (path, r.text)
        assert r.headers["www-authenticate"] == "Bearer"
    assert guarded.post("/lookup", json=LOOKUP, headers={"Authorization": TOKEN}).status_code == 401  # no scheme


def test_indexer_api_token_wrong_token_is_403(guarded: TestClient) -> None:
    for path in ("/replicas", "/metrics"):
        assert guarded.get(path, headers=bearer("not-the-token-0123456789")).status_code == 403, path
    assert guarded.post("/lookup", json=LOOKUP, headers=bearer(TOKEN + "x")).status_code == 403


def test_indexer_api_token_normal_requests_are_200(guarded: TestClient) -> None:
    r = guarded.post("/lookup", json=LOOKUP, headers=bearer(TOKEN))
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["prompt_tokens"] == 40 and body["block_size"] == 16
    assert all(v["hit_tokens"] == 0 for v in body["replicas"].values())  # an empty index
    assert guarded.get("/replicas", headers=bearer(TOKEN)).status_code == 200
    assert "litellm_kv_indexer" in guarded.get("/metrics", headers=bearer(TOKEN)).text


def test_indexer_api_token_health_without_token_tells_the_status_only(guarded: TestClient) -> None:
    anonymous = guarded.get("/health")
    assert anonymous.status_code in (200, 503)
    assert anonymous.json() == {"status": "degraded"}  # the replica is unreachable
    full = guarded.get("/health", headers=bearer(TOKEN)).json()
    assert full["status"] == "degraded" and full["replicas"][0]["model_group"] == GROUP


def test_indexer_max_request_bytes_oversized_body_is_413(guarded: TestClient) -> None:
    big = {"model_group": GROUP, "token_ids": [7] * 3000}  # about 6 KB of JSON, over 4096 bytes
    r = guarded.post("/lookup", json=big, headers=bearer(TOKEN))
    assert r.status_code == 413 and "max_request_bytes" in r.json()["detail"]
    # no Content-Length (a chunked upload): the cap holds while the body streams in
    chunks = iter([b'{"model_group": "g", "token_ids": [', b"1, " * 1500, b"1]}"])
    r = guarded.post("/lookup", content=chunks, headers={**bearer(TOKEN), "Content-Type": "application/json"})
    assert r.status_code == 413 and "max_request_bytes" in r.json()["detail"]


def test_indexer_max_lookup_tokens_too_many_token_ids_is_413(guarded: TestClient) -> None:
    r = guarded.post("/lookup", json={"model_group": GROUP, "token_ids": [1] * 257}, headers=bearer(TOKEN))
    assert r.status_code == 413 and "max_lookup_tokens" in r.json()["detail"]
    assert guarded.post("/lookup", json={"model_group": GROUP, "token_ids": [1] * 256},
                        headers=bearer(TOKEN)).status_code == 200


@pytest.mark.parametrize("body", [b"not json", b'{"model_group": "g"}', b'{"model_group": "g", "token_ids": [-1]}',
                                  b'{"model_group": "g", "token_ids": [1e400]}',
                                  b'{"model_group": "g", "token_ids": [' + b"9" * 400 + b"]}"])
def test_indexer_lookup_malformed_body_is_422(guarded: TestClient, body: bytes) -> None:
    r = guarded.post("/lookup", content=body, headers={**bearer(TOKEN), "Content-Type": "application/json"})
    assert r.status_code == 422, r.text


def test_indexer_api_token_from_the_environment(redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_KV_INDEXER_TOKEN", TOKEN)
    with client(settings(redis_server.url)) as c:
        assert c.post("/lookup", json=LOOKUP).status_code == 401
        assert c.post("/lookup", json=LOOKUP, headers=bearer(TOKEN)).status_code == 200


def test_indexer_api_token_required_beyond_loopback(redis_server: RedisServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LITELLM_KV_INDEXER_TOKEN", raising=False)
    assert settings(redis_server.url).host == "127.0.0.1"  # the default
    for host in ("0.0.0.0", "10.1.2.3", "indexer-a", "::"):
        with pytest.raises(ConfigError, match="LITELLM_KV_INDEXER_TOKEN"):
            settings(redis_server.url, host=host).token()
    with pytest.raises(ConfigError, match="at least 16"):
        settings(redis_server.url, api_token="short").token()
    assert settings(redis_server.url, host="0.0.0.0", api_token=TOKEN).token() == TOKEN
    # Loopback without a token stays open (a single-machine set-up; the indexer logs a warning).
    with client(settings(redis_server.url)) as c:
        assert c.post("/lookup", json=LOOKUP).status_code == 200


def test_indexer_cli_refuses_to_bind_beyond_loopback_without_a_token(tmp_path: Path) -> None:
    cfg = tmp_path / "ix.yaml"
    cfg.write_text(yaml.safe_dump({"redis_url": f"redis://127.0.0.1:{free_port()}/0",
                                   "model_groups": {GROUP: {"replicas": [{"api_base": "http://127.0.0.1:9"}]}}}))
    proc = ManagedProcess("indexer-no-token", [PYTHON, "-m", "litellm_kv.cli", "indexer", "--config", str(cfg),
                                               "--host", "0.0.0.0", "--port", str(free_port())],
                          cwd=str(ROOT), env={"LITELLM_KV_INDEXER_TOKEN": ""})
    rc = proc.proc.wait(60)
    proc.stop()
    assert rc == 2
    assert "LITELLM_KV_INDEXER_TOKEN" in proc.log_path.read_text()


def test_indexer_sigterm_is_not_held_by_a_client_that_never_finishes_its_request(redis_server: RedisServer,
                                                                                  tmp_path: Path) -> None:
    """A client that sends a request's headers and never its body does not keep a stopping indexer alive: the
    server waits for open requests a bounded time, then the indexer stops and releases its leases."""
    port = free_port()
    cfg = tmp_path / "ix.yaml"
    cfg.write_text(yaml.safe_dump({
        "redis_url": redis_server.url, "port": port, "assignment": "lease", "indexer_id": "slow-client",
        "model_groups": {GROUP: {"replicas": [{"api_base": f"http://127.0.0.1:{free_port()}"}]}},
    }))
    proc = ManagedProcess("indexer-slow-client", [PYTHON, "-m", "litellm_kv.cli", "indexer", "--config", str(cfg)],
                          cwd=str(ROOT))
    try:
        proc.wait_until(lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code in (200, 503),
                        60, "indexer /health")
        with socket.create_connection(("127.0.0.1", port), timeout=5) as slow:
            slow.sendall(b"POST /lookup HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 1000\r\n\r\n{\"model_group\": ")
            time.sleep(0.5)  # the request is in the app, waiting for the rest of its body
            t0 = time.monotonic()
            proc.signal(signal.SIGTERM)
            rc = proc.proc.wait(30)
            took = time.monotonic() - t0
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    # uvicorn ends by raising the signal it caught again: a clean stop exits on SIGTERM.
    assert rc in (0, -signal.SIGTERM) and took < SHUTDOWN_BOUND_S, (rc, took, log[-2000:])
    assert "timeout graceful shutdown exceeded" in log, log[-2000:]
    assert "released 1 leases of g" in log, log[-2000:]
