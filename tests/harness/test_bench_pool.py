"""benchmarks/bench_ttft.py's run-by-run comparison and its pooling of earlier runs' --json files (no engines: the
figures are made up, the arithmetic is the bench's)."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support.benchmarks import load_benchmark
from tools.harness.testbed import KV, LEAST_BUSY, SHUFFLE


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark("bench_ttft")


def _cell(workload: str, rate: float, means: dict[str, list[float]], p95s: dict[str, list[float]]) -> dict[str, Any]:
    return {"workload": workload, "rate": rate,
            "routings": {g: {"per_run_ttft_mean_ms": means[g], "per_run_ttft_p95_ms": p95s[g]}
                         for g in (SHUFFLE, LEAST_BUSY, KV)}}


def test_paired_differences(bench: ModuleType) -> None:
    d = bench.paired([100.0, 300.0, 200.0], [150.0, 250.0, 260.0])
    assert d["n"] == 3 and d["lower_in"] == 2
    assert d["mean_ms"] == pytest.approx((-50 + 50 - 60) / 3, abs=0.05)
    assert d["sd_ms"] == pytest.approx(60.8, abs=0.05)  # sd of (-50, 50, -60)
    assert d["se_ms"] == pytest.approx(60.83 / 3 ** 0.5, abs=0.05)


def test_pool_merges_runs_by_cell_and_judges_the_pooled_means(bench: ModuleType, tmp_path: Path) -> None:
    a = {"cells": [_cell("chat", 6.81, {SHUFFLE: [400, 500], LEAST_BUSY: [420, 380], KV: [350, 450]},
                         {SHUFFLE: [800, 900], LEAST_BUSY: [700, 760], KV: [650, 900]})]}
    b = {"cells": [_cell("chat", 6.81, {SHUFFLE: [300], LEAST_BUSY: [320], KV: [340]},
                         {SHUFFLE: [600], LEAST_BUSY: [700], KV: [590]}),
                   _cell("unique", 3.4, {SHUFFLE: [200, 210], LEAST_BUSY: [190, 230], KV: [205, 215]},
                         {SHUFFLE: [300, 310], LEAST_BUSY: [290, 330], KV: [305, 315]})]}
    paths = []
    for name, payload in (("a.json", a), ("b.json", b)):
        (tmp_path / name).write_text(json.dumps(payload))
        paths.append(str(tmp_path / name))
    pooled = bench.pool(paths)
    chat, unique = pooled["cells"]
    assert chat["benches"] == 2 and unique["benches"] == 1
    kv = chat["routings"][KV]
    assert kv["runs"] == 3 and kv["ttft_mean_ms"] == pytest.approx(380.0) and (kv["min_ms"], kv["max_ms"]) == (340, 450)
    assert kv["ttft_p95_ms"] == pytest.approx(713.3, abs=0.1)
    vs_shuffle = chat["paired"][SHUFFLE]["ttft_mean"]
    assert vs_shuffle["lower_in"] == 2 and vs_shuffle["mean_ms"] == pytest.approx((-50 - 50 + 40) / 3, abs=0.05)
    # Pooled means: kv 380 against shuffle 400 and least-busy 373.3, not below both; p95s 713 against 767 and 720.
    # Run by run, no difference is below zero by two standard errors (kv - shuffle mean: -20 ms, se 30).
    assert chat["verdict"] == {"kind": "win", "mean_below_both": False, "p95_below_both": True,
                               "mean_clearly_below_both": False, "p95_clearly_below_both": False}
    v = unique["verdict"]
    assert v["kind"] == "control" and v["kv_minus_least_busy_ms"] == pytest.approx(0.0)
    assert v["least_busy_spread_ms"] == pytest.approx(40.0) and v["within_noise"] is True
    assert v["differs_run_by_run"] is None  # two runs: no standard error to judge by
    md = bench.pool_markdown(pooled)
    assert "| chat | 6.81 | litellm-kv | 3 | 380 (340-450" in md and "lower in 2/3" in md


def test_pool_merges_benches_by_load_fraction_where_each_measured_its_rates(bench: ModuleType, tmp_path: Path) -> None:
    """Benches that set their rates from the fleet speed they measured pool by load fraction (the machine's speed
    drifts, so 0.5x is 5.18 req/s in one and 5.14 in the next); rates given with --rates pool only by rate."""
    def one(rate: float, fraction: float, **flag: bool) -> dict[str, Any]:
        c = _cell("chat", rate, {SHUFFLE: [100], LEAST_BUSY: [110], KV: [90]},
                  {SHUFFLE: [200], LEAST_BUSY: [210], KV: [190]})
        return {**c, "load_fraction": fraction, **flag}

    files = {
        "old.json": {"capacity_req_s": 10.36, "cells": [one(5.18, 0.5)]},  # before the flag: inferred
        "new.json": {"capacity_req_s": 10.28, "cells": [one(5.14, 0.5, rate_from_capacity=True)]},
        "fixed.json": {"capacity_req_s": 10.28, "cells": [one(5.14, 0.5, rate_from_capacity=False)]},
        "odd.json": {"capacity_req_s": 10.28, "cells": [one(4.0, 0.5)]},  # a rate that is not 0.5 of its capacity
    }
    paths = []
    for name, payload in files.items():
        (tmp_path / name).write_text(json.dumps(payload))
        paths.append(str(tmp_path / name))
    cells = bench.pool(paths)["cells"]
    assert [(c["load_fraction"], c["rates"], c["routings"][KV]["runs"]) for c in cells] == [
        (0.5, [5.18, 5.14], 2), (None, [5.14], 1), (None, [4.0], 1)]
    md = bench.pool_markdown(bench.pool(paths))
    assert "| chat | 0.5× (5.14-5.18) | litellm-kv | 2 |" in md and "| chat | 5.14 | litellm-kv | 1 |" in md


def test_verdict_beyond_the_noise_needs_both_baselines_and_three_runs(bench: ModuleType) -> None:
    routings = {g: {"ttft_mean_ms": m, "ttft_p95_ms": 2 * m} for g, m in ((SHUFFLE, 200.0), (LEAST_BUSY, 210.0),
                                                                         (KV, 150.0))}
    steady = {SHUFFLE: [200.0, 205.0, 195.0], LEAST_BUSY: [210.0, 212.0, 208.0], KV: [150.0, 149.0, 151.0]}
    pairs = bench.paired_all({g: {"mean": m, "p95": [2 * x for x in m]} for g, m in steady.items()})
    v = bench.verdict("chat", routings, steady[LEAST_BUSY], pairs)
    assert v["mean_clearly_below_both"] is True and v["p95_clearly_below_both"] is True
    # One baseline's runs straddle litellm-kv's: below it on the pooled mean, not beyond the noise.
    straddle = {**steady, LEAST_BUSY: [100.0, 300.0, 160.0]}
    pairs = bench.paired_all({g: {"mean": m, "p95": [2 * x for x in m]} for g, m in straddle.items()})
    v = bench.verdict("chat", routings, straddle[LEAST_BUSY], pairs)
    assert v["mean_below_both"] is True and v["mean_clearly_below_both"] is False
    two = {g: m[:2] for g, m in steady.items()}
    pairs = bench.paired_all({g: {"mean": m, "p95": m} for g, m in two.items()})
    assert bench.verdict("chat", routings, two[LEAST_BUSY], pairs)["mean_clearly_below_both"] is None
    assert "beyond the noise, run by run: False" in bench.verdict_text(
        {"kind": "win", "mean_below_both": True, "p95_below_both": True, "mean_clearly_below_both": True,
         "p95_clearly_below_both": False})


def test_markdown_says_how_the_rounds_drew_their_requests(bench: ModuleType) -> None:
    assert bench.arrivals_text({"runs": 5}) == ", every run the same requests (draw 0)"  # files from before
    assert bench.arrivals_text({"runs": 5, "arrivals": "fixed", "first_draw": 3}) == \
        ", every run the same requests (draw 3)"
    assert bench.arrivals_text({"runs": 5, "arrivals": "vary", "first_draw": 10}) == \
        ", each round its own requests (draws 10-14)"


def test_control_verdict_judges_the_run_by_run_difference(bench: ModuleType) -> None:
    """With each round its own draw, the per-run means spread with the draws; the paired difference does not."""
    lb = [150.0, 250.0, 350.0, 200.0]
    routings = {g: {"ttft_mean_ms": 0.0, "ttft_p95_ms": 0.0} for g in (SHUFFLE, LEAST_BUSY, KV)}
    for kv, differs in (([160.0, 262.0, 358.0, 211.0], True), ([140.0, 262.0, 345.0, 210.0], False)):
        routings[KV]["ttft_mean_ms"], routings[LEAST_BUSY]["ttft_mean_ms"] = sum(kv) / 4, sum(lb) / 4
        pairs = bench.paired_all({SHUFFLE: {"mean": lb, "p95": lb}, LEAST_BUSY: {"mean": lb, "p95": lb},
                                  KV: {"mean": kv, "p95": kv}})
        v = bench.verdict("unique", routings, lb, pairs)
        assert v["within_noise"] is True  # within the 200 ms spread of least-busy's runs either way
        assert v["differs_run_by_run"] is differs, kv
        assert ("differs run by run beyond the noise: " + str(differs)) in bench.verdict_text(v)


def test_pool_plots_one_png_per_workload_against_the_load_fraction(bench: ModuleType, tmp_path: Path) -> None:
    def cell(workload: str, rate: float, fraction: float, kv: float) -> dict[str, Any]:
        c = _cell(workload, rate, {SHUFFLE: [100.0, 120.0], LEAST_BUSY: [110.0, 100.0], KV: [kv, kv]},
                  {SHUFFLE: [200.0, 220.0], LEAST_BUSY: [210.0, 230.0], KV: [2 * kv, 2 * kv]})
        return {**c, "load_fraction": fraction, "rate_from_capacity": True}

    payload = {"capacity_req_s": 10.0, "cells": [cell("chat", 5.0, 0.5, 90.0), cell("chat", 9.0, 0.9, 95.0),
                                                 cell("fanout", 5.0, 0.5, 80.0)]}
    (tmp_path / "a.json").write_text(json.dumps(payload))
    paths = bench.pool_plots(bench.pool([str(tmp_path / "a.json")]), tmp_path / "img")
    assert [p.name for p in paths] == ["ttft_chat-pooled.png", "ttft_fanout-pooled.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)
