"""When the router asks the engines to re-announce their cache hits (``kv.report_mode_full``).

The rule on its own: replicas here are :class:`ReplicaState` records whose subscriber is a stand-in with the one
attribute the rule reads (``complete``), and the shared-mode marks come from a stand-in of the index's
``whole_streams``. What sets those flags is tested against their real parts: the subscriber over vLLM's wire
protocol (tests/vllm/test_subscriber.py) and a real engine (tests/vllm/test_engine_exactness.py), the marks in a
real Redis (tests/index/test_index_redis.py), and the whole path through real proxies
(tests/integration/test_routing_e2e.py, tests/integration/test_routing_shared.py).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import pytest

from litellm_kv.config import parse_section
from litellm_kv.errors import ConfigError
from litellm_kv.index.memory import InMemoryIndex
from litellm_kv.routing.fleet import Fleet, ReplicaState
from litellm_kv.routing.options import KVRoutingSettings
from litellm_kv.vllm.engine import EngineClient


@dataclass
class Stream:
    complete: bool


def _fleet(mode: object = "auto", *, embedded: bool = True) -> Fleet:
    opts = parse_section(KVRoutingSettings, {"report_mode_full": mode}, "kv")
    return Fleet("g", opts, InMemoryIndex(), embedded=embedded)


def _replica(fleet: Fleet, name: str, *, complete: bool | None = None, ready: bool = True) -> ReplicaState:
    st = ReplicaState(name, name, f"http://{name}", EngineClient(f"http://{name}:1"), ready=ready,
                      subscriber=None if complete is None else Stream(complete))
    fleet.replicas[name] = st
    return st


def test_the_setting_takes_auto_true_or_false() -> None:
    assert parse_section(KVRoutingSettings, {}, "kv").report_mode_full == "auto"
    assert parse_section(KVRoutingSettings, {"report_mode_full": True}, "kv").report_mode_full is True
    assert parse_section(KVRoutingSettings, {"report_mode_full": False}, "kv").report_mode_full is False
    with pytest.raises(ConfigError, match="report_mode_full"):
        parse_section(KVRoutingSettings, {"report_mode_full": "sometimes"}, "kv")


def test_auto_asks_only_while_a_ready_replicas_stream_is_not_followed_whole() -> None:
    fleet = _fleet()
    assert not fleet.reannounce_requested()  # no replica: nothing to ask
    _replica(fleet, "a", complete=True)
    b = _replica(fleet, "b", complete=True)
    assert not fleet.reannounce_requested()
    b.subscriber = Stream(False)
    assert fleet.reannounce_requested()
    b.ready = False  # not routed to: judged again when brought up
    assert not fleet.reannounce_requested()
    _replica(fleet, "c")  # ready, but no subscriber yet: unknown reads as not whole
    assert fleet.reannounce_requested()
    assert fleet.status()["reannounce"] is True
    assert {r["replica"]: r["stream_complete"] for r in fleet.status()["replicas"]} == {
        "a": True, "b": False, "c": False}


def test_auto_asks_while_the_index_may_lose_entries() -> None:
    fleet = _fleet()
    _replica(fleet, "a", complete=True)
    problem = ["the Redis deletes keys"]
    fleet.index_problem = lambda: problem[0]
    assert fleet.reannounce_requested()
    problem[0] = ""
    assert not fleet.reannounce_requested()


def test_true_always_asks_and_false_never() -> None:
    always, never = _fleet(True), _fleet(False)
    for fleet in (always, never):
        _replica(fleet, "a", complete=True)
        _replica(fleet, "b", complete=False)
    assert always.reannounce_requested() and not never.reannounce_requested()
    always.replicas["b"].subscriber = Stream(True)
    assert always.reannounce_requested()


class Marks:
    """Stands in for RedisIndex.whole_streams (the marks themselves are tested on a real Redis)."""

    def __init__(self, marks: dict[str, bool], hang: bool = False) -> None:
        self.marks, self.hang = marks, hang

    async def whole_streams(self, group: str) -> dict[str, bool]:
        if self.hang:
            await asyncio.sleep(30)
        return dict(self.marks)


async def test_shared_mode_reads_every_rank_of_a_replica_and_a_failed_read_as_not_whole() -> None:
    fleet = _fleet(embedded=False)
    _replica(fleet, "http://a:1")
    _replica(fleet, "http://b:1")
    marks = Marks({"http://a:1#0": True, "http://b:1#0": True, "http://b:1#1": False})
    fleet.index = marks  # type: ignore[assignment]
    await fleet._read_whole_streams()
    assert fleet.streams_complete == {"http://a:1": True, "http://b:1": False}
    assert fleet.reannounce_requested()
    marks.marks["http://b:1#1"] = True
    await fleet._read_whole_streams()
    assert not fleet.reannounce_requested()
    marks.hang = True  # a hung Redis: the read gives up within its bound, and unknown is not whole
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await fleet._read_whole_streams()
    assert loop.time() - t0 < 5
    assert fleet.streams_complete == {} and fleet.reannounce_requested()
