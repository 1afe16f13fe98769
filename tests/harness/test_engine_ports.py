"""The engine harness's ports (tools/harness/engines.py): every port of a replica is distinct, and the ones a start
chose together are the ones the engine is told to use. Nothing is started here; the engine tests start real ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.harness.engines import EngineReplica, replica_ports
from tools.harness.procs import free_ports


def test_ports_given_are_the_endpoints_used() -> None:
    port, events_port, replay_port = free_ports(3)
    rep = EngineReplica(name="p", port=port, model_dir=Path("/nonexistent"), events="tcp-bind",
                        events_port=events_port, replay_port=replay_port)
    assert rep.url == f"http://127.0.0.1:{port}"
    assert rep.events_endpoint == f"tcp://*:{events_port}"
    assert rep.subscribe_endpoint == f"tcp://127.0.0.1:{events_port}"
    assert rep.replay_endpoint == f"tcp://127.0.0.1:{replay_port}"


def test_ports_chosen_here_differ_from_each_other() -> None:
    (port,) = free_ports(1)
    for _ in range(50):
        rep = EngineReplica(name="p", port=port, model_dir=Path("/nonexistent"), events="tcp-connect")
        assert rep.events_port != rep.replay_port
        assert rep.subscribe_endpoint.endswith(f":{rep.events_port}")
        assert rep.replay_endpoint.endswith(f":{rep.replay_port}")


def test_replica_ports_are_distinct_triples() -> None:
    for _ in range(20):
        triples = replica_ports(4)
        assert len(triples) == 4 and all(len(t) == 3 for t in triples)
        assert len({p for t in triples for p in t}) == 12


def test_one_of_the_two_side_ports_alone_is_refused() -> None:
    """Choosing the missing one here could hand out the given one again (it is not bound yet)."""
    (port,) = free_ports(1)
    with pytest.raises(ValueError, match="both"):
        EngineReplica(name="p", port=port, model_dir=Path("/nonexistent"), events_port=port + 1)
