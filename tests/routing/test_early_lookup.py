"""The table of early lookups (:mod:`litellm_kv.routing.early_lookup`): its bounds and what it counts. The round
trip itself and the decision that takes it run against a real Redis in tests/routing/test_load.py, and through
real proxies in tests/integration/test_routing_shared.py."""

from __future__ import annotations

import asyncio

from litellm_kv.routing.early_lookup import (
    EARLY_LOOKUPS,
    MAX_ENTRIES,
    MAX_RUNNING,
    MAX_TOTAL_CHARS,
    EarlyAnswer,
    EarlyLookups,
)


def _count(group: str, outcome: str) -> float:
    return float(EARLY_LOOKUPS.labels(group, outcome)._value.get())


async def test_running_tasks_are_bounded_until_they_end() -> None:
    table = EarlyLookups("bounded", 0.05)
    gate = asyncio.Event()

    async def slow() -> EarlyAnswer | None:
        await gate.wait()
        return EarlyAnswer([1])

    assert all(table.start(f"text {i}", slow) for i in range(MAX_RUNNING))
    assert not table.start("one more", slow)  # too many running: not started, counted
    assert _count("bounded", "skipped") == 1
    assert not table.start("text 0", slow)  # one is held for that text already
    # Taken from the table while it runs: it still counts as running until it ends, and it is never cancelled.
    first = table.take("text 0")
    assert first is not None and table.take("text 0") is None
    assert not table.start("another", slow)
    gate.set()
    assert (await first) == EarlyAnswer([1]) and not first.cancelled()
    await asyncio.sleep(0)
    assert table.start("another", slow)


async def test_the_oldest_answers_are_dropped_past_the_bound() -> None:
    table = EarlyLookups("held", 0.05)

    async def quick() -> EarlyAnswer | None:
        return EarlyAnswer([2])

    for i in range(MAX_ENTRIES + 3):
        assert table.start(f"text {i}", quick)
        await asyncio.sleep(0)  # each finishes before the next starts
    assert len(table) == MAX_ENTRIES and _count("held", "unused") == 3
    assert table.take("text 0") is None and table.take(f"text {MAX_ENTRIES + 2}") is not None
    table.clear()
    assert len(table) == 0 and _count("held", "unused") == 3 + MAX_ENTRIES - 1


async def test_the_text_held_is_bounded() -> None:
    table = EarlyLookups("chars", 0.05)

    async def quick() -> EarlyAnswer | None:
        return EarlyAnswer([3])

    assert not table.start("x" * (MAX_TOTAL_CHARS + 1), quick)  # longer than the table holds: not started
    assert _count("chars", "skipped") == 1
    third = MAX_TOTAL_CHARS // 3
    for c in "abcd":
        assert table.start(c * third, quick)
        await asyncio.sleep(0)
    # The fourth third pushed the first out; taking one gives its characters back.
    assert len(table) == 3 and _count("chars", "unused") == 1 and table.take("a" * third) is None
    assert table.take("b" * third) is not None
    assert table.start("e" * third, quick) and len(table) == 3 and _count("chars", "unused") == 1
