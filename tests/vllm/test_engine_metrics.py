"""engine_metrics: the router's figures from a vLLM /metrics body (the real engines' bodies are read in
test_engine_exactness and test_routing_e2e; this pins the parsing rules on crafted bodies), and the
scrape itself (EngineClient.metrics) on answers a real engine cannot be made to give."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from litellm_kv.vllm.engine import EngineClient, EngineError, EngineMetrics, engine_metrics
from tools.harness.procs import free_port

BODY = """\
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny"} 3.0
vllm:num_requests_waiting{engine="1",model_name="tiny"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",reason="capacity"} 99.0
vllm:num_requests_running{engine="1",model_name="tiny"} 1.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.75
vllm:e2e_request_latency_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 7.0
vllm:prefix_cache_hits_total{engine="0",model_name="tiny"} 1.5e+03
vllm:prefix_cache_queries_total{engine="0",model_name="tiny"} 2000.0
vllm:prefix_cache_queries_total{engine="1",model_name="tiny"} NaN
process_start_time_seconds 1.7e9
x_vllm:num_requests_running 50.0
vllm:cache_config_info{block_size="32",enable_prefix_caching="True",engine="0",note="a \\"quoted\\" \\\\ value",\
num_gpu_blocks="512",prefix_caching_hash_algo="sha256"} 1.0
vllm:cache_config_info{block_size="64",engine="1"} 1.0
"""


def test_reads_the_wanted_samples_and_nothing_else() -> None:
    m = engine_metrics(BODY)
    assert m.waiting == 7  # both DP ranks; the *_by_reason lookalike is not counted
    assert m.running == 3  # the first line of the body counts; 'x_vllm:...' does not
    assert m.kv_usage == 0.5
    assert m.prefix_cache_hits == 1500.0
    assert m.prefix_cache_queries is not None and m.prefix_cache_queries != m.prefix_cache_queries  # NaN kept
    assert m.process_start_time == 1.7e9
    assert (m.block_size, m.hash_algo, m.prefix_caching, m.num_gpu_blocks) == (32, "sha256", True, 512)
    assert m.cache_config["note"] == 'a "quoted" \\ value'  # the first rank's labels, unescaped


def test_crlf_bodies_and_absent_samples() -> None:
    m = engine_metrics(BODY.replace("\n", "\r\n"))
    assert (m.waiting, m.running, m.block_size) == (7, 3, 32)
    empty = engine_metrics("# nothing here\nother_metric 1.0\n")
    assert (empty.waiting, empty.running, empty.kv_usage, empty.block_size) == (None, None, None, None)
    assert engine_metrics("") == empty


def test_agrees_with_a_line_by_line_parse() -> None:
    """The one-pass scan against a plain per-line parse of the same body, sample by sample."""
    sample = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{.*\})?\s+(\S+)")
    waiting = 0
    for line in BODY.replace("\\\n", "").splitlines():
        hit = sample.match(line)
        if hit and hit.group(1) == "vllm:num_requests_waiting":
            waiting += int(float(hit.group(2)))
    assert engine_metrics(BODY).waiting == waiting


# -- EngineClient.metrics(): the scrape itself -------------------------------------------------------
# The real engines' /metrics is scraped in test_engine_exactness and test_routing_e2e. An engine cannot be
# made to answer 500, stall or cut a response short, so those answers come from a small HTTP server here.

FINITE_BODY = BODY.replace("NaN", "2500.0")  # NaN != NaN: whole-object comparisons need a finite body
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _serve(handler: Handler) -> tuple[asyncio.Server, str]:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, f"http://127.0.0.1:{port}"


def _answer(status: str, body: bytes, seen: list[bytes] | None = None) -> Handler:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if seen is not None:
                    seen.append(head)
                writer.write(f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
                             .encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
    return handle


@pytest.fixture
async def body_server() -> AsyncIterator[tuple[str, list[bytes]]]:
    seen: list[bytes] = []
    server, url = await _serve(_answer("200 OK", FINITE_BODY.encode(), seen))
    yield url, seen
    server.close()
    await server.wait_closed()


async def test_scrape_reads_the_body_on_one_kept_alive_connection(body_server: tuple[str, list[bytes]]) -> None:
    url, seen = body_server
    async with EngineClient(url + "/v1", api_key="sk-engine") as client:
        first = await client.metrics()
        second = await client.metrics()
    assert first == second == engine_metrics(FINITE_BODY)
    assert len(seen) == 2
    head = seen[0].decode().lower()
    assert head.startswith("get /metrics http/1.1") and "authorization: bearer sk-engine" in head
    assert "accept-encoding: identity" in head  # the engine is not asked to compress what it sends every second


async def test_scrape_errors_name_the_replica_and_the_cause() -> None:
    server, url = await _serve(_answer("500 Internal Server Error", b"engine exploded"))
    try:
        async with EngineClient(url) as client:
            with pytest.raises(EngineError, match=r"/metrics: HTTP 500: engine exploded"):
                await client.metrics()
    finally:
        server.close()
        await server.wait_closed()
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with EngineClient(closed) as client:
        with pytest.raises(EngineError, match=r"127\.0\.0\.1:\d+/metrics: ClientConnectorError"):
            await client.metrics()


async def test_scrape_times_out_on_a_stalled_engine_and_on_a_cut_body() -> None:
    async def stall(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(5)
        writer.close()

    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\nvllm:num_requests_running 1.0\n")
        await writer.drain()
        writer.close()

    for handler, cause in ((stall, "timed out"), (cut, "ClientPayloadError")):
        server, url = await _serve(handler)
        try:
            async with EngineClient(url, timeout=0.3) as client:
                t0 = asyncio.get_running_loop().time()
                with pytest.raises(EngineError, match=cause):
                    await client.metrics()
                assert asyncio.get_running_loop().time() - t0 < 2.0
        finally:
            server.close()


def test_one_client_scrapes_from_two_event_loops() -> None:
    """A client outlives the loop it first scraped on (a test's loop, a restarted service): the next loop
    gets its own connection instead of an error about a closed or foreign loop."""
    client: EngineClient | None = None

    async def scrape_once() -> EngineMetrics:
        nonlocal client
        server, url = await _serve(_answer("200 OK", BODY.encode()))
        try:
            if client is None:
                client = EngineClient(url)
            client.base_url = url
            return await client.metrics()
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(scrape_once()).running == 3
    assert asyncio.run(scrape_once()).running == 3
    assert client is not None
    asyncio.run(client.aclose())


def test_timing_histograms_for_the_ttft_model() -> None:
    """Sums and counts of the prefill, inter-token and output-length histograms, summed over DP ranks; the
    buckets and lookalike names are not read."""
    body = BODY + (
        'vllm:request_prefill_time_seconds_sum{engine="0",model_name="tiny"} 1.5\n'
        'vllm:request_prefill_time_seconds_sum{engine="1",model_name="tiny"} 0.5\n'
        'vllm:request_prefill_time_seconds_count{engine="0",model_name="tiny"} 10.0\n'
        'vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="tiny"} 7.0\n'
        'vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="tiny"} 12000.0\n'
        'vllm:inter_token_latency_seconds_sum{engine="0",model_name="tiny"} 0.9\n'
        'vllm:inter_token_latency_seconds_count{engine="0",model_name="tiny"} 300.0\n'
        'vllm:request_generation_tokens_sum{engine="0",model_name="tiny"} 320.0\n'
        'vllm:request_generation_tokens_count{engine="0",model_name="tiny"} 10.0\n'
        'vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 99.0\n'
    )
    t = engine_metrics(body).timings
    assert t == {
        "vllm:request_prefill_time_seconds_sum": 2.0, "vllm:request_prefill_time_seconds_count": 10.0,
        "vllm:request_prefill_kv_computed_tokens_sum": 12000.0, "vllm:inter_token_latency_seconds_sum": 0.9,
        "vllm:inter_token_latency_seconds_count": 300.0, "vllm:request_generation_tokens_sum": 320.0,
        "vllm:request_generation_tokens_count": 10.0,
    }
    assert engine_metrics(BODY).timings == {}
