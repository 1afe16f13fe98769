"""benchmarks/bench_proxy_cpu.py's summary of its runs (no processes: the figures are made up, the arithmetic is
the bench's; the bench itself starts a real engine and real proxies)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.support.benchmarks import load_benchmark


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_proxy_cpu")


def test_summary_pairs_each_arm_with_litellm_of_its_block(bench: ModuleType) -> None:
    cpu = {("litellm", 0): 40.0, ("callback", 0): 43.0, ("kv", 0): 48.0,
           ("kv", 1): 50.0, ("callback", 1): 47.0, ("litellm", 1): 46.0}
    runs = [{"arm": a, "block": b, "cpu_ms_per_request": v} for (a, b), v in cpu.items()]
    s = bench.summarise(runs)
    assert s["litellm"] == {"median_ms": 43.0, "min_ms": 40.0, "max_ms": 46.0, "runs": 2}
    # Differences within each block: callback +3 and +1, kv +8 and +4; medians of two are their means.
    assert s["callback"]["minus_litellm_ms"] == 2.0 and s["callback"]["minus_litellm_min_max_ms"] == [1.0, 3.0]
    assert s["kv"]["minus_litellm_ms"] == 6.0 and s["kv"]["ratio"] == pytest.approx(49.0 / 43.0, abs=1e-3)
    text = bench.report(s, bench.argparse.Namespace(tokens=2500, max_tokens=32, rate=2.0))
    assert "kv" in text and "+6.0 ms (+4.0 to +8.0)" in text


def test_only_the_kv_arm_routes_and_litellm_has_no_callback(bench: ModuleType, tmp_path: Path) -> None:
    class Replica:
        api_base = "http://127.0.0.1:1/v1"
        model_dir = tmp_path

    plain, hooked, kv = (bench.proxy_config(Replica(), arm) for arm in bench.ARMS)
    assert "callbacks" not in plain["litellm_settings"] and "litellm_kv" not in plain
    assert hooked["litellm_kv"]["model_groups"] == {}
    assert kv["litellm_kv"]["model_groups"][bench.GROUP]["routing"] == "kv"
