"""Indexer configuration and CLI: typed options, errors that name the option, exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from litellm_kv.errors import ConfigError
from litellm_kv.services.indexer.config import load_indexer_config
from litellm_kv.vllm.wire import connectable
from tools.harness.procs import PYTHON, ROOT, ManagedProcess


def test_config_parses_and_checks(tmp_path: Path) -> None:
    p = tmp_path / "ix.yaml"
    p.write_text(
        "redis_url: redis://127.0.0.1:6379/1\nhash_seed: '0'\nmodel_groups:\n  g:\n    hash_algo: sha256\n"
        "    replicas:\n      - api_base: http://h:8000/v1\n        event_endpoints: ['tcp://h:5557']\n"
    )
    cfg = load_indexer_config(p)
    assert cfg.model_groups["g"].replicas[0].event_endpoints == ["tcp://h:5557"]
    assert cfg.seed_of("g") == "0" and cfg.port == 8790
    p.write_text("redis_url: x\nmodel_groups:\n  g:\n    replicas: [{api_base: h, bogus: 1}]\n")
    with pytest.raises(ConfigError, match="bogus"):
        load_indexer_config(p)
    p.write_text("redis_url: x\nmodel_groups:\n  g:\n    hash_algo: md5\n    replicas: [{api_base: h}]\n")
    with pytest.raises(ConfigError, match="hash_algo"):
        load_indexer_config(p)


def test_wildcard_publisher_endpoints_resolve_to_the_replica_host() -> None:
    assert connectable("tcp://*:5557", "http://10.1.2.3:8000/v1") == "tcp://10.1.2.3:5557"
    assert connectable("tcp://0.0.0.0:5557", "http://h:8000") == "tcp://h:5557"
    assert connectable("ipc:///tmp/x.sock", "http://h:8000") == "ipc:///tmp/x.sock"


def test_cli_rejects_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("redis_url: redis://127.0.0.1:1/0\nexactness_sample_rate: 2\n")
    proc = ManagedProcess("indexer-bad", [PYTHON, "-m", "litellm_kv.cli", "indexer", "--config", str(bad)],
                          cwd=str(ROOT))
    rc = proc.proc.wait(60)
    proc.stop()
    assert rc == 2
    assert "exactness_sample_rate" in proc.log_path.read_text()


def test_docs_list_every_option_and_metric() -> None:
    import dataclasses

    import litellm_kv.services.indexer.service  # noqa: F401  (declares the metrics)
    from litellm_kv.observability import declared_metrics
    from litellm_kv.services.indexer.config import IndexerGroupSettings, IndexerReplicaSettings, IndexerSettings

    page = (ROOT / "docs" / "indexer.md").read_text()
    for cls in (IndexerSettings, IndexerGroupSettings, IndexerReplicaSettings):
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            assert f.name in page, f"{cls.__name__}.{f.name} missing from docs/indexer.md"
    indexer_metrics = [name for name in declared_metrics() if name.startswith("litellm_kv_indexer_")]
    assert indexer_metrics, "no indexer metric declared"
    for name in indexer_metrics:
        assert name.removeprefix("litellm_kv_") in page, name


LEASE_BASE = "redis_url: redis://127.0.0.1:6379/1\nmodel_groups:\n  g:\n    replicas: [{api_base: 'http://h:8000'}]\n"


@pytest.mark.parametrize("extra,named", [
    ("assignment: lease\nsplit_replicas: true\n", "split_replicas"),
    ("assignment: lease\nlease_ttl_s: 3\nlease_renew_interval_s: 2\n", "lease_ttl_s"),
    ("assignment: lease\nlease_renew_interval_s: 0\n", "lease_renew_interval_s"),
    ("assignment: lease\nlease_ttl_s: 25\nheartbeat_ttl_s: 30\n", "heartbeat_ttl_s"),
    ("assignment: lease\nindexer_id: 'a|b'\n", "indexer_id"),
    ("assignment: lease\nlease_unreachable_handoff_s: 0\n", "lease_unreachable_handoff_s"),
    ("assignment: lease\nlease_unreachable_handoff_s: 25\n", "heartbeat_ttl_s"),
    ("assignment: lease\nlease_unreachable_cooldown_s: 1\n", "lease_unreachable_cooldown_s"),
    ("assignment: leases\n", "assignment"),
])
def test_lease_assignment_rejects_settings_that_would_leave_replicas_unfollowed(
    tmp_path: Path, extra: str, named: str
) -> None:
    p = tmp_path / "ix.yaml"
    p.write_text(LEASE_BASE + extra)
    with pytest.raises(ConfigError, match=named):
        load_indexer_config(p)


def test_lease_assignment_defaults_are_valid(tmp_path: Path) -> None:
    p = tmp_path / "ix.yaml"
    p.write_text(LEASE_BASE + "assignment: lease\n")
    cfg = load_indexer_config(p)
    assert cfg.assignment == "lease" and cfg.indexer_id is None
    assert cfg.heartbeat_ttl_s > cfg.lease_ttl_s + cfg.lease_renew_interval_s + cfg.heartbeat_interval_s
    # A replica its indexer cannot reach is given up after as long as a dead indexer's replicas wait.
    assert cfg.unreachable_handoff_s() == cfg.lease_ttl_s and cfg.unreachable_cooldown_s() == 6 * cfg.lease_ttl_s


def test_apply_call_size_is_a_checked_setting(tmp_path: Path) -> None:
    from litellm_kv.services.indexer.service import Indexer

    p = tmp_path / "ix.yaml"
    p.write_text(LEASE_BASE + "apply_call_blocks: 64\n")
    cfg = load_indexer_config(p)
    assert cfg.apply_call_blocks == 64
    assert Indexer(cfg).index.apply_call_blocks == 64  # reaches the Redis index (no connection is made yet)
    for bad in ("0", "100000", "many"):
        p.write_text(LEASE_BASE + f"apply_call_blocks: {bad}\n")
        with pytest.raises(ConfigError, match="apply_call_blocks"):
            load_indexer_config(p)
