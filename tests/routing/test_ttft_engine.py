"""The TTFT model against a real vLLM CPU replica: the engine exports the timing histograms the rates are
learned from (names as in vLLM 0.32), the RateBook calibrates from real scrapes, and its prediction for a
request on the idle replica is close to the TTFT a streaming client measures."""

from __future__ import annotations

import random
import time

import httpx
import pytest

from litellm_kv.routing.cost import Candidate, CostModel, CostSettings
from litellm_kv.routing.ttft import EngineTimings, RateBook, TtftSettings
from litellm_kv.vllm.engine import TIMING_SAMPLES, EngineClient
from tools.harness.engines import SERVED_NAME, EngineReplica

pytestmark = [pytest.mark.engine]


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(f"w{rng.randrange(100_000)}" for _ in range(words))


async def _stream_ttft(http: httpx.AsyncClient, url: str, prompt: str) -> float:
    """Seconds from sending to the first streamed chunk with text. The stream is read to its end: a request
    the client abandons is aborted, and vLLM records no prefill figures for aborted requests."""
    t0 = time.perf_counter()
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    async with http.stream("POST", f"{url}/v1/completions", json=body) as resp:
        if resp.status_code != 200:
            raise AssertionError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
        first = None
        async for line in resp.aiter_lines():
            if first is None and line.startswith("data: ") and '"text"' in line:
                first = time.perf_counter() - t0
    assert first is not None, "no streamed text"
    return first


async def test_rates_calibrate_from_a_real_engine_and_predict_its_ttft(engines: list[EngineReplica]) -> None:
    rep = engines[0]
    rng = random.Random(7)
    # A default far too fast for any engine here, so the learned rate must come from the engine's figures.
    book = RateBook(TtftSettings(prefill_s_per_token=1e-8, prior_requests=1))
    async with EngineClient(rep.url) as client, httpx.AsyncClient(timeout=60) as http:
        m = await client.metrics()
        assert set(TIMING_SAMPLES) <= set(m.timings), sorted(m.timings)  # vLLM exports every one
        first = EngineTimings(*(m.timings[k] for k in TIMING_SAMPLES))
        book.observe_engine(rep.url, first)
        # Unique prompts of varied length (nothing cached), one at a time, scraped every few requests.
        for i in range(16):
            await _stream_ttft(http, rep.url, _prompt(rng, rng.choice([100, 250, 500])))
            if i % 4 == 3:
                m = await client.metrics()
                book.observe_engine(rep.url, EngineTimings(*(m.timings[k] for k in TIMING_SAMPLES)))
        last = EngineTimings(*(m.timings[k] for k in TIMING_SAMPLES))
        rates = book.rates(rep.url)
        assert rates.calibrated and rates.engine_prefills >= 12
        # The engine's own figures over the run: prefill seconds beyond the overhead per computed token.
        n = last.prefill_count - first.prefill_count
        engine_rate = ((last.prefill_s_sum - first.prefill_s_sum) - book.cfg.prefill_overhead_s * n) / (
            last.prefill_tokens_sum - first.prefill_tokens_sum)
        assert rates.prefill_s_per_token == pytest.approx(engine_rate, rel=0.15), (rates, engine_rate)
        assert rates.output_tokens == pytest.approx(4, abs=0.5)
        # Predicted vs measured TTFT of one more idle-replica request (proxy-free: only engine + HTTP).
        prompt = _prompt(rng, 500)
        tokens = len((await http.post(f"{rep.url}/tokenize", json={"model": SERVED_NAME, "prompt": prompt})
                      ).json()["tokens"])
        model = CostModel(CostSettings(), ttft=book.cfg)
        d = model.choose(tokens, rep.block_size, [Candidate(rep.url, rates=rates)])
        measured = min([await _stream_ttft(http, rep.url, _prompt(rng, 500)) for _ in range(3)])
        print(f"engine rate {engine_rate * 1e6:.1f} ms/1K tokens, learned {rates.prefill_s_per_token * 1e6:.1f}; "
              f"decode step {rates.decode_step_s * 1e3:.1f} ms; {tokens}-token prompt: predicted TTFT "
              f"{d.ttft_s[rep.url] * 1e3:.1f} ms, measured {measured * 1e3:.1f} ms")
        # Timing on a shared 2-core machine: a loose bound, the point is the order of magnitude (the
        # wrong default predicts ~50× too long).
        assert d.ttft_s[rep.url] < 5 * measured + 0.05, (d.ttft_s, measured)
        assert measured < 5 * d.ttft_s[rep.url] + 0.05, (d.ttft_s, measured)
