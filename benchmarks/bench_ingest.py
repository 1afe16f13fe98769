"""KV-event ingest per indexer process: this checkout against a baseline commit, in the same run.

For payloads shaped like a busy vLLM engine's (msgpack ``KVEventBatch``: map events, 64-bit int hashes,
block size 16; each batch a 4-16-block ``BlockStored`` chain plus a few one-hash ``BlockRemoved``), prints
blocks/s (stored + removed hashes) of:

* **decode**: ``decode_event_batch`` alone;
* **memory**: decode + ``to_block_ops`` + ``InMemoryIndex.apply_sync`` (the embedded subscriber's work);
* **decode cpu** / **memory cpu**: the same per second of the process's own CPU time (``time.process_time``),
  which other jobs on a shared machine do not stretch (they still share its caches);
* **redis** / **cluster**: the indexer's own path without the socket: ``EventStream`` decoding, building the
  ops and applying them to a real ``redis-server`` / a real 3-master Redis Cluster (``tools/harness``), with
  its per-stream dedupe. The baseline applies one batch per round trip (its only way); this checkout sends
  the batches queued together (``--per-call`` of them: what a saturated stream finds on its socket) and,
  for comparison, one per call;
* **scaling**: 1, 2 and 4 indexer processes at once, each with its own replica stream (in the cluster, each
  its own model group), aggregate and per-process blocks/s;
* **bytes per block** in Redis and in the Redis Cluster (``used_memory`` summed over the masters), and the
  Redis CPU time per block (``INFO commandstats``), for sizing (docs/operations.md);
* the in-memory index's lookup speed and memory per (replica, block), against a naive dict baseline.

Each figure is measured ``--repeats`` times in separate processes (baseline and this checkout alternating);
the median is printed with the min-max spread. Decode and memory run both codes in one process, in
alternating chunks of 500 batches (``--passes`` passes over the payloads), so that both meet the same load
from other jobs on a shared machine; the baseline's modules are loaded from its tree by file (its own
``BlockOp`` too). Redis figures are one pass per process, baseline and this checkout one after the other.
The baseline is ``--baseline`` (a git commit; its ``litellm_kv`` is extracted with ``git archive``);
``--baseline none`` skips it.

    .venv/bin/python benchmarks/bench_ingest.py [--repeats 3] [--baseline e53cfb2] [--quick]

Needs ``redis-server`` and ``redis-cli`` on PATH (private servers on free loopback ports, stopped at the end).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parents[1]
if "--worker" not in sys.argv:  # a worker imports the tree it is given (PYTHONPATH), this checkout or the baseline
    sys.path.insert(0, str(ROOT))

BS = 16  # tokens per block (vLLM's GPU default)
DEFAULT_BASELINE = "e53cfb2"  # main before the ingest work (msgpack decoding, one HGET/HSET/SADD per hash)


# -- workload -------------------------------------------------------------------------------------------


def make_batches(seed: int, n: int, block_size: int = BS) -> tuple[list[bytes], int]:
    """Batches like a busy engine's: a 4-16-block BlockStored chain plus a few 1-hash removals."""
    rng = random.Random(seed)
    payloads: list[bytes] = []
    live: list[int] = []
    blocks = 0
    parent = None
    for _ in range(n):
        events: list[dict[str, Any]] = []
        k = rng.randint(4, 16)
        hashes = [rng.getrandbits(64) for _ in range(k)]
        events.append({
            "type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": [rng.randrange(150_000) for _ in range(k * block_size)], "block_size": block_size,
            "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [None] * k, "group_idx": 0,
            "kv_cache_spec_kind": "full_attention",
        })
        parent = hashes[-1] if rng.random() < 0.7 else None
        live.extend(hashes)
        blocks += k
        for _ in range(rng.randint(0, k)):
            if live:
                h = live.pop(rng.randrange(len(live)))
                events.append({"type": "BlockRemoved", "block_hashes": [h], "medium": "GPU", "group_idx": 0})
                blocks += 1
        payloads.append(bytes(msgpack.packb([time.time(), events, 0])))
    return payloads, blocks


# -- worker: one process, one code tree -------------------------------------------------------------------


def _wait_until(t: float) -> None:
    while (d := t - time.time()) > 0:
        time.sleep(min(d, 0.05))


def run_worker(spec: dict[str, Any]) -> dict[str, Any]:
    payloads: list[bytes] = msgpack.unpackb(Path(spec["payloads"]).read_bytes())
    mode = spec["mode"]
    if mode == "cpu":
        return _cpu_worker(spec, payloads)
    return asyncio.run(_redis_worker(spec, payloads))


def _load(name: str, path: Path) -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


def _cpu_worker(spec: dict[str, Any], payloads: list[bytes]) -> dict[str, Any]:
    """Decode and decode + apply to the in-memory index, this checkout and the baseline in one process, in
    alternating chunks of batches: both meet the same load from other jobs."""
    from litellm_kv.index import memory
    from litellm_kv.vllm import events

    codes = {"new": (events.decode_event_batch, events.to_block_ops, memory.InMemoryIndex)}
    if spec.get("baseline"):
        tree = Path(spec["baseline"]) / "litellm_kv"
        base = _load("baseline_base", tree / "index" / "base.py")
        old_events = _load("baseline_events", tree / "vllm" / "events.py")
        old_events.BlockOp, old_events.tier_of_medium = base.BlockOp, base.tier_of_medium  # its own BlockOp
        old_memory = _load("baseline_memory", tree / "index" / "memory.py")
        codes["baseline"] = (old_events.decode_event_batch, old_events.to_block_ops, old_memory.InMemoryIndex)
    parts = ("decode", "memory", "decode cpu", "memory cpu")
    spent = {(label, part): 0.0 for label in codes for part in parts}
    chunk = 500
    clock, cpu = time.perf_counter, time.process_time
    for _ in range(spec["passes"]):
        indexes = {label: c[2]() for label, c in codes.items()}
        for i in range(0, len(payloads), chunk):
            part_payloads = payloads[i : i + chunk]
            for label, (decode, to_ops, _cls) in codes.items():
                t0, c0 = clock(), cpu()
                for p in part_payloads:
                    decode(p, keep_valid=True)
                t1, c1 = clock(), cpu()
                idx = indexes[label]
                for p in part_payloads:
                    batch = decode(p, keep_valid=True)
                    idx.apply_sync("g", "r0", [op for ev in batch.events for op in to_ops(ev)])
                t2, c2 = clock(), cpu()
                for part, secs in zip(parts, (t1 - t0, t2 - t1, c1 - c0, c2 - c1), strict=True):
                    spent[(label, part)] += secs
    return {f"{label}/{part}": secs / spec["passes"] for (label, part), secs in spent.items()}


async def _redis_worker(spec: dict[str, Any], payloads: list[bytes]) -> dict[str, Any]:
    import zmq.asyncio

    from litellm_kv.index.redis import RedisIndex
    from litellm_kv.services.indexer.stream import EventStream

    target: Any = spec["url"]
    if spec.get("cluster_nodes"):
        from litellm_kv.config import RedisSettings

        target = RedisSettings(cluster_nodes=spec["cluster_nodes"])
    index = RedisIndex(target)
    ctx = zmq.asyncio.Context()
    name = spec["replica"]
    stream = EventStream(index, ctx, group=spec["group"], replica=name, stream=f"{name}#0",
                         endpoint="inproc://unused", replay_endpoint=None)
    await index.ping()
    await index.apply_batch(spec["group"], name, [])  # registers the group, loads the script
    batched = hasattr(stream, "_apply_many") and spec["per_call"] > 0
    _wait_until(spec["start_at"])
    w0, t0 = time.time(), time.perf_counter()
    if batched:
        per = spec["per_call"]
        items = [(seq, p, False) for seq, p in enumerate(payloads)]
        for i in range(0, len(items), per):
            await stream._apply_many(items[i : i + per])
    else:
        for seq, p in enumerate(payloads):
            await stream._apply(seq, p)  # type: ignore[attr-defined]  # the baseline's one-batch path
    secs = time.perf_counter() - t0
    w1 = time.time()
    ok = stream.stats.last_seq == len(payloads) - 1 and not stream.stats.gaps and not stream.stats.resyncs
    await index.close()
    ctx.term()
    return {"seconds": secs, "start": w0, "end": w1, "round_trips": index.round_trips, "ok": ok}


# -- the parent: trees, servers, repeats -------------------------------------------------------------------


def baseline_tree(ref: str, into: Path) -> Path | None:
    try:
        data = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "litellm_kv"], check=True,
                              capture_output=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"baseline {ref!r} not available ({exc}); this checkout only")
        return None
    subprocess.run(["tar", "-x", "-C", str(into)], input=data, check=True, timeout=60)
    return into


def spawn(tree: Path, spec: dict[str, Any]) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)], cwd=str(tree), env=env,
                            stdout=subprocess.PIPE, text=True)


def collect(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"worker failed ({proc.returncode})")
    return json.loads(out.strip().splitlines()[-1])


def run_one(tree: Path, spec: dict[str, Any]) -> dict[str, Any]:
    return collect(spawn(tree, {"start_at": 0, **spec}))


def fmt(rates: Sequence[float]) -> str:
    med = statistics.median(rates)
    return f"{med:>11,.0f}  ({min(rates):,.0f}-{max(rates):,.0f})"


def ratio(new: Sequence[float], old: Sequence[float]) -> str:
    return f"{statistics.median(new) / statistics.median(old):5.2f}x"


class Servers:
    def __init__(self) -> None:
        from tools.harness.redis_cluster import RedisClusterServers
        from tools.harness.redis_server import RedisServer

        self.single = RedisServer(name="bench-ingest-redis")
        self.cluster = RedisClusterServers(masters=3, replicas=0, name="bench-ingest-cluster")

    def target(self, kind: str) -> dict[str, Any]:
        if kind == "cluster":
            return {"url": None, "cluster_nodes": self.cluster.startup_nodes}
        return {"url": self.single.url}

    def flush(self) -> None:
        self.single.client().flushall()
        self.cluster.flushall()

    def resetstat(self, kind: str) -> None:
        for c in self._clients(kind):
            c.config_resetstat()

    def evalsha_usec(self, kind: str) -> float:
        total = 0.0
        for c in self._clients(kind):
            total += float(c.info("commandstats").get("cmdstat_evalsha", {}).get("usec", 0))
        return total

    def used_memory(self, kind: str) -> int:
        return sum(int(c.info("memory")["used_memory"]) for c in self._clients(kind))

    def _clients(self, kind: str) -> list[Any]:
        if kind == "cluster":
            return [n.client() for n in self.cluster.nodes if n.alive() and n.role() == "master"]
        return [self.single.client()]

    def stop(self) -> None:
        self.single.stop()
        self.cluster.stop()


def bench_rates(trees: dict[str, Path], args: argparse.Namespace, work: Path, servers: Servers) -> None:
    payloads, blocks = make_batches(1, args.batches)
    fast_file = work / "payloads-memory.msgpack"
    fast_file.write_bytes(msgpack.packb(payloads))
    rpayloads, rblocks = make_batches(2, args.redis_batches)
    redis_file = work / "payloads-redis.msgpack"
    redis_file.write_bytes(msgpack.packb(rpayloads))
    print(f"workload: {args.batches} batches, {blocks:,} block events (stored + removed) for decode/memory; "
          f"{args.redis_batches} batches, {rblocks:,} for Redis; block size {BS}")
    print(f"blocks/s per process, median of {args.repeats} processes (min-max); decode/memory: both codes in "
          f"one process, alternating; baseline {args.baseline}\n")
    rows: dict[str, dict[str, list[float]]] = {}

    def add(row: str, col: str, rate: float) -> None:
        rows.setdefault(row, {}).setdefault(col, []).append(rate)

    for _ in range(args.repeats):
        res = run_one(trees["new"], {"mode": "cpu", "payloads": str(fast_file), "passes": args.passes,
                                     "baseline": str(trees["baseline"]) if "baseline" in trees else None})
        for key, secs in res.items():
            label, part = key.split("/")
            add(part, label, blocks / secs)
    usec: dict[str, list[float]] = {}
    for kind in ("redis", "cluster"):
        for rep in range(args.repeats):
            cases = [(label, tree, 0) for label, tree in trees.items() if label == "baseline"]
            cases += [("new, 1/call", trees["new"], 1), ("new", trees["new"], args.per_call)]
            for label, tree, per in cases:
                servers.flush()
                servers.resetstat(kind)
                res = run_one(tree, {"mode": "redis", "payloads": str(redis_file), "group": "bench/model",
                                     "replica": f"r-{rep}", "per_call": per, **servers.target(kind)})
                if not res["ok"]:
                    raise RuntimeError(f"{kind} {label}: the stream did not apply every batch: {res}")
                add(kind, label, rblocks / res["seconds"])
                if label == "new":
                    usec.setdefault(kind, []).append(servers.evalsha_usec(kind) / rblocks)
    cols = [c for c in ("baseline", "new, 1/call", "new") if c in trees or c == "new, 1/call"]
    print(f"{'':10}" + "".join(f"{c:>32}" for c in cols) + ("    new/baseline" if "baseline" in trees else ""))
    for row, by in rows.items():
        line = f"{row:10}" + "".join(f"{fmt(by[c]) if c in by else '-':>32}" for c in cols)
        if "baseline" in by:
            line += f"    {ratio(by['new'], by['baseline'])}"
        print(line)
    for kind, xs in usec.items():
        print(f"Redis CPU in the apply script ({kind}, new, {args.per_call} batches/call): "
              f"{statistics.median(xs):.2f} us per block event (min-max {min(xs):.2f}-{max(xs):.2f})")


def bench_scaling(trees: dict[str, Path], args: argparse.Namespace, work: Path, servers: Servers) -> None:
    payloads, blocks = make_batches(3, args.redis_batches)
    f = work / "payloads-scaling.msgpack"
    f.write_bytes(msgpack.packb(payloads))
    print(f"\nscaling: P indexer processes at once (this checkout, {args.per_call} batches/call), each its own "
          f"stream of {blocks:,} block events; aggregate = all blocks / (last end - first start)")
    print(f"{'':10}{'P':>3}{'aggregate blocks/s':>30}{'per process':>30}")
    for kind in ("redis", "cluster"):
        for procs in (1, 2, 4):
            agg: list[float] = []
            per: list[float] = []
            for rep in range(args.repeats):
                servers.flush()
                start_at = time.time() + 3.0 + 0.5 * procs  # every worker imported and connected by then
                ps = [spawn(trees["new"], {
                    "mode": "redis", "payloads": str(f), "group": f"bench/model-{i}" if kind == "cluster"
                    else "bench/model", "replica": f"r{i}-{rep}", "per_call": args.per_call,
                    "start_at": start_at, **servers.target(kind)}) for i in range(procs)]
                res = [collect(p) for p in ps]
                if not all(r["ok"] for r in res):
                    raise RuntimeError(f"scaling {kind} x{procs}: a stream did not apply every batch")
                span = max(r["end"] for r in res) - min(r["start"] for r in res)
                agg.append(blocks * procs / span)
                per.extend(blocks / r["seconds"] for r in res)
            print(f"{kind:10}{procs:>3}{fmt(agg):>30}{fmt(per):>30}")


async def bench_bytes(servers: Servers, n: int) -> None:
    from litellm_kv.config import RedisSettings
    from litellm_kv.index.base import BlockOp, Tier
    from litellm_kv.index.redis import BatchOps, RedisIndex

    print(f"\nbytes per block: {n:,} distinct blocks on one replica, then the same blocks on a second replica")
    rng = random.Random(4)
    for kind in ("redis", "cluster"):
        servers.flush()
        target: Any = servers.single.url
        if kind == "cluster":
            target = RedisSettings(cluster_nodes=servers.cluster.startup_nodes)
        idx = RedisIndex(target)
        hashes = [rng.getrandbits(64) for _ in range(n)]
        await idx.apply_batch("bench/model", "warm", [])
        m0 = servers.used_memory(kind)
        for r in ("ra", "rb"):
            specs = [BatchOps([BlockOp(tuple(hashes[i : i + 16]), Tier.GPU, 1)]) for i in range(0, n, 16)]
            await idx.apply_batches("bench/model", r, specs)
            if r == "ra":
                m1 = servers.used_memory(kind)
        m2 = servers.used_memory(kind)
        chain = hashes[:512]  # an 8K-token prompt at block 16, held whole by both replicas
        servers.resetstat(kind)
        for _ in range(300):
            await idx.lookup("bench/model", chain)
        lookup_us = servers.evalsha_usec(kind) / 300
        await idx.close()
        print(f"  {kind:8} {(m1 - m0) / n:6.1f} bytes per (replica, block) entry;  "
              f"{(m2 - m1) / n:6.1f} per second replica on a block;  "
              f"lookup of a 512-block chain: {lookup_us:.0f} us of Redis CPU")


# -- in-memory lookup and memory (this checkout, in process) ----------------------------------------------


class NaiveIndex:
    """Per-hash dict of replica -> refcount; lookup walks each replica in Python."""

    def __init__(self) -> None:
        self.blocks: dict[int, dict[str, int]] = {}

    def apply(self, replica: str, ops: Sequence[Any]) -> None:
        for op in ops:
            for h in op.hashes:
                holders = self.blocks.setdefault(h, {})
                n = holders.get(replica, 0) + op.delta
                if n > 0:
                    holders[replica] = n
                else:
                    holders.pop(replica, None)

    def lookup(self, hashes: Sequence[int], replicas: Sequence[str]) -> dict[str, Any]:
        from litellm_kv.index.base import ReplicaMatch

        out = {}
        for r in replicas:
            n = 0
            for h in hashes:
                if r not in self.blocks.get(h, ()):
                    break
                n += 1
            if n:
                out[r] = ReplicaMatch(gpu=n)
        return out


def bench_lookup(rng: random.Random, replicas: int = 8, chain_len: int = 1000, noise: int = 20_000) -> None:
    from litellm_kv.index.base import BlockOp, Tier
    from litellm_kv.index.memory import InMemoryIndex

    chain = [rng.getrandbits(64) for _ in range(chain_len)]
    names = [f"r{i}" for i in range(replicas)]
    idx = InMemoryIndex()
    naive = NaiveIndex()
    for i, r in enumerate(names):
        held = chain[: chain_len * (i + 1) // replicas]
        other = [rng.getrandbits(64) for _ in range(noise)]
        for o in ([BlockOp(tuple(held), Tier.GPU, 1)], [BlockOp(tuple(other), Tier.GPU, 1)]):
            idx.apply_sync("g", r, o)
            naive.apply(r, o)
    assert idx.lookup_sync("g", chain) == naive.lookup(chain, names)

    def timed(fn: Any, n: int) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t) * 1e6)
        return sorted(out)

    fast = timed(lambda: idx.lookup_sync("g", chain), 2000)
    slow = timed(lambda: naive.lookup(chain, names), 300)
    miss = [rng.getrandbits(64) for _ in range(chain_len)]
    cold = timed(lambda: idx.lookup_sync("g", miss), 2000)

    def p(xs: list[float], q: float) -> float:
        return xs[int(q * (len(xs) - 1))]

    print(f"\nlookup: {chain_len}-block chain, {replicas} replicas holding 1/8..8/8 of it, {noise} other blocks each")
    print(f"  memory index  p50 {p(fast, .5):8.1f} us   p99 {p(fast, .99):8.1f} us")
    print(f"  naive         p50 {p(slow, .5):8.1f} us   p99 {p(slow, .99):8.1f} us   "
          f"naive/memory = {statistics.median(slow) / statistics.median(fast):.1f}x")
    print(f"  memory index, chain held nowhere: p50 {p(cold, .5):.1f} us")


def bench_memory(rng: random.Random, n: int = 200_000, replicas: int = 2) -> None:
    from litellm_kv.index.base import BlockOp, Tier
    from litellm_kv.index.memory import InMemoryIndex

    payload = bytes(msgpack.packb([[rng.getrandbits(64) for _ in range(n)]]))
    gc.collect()
    tracemalloc.start()
    hashes = msgpack.unpackb(payload)[0]  # fresh int objects, as decoding creates them
    base = tracemalloc.get_traced_memory()[0]
    idx = InMemoryIndex()
    for r in range(replicas):
        idx.apply_sync("g", f"r{r}", [BlockOp(tuple(hashes), Tier.GPU, 1)])
    del hashes
    gc.collect()
    used = tracemalloc.get_traced_memory()[0] - base
    naive = NaiveIndex()
    hashes2 = msgpack.unpackb(payload)[0]
    base2 = tracemalloc.get_traced_memory()[0]
    for r in range(replicas):
        naive.apply(f"r{r}", [BlockOp(tuple(hashes2), Tier.GPU, 1)])
    del hashes2
    gc.collect()
    used2 = tracemalloc.get_traced_memory()[0] - base2
    tracemalloc.stop()
    entries = n * replicas
    print(f"\nmemory: {n} distinct blocks on {replicas} replicas ({entries} entries)")
    print(f"  memory index {used / entries:6.1f} bytes per (replica, block)   "
          f"(hash object counted once, shared by replicas)")
    print(f"  naive        {used2 / entries:6.1f} bytes per (replica, block)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--batches", type=int, default=20_000, help="event batches for decode and memory")
    ap.add_argument("--redis-batches", type=int, default=4_000, help="event batches per Redis stream")
    ap.add_argument("--per-call", type=int, default=64, help="batches per apply call (this checkout)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2, help="decode/memory: passes over the payloads per process")
    ap.add_argument("--baseline", default=DEFAULT_BASELINE, help="git commit to compare with, or 'none'")
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat (a smoke run)")
    ap.add_argument("--only", choices=["rates", "scaling", "bytes", "memory-index"], help="one part only")
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(run_worker(json.loads(args.worker))))
        return
    if args.quick:
        args.batches, args.redis_batches, args.repeats = 2_000, 400, 1
    print(f"load before: {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
        work = Path(tmp)
        trees: dict[str, Path] = {}
        if args.baseline != "none":
            base = work / "baseline"
            base.mkdir()
            if baseline_tree(args.baseline, base) is not None:
                trees["baseline"] = base
        trees["new"] = ROOT
        needs_redis = args.only in (None, "rates", "scaling", "bytes")
        servers = Servers() if needs_redis else None
        try:
            if servers is not None and args.only in (None, "rates"):
                bench_rates(trees, args, work, servers)
            if servers is not None and args.only in (None, "scaling"):
                bench_scaling(trees, args, work, servers)
            if servers is not None and args.only in (None, "bytes"):
                asyncio.run(bench_bytes(servers, 16_000 if args.quick else 160_000))
        finally:
            if servers is not None:
                servers.stop()
    if args.only in (None, "memory-index"):
        rng = random.Random(42)
        bench_lookup(rng)
        bench_memory(rng)
    print(f"\nload after: {os.getloadavg()[0]:.2f} (1 min)")


if __name__ == "__main__":
    main()
