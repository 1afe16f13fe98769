"""``tools.harness.procs.start_all``, which starts several servers at once for the fixtures: results in order, the
starts overlapping, and on a failed start the others' servers stopped and the error raised. Plain callables stand in
for the servers here; the fixtures that use it start real engines and proxies."""

from __future__ import annotations

import threading

import pytest

from tools.harness.procs import start_all


def test_results_come_back_in_the_order_of_the_starts_and_the_starts_overlap() -> None:
    barrier = threading.Barrier(3, timeout=10)

    def start(i: int) -> int:
        barrier.wait()  # only passes when all three run at once
        return i

    assert start_all([lambda i=i: start(i) for i in range(3)], stop=lambda _: None) == [0, 1, 2]


def test_a_failed_start_stops_the_others_and_raises_the_first_error() -> None:
    stopped: list[str] = []

    def fail(msg: str) -> str:
        raise RuntimeError(msg)

    starts = [lambda: "a", lambda: fail("first"), lambda: "c", lambda: fail("second")]
    with pytest.raises(RuntimeError, match="first"):
        start_all(starts, stop=stopped.append)
    assert sorted(stopped) == ["a", "c"]


def test_a_stop_that_fails_does_not_hide_the_start_error() -> None:
    def stop(_: str) -> None:
        raise OSError("already gone")

    def never_ready() -> str:
        raise TimeoutError("not ready")

    with pytest.raises(TimeoutError, match="not ready"):
        start_all([lambda: "a", never_ready], stop=stop)
