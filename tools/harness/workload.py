"""The shared-prefix + multi-turn chat workload used by the demo and the end-to-end tests.

Groups of conversations share a long system prompt (the llm-d "shared prefix" shape); each
conversation then runs several turns, every turn resending the whole history (the agent /
chat shape). Everything is deterministic for a seed, and replies come from the real engine
with temperature 0, so two runs through different routers send the same prompts.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import httpx

_SYLLABLES = ("ka", "lo", "mi", "ru", "te", "son", "var", "pel", "dor", "qui", "zen", "bra", "tho", "gli", "nex")

TOOLS = [{
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "Look up an order by its id and return its status.",
        "parameters": {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]},
    },
}]


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n))


@dataclass(slots=True)
class Conversation:
    group: int
    system: str
    user_turns: list[str]
    history: list[dict[str, Any]] = field(default_factory=list)


# The routing comparison (tests, demo): 24 conversations, each with its own short system prompt, 5 turns. One
# workload needs ~440 distinct blocks of 32 tokens: more than one test replica holds (256), less than two.
# simple-shuffle's cached ratio on it varies run to run with its random choices (measured by replaying
# the same requests through an LRU model: 0.39 +- 0.03 over 16 seeds; more on real engines), so comparisons
# pool three workloads.
COMPARISON = {"groups": 24, "convs_per_group": 1, "turns": 5, "system_words": 80, "user_words": 15}
COMPARISON_SEEDS = (5, 6, 7)


def make_workload(groups: int = 8, convs_per_group: int = 3, turns: int = 4, system_words: int = 260,
                  user_words: int = 30, seed: int = 7) -> list[Conversation]:
    rng = random.Random(seed)
    systems = [f"You are assistant number {g}. " + _words(rng, system_words) for g in range(groups)]
    convs = []
    for g in range(groups):
        for _ in range(convs_per_group):
            convs.append(Conversation(g, systems[g], [_words(rng, user_words) for _ in range(turns)]))
    return convs


@dataclass(slots=True)
class Result:
    latency_s: float
    prompt_tokens: int
    cached_tokens: int
    deployment: str
    status: int


@dataclass(slots=True)
class RunStats:
    label: str
    results: list[Result]

    def __add__(self, other: RunStats) -> RunStats:
        return RunStats(self.label, self.results + other.results)

    @property
    def ok(self) -> list[Result]:
        return [r for r in self.results if r.status == 200]

    @property
    def cached_ratio(self) -> float:
        p = sum(r.prompt_tokens for r in self.ok)
        return sum(r.cached_tokens for r in self.ok) / p if p else 0.0

    @property
    def mean_latency_ms(self) -> float:
        return 1000 * statistics.fmean(r.latency_s for r in self.ok) if self.ok else float("nan")

    @property
    def p95_latency_ms(self) -> float:
        lat = sorted(r.latency_s for r in self.ok)
        return 1000 * lat[min(len(lat) - 1, int(0.95 * len(lat)))] if lat else float("nan")

    @property
    def per_deployment(self) -> Counter[str]:
        return Counter(r.deployment for r in self.ok)

    @property
    def failures(self) -> int:
        return sum(1 for r in self.results if r.status != 200)


async def _one(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any],
               stream: bool) -> tuple[Result, str]:
    t0 = time.perf_counter()
    if not stream:
        r = await client.post(url, json=body, headers=headers)
        dt = time.perf_counter() - t0
        if r.status_code != 200:
            return Result(dt, 0, 0, "", r.status_code), ""
        data = r.json()
        usage = data.get("usage") or {}
        cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
        text = data["choices"][0]["message"].get("content") or ""
        return Result(dt, usage.get("prompt_tokens", 0), cached, r.headers.get("x-litellm-model-id", ""), 200), text
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    text_parts: list[str] = []
    usage = {}
    dep = ""
    import json

    async with client.stream("POST", url, json=body, headers=headers) as r:
        dep = r.headers.get("x-litellm-model-id", "")
        if r.status_code != 200:
            await r.aread()
            return Result(time.perf_counter() - t0, 0, 0, dep, r.status_code), ""
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for ch in chunk.get("choices") or []:
                text_parts.append((ch.get("delta") or {}).get("content") or "")
            if chunk.get("usage"):
                usage = chunk["usage"]
    dt = time.perf_counter() - t0
    cached = ((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0
    return Result(dt, usage.get("prompt_tokens", 0), cached, dep, 200), "".join(text_parts)


async def run_workload(proxy_url: str | list[str], api_key: str, model: str, conversations: list[Conversation], *,
                       label: str, concurrency: int = 4, stream: bool = False, tools: bool = False,
                       max_tokens: int = 12, seed: int = 11) -> RunStats:
    """Send every conversation turn by turn (turns of different conversations interleave).

    With several proxy URLs, consecutive requests go to the proxies in turn (a fleet of proxies)."""
    for c in conversations:
        c.history = [{"role": "system", "content": c.system}]
    urls = [f"{u}/v1/chat/completions" for u in ([proxy_url] if isinstance(proxy_url, str) else proxy_url)]
    sent = 0
    headers = {"Authorization": f"Bearer {api_key}"}
    sem = asyncio.Semaphore(concurrency)
    results: list[Result] = []
    rng = random.Random(seed)
    turns = max(len(c.user_turns) for c in conversations)
    async with httpx.AsyncClient(timeout=120) as client:
        async def step(c: Conversation, t: int) -> None:
            c.history.append({"role": "user", "content": c.user_turns[t]})
            body: dict[str, Any] = {"model": model, "messages": list(c.history), "max_tokens": max_tokens,
                                    "temperature": 0}
            if tools:
                body["tools"] = TOOLS
                body["tool_choice"] = "none"
            nonlocal sent
            url = urls[sent % len(urls)]
            sent += 1
            async with sem:
                res, text = await _one(client, url, headers, body, stream)
            results.append(res)
            c.history.append({"role": "assistant", "content": text or "ok"})

        for t in range(turns):
            order = [c for c in conversations if t < len(c.user_turns)]
            rng.shuffle(order)
            await asyncio.gather(*(step(c, t) for c in order))
    return RunStats(label, results)


def format_table(rows: list[RunStats], replicas: dict[str, str] | None = None) -> str:
    """A plain-text comparison table (cached ratio, latency, requests per replica)."""
    names = replicas or {}
    lines = [f"{'routing':<28} {'cached/prompt':>13} {'mean ms':>9} {'p95 ms':>9} {'failed':>7}  requests per replica"]
    for s in rows:
        per = ", ".join(f"{names.get(k, k)}={v}" for k, v in sorted(s.per_deployment.items()))
        lines.append(f"{s.label:<28} {s.cached_ratio:>13.3f} {s.mean_latency_ms:>9.1f} {s.p95_latency_ms:>9.1f} "
                     f"{s.failures:>7}  {per}")
    return "\n".join(lines)
