"""HTTP client for one vLLM replica: tokenisation, metrics, KV-event sources, models.

Only the engine endpoints a router needs (vllm-contract.md §6): ``/tokenize`` (the exact
chat-templated prompt tokens), ``/metrics`` (load gauges, prefix-cache counters and the cache
config the hashes depend on), ``/kv_event_sources`` (the resolved ZMQ endpoints per DP rank)
and ``/v1/models`` (served names and LoRA adapters with their paths).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx

DEFAULT_TIMEOUT_S = 5.0


class EngineError(RuntimeError):
    """An engine call failed: unreachable, timed out, non-2xx or an unexpected body.
    The message names the replica, the endpoint and what went wrong."""


@dataclass(slots=True, frozen=True)
class KVEventSource:
    """One data-parallel rank's KV-event publisher, as ``GET /kv_event_sources`` reports it."""

    dp_rank: int
    endpoint: str
    replay_endpoint: str | None
    topic: str
    buffer_steps: int | None = None


@dataclass(slots=True)
class EngineMetrics:
    """What a router reads from one ``/metrics`` scrape (None: the engine did not report it)."""

    waiting: int | None = None
    running: int | None = None
    kv_usage: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_queries: float | None = None
    block_size: int | None = None
    hash_algo: str | None = None
    prefix_caching: bool | None = None
    num_gpu_blocks: int | None = None
    process_start_time: float | None = None
    cache_config: dict[str, str] = field(default_factory=dict)
    # Sums and counts of the timing histograms the TTFT cost model learns from (routing/ttft.py); all DP
    # ranks summed. Empty when the engine exports none of them.
    timings: dict[str, float] = field(default_factory=dict)


TIMING_SAMPLES = (  # in the field order of routing.ttft.EngineTimings
    "vllm:request_prefill_time_seconds_sum", "vllm:request_prefill_time_seconds_count",
    "vllm:request_prefill_kv_computed_tokens_sum", "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count", "vllm:request_generation_tokens_sum",
    "vllm:request_generation_tokens_count",
)


_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def _labels(raw: str | None) -> dict[str, str]:
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in _LABEL.findall(raw or "")}


# The samples the router reads, matched in one pass over the body. vLLM's /metrics is large (histogram
# buckets mostly) and is scraped every second per replica on the proxy's event loop: parsing every line
# delayed routing decisions whose Redis round trip was in flight (docs/performance.md).
_WANTED_SAMPLE = re.compile(
    r"\n(vllm:num_requests_waiting|vllm:num_requests_running|vllm:kv_cache_usage_perc|vllm:prefix_cache_hits_total"
    r"|vllm:prefix_cache_queries_total|process_start_time_seconds|vllm:cache_config_info"
    r"|vllm:request_prefill_time_seconds_(?:sum|count)|vllm:request_prefill_kv_computed_tokens_sum"
    r"|vllm:inter_token_latency_seconds_(?:sum|count)|vllm:request_generation_tokens_(?:sum|count))"
    r"(?:\{(.*)\})?[ \t]+(\S+)"
)  # anchored on a literal newline (the body gets one in front), which lets the regex engine skip to line
# starts, faster than ^ with MULTILINE and far faster than a full parse


_TIMING = frozenset(TIMING_SAMPLES)


def engine_metrics(text: str) -> EngineMetrics:
    """Extract the router-relevant figures from a vLLM ``/metrics`` body. Per-engine samples
    (DP ranks behind one API server) are summed for counts and averaged for usage."""
    m = EngineMetrics()
    usage: list[float] = []
    for match in _WANTED_SAMPLE.finditer("\n" + text):
        name, raw_labels, raw_value = match.groups()
        try:
            value = float(raw_value)
        except ValueError:
            continue
        if name == "vllm:num_requests_waiting":
            m.waiting = (m.waiting or 0) + int(value)
        elif name == "vllm:num_requests_running":
            m.running = (m.running or 0) + int(value)
        elif name == "vllm:kv_cache_usage_perc":
            usage.append(value)
        elif name == "vllm:prefix_cache_hits_total":
            m.prefix_cache_hits = (m.prefix_cache_hits or 0.0) + value
        elif name == "vllm:prefix_cache_queries_total":
            m.prefix_cache_queries = (m.prefix_cache_queries or 0.0) + value
        elif name in _TIMING:
            m.timings[name] = m.timings.get(name, 0.0) + value
        elif name == "process_start_time_seconds":
            m.process_start_time = value
        elif name == "vllm:cache_config_info" and not m.cache_config:
            labels = _labels(raw_labels)
            m.cache_config = labels
            m.block_size = _int_or_none(labels.get("block_size"))
            m.hash_algo = labels.get("prefix_caching_hash_algo") or None
            epc = labels.get("enable_prefix_caching")
            m.prefix_caching = None if epc is None else epc == "True"
            m.num_gpu_blocks = _int_or_none(labels.get("num_gpu_blocks"))
    if usage:
        m.kv_usage = sum(usage) / len(usage)
    return m


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


class EngineClient:
    """Async client of one vLLM OpenAI-compatible server (``base_url`` without ``/v1``).

    Every call has an explicit timeout and raises :class:`EngineError` on failure.
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT_S,
        api_key: str | None = None,
        model: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        base = base_url.rstrip("/")
        self.base_url = base[:-3] if base.endswith("/v1") else base
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._headers = headers
        self._timeout = timeout
        self._scraper: aiohttp.ClientSession | None = None  # /metrics only: see metrics()
        self._scraper_loop: asyncio.AbstractEventLoop | None = None
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=min(timeout, 2.0)),
            limits=httpx.Limits(max_connections=16, max_keepalive_connections=8),
            headers=headers,
            transport=transport,
        )

    async def aclose(self) -> None:
        await self._http.aclose()
        if self._scraper is not None:
            await self._scraper.close()
            self._scraper = None

    async def __aenter__(self) -> EngineClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _request(self, method: str, path: str, json: Any = None) -> httpx.Response:
        try:
            resp = await self._http.request(method, path, json=json)
        except httpx.TimeoutException as exc:
            raise EngineError(f"{self.base_url}{path}: timed out ({type(exc).__name__})") from exc
        except httpx.HTTPError as exc:
            raise EngineError(f"{self.base_url}{path}: {type(exc).__name__}: {exc}") from exc
        if resp.status_code >= 400:
            raise EngineError(f"{self.base_url}{path}: HTTP {resp.status_code}: {resp.text[:300]}")
        return resp

    async def _json(self, method: str, path: str, json: Any = None) -> Any:
        resp = await self._request(method, path, json)
        try:
            return resp.json()
        except ValueError as exc:
            raise EngineError(f"{self.base_url}{path}: body is not JSON: {resp.text[:200]!r}") from exc

    # -- tokenisation --------------------------------------------------------------------------

    async def tokenize_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Prompt tokens exactly as ``/v1/chat/completions`` will build them (same renderer).

        ``/tokenize`` has no ``reasoning_effort``: pass ``enable_thinking`` in
        ``chat_template_kwargs`` yourself when the request sets it.
        """
        body: dict[str, Any] = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt and not continue_final_message,
            "continue_final_message": continue_final_message,
        }
        if self.model:
            body["model"] = self.model
        if tools:
            body["tools"] = list(tools)
        if chat_template_kwargs:
            body["chat_template_kwargs"] = dict(chat_template_kwargs)
        return self._tokens(await self._json("POST", "/tokenize", body))

    async def tokenize_prompt(self, prompt: str, add_special_tokens: bool = True) -> list[int]:
        """Tokens of a completions-style prompt."""
        body: dict[str, Any] = {"prompt": prompt, "add_special_tokens": add_special_tokens}
        if self.model:
            body["model"] = self.model
        return self._tokens(await self._json("POST", "/tokenize", body))

    def _tokens(self, data: Any) -> list[int]:
        tokens = data.get("tokens") if isinstance(data, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            raise EngineError(f"{self.base_url}/tokenize: no integer 'tokens' list in {str(data)[:200]}")
        return tokens

    # -- state ---------------------------------------------------------------------------------

    async def metrics(self) -> EngineMetrics:
        """One scrape of ``/metrics``, through aiohttp rather than httpx: the body is large and fetched every
        second per replica on the proxy's event loop, where httpx's pure-Python HTTP parsing takes several
        times the loop time of aiohttp's C parser — loop time a routing decision waiting for Redis could not
        have (figures in docs/performance.md)."""
        url = self.base_url + "/metrics"
        loop = asyncio.get_running_loop()
        if self._scraper is None or self._scraper.closed or self._scraper_loop is not loop:
            # A session belongs to the loop that made it (a client reused from another loop gets its own).
            self._scraper_loop = loop
            self._scraper = aiohttp.ClientSession(
                headers={**self._headers, "Accept-Encoding": "identity"},
                timeout=aiohttp.ClientTimeout(total=self._timeout, connect=min(self._timeout, 2.0)),
                connector=aiohttp.TCPConnector(limit=2),
            )
        try:
            async with self._scraper.get(url) as resp:
                body = await resp.read()
                status = resp.status
        except asyncio.TimeoutError as exc:
            raise EngineError(f"{url}: timed out ({type(exc).__name__})") from exc
        except aiohttp.ClientError as exc:
            raise EngineError(f"{url}: {type(exc).__name__}: {exc}") from exc
        text = body.decode("utf-8", "replace")
        if status >= 400:
            raise EngineError(f"{url}: HTTP {status}: {text[:300]}")
        return engine_metrics(text)

    async def kv_event_sources(self) -> list[KVEventSource]:
        """The engine's resolved KV-event publishers, one per DP rank (empty: events are off)."""
        data = await self._json("GET", "/kv_event_sources")
        if not isinstance(data, dict):
            raise EngineError(f"{self.base_url}/kv_event_sources: expected an object, got {str(data)[:200]}")
        out: list[KVEventSource] = []
        for rank, cfg in data.items():
            if not isinstance(cfg, dict) or not cfg.get("enable_kv_cache_events"):
                continue
            if cfg.get("publisher") not in (None, "zmq"):
                continue
            out.append(
                KVEventSource(
                    dp_rank=int(rank),
                    endpoint=str(cfg.get("endpoint") or ""),
                    replay_endpoint=cfg.get("replay_endpoint") or None,
                    topic=str(cfg.get("topic") or ""),
                    buffer_steps=cfg.get("buffer_steps"),
                )
            )
        return sorted(out, key=lambda s: s.dp_rank)

    async def models(self) -> list[dict[str, Any]]:
        """``/v1/models`` entries: base models have ``parent`` None; LoRA adapters have the base
        as ``parent`` and their resolved path as ``root`` (the path vLLM hashes)."""
        data = await self._json("GET", "/v1/models")
        entries = data.get("data") if isinstance(data, dict) else None
        if not isinstance(entries, list):
            raise EngineError(f"{self.base_url}/v1/models: no 'data' list")
        return [e for e in entries if isinstance(e, dict)]

    async def health(self) -> bool:
        try:
            await self._request("GET", "/health")
        except EngineError:
            return False
        return True
