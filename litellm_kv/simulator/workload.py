"""Workloads for the replay simulator: Mooncake traces and synthetic generators.

A request is described by its prompt's *full-block ids*: prefix-chained 64-bit ids, one per
``block_size`` tokens, equal exactly when the prompt prefixes up to that block are equal (the
property vLLM's chained block hashes have). Token ids are never materialised per token: the
simulator and every strategy work on block ids, and the KV events carry deterministic tokens
derived from them.

Mooncake traces give one id per 512-token block, already prefix-chained; block ``j`` of trace
block ``h`` becomes the id ``(h + 1) << 6 | j`` (512 / block_size ≤ 64 sub-blocks), which keeps
the chaining. Generated workloads chain their own ids with a 64-bit mix.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

TRACE_BLOCK = 512
_MASK = (1 << 64) - 1


def mix(parent: int, value: int) -> int:
    """A 64-bit chained id (splitmix64 finaliser over parent and value)."""
    z = (parent * 0x9E3779B97F4A7C15 + value + 0x632BE59BD9B4E019) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


@dataclass(slots=True)
class SimRequest:
    rid: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    blocks: list[int]  # full-block ids of the prompt (len == prompt_tokens // block_size)
    session: str = ""  # conversation / caller id (LiteLLM session affinity keys on it)
    # Ids of the full blocks the answer completes, when a later prompt repeats them (chats);
    # empty: the generated blocks are unique.
    output_blocks: list[int] = field(default_factory=list)


def _check_block_size(block_size: int) -> None:
    if block_size <= 0 or TRACE_BLOCK % block_size or TRACE_BLOCK // block_size > 64:
        raise ValueError(f"block size {block_size} must divide {TRACE_BLOCK} into at most 64 parts")


def load_mooncake(path: str | Path, block_size: int = 16, limit: int | None = None,
                  speed: float = 1.0) -> list[SimRequest]:
    """Read a Mooncake FAST'25 trace (JSON lines: timestamp ms, input_length, output_length,
    hash_ids). ``speed`` > 1 compresses time (a higher request rate over the same requests).
    The session is the first block after the trace-wide shared block (the conversation root)."""
    _check_block_size(block_size)
    per = TRACE_BLOCK // block_size
    out: list[SimRequest] = []
    with open(path) as fh:
        for i, line in enumerate(fh):
            if limit is not None and i >= limit:
                break
            row = json.loads(line)
            length = int(row["input_length"])
            ids: list[int] = row["hash_ids"]
            n_full = length // block_size
            blocks = [((h + 1) << 6) | j for h in ids for j in range(per)][:n_full]
            session = str(ids[1] if len(ids) > 1 else ids[0])
            out.append(SimRequest(i, row["timestamp"] / 1000.0 / speed, length,
                                  max(1, int(row["output_length"])), blocks, session))
    return out


def _chain(root: int, n_blocks: int, start: int = 0, parent: int | None = None) -> list[int]:
    ids = []
    # Both matter when both are given: the parent places the chain after a shared head, the root makes
    # this request's tail its own (without it, every request after the same head repeated one tail).
    p = root if parent is None else mix(parent, root)
    for j in range(n_blocks):
        p = mix(p, start + j)
        ids.append(p)
    return ids


def _poisson_times(rng: random.Random, n: int, rate: float) -> Iterator[float]:
    t = 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        yield t


def shared_prefix(groups: int = 16, prompts_per_group: int = 32, system_len: int = 6000,
                  question_len: int = 1200, output_len: int = 200, rate: float = 4.0,
                  block_size: int = 16, seed: int = 0) -> list[SimRequest]:
    """llm-d's shape: ``groups`` long system prompts, each followed by distinct questions,
    requests of all groups interleaved at random."""
    rng = random.Random(seed)
    order = [(g, q) for g in range(groups) for q in range(prompts_per_group)]
    rng.shuffle(order)
    out = []
    for i, ((g, q), t) in enumerate(zip(order, _poisson_times(rng, len(order), rate), strict=True)):
        sys_blocks = _chain(mix(seed, 1000 + g), system_len // block_size)
        total = system_len + question_len
        tail = _chain(mix(seed, 10_000_000 + g * 100_000 + q), total // block_size - len(sys_blocks),
                      parent=sys_blocks[-1] if sys_blocks else None)
        out.append(SimRequest(i, t, total, output_len, sys_blocks + tail, f"g{g}q{q}"))
    return out


def multi_turn(sessions: int = 64, turns: int = 6, system_len: int = 2000, user_len: int = 300,
               output_len: int = 300, think_s: float = 20.0, rate: float = 2.0, block_size: int = 16,
               shared_system: bool = True, seed: int = 0) -> list[SimRequest]:
    """Chats: each turn's prompt is the previous prompt + the previous answer + a new user
    message. Sessions start as a Poisson stream; turns follow after exponential think times
    (the in-flight count of a session is zero between turns)."""
    rng = random.Random(seed)
    out: list[SimRequest] = []
    starts = list(_poisson_times(rng, sessions, rate))
    for s, t0 in enumerate(starts):
        root = mix(seed, 7 if shared_system else 100 + s)
        # Token stream identity: a chat is one growing sequence of chained blocks.
        chain_root = mix(root, 31 * s + 1)
        length = system_len + user_len
        t = t0
        for _turn in range(turns):
            n_sys = system_len // block_size
            sys_blocks = _chain(root, n_sys)
            rest = _chain(chain_root, (length + output_len) // block_size - n_sys, start=n_sys,
                          parent=mix(sys_blocks[-1] if sys_blocks else root, s))
            full = sys_blocks + rest
            n_prompt = length // block_size
            out.append(SimRequest(0, t, length, output_len, full[:n_prompt], f"s{s}",
                                  full[n_prompt:]))
            length += output_len + user_len
            t += rng.expovariate(1.0 / think_s) + output_len * 0.02
    out.sort(key=lambda r: r.arrival_s)
    for i, r in enumerate(out):
        r.rid = i
    return out


def agent_fanout(tasks: int = 40, fanout: int = 8, context_len: int = 8000, sub_len: int = 400,
                 output_len: int = 150, rate: float = 1.0, burst_s: float = 0.05, block_size: int = 16,
                 seed: int = 0) -> list[SimRequest]:
    """Agent sub-calls: each task sends ``fanout`` requests sharing a long fresh context within
    ``burst_s`` (sibling bursts: the context is nowhere cached when the burst is routed)."""
    rng = random.Random(seed)
    out = []
    for k, t0 in enumerate(_poisson_times(rng, tasks, rate)):
        ctx = _chain(mix(seed, 50_000 + k), context_len // block_size)
        for f in range(fanout):
            total = context_len + sub_len
            tail = _chain(mix(seed, 900_000 + k * 64 + f), total // block_size - len(ctx), parent=ctx[-1])
            out.append(SimRequest(0, t0 + rng.uniform(0, burst_s), total, output_len, ctx + tail, f"a{k}"))
    out.sort(key=lambda r: r.arrival_s)
    for i, r in enumerate(out):
        r.rid = i
    return out


def unique_prompts(n: int = 400, prompt_len: int = 3000, output_len: int = 200, rate: float = 4.0,
                   block_size: int = 16, seed: int = 0) -> list[SimRequest]:
    """No shared prefixes at all: any cache-aware policy can only lose here."""
    rng = random.Random(seed)
    return [SimRequest(i, t, prompt_len, output_len, _chain(mix(seed, 3_000_000 + i), prompt_len // block_size),
                       f"u{i}")
            for i, t in enumerate(_poisson_times(rng, n, rate))]


def hot_prefix(n: int = 600, prefixes: int = 20, zipf_s: float = 1.3, prefix_len: int = 4000,
               suffix_len: int = 300, output_len: int = 150, rate: float = 6.0, block_size: int = 16,
               seed: int = 0) -> list[SimRequest]:
    """Skewed reuse: prefix k is drawn with probability ∝ 1/(k+1)^s (one very hot prefix)."""
    rng = random.Random(seed)
    weights = [1.0 / (k + 1) ** zipf_s for k in range(prefixes)]
    out = []
    for i, t in enumerate(_poisson_times(rng, n, rate)):
        k = rng.choices(range(prefixes), weights)[0]
        pre = _chain(mix(seed, 4_000 + k), prefix_len // block_size)
        total = prefix_len + suffix_len
        tail = _chain(mix(seed, 5_000_000 + i), total // block_size - len(pre), parent=pre[-1])
        out.append(SimRequest(i, t, total, output_len, pre + tail, f"h{i}"))
    return out


GENERATORS: dict[str, Callable[..., list[SimRequest]]] = {
    "shared-prefix": shared_prefix,
    "multi-turn": multi_turn,
    "agent-fanout": agent_fanout,
    "unique": unique_prompts,
    "hot-prefix": hot_prefix,
}


def scale_rate(requests: list[SimRequest], factor: float) -> list[SimRequest]:
    """The same requests arriving ``factor`` times faster."""
    return [SimRequest(r.rid, r.arrival_s / factor, r.prompt_tokens, r.output_tokens, r.blocks, r.session,
                       r.output_blocks) for r in requests]
