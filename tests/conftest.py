"""Shared pytest fixtures.

``engines``: two real vLLM CPU replicas (tiny local model, block size 32, sha256, 8 MiB KV
cache = 256 blocks each so a modest workload forces eviction, KV events over ipc:// with a
replay socket), started once per test session and stopped at its end. Tests must not assume
the caches are empty: other tests share the replicas. A test that kills or restarts a replica
must leave it running again (``EngineReplica.restart()``).

``redis_cluster`` (3 masters + 3 replicas) and ``redis_sentinel`` (master + replica + 3 sentinels): real
servers, started on first use and shared by the session's store contract suites (each test flushes them).
A test that kills a node must leave the setup healthy again (restart the node, wait for it).

``litellm_postgres``: one PostgreSQL with LiteLLM's schema migrated once; a module takes its own empty database
with ``litellm_postgres.database()`` (and drops it with ``stop()``). Ask for it with
``request.getfixturevalue`` after checking ``tools.harness.database.unavailable()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.harness.database import PostgresServer
from tools.harness.engines import EngineReplica, ensure_model, start_replicas, stop_replicas
from tools.harness.redis_cluster import RedisClusterServers, RedisSentinelServers


@pytest.fixture(scope="session")
def engine_model() -> Path:
    """Directory of the tiny test model (built once, deterministic)."""
    return ensure_model()


@pytest.fixture(scope="session")
def engines(engine_model: Path) -> Iterator[list[EngineReplica]]:
    # VLLM_SERVER_DEV_MODE exposes POST /reset_prefix_cache (tests that compare routers start cold).
    reps = start_replicas(2, kv_cache_bytes="8M", block_size=32, events="ipc", name_prefix="engine",
                          env={"VLLM_SERVER_DEV_MODE": "1"})
    try:
        yield reps
    finally:
        stop_replicas(reps)


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisClusterServers]:
    cluster = RedisClusterServers(name="redis-cluster")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[RedisSentinelServers]:
    setup = RedisSentinelServers(name="redis-sentinel")
    try:
        yield setup
    finally:
        setup.stop()


@pytest.fixture(scope="session")
def litellm_postgres() -> Iterator[PostgresServer]:
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()
