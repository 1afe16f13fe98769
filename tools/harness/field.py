"""Workloads from the field, open-loop and streamed, for the TTFT testbed (demo, benchmarks, tests).

Three shapes, each a list of :class:`FieldRequest` with a scheduled send time drawn from a Poisson
process at a set request rate (open loop: a request is sent at its time whether or not earlier
ones have finished; the only waits are a chat's next turn for its previous turn and an agent's
sub-calls for their lead call, as a real client would):

* ``chat`` (a): llm-d's capacity shape scaled to this machine: groups of users share a long system
  prompt, every user runs a multi-turn chat (each turn resends the history);
* ``fanout`` (b): agentic fan-out: each task has its own long context; a lead call reads it, then
  several sub-calls over the same context run in parallel;
* ``unique`` (c): the control: every prompt is new, so no routing can find a cache hit;
* ``images`` (d): image conversations for the vision-language testbed: each opens with its own image, and
  every later turn resends the history, image included.

Everything is deterministic for a seed, and assistant turns in a chat's history are fixed text (not
the engine's reply), so every routing strategy is sent exactly the same prompts. Sizes are in
tokens of the testbed model's tokenizer (:data:`TOKENS_PER_WORD` measured on it); exact token and
block counts come from :func:`distinct_blocks`.

:func:`run_open_loop` sends one workload through a proxy, streaming, and records per request the
time to the first content chunk (TTFT), the end-to-end latency, output and cached tokens and the
replica (``x-litellm-model-id``); :class:`OpenLoopStats` summarises a run (or several pooled).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import random
import re
import statistics
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

_SYLLABLES = ("ka", "lo", "mi", "ru", "te", "son", "var", "pel", "dor", "qui", "zen", "bra", "tho", "gli", "nex")
# Measured: 3.14 tokens per pseudo-word with the tiny/ttft tokenizer (tools/engine/build_model.py).
TOKENS_PER_WORD = 3.14
Messages = list[dict[str, Any]]


def _text(rng: random.Random, tokens: int) -> str:
    n = max(1, round(tokens / TOKENS_PER_WORD))
    return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n))


@dataclass(slots=True)
class FieldRequest:
    """One request of a workload: what to send, when, and what it must wait for."""

    rid: int
    at_s: float  # scheduled send time, seconds from the run's start
    messages: Messages
    session: str
    after: int | None = None  # rid of the request that must finish first (previous turn, lead call)


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    describe: str
    requests: list[FieldRequest]


def poisson_times(n: int, rate: float, rng: random.Random) -> list[float]:
    """``n`` arrival times of a Poisson process of ``rate`` per second, starting at 0."""
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


def chat_workload(*, groups: int = 4, users_per_group: int = 3, turns: int = 3, system_tokens: int = 2500,
                  user_tokens: int = 120, reply_tokens: int = 40, rate: float = 1.0, seed: int = 1) -> Workload:
    """(a) Groups of users sharing a long system prompt, multi-turn (llm-d's capacity shape, scaled).

    Each arrival goes to a user picked at random among those with turns left, so groups and users
    interleave as in llm-d's benchmark; a user's next turn also waits for the previous one."""
    rng = random.Random(seed)
    systems = [f"You are the assistant of team {g}. " + _text(rng, system_tokens) for g in range(groups)]
    users = [(g, u) for g in range(groups) for u in range(users_per_group)]
    history: dict[tuple[int, int], Messages] = {k: [{"role": "system", "content": systems[k[0]]}] for k in users}
    left = {k: turns for k in users}
    last: dict[tuple[int, int], int] = {}
    times = poisson_times(len(users) * turns, rate, rng)
    reqs: list[FieldRequest] = []
    for rid, at in enumerate(times):
        k = rng.choice([u for u in users if left[u] > 0])
        left[k] -= 1
        history[k].append({"role": "user", "content": _text(rng, user_tokens)})
        reqs.append(FieldRequest(rid, at, list(history[k]), f"g{k[0]}u{k[1]}", last.get(k)))
        history[k].append({"role": "assistant", "content": _text(rng, reply_tokens)})
        last[k] = rid
    return Workload("chat", f"(a) {groups} groups x {users_per_group} users sharing a {system_tokens}-token system "
                    f"prompt, {turns} turns of +{user_tokens} user +{reply_tokens} assistant tokens", reqs)


def fanout_workload(*, tasks: int = 6, fanout: int = 4, context_tokens: int = 4000, sub_tokens: int = 100,
                    rate: float = 1.0, seed: int = 2) -> Workload:
    """(b) Agentic fan-out: per task one lead call over a fresh long context, then ``fanout`` parallel
    sub-calls over the same context. Tasks arrive at ``rate / (1 + fanout)`` so requests average ``rate``."""
    rng = random.Random(seed)
    starts = poisson_times(tasks, rate / (1 + fanout), rng)
    reqs: list[FieldRequest] = []
    for t, at in enumerate(starts):
        ctx = {"role": "system", "content": f"Agent task {t}. Context follows. " + _text(rng, context_tokens)}
        lead = len(reqs)
        plan = {"role": "user", "content": "Plan the sub-tasks. " + _text(rng, sub_tokens)}
        reqs.append(FieldRequest(lead, at, [ctx, plan], f"task{t}"))
        for s in range(fanout):
            sub = {"role": "user", "content": f"Sub-task {s}: " + _text(rng, sub_tokens)}
            reqs.append(FieldRequest(len(reqs), at, [ctx, sub], f"task{t}", after=lead))
    return Workload("fanout", f"(b) {tasks} tasks: a lead call over a fresh {context_tokens}-token context, then "
                    f"{fanout} parallel sub-calls (+{sub_tokens} tokens each) over it", reqs)


def unique_workload(*, n: int = 16, prompt_tokens: int = 2500, rate: float = 1.0, seed: int = 3) -> Workload:
    """(c) The control: ``n`` unrelated prompts; no routing can find a hit."""
    rng = random.Random(seed)
    times = poisson_times(n, rate, rng)
    reqs = [FieldRequest(i, at, [{"role": "user", "content": f"Question {i}. " + _text(rng, prompt_tokens)}], f"u{i}")
            for i, at in enumerate(times)]
    return Workload("unique", f"(c) {n} unrelated {prompt_tokens}-token prompts", reqs)


def _png(w: int, h: int, rng: random.Random) -> bytes:
    """A PNG of ``w`` x ``h`` with a random colour and a few random pixels (distinct bytes per draw)."""
    import io

    from PIL import Image

    img = Image.new("RGB", (w, h), (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    for _ in range(20):
        img.putpixel((rng.randrange(w), rng.randrange(h)), (rng.randrange(256), rng.randrange(256), rng.randrange(256)))
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def image_chat_workload(*, conversations: int = 12, turns: int = 3, user_tokens: int = 60, reply_tokens: int = 30,
                        sizes: Sequence[tuple[int, int]] = ((784, 784), (896, 672), (640, 480)), rate: float = 1.0,
                        seed: int = 4) -> Workload:
    """(d) Image conversations (the vision-language testbed): each opens with its own image (inline PNG) and a
    question; every later turn resends the history, image included, and waits for the previous turn."""
    import base64

    rng = random.Random(seed)
    history: dict[int, Messages] = {}
    for c in range(conversations):
        w, h = sizes[c % len(sizes)]
        url = "data:image/png;base64," + base64.b64encode(_png(w, h, rng)).decode("ascii")
        question = {"type": "text", "text": f"Picture {c}. " + _text(rng, user_tokens)}
        history[c] = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, question]}]
    left = {c: turns for c in range(conversations)}
    last: dict[int, int] = {}
    reqs: list[FieldRequest] = []
    for rid, at in enumerate(poisson_times(conversations * turns, rate, rng)):
        c = rng.choice([k for k in left if left[k] > 0])
        left[c] -= 1
        if c in last:
            history[c].append({"role": "user", "content": _text(rng, user_tokens)})
        reqs.append(FieldRequest(rid, at, list(history[c]), f"img{c}", last.get(c)))
        history[c].append({"role": "assistant", "content": _text(rng, reply_tokens)})
        last[c] = rid
    return Workload("images", f"(d) {conversations} image conversations ({', '.join(f'{w}x{h}' for w, h in sizes)} "
                    f"PNGs), {turns} turns of +{user_tokens} user +{reply_tokens} assistant tokens, images resent",
                    reqs)


WORKLOADS = {"chat": chat_workload, "fanout": fanout_workload, "unique": unique_workload,
             "images": image_chat_workload}


def make(name: str, rate: float, seed: int | None = None, draw: int = 0, **sizes: Any) -> Workload:
    """One workload by name at ``rate`` requests per second (sizes: the generator's keyword arguments). ``draw``
    picks an independent draw of its arrivals and contents when no ``seed`` is given: draw 0 is the generator's
    default seed, draw ``i`` another fixed seed derived from it."""
    fn = WORKLOADS[name]
    kw: dict[str, Any] = dict(sizes)
    if seed is None and draw:
        seed = draw_seed(int(inspect.signature(fn).parameters["seed"].default), draw)
    if seed is not None:
        kw["seed"] = seed
    return fn(rate=rate, **kw)  # type: ignore[operator]


def draw_seed(seed: int, draw: int) -> int:
    """The seed of draw ``draw`` of a workload whose draw 0 is ``seed``."""
    return seed + 1009 * draw


# -- sending ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    rid: int
    status: int
    ttft_s: float = math.nan
    e2e_s: float = math.nan
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    deployment: str = ""
    sent_s: float = 0.0  # actual send time from the run's start
    headers: dict[str, str] = field(default_factory=dict)


async def _stream_one(client: httpx.AsyncClient, url: str, headers: dict[str, str], body: dict[str, Any],
                      rid: int, t_run: float) -> Outcome:
    t0 = time.perf_counter()
    out = Outcome(rid, 0, sent_s=t0 - t_run)
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            out.status = r.status_code
            out.deployment = r.headers.get("x-litellm-model-id", "")
            out.headers = {k: v for k, v in r.headers.items() if k.startswith("x-litellm-kv")}
            if r.status_code != 200:
                await r.aread()
                out.e2e_s = time.perf_counter() - t0
                return out
            usage: dict[str, Any] = {}
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if math.isnan(out.ttft_s):
                    for ch in chunk.get("choices") or []:
                        delta = ch.get("delta") or {}
                        if delta.get("content") or delta.get("reasoning_content"):
                            out.ttft_s = time.perf_counter() - t0
                            break
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except httpx.HTTPError:
        out.status = 0
    out.e2e_s = time.perf_counter() - t0
    if out.status == 200:
        out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        out.output_tokens = int(usage.get("completion_tokens") or 0)
        out.cached_tokens = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
        if math.isnan(out.ttft_s):  # no content at all (an immediate end): the first token is the end
            out.ttft_s = out.e2e_s
    return out


async def run_open_loop(proxy_url: str, api_key: str, model: str, workload: Workload, *, max_tokens: int = 32,
                        timeout_s: float = 300.0) -> OpenLoopRun:
    """Send ``workload`` open-loop (each request at its ``at_s``, or once its ``after`` is done), streamed."""
    url = f"{proxy_url}/v1/chat/completions"
    headers = {"Authorization": f"Bearer {api_key}"}
    reqs = workload.requests
    done = {r.rid: asyncio.Event() for r in reqs}
    outcomes: dict[int, Outcome] = {}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=timeout_s, limits=limits) as client:
        t_run = time.perf_counter()

        async def one(r: FieldRequest) -> None:
            try:
                delay = r.at_s - (time.perf_counter() - t_run)
                if delay > 0:
                    await asyncio.sleep(delay)
                if r.after is not None:
                    await done[r.after].wait()
                body = {"model": model, "messages": r.messages, "max_tokens": max_tokens, "temperature": 0,
                        "stream": True, "stream_options": {"include_usage": True}}
                outcomes[r.rid] = await _stream_one(client, url, headers, body, r.rid, t_run)
            finally:
                done[r.rid].set()

        await asyncio.gather(*(one(r) for r in reqs))
        wall = time.perf_counter() - t_run
    return OpenLoopRun(workload.name, model, [outcomes[r.rid] for r in reqs], wall)


# -- statistics ------------------------------------------------------------------------------------------


def quantile(xs: Sequence[float], q: float) -> float:
    """Nearest-rank quantile (``q`` in 0..1); NaN when empty."""
    s = sorted(xs)
    if not s:
        return math.nan
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@dataclass(slots=True)
class OpenLoopRun:
    """One run (or several pooled with ``+``) of one workload through one routing."""

    workload: str
    routing: str
    outcomes: list[Outcome]
    wall_s: float
    runs: int = 1

    def __add__(self, other: OpenLoopRun) -> OpenLoopRun:
        return OpenLoopRun(self.workload, self.routing, self.outcomes + other.outcomes, self.wall_s + other.wall_s,
                           self.runs + other.runs)

    @property
    def ok(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == 200]

    @property
    def failures(self) -> int:
        return len(self.outcomes) - len(self.ok)

    def ttft(self, q: float | None = None) -> float:
        """TTFT in seconds: the mean, or quantile ``q``."""
        xs = [o.ttft_s for o in self.ok]
        if not xs:
            return math.nan
        return statistics.fmean(xs) if q is None else quantile(xs, q)

    def e2e(self, q: float | None = None) -> float:
        xs = [o.e2e_s for o in self.ok]
        if not xs:
            return math.nan
        return statistics.fmean(xs) if q is None else quantile(xs, q)

    @property
    def output_tps(self) -> float:
        """Output tokens per second of wall time (summed over pooled runs)."""
        return sum(o.output_tokens for o in self.ok) / self.wall_s if self.wall_s else 0.0

    @property
    def cached_ratio(self) -> float:
        p = sum(o.prompt_tokens for o in self.ok)
        return sum(o.cached_tokens for o in self.ok) / p if p else 0.0

    @property
    def prompt_tokens_mean(self) -> float:
        return statistics.fmean(o.prompt_tokens for o in self.ok) if self.ok else math.nan

    def by_cached_share(self) -> dict[str, dict[str, float]]:
        """TTFT split by what the engine found cached: ``hit`` (at least half the prompt) and ``miss`` (less), so a
        routing's time can be traced to the requests computed in full and to those found cached."""
        out: dict[str, dict[str, float]] = {}
        for kind in ("hit", "miss"):
            xs = [o.ttft_s for o in self.ok if (2 * o.cached_tokens >= o.prompt_tokens > 0) == (kind == "hit")]
            if xs:
                out[kind] = {"n": len(xs), "ttft_mean_ms": round(1000 * statistics.fmean(xs), 1),
                             "ttft_p95_ms": round(1000 * quantile(xs, 0.95), 1)}
        return out

    def per_replica(self, names: dict[str, str] | None = None) -> dict[str, int]:
        n = names or {}
        return dict(sorted(Counter(n.get(o.deployment, o.deployment or "?") for o in self.ok).items()))

    def summary(self) -> dict[str, Any]:
        return {
            "workload": self.workload, "routing": self.routing, "runs": self.runs, "requests": len(self.outcomes),
            "failures": self.failures, "ttft_mean_ms": round(1000 * self.ttft(), 1),
            "ttft_p50_ms": round(1000 * self.ttft(0.5), 1), "ttft_p95_ms": round(1000 * self.ttft(0.95), 1),
            "e2e_mean_ms": round(1000 * self.e2e(), 1), "e2e_p95_ms": round(1000 * self.e2e(0.95), 1),
            "output_tok_s": round(self.output_tps, 1), "cached_ratio": round(self.cached_ratio, 4),
            "prompt_tokens_mean": round(self.prompt_tokens_mean, 0) if self.ok else None,
        }


def distinct_blocks(workload: Workload, chat_tokens: Any, hasher: Any) -> tuple[int, int, int]:
    """(distinct full blocks, mean prompt tokens, max prompt tokens) of a workload, exactly:
    ``chat_tokens(messages)`` renders and tokenizes as the engine does, ``hasher.block_hashes`` is vLLM's."""
    seen: set[bytes] = set()
    lengths = []
    for r in workload.requests:
        toks = chat_tokens(r.messages)
        lengths.append(len(toks))
        seen.update(hasher.block_hashes(toks))
    return len(seen), round(statistics.fmean(lengths)), max(lengths)


def prefix_group(session: str) -> str:
    """The requests that share a prompt prefix: a chat group's users share its system prompt (``g3u1`` -> ``g3``);
    a fan-out task, an image conversation and a unique prompt are their own."""
    m = re.fullmatch(r"(g\d+)u\d+", session)
    return m.group(1) if m else session


def placement(run: OpenLoopRun, wl: Workload, names: dict[str, str]) -> dict[str, Any]:
    """Where one run put each prefix group: the replica of its first request (groups per replica) and how many of
    its later requests went elsewhere (``away``)."""
    group = {r.rid: prefix_group(r.session) for r in wl.requests}
    first: dict[str, str] = {}
    away = 0
    for o in sorted(run.ok, key=lambda o: o.sent_s):
        g, rep = group.get(o.rid, "?"), names.get(o.deployment, o.deployment or "?")
        if g not in first:
            first[g] = rep
        elif first[g] != rep:
            away += 1
    return {"groups": dict(sorted(Counter(first.values()).items())), "away": away}
