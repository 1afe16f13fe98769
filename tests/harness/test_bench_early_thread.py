"""benchmarks/bench_early_thread.py: one trial against a real redis-server and the test model's tokenizer (the
figures themselves are the benchmark's to print, not asserted)."""

from __future__ import annotations

import pytest
import redis

from tests.support.benchmarks import load_benchmark
from tools.harness.engines import ensure_model
from tools.harness.redis_server import RedisServer

pytestmark = pytest.mark.redis


def test_a_trial_times_each_step_of_a_never_seen_prompt_in_order() -> None:
    bench = load_benchmark("bench_early_thread")
    tok = bench.LocalChatTokenizer(str(ensure_model()))
    server = RedisServer(name="redis-test-early-thread")
    try:
        client = redis.Redis.from_url(server.url)
        for busy_ms in (0.0, 5.0):
            row = bench.trial(tok, client, bench.text_of(2048, 7), busy_ms)
            assert 1500 <= row["tokens"] <= 2600, row  # about the size asked for
            assert 0 < row["encode"] <= row["hash"] <= row["round trip"], row
        assert bench.text_of(2048, 7) != bench.text_of(2048, 8)  # each trial's prompt is new to the tokenizer
        s = bench.summary([{"encode": 1.0, "hash": 2.0, "round trip": 3.0}, {"encode": 3.0, "hash": 4.0,
                                                                             "round trip": 9.0}])
        assert s == {"encode": (2.0, 3.0), "hash": (3.0, 4.0), "round trip": (6.0, 9.0)}
    finally:
        server.stop()
