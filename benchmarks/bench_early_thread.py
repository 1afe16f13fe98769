"""Could a routing decision's early work escape the event loop in a thread? Its latency while the loop thread runs.

    .venv/bin/python benchmarks/bench_early_thread.py [--tokens 8192] [--trials 30] [--busy-ms 15]

The early lookup (``routing/early_lookup.py``) runs on the event loop, so its steps wait while LiteLLM's own work
before the routing hook holds the loop (docs/performance.md, 2026-12-08). The alternative is a thread of its own
that encodes the prompt, hashes it and makes the Redis round trip. This measures how long that thread takes from
its start to each step's end: encode (the local tokenizer, the test model's), hash (a memo-less
``BlockHasher``), and one round trip to a real ``redis-server`` started here. It is measured in two conditions,
alternating, each ``--trials`` times: the main thread idle (the baseline), and the main thread running pure Python
for ``--busy-ms`` (what LiteLLM's pre-hook work is to such a thread). It prints the median and max of each, and
the busy/idle ratio. A last block repeats the busy case with a 1 ms switch interval instead of CPython's 5 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from litellm_kv.vllm.hashing import BlockHasher
from litellm_kv.vllm.tokenization import LocalChatTokenizer
from tools.harness.engines import ensure_model
from tools.harness.redis_server import RedisServer

STEPS = ("encode", "hash", "round trip")


def busy(ms: float) -> None:
    """Pure Python for ``ms`` milliseconds: the loop thread running LiteLLM's code holds the GIL like this."""
    end = time.perf_counter() + ms / 1000
    x = 0
    while time.perf_counter() < end:
        x += sum(i * i for i in range(50))


def trial(tok: LocalChatTokenizer, client: Any, text: str, busy_ms: float) -> dict[str, float]:
    """One thread's encode → hash → round trip, each step's end in ms from the thread's start."""
    out: dict[str, float] = {}
    t0 = time.perf_counter()

    def work() -> None:
        ids = list(tok.encode_segment(text))
        out["encode"] = (time.perf_counter() - t0) * 1000
        hashes = BlockHasher("sha256", 16).wire_hashes(ids)
        out["hash"] = (time.perf_counter() - t0) * 1000
        client.eval("return #ARGV", 0, *hashes[:64])
        out["round trip"] = (time.perf_counter() - t0) * 1000
        out["tokens"] = len(ids)

    th = threading.Thread(target=work)
    th.start()
    if busy_ms:
        busy(busy_ms)
    th.join()
    return out


def text_of(tokens: int, n: int) -> str:
    """A prompt of about ``tokens`` tokens that the tokenizer has never seen (no memo helps)."""
    return " ".join(f"w{n:05d}x{j} some words here" for j in range(tokens // 13))


def summary(rows: list[dict[str, float]]) -> dict[str, tuple[float, float]]:
    return {s: (statistics.median(r[s] for r in rows), max(r[s] for r in rows)) for s in STEPS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--trials", type=int, default=30, help="per condition and round")
    ap.add_argument("--rounds", type=int, default=2, help="idle/busy rounds, alternating")
    ap.add_argument("--busy-ms", type=float, default=15.0)
    args = ap.parse_args()

    tok = LocalChatTokenizer(str(ensure_model()))
    server = RedisServer(name="redis-bench-early-thread")
    try:
        client = redis.Redis.from_url(server.url)
        client.ping()
        n = 0
        results: dict[str, list[dict[str, float]]] = {"idle": [], "busy": []}
        for rnd in range(args.rounds):
            for cond in ("idle", "busy"):
                rows = []
                for _ in range(args.trials):
                    n += 1
                    rows.append(trial(tok, client, text_of(args.tokens, n), args.busy_ms if cond == "busy" else 0))
                results[cond] += rows
                s = summary(rows)
                print(f"round {rnd} {cond:5}  tokens {int(rows[0]['tokens'])}  " + "  ".join(
                    f"{k} {v[0]:.2f} (max {v[1]:.2f})" for k, v in s.items()), flush=True)
        old = sys.getswitchinterval()
        sys.setswitchinterval(0.001)
        try:
            fast = []
            for _ in range(args.trials):
                n += 1
                fast.append(trial(tok, client, text_of(args.tokens, n), args.busy_ms))
        finally:
            sys.setswitchinterval(old)
        idle, busy_rows = summary(results["idle"]), summary(results["busy"])
        fast_s = summary(fast)
        print(f"\nms from the thread's start, median (max) over {len(results['idle'])} trials per condition; "
              f"main thread busy for {args.busy_ms:g} ms in 'busy':")
        print(f"{'step ends':12} {'idle':>16} {'busy':>16} {'busy/idle':>10} {'busy, 1 ms switch':>20}")
        for k in STEPS:
            print(f"{k:12} {idle[k][0]:8.2f} ({idle[k][1]:5.2f}) {busy_rows[k][0]:8.2f} ({busy_rows[k][1]:5.2f}) "
                  f"{busy_rows[k][0] / idle[k][0]:10.2f} {fast_s[k][0]:12.2f} ({fast_s[k][1]:5.2f})")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
