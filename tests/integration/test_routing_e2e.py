"""KV-aware routing end to end: a real ``litellm`` proxy with litellm-kv (embedded mode) in front of two
real vLLM CPU replicas, compared with LiteLLM's ``simple-shuffle`` over the same replicas in the same run.

The replicas' KV caches (session fixture: 256 blocks of 32 tokens each) are smaller than the workload's
distinct prefixes but the fleet's caches are not: the regime where routing matters. The test asserts and
prints that sizing.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.hashing import BlockHasher
from tools.harness.engines import EngineReplica, reset_prefix_caches
from tools.harness.procs import ROOT, free_ports
from tools.harness.prometheus import PrometheusServer
from tools.harness.proxy import MASTER_KEY, Proxy, start_proxy
from tools.harness.workload import COMPARISON, COMPARISON_SEEDS, format_table, make_workload, run_workload

pytestmark = [pytest.mark.engine, pytest.mark.proxy]

KV = "tiny-kv"
DEFAULT = "tiny-default"
SHADOW = "tiny-shadow"
TENANT = "tiny-tenant"
KEYS = {
    "sk-team-a": {"key_alias": "bot-a", "team_id": "team-a"},
    "sk-team-b": {"key_alias": "bot-b", "team_id": "team-b"},
}
HEADERS = {"Authorization": f"Bearer {MASTER_KEY}"}


def _config(engines: list[EngineReplica], model_dir: str, extra_kv: dict[str, Any] | None = None,
            groups: tuple[str, ...] = (KV, DEFAULT)) -> dict[str, Any]:
    model_list = []
    for group in groups:
        for i, r in enumerate(engines):
            model_list.append({
                "model_name": group,
                "litellm_params": {"model": "hosted_vllm/tiny", "api_base": r.api_base, "api_key": "none"},
                "model_info": {"id": f"{group}-{i}"},
            })
    return {
        "model_list": model_list,
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 2, "allowed_fails": 1,
                            "cooldown_time": 5},
        "litellm_settings": {"callbacks": ["litellm_kv.integration.callback.proxy_handler"], "request_timeout": 60},
        "litellm_kv": {"mode": "embedded", "model_groups": {
            g: {"routing": "kv", "kv": {
                "tokenizer_path": model_dir, "scrape_interval_s": 0.5, "discovery_interval_s": 1.0,
                # A TTFT target no replica can meet: routing is what it would be without one (the shadow test
                # holds), and every decision is counted as unmet (test_a_ttft_target_...).
                # The shadow group asks for every hit's re-announcement (the re-announcement test).
                **({"shadow": True, "ttft": {"slo_ttft_s": 1e-6}, "report_mode_full": True} if g == SHADOW else {}),
                **({"tenant_isolation": "team"} if g == TENANT else {}),
                **(extra_kv or {})}}
            for g in groups if g != DEFAULT
        # LiteLLM's own routing over the same engines, configured without limits (unconfigured, it would be
        # refused as a second name over the tenant-isolated group's engines).
        } | ({DEFAULT: {}} if DEFAULT in groups else {})},
    }


def _health(proxy: Proxy, **params: Any) -> dict[str, Any]:
    r = httpx.get(f"{proxy.url}/litellm-kv/health", headers=HEADERS, timeout=10, params=params)
    r.raise_for_status()
    return dict(r.json())


def _wait_exact(proxy: Proxy, timeout: float = 60) -> dict[str, Any]:
    return proxy.wait_kv_exact(KV, timeout)


def _metric(proxy: Proxy, prefix: str) -> dict[str, float]:
    text = httpx.get(f"{proxy.url}/litellm-kv/metrics", headers=HEADERS, timeout=10).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _subscriber(proxy: Proxy, replica: EngineReplica) -> dict[str, Any]:
    reps = _health(proxy)["routing"]["groups"][KV]["replicas"]
    rep = next(r for r in reps if r["replica"].endswith(f":{replica.port}"))
    return dict(rep["subscriber"]["ranks"][0])


def _reset(engines: list[EngineReplica]) -> None:
    reset_prefix_caches(engines)


@pytest.fixture(scope="module")
def proxy(engines: list[EngineReplica], engine_model: Any) -> Iterator[Proxy]:
    p = start_proxy(_config(engines, str(engine_model), groups=(KV, DEFAULT, SHADOW, TENANT)), name="routing-e2e",
                    keys=KEYS, env={"LITELLM_KV_SALT_SECRET": "test-secret"})
    try:
        _wait_exact(p)
        yield p
    finally:
        p.stop()


def _local_tokenizer(proxy: Proxy, timeout: float = 30) -> str:
    """The group's tokenizer state once it is the verified local one (or as it stands at the timeout)."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        state = str(proxy.kv_health(KV).get("tokenizer"))
        if state.startswith("local"):
            break
        time.sleep(0.5)
    return state


def test_kv_group_tokenizes_locally_with_fast_bpe(proxy: Proxy) -> None:
    """The test model's tokenizer.json is the engine's, so the group verifies its local tokenizer against
    /tokenize and routes on the fast path (the one users with a real checkpoint get)."""
    state = _local_tokenizer(proxy)
    assert state.startswith("local (verified") and "fast BPE on" in state, state
    assert _health(proxy)["routing"]["hashing"] == "native"  # the compiled sha256 chain (litellm_kv/vllm/_chain.c)


def test_a_prompt_longer_than_the_engines_accept_is_routed_by_load(proxy: Proxy, engines: list[EngineReplica]) -> None:
    """A prompt no engine accepts has no cache to be routed to: it goes by load (``why="prompt_too_long"``), and
    the engine's own refusal reaches the client. A prompt of megabytes is refused by its length in characters
    before it is encoded (encoding 4 MB held the proxy's event loop ~0.3 s); a shorter one once its tokens are
    counted, before they are hashed or looked up."""
    assert _local_tokenizer(proxy).startswith("local (verified")  # the bound by length is the local tokenizer's
    replicas = _health(proxy)["routing"]["groups"][KV]["replicas"]
    assert {r["max_model_len"] for r in replicas} == {engines[0].max_model_len}  # read from /v1/models
    name = f'litellm_kv_routing_fallbacks_total{{model_group="{KV}",why="prompt_too_long"}}'
    before = _metric(proxy, name).get(name, 0.0)
    words = "routing cache "
    n_tokens = len(httpx.post(f"{engines[0].url}/tokenize", json={"prompt": words * 100}, timeout=30).json()["tokens"])
    over_by_count = words * (2 * 100 * engines[0].max_model_len // n_tokens)  # ~2x the limit in tokens
    over_by_length = words * 400_000  # 5.6 MB
    for text in (over_by_count, over_by_length):
        r = httpx.post(f"{proxy.url}/v1/chat/completions", headers=HEADERS, timeout=120, json={
            "model": KV, "max_tokens": 1, "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 400, r.text[:300]  # the engine's refusal, as without litellm-kv
    assert _metric(proxy, name).get(name, 0.0) - before == 2


async def _distinct_blocks(url: str, convs: list[Any], block_size: int) -> int:
    hasher = BlockHasher("sha256", block_size)
    seen: set[bytes] = set()
    async with EngineClient(url) as c:
        for conv in convs:
            hist: list[dict[str, Any]] = [{"role": "system", "content": conv.system}]
            for u in conv.user_turns:
                hist.append({"role": "user", "content": u})
                seen.update(hasher.block_hashes(await c.tokenize_chat(hist)))
                hist.append({"role": "assistant", "content": "x " * 10})
    return len(seen)


def test_kv_routing_beats_simple_shuffle(proxy: Proxy, engines: list[EngineReplica]) -> None:
    workloads = [make_workload(**COMPARISON, seed=seed) for seed in COMPARISON_SEEDS]

    async def run() -> tuple[Any, Any, int, int, int]:
        async with EngineClient(engines[0].url) as c:
            m = await c.metrics()
        bs, blocks = int(m.block_size or 0), int(m.num_gpu_blocks or 0)
        need = min([await _distinct_blocks(engines[0].url, convs, bs) for convs in workloads])
        base = kv = None
        for convs in workloads:  # caches reset before every run: each workload starts cold
            _reset(engines)
            b = await run_workload(proxy.url, MASTER_KEY, DEFAULT, convs, label="LiteLLM simple-shuffle",
                                   concurrency=3)
            _reset(engines)
            k = await run_workload(proxy.url, MASTER_KEY, KV, convs, label="litellm-kv", concurrency=3)
            base, kv = (b, k) if base is None or kv is None else (base + b, kv + k)
        return base, kv, need, blocks, bs

    before = _metric(proxy, "litellm_kv_prediction_checks_total")
    base, kv, need, blocks, bs = asyncio.run(run())
    print(f"\nKV cache per replica: {blocks} blocks of {bs}; workload needs {need} distinct blocks")
    print(format_table([base, kv]))
    assert need > blocks, "workload must overflow one replica's cache"
    assert need <= 2 * blocks, "workload must fit the fleet's caches"
    assert base.failures == 0 and kv.failures == 0
    ratio = kv.cached_ratio / max(base.cached_ratio, 1e-9)
    print(f"cached-token ratio litellm-kv / simple-shuffle = {ratio:.2f}x")
    assert kv.cached_ratio >= 1.5 * base.cached_ratio
    after = _metric(proxy, "litellm_kv_prediction_checks_total")
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    exact = sum(v for k, v in delta.items() if 'outcome="exact"' in k)
    total = sum(v for k, v in delta.items() if 'outcome="fallback"' not in k)
    print(f"predictions: {exact:.0f}/{total:.0f} exact ({delta})")
    assert total >= len(kv.results)
    assert exact / total >= 0.8, delta


def test_streaming_with_tools(proxy: Proxy, engines: list[EngineReplica]) -> None:
    convs = make_workload(groups=3, convs_per_group=2, turns=3, system_words=200, seed=21)
    before = _metric(proxy, "litellm_kv_prediction_checks_total")
    ttft_before = _metric(proxy, "litellm_kv_ttft_prediction_error_seconds_count")
    errors_before = _health(proxy)["routing"]["groups"][KV]["ttft_error"]["responses"]
    stats = asyncio.run(run_workload(proxy.url, MASTER_KEY, KV, convs, label="litellm-kv stream+tools",
                                     concurrency=2, stream=True, tools=True))
    print("\n" + format_table([stats]))
    assert stats.failures == 0
    assert stats.cached_ratio > 0.3
    after = _metric(proxy, "litellm_kv_prediction_checks_total")
    checked = sum(after.get(k, 0) - before.get(k, 0) for k in after)
    assert checked >= len(stats.results), "streamed usage must reach the verification"
    # Every streamed answer's time to first token is set against the cost model's prediction.
    ttft_after = _metric(proxy, "litellm_kv_ttft_prediction_error_seconds_count")
    measured = sum(ttft_after.get(k, 0) - ttft_before.get(k, 0) for k in ttft_after)
    assert measured >= len(stats.results), (ttft_before, ttft_after)
    # The same errors one by one on /litellm-kv/health, as many as the histogram counted.
    error = _health(proxy, ttft_errors_since=errors_before)["routing"]["groups"][KV]["ttft_error"]
    assert len(error["since"]["errors_ms"]) == measured and error["since"]["dropped"] == 0, error
    assert error["responses"] == errors_before + measured and error["abs_error_ms"]["p90"] >= 0, error
    for bad in ("-1", "many"):
        r = httpx.get(f"{proxy.url}/litellm-kv/health", headers=HEADERS, timeout=10, params={"ttft_errors_since": bad})
        assert r.status_code == 422, (bad, r.status_code, r.text)
    rates = _health(proxy)["routing"]["groups"][KV]["rates"]
    assert sum(r["measured_ttfts"] for r in rates.values()) > 0, rates


def test_the_dashboard_queries_answer_on_a_real_prometheus(proxy: Proxy, engines: list[EngineReplica]) -> None:
    """A real Prometheus scrapes this proxy's /litellm-kv/metrics (with the admin key) and both engines, while
    streamed requests go through the KV group; then every query of the Grafana dashboard is evaluated. Each must
    be valid PromQL on these series, and the panels of what this traffic exercises must show data: routing
    decisions, the TTFT prediction error, the predicted TTFT per replica, the engines' prefix-cache hit rate and
    load."""
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/litellm-kv.json").read_text())
    queries = {t["expr"]: p["title"] for p in dashboard["panels"] for t in p["targets"]}
    host = proxy.url.removeprefix("http://")
    prom = PrometheusServer({"litellm-kv": ("/litellm-kv/metrics", [host], MASTER_KEY),
                             "vllm": ("/metrics", [f"127.0.0.1:{e.port}" for e in engines], None)})
    try:
        prom.wait_scraped()
        system = "You answer questions about the dashboard. " * 40
        for i in range(4):  # after the first scrape, so the counters' rates are not zero
            body = {"model": KV, "max_tokens": 8, "stream": True, "messages": [
                {"role": "system", "content": system}, {"role": "user", "content": f"panel question {i}"}]}
            with httpx.stream("POST", f"{proxy.url}/v1/chat/completions", json=body, headers=HEADERS,
                              timeout=120) as r:
                assert r.status_code == 200
                r.read()
        time.sleep(3)  # two scrapes more
        answers = {expr: prom.query(expr) for expr in queries}
    finally:
        prom.stop()
    failed = {queries[e]: a.get("error") for e, a in answers.items() if a.get("status") != "success"}
    assert not failed, failed

    def values(expr: str) -> list[float]:
        return [float(v["value"][1]) for v in answers[expr]["data"]["result"]]

    must_show = [e for e in queries if any(name in e for name in (
        "litellm_kv_routing_decisions_total", "litellm_kv_ttft_prediction_error_seconds_bucket",
        "litellm_kv_predicted_ttft_seconds", "vllm:prefix_cache_hits_total", "vllm:num_requests_running"))]
    assert len(must_show) >= 7, must_show
    empty = [queries[e] + ": " + e for e in must_show if not [v for v in values(e) if v == v]]  # NaN != NaN
    assert not empty, empty
    assert all(v > 0 for v in values("max by (model_group, replica) (litellm_kv_predicted_ttft_seconds)"))


def test_hot_prefix_spreads_under_load(proxy: Proxy) -> None:
    """One hot prefix at high concurrency: once the holder is loaded, the other replica gets work. Each request
    decodes long enough (96 tokens) that the 24 are in flight together however fast the machine: with 24 tokens a
    CI run had the first ones finish before the last were routed, the holder never reached the hold's bound on
    requests in flight, and all 24 stayed there, as the hold intends for a holder that is not loaded."""
    system = "You are the hot assistant. " + " ".join(f"rule{i} must be followed carefully" for i in range(120))

    def hold_outcomes() -> dict[str, float]:
        return proxy.metric_by("litellm_kv_routing_prefix_hold_total", "outcome", model_group=KV)

    async def run() -> dict[str, int]:
        counts: dict[str, int] = {}
        async with httpx.AsyncClient(timeout=120) as c:
            async def one(i: int) -> None:
                body = {"model": KV, "max_tokens": 96, "temperature": 0, "ignore_eos": True, "messages": [
                    {"role": "system", "content": system}, {"role": "user", "content": f"question {i} " * 20}]}
                r = await c.post(f"{proxy.url}/v1/chat/completions", json=body, headers=HEADERS)
                assert r.status_code == 200, r.text
                assert r.json()["usage"]["completion_tokens"] == 96  # ignore_eos reached the engine
                dep = r.headers.get("x-litellm-model-id", "")
                counts[dep] = counts.get(dep, 0) + 1

            await asyncio.gather(*(one(i) for i in range(24)))
        return counts

    before = hold_outcomes()
    counts = asyncio.run(run())
    held = {k: v - before.get(k, 0.0) for k, v in hold_outcomes().items()}
    print(f"\nhot prefix, 24 concurrent requests: {counts}; the hold's outcomes: {held}")
    assert len(counts) == 2 and min(counts.values()) >= 3, (counts, held)


def _cache_blocks_on(replica: EngineReplica, text: str, requests: int) -> None:
    """Prompts of a few blocks sent straight to one engine, then a moment for their events to reach the index."""
    for i in range(requests):
        httpx.post(f"{replica.url}/v1/chat/completions", timeout=60, json={
            "model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": f"{text} {i} " * 80}]})
    time.sleep(1.0)


def test_a_cache_reset_reaches_the_index_only_with_the_engines_next_step(
    proxy: Proxy, engines: list[EngineReplica]
) -> None:
    # vLLM publishes KV events from its engine steps: the AllBlocksCleared of a reset on an idle engine waits for
    # the engine's next request. reset_prefix_caches therefore sends each replica a request shorter than a block.
    target = engines[0]
    _cache_blocks_on(target, "reset me", 2)
    purges = _subscriber(proxy, target)["purges"]
    httpx.post(f"{target.url}/reset_prefix_cache", timeout=30).raise_for_status()
    time.sleep(1.5)
    assert _subscriber(proxy, target)["purges"] == purges, "an idle engine sent its reset before its next step"
    reset_prefix_caches([target])  # resets again, then the short request
    proxy.proc.wait_until(lambda: _subscriber(proxy, target)["purges"] > purges, 10, "the reset reaching the index")


def test_reannouncements_are_asked_for_only_while_the_index_may_lack_blocks(
    proxy: Proxy, engines: list[EngineReplica]
) -> None:
    """``report_mode_full: "auto"`` (the default): once every replica's event stream has been followed whole (here
    from the caches' reset, whatever came before), requests no longer ask the engines to re-announce their hits,
    and the predictions stay exact without them. The shadow group, set to true, still asks, and the engines
    re-announce that group's hits."""
    _reset(engines)  # the AllBlocksCleared of each replica: its stream is followed whole from there

    def kv_group() -> dict[str, Any]:
        return dict(_health(proxy)["routing"]["groups"][KV])

    proxy.proc.wait_until(lambda: all(r["stream_complete"] for r in kv_group()["replicas"]), 15,
                          "every replica's stream followed whole after the reset")
    assert kv_group()["reannounce"] is False
    assert _health(proxy)["routing"]["groups"][SHADOW]["reannounce"] is True
    gauge = _metric(proxy, "litellm_kv_reannounce_requested")
    assert gauge[f'litellm_kv_reannounce_requested{{model_group="{KV}"}}'] == 0, gauge
    assert gauge[f'litellm_kv_reannounce_requested{{model_group="{SHADOW}"}}'] == 1, gauge

    def reannounced() -> int:
        return sum(int(_subscriber(proxy, e)["reannounced"]) for e in engines)

    def cached(r: httpx.Response) -> int:
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)

    msgs = [{"role": "user", "content": "a prompt hit without a re-announcement " * 40}]
    before, checks_before = reannounced(), _metric(proxy, "litellm_kv_prediction_checks_total")
    replies = [_chat(proxy, KV, msgs) for _ in range(3)]
    assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
    assert cached(replies[-1]) > 0
    time.sleep(1.0)  # the hits' events, had any been re-announced
    assert reannounced() == before, "the engines re-announced hits nobody asked them to"
    after = _metric(proxy, "litellm_kv_prediction_checks_total")
    key = f'litellm_kv_prediction_checks_total{{model_group="{KV}",outcome="exact"}}'
    assert after.get(key, 0) - checks_before.get(key, 0) == 3, after

    # The shadow group asks: LiteLLM places its requests at random, so send until one hits.
    hits = 0
    for _ in range(8):
        r = _chat(proxy, SHADOW, msgs)
        assert r.status_code == 200, r.text
        hits += cached(r) > 0
        if hits:
            break
    assert hits, "no shadow-group request hit the cached prompt"
    proxy.proc.wait_until(lambda: reannounced() > before, 10, "the shadow group's hit re-announced")


def test_replica_killed_then_restarted(proxy: Proxy, engines: list[EngineReplica]) -> None:
    victim = engines[1]
    # Give the victim cached blocks the index knows about, so its restart has something to purge.
    _cache_blocks_on(victim, "victim", 3)
    purges_before = _subscriber(proxy, victim)["purges"]
    victim.kill()
    try:
        async def run() -> list[int]:
            async with httpx.AsyncClient(timeout=120) as c:
                out = []
                for i in range(6):
                    body = {"model": KV, "max_tokens": 4, "temperature": 0,
                            "messages": [{"role": "user", "content": f"while one replica is down {i}"}]}
                    r = await c.post(f"{proxy.url}/v1/chat/completions", json=body, headers=HEADERS)
                    out.append(r.status_code)
                return out

        codes = asyncio.run(run())
        print(f"\nstatus codes with one replica down: {codes}")
        assert codes == [200] * 6
    finally:
        victim.restart()
    # The restarted engine starts its event seq again at 0: its old entries must be gone and it must
    # be ready again.
    _wait_exact(proxy, timeout=60)
    rep = next(r for r in _health(proxy)["routing"]["groups"][KV]["replicas"] if r["replica"].endswith(
        f":{victim.port}"))
    print(f"restarted replica state: {rep}")
    assert rep["ready"]
    assert _subscriber(proxy, victim)["purges"] > purges_before, "the restarted engine's old entries must go"


def _chat(proxy: Proxy, model: str, messages: list[dict[str, Any]], key: str = MASTER_KEY,
          **extra: Any) -> httpx.Response:
    body = {"model": model, "max_tokens": 4, "temperature": 0, "messages": messages, **extra}
    return httpx.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {key}"})


def test_a_long_prompt_is_encoded_while_litellm_authenticates_it(proxy: Proxy) -> None:
    """``early_tokenize_chars`` (on by default): a long new system prompt's segment is encoded in the worker thread
    from the body's arrival, the decision takes it from there (``ready``, or ``waited`` on a slow machine), and the
    prediction it routes with is still exact: the second request's predicted cached tokens are the engine's."""
    assert _local_tokenizer(proxy).startswith("local (verified")
    before = _metric(proxy, "litellm_kv_early_tokenize_segments_total")
    checks = _metric(proxy, "litellm_kv_prediction_checks_total")
    system = " ".join(f"early{i} segment" for i in range(300))  # ~5K characters, ~2K tokens, never sent before
    for turn in range(2):
        r = _chat(proxy, KV, [{"role": "system", "content": system}, {"role": "user", "content": f"turn {turn}"}])
        assert r.status_code == 200, r.text
    after = _metric(proxy, "litellm_kv_early_tokenize_segments_total")
    took = {k: after[k] - before.get(k, 0) for k in after if f'model_group="{KV}"' in k and after[k] > before.get(k, 0)}
    print(f"\nearly tokenize: {took}")
    used = sum(v for k, v in took.items() if 'outcome="ready"' in k or 'outcome="waited"' in k)
    assert used == 1, took  # the first request's system prompt; the second found it in the memo
    # No request without a key is looked at (LiteLLM refuses it; nothing is queued for it).
    r = httpx.post(f"{proxy.url}/v1/chat/completions", timeout=60, json={
        "model": KV, "max_tokens": 2, "messages": [{"role": "system", "content": system + " anonymous"}]})
    assert r.status_code in (400, 401), r.text
    assert _metric(proxy, "litellm_kv_early_tokenize_segments_total") == after
    _assert_checked_exact(proxy, checks, 2)


def _assert_checked_exact(proxy: Proxy, before: dict[str, float], n: int) -> None:
    """Wait (10 s at most) until ``n`` predictions of the KV group were checked since ``before`` (the prediction
    checks metric then), and require every one exact."""
    exact = f'litellm_kv_prediction_checks_total{{model_group="{KV}",outcome="exact"}}'

    def checked() -> dict[str, float]:
        now = _metric(proxy, "litellm_kv_prediction_checks_total")
        return {k: now[k] - before.get(k, 0) for k in now if now[k] != before.get(k, 0)}

    proxy.proc.wait_until(lambda: sum(checked().values()) >= n, 10, f"{n} predictions checked")
    assert checked() == {exact: n}


def test_shadow_mode_records_but_lets_litellm_route(proxy: Proxy) -> None:
    # The restart test before this one waits for the KV group only: the shadow group shares its engines, and its
    # subscriber may still be catching up with the restarted one (then nothing is predicted yet).
    proxy.wait_kv_exact(SHADOW, timeout=60)
    before = _metric(proxy, "litellm_kv_routing_decisions_total")
    shadow_before = _metric(proxy, "litellm_kv_shadow_tokens_total")
    msgs = [{"role": "system", "content": "shadow trial " * 120}, {"role": "user", "content": "hello"}]
    deployments = set()
    for _ in range(6):
        r = _chat(proxy, SHADOW, msgs)
        assert r.status_code == 200, r.text
        deployments.add(r.headers.get("x-litellm-model-id"))
    after = _metric(proxy, "litellm_kv_routing_decisions_total")
    key = f'litellm_kv_routing_decisions_total{{model_group="{SHADOW}",reason="shadow"}}'
    assert after.get(key, 0) - before.get(key, 0) == 6
    shadow = _metric(proxy, "litellm_kv_shadow_tokens_total")
    grew = {k: shadow[k] - shadow_before.get(k, 0) for k in shadow if SHADOW in k}
    print(f"\nshadow: LiteLLM used {sorted(deployments)}; {grew}")
    assert grew[f'litellm_kv_shadow_tokens_total{{kind="prompt",model_group="{SHADOW}"}}'] > 0
    assert grew[f'litellm_kv_shadow_tokens_total{{kind="would_have_cached",model_group="{SHADOW}"}}'] > 0


def test_a_ttft_target_shows_on_health_route_and_metrics(proxy: Proxy) -> None:
    """The shadow group's 1 us target comes from the YAML config through the real proxy: /health shows it,
    /route says no replica was predicted to meet it, and each request's decision counts as unmet."""
    groups = _health(proxy)["routing"]["groups"]
    assert groups[SHADOW]["slo_ttft_s"] == pytest.approx(1e-6)
    assert groups[KV]["slo_ttft_s"] is None
    msgs = [{"role": "system", "content": "target trial " * 100}, {"role": "user", "content": "hi"}]
    r = httpx.post(f"{proxy.url}/litellm-kv/route", json={"model": SHADOW, "messages": msgs}, headers=HEADERS,
                   timeout=30)
    r.raise_for_status()
    assert r.json()["slo_met"] is False
    r = httpx.post(f"{proxy.url}/litellm-kv/route", json={"model": KV, "messages": msgs}, headers=HEADERS, timeout=30)
    r.raise_for_status()
    assert r.json()["slo_met"] is None
    key = f'litellm_kv_routing_slo_unmet_total{{model_group="{SHADOW}"}}'
    before = _metric(proxy, "litellm_kv_routing_slo_unmet_total").get(key, 0)
    for _ in range(3):
        assert _chat(proxy, SHADOW, msgs).status_code == 200
    assert _metric(proxy, "litellm_kv_routing_slo_unmet_total").get(key, 0) - before >= 3


def test_tenant_cache_isolation(proxy: Proxy) -> None:
    """Teams never share prefix blocks (a keyed cache_salt per team), and routing stays exact with the salt."""
    msgs = [{"role": "system", "content": "isolated tenant prompt " * 60}, {"role": "user", "content": "same"}]
    checks_before = _metric(proxy, "litellm_kv_prediction_checks_total")
    a1 = _chat(proxy, TENANT, msgs, key="sk-team-a")
    a2 = _chat(proxy, TENANT, msgs, key="sk-team-a")
    b1 = _chat(proxy, TENANT, msgs, key="sk-team-b")
    b2 = _chat(proxy, TENANT, msgs, key="sk-team-b")
    for r in (a1, a2, b1, b2):
        assert r.status_code == 200, r.text

    def cached(r: httpx.Response) -> int:
        return int(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] or 0)

    print(f"\ncached tokens: team a {cached(a1)}, {cached(a2)}; team b {cached(b1)}, {cached(b2)}")
    assert cached(a2) > 0 and cached(b2) > 0
    assert cached(b1) == 0, "team b must not hit team a's blocks"
    after = _metric(proxy, "litellm_kv_prediction_checks_total")
    key = f'litellm_kv_prediction_checks_total{{model_group="{TENANT}",outcome="exact"}}'
    assert after.get(key, 0) - checks_before.get(key, 0) == 4, after


def test_tenant_cache_isolation_holds_on_the_responses_endpoint(proxy: Proxy) -> None:
    """``/v1/responses`` reaches vLLM's own Responses endpoint, and LiteLLM sends only the Responses fields it knows:
    the team's cache_salt rides in ``extra_body``. Before, those calls reached the engines unsalted, and team b's
    first call hit team a's blocks."""
    text = f"isolated responses prompt {time.time_ns()} " * 60

    def respond(key: str) -> int:
        r = httpx.post(f"{proxy.url}/v1/responses", timeout=120, headers={"Authorization": f"Bearer {key}"},
                       json={"model": TENANT, "input": text, "max_output_tokens": 16, "temperature": 0})
        assert r.status_code == 200, r.text
        return int((r.json()["usage"].get("input_tokens_details") or {}).get("cached_tokens") or 0)

    # These calls carry no messages, so they are routed by load: four of team a's land on both replicas or twice on
    # one, so a later one hits and, before, team b's first call found team a's unsalted blocks wherever it went.
    a = [respond("sk-team-a") for _ in range(4)]
    b1 = respond("sk-team-b")
    print(f"\ncached tokens on /v1/responses: team a {a}; team b {b1}")
    assert max(a[1:]) > 0, "a team's own calls share its cache"
    assert b1 == 0, "team b must not hit team a's blocks"


def test_new_empty_replica_receives_traffic(engines: list[EngineReplica], engine_model: Any) -> None:
    """A replica that is down when the proxy starts is skipped (no failed attempts), then gets traffic
    once it comes up empty (anti-starvation / least-loaded for new prefixes)."""
    port, events_port, replay_port = free_ports(3)
    newcomer = EngineReplica(name="newcomer", port=port, model_dir=engine_model, events_port=events_port,
                             replay_port=replay_port)
    p = start_proxy(_config([engines[0], newcomer], str(engine_model), groups=(KV,)), name="routing-newcomer")
    try:
        deadline = time.monotonic() + 60
        while not _health(p)["routing"]["groups"][KV]["replicas"]:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        codes = [_chat(p, KV, [{"role": "user", "content": f"before the newcomer {i} " * 10}]) for i in range(4)]
        assert [r.status_code for r in codes] == [200] * 4
        assert {r.headers.get("x-litellm-model-id") for r in codes} == {f"{KV}-0"}
        newcomer.start()
        newcomer.wait_ready()
        _wait_exact(p)
        served = [_chat(p, KV, [{"role": "user", "content": f"fresh topic {i} " * 30}]) for i in range(10)]
        where = [r.headers.get("x-litellm-model-id") for r in served]
        print(f"\nafter the newcomer came up: {where}")
        assert all(r.status_code == 200 for r in served)
        assert where.count(f"{KV}-1") >= 2, where
    finally:
        p.stop()
        newcomer.stop()


def test_deployments_that_name_a_litellm_credential_are_routed_by_cache(
        engines: list[EngineReplica], engine_model: Any) -> None:
    """A deployment may name its engine through a LiteLLM credential (``litellm_credential_name``, an entry of
    ``credential_list`` holding the ``api_base``) instead of an ``api_base`` of its own. The KV-routed group finds its
    replicas there; before, it saw none and every request went by LiteLLM's routing."""
    config = _config(engines, str(engine_model), groups=(KV,))
    config["credential_list"] = [
        {"credential_name": f"engine-{i}", "credential_info": {}, "credential_values": {"api_base": r.api_base}}
        for i, r in enumerate(engines)]
    for i, dep in enumerate(config["model_list"]):
        dep["litellm_params"].pop("api_base")
        dep["litellm_params"]["litellm_credential_name"] = f"engine-{i}"
    p = start_proxy(config, name="routing-credentials")
    try:
        _reset(engines)
        health = p.wait_kv_exact(KV, 60)
        replicas = sorted(str(r.get("replica")) for r in health["replicas"])
        assert len(replicas) == 2, health
        msgs = [{"role": "system", "content": "credentialed engines " * 120}, {"role": "user", "content": "hi"}]
        served = [_chat(p, KV, msgs) for _ in range(4)]
        assert all(r.status_code == 200 for r in served), [r.text[:200] for r in served]
        where = {r.headers.get("x-litellm-model-id") for r in served}
        cached = [r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] for r in served]
        print(f"\ncredentialed replicas {replicas}: served by {where}, cached tokens {cached}")
        assert len(where) == 1 and min(cached[1:]) > 0, (where, cached)
    finally:
        p.stop()
