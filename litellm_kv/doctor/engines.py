"""Checks of one KV-routed group's engines through their HTTP API and event streams.

The group is brought up exactly as the proxy brings it up (:class:`~litellm_kv.routing.group.KVGroup`:
scrape ``/metrics``, discover ``/kv_event_sources``, subscribe, verify the local tokenizer), on an index of
the doctor's own in memory, so what it reports is what the proxy's ``/litellm-kv/health`` would say. Then a
probe conversation (a fresh random prefix) is sent to each replica twice: the first answer shows whether
``usage.prompt_tokens_details`` is reported and makes the engine announce blocks on its event stream
(every announced hash is recomputed); the prediction litellm-kv makes for the second is compared with the
``cached_tokens`` the engine reports for it.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from typing import Any

from litellm_kv.doctor.deployment import KVGroupPlan, doctor_options, served_model
from litellm_kv.doctor.report import Report, Status
from litellm_kv.index.memory import InMemoryIndex
from litellm_kv.routing.fleet import ReplicaState, replica_id
from litellm_kv.routing.group import ChatRequest, KVGroup
from litellm_kv.vllm.engine import EngineClient, EngineError
from litellm_kv.vllm.hashing import BlockHasher
from litellm_kv.vllm.subscriber import ReplicaSubscribers

FIX_EVENTS = ("start vLLM with --kv-events-config '{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", "
              "\"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\"}' (docs/engine.md)")
FIX_PREFIX = "start vLLM with --enable-prefix-caching (on by default in the V1 engine unless turned off)"
FIX_DETAILS = ("start vLLM with --enable-prompt-tokens-details (litellm-kv compares its predictions with "
               "usage.prompt_tokens_details.cached_tokens)")


def probe_messages(block_size: int) -> list[dict[str, Any]]:
    """A conversation no cache holds yet (random words up front), long enough for at least two full blocks."""
    words = [secrets.token_hex(3) for _ in range(max(block_size, 16))]
    return [{"role": "user", "content": "litellm-kv doctor probe " + " ".join(words)}]


class GroupCheck:
    """Runs the checks of one group; findings go into ``report``."""

    def __init__(self, plan: KVGroupPlan, report: Report, *, timeout_s: float = 20.0) -> None:
        self.plan = plan
        self.report = report
        self.timeout_s = timeout_s
        self.group = KVGroup(plan.name, doctor_options(plan.options), InMemoryIndex(), None, True, "memory",
                             members=lambda: plan.deployments)

    async def run(self) -> None:
        try:
            await self.group.sync(self.plan.deployments)
            for d in self.plan.deployments:
                rid = replica_id(d["litellm_params"]["api_base"])
                self.report.section(f"group {self.plan.name}, replica {rid}")
                await self._replica(d, self.group.fleet.replicas[rid])
            self.report.section(f"group {self.plan.name}")
            self._group_findings()
        finally:
            await self.group.stop()

    # -- one replica -------------------------------------------------------------------------------
    async def _replica(self, deployment: dict[str, Any], st: ReplicaState) -> None:
        add = self.report.add
        target = f"{self.plan.name}/{st.replica}"
        if not st.reachable:
            add("engine.reachable", target, Status.ERROR, st.error,
                "check the deployment's api_base and that the vLLM server is running and reachable from here")
            return
        add("engine.reachable", target, Status.OK, f"{st.api_base}/metrics answers")
        if st.block_size is None or st.hash_algo is None:
            add("engine.cache_config", target, Status.ERROR, "/metrics has no vllm:cache_config_info",
                "run a vLLM with the V1 engine (0.10 or later); litellm-kv reads block size and hash algorithm there")
        else:
            self._cache_config(target, st.block_size, st.hash_algo)
        if st.prefix_caching is False:
            add("engine.prefix_caching", target, Status.ERROR, "prefix caching is off (enable_prefix_caching=False)",
                FIX_PREFIX)
        elif st.prefix_caching:
            add("engine.prefix_caching", target, Status.OK, "on")
        params = deployment["litellm_params"]
        probe_client = EngineClient(st.api_base, timeout=max(self.timeout_s, 5.0), api_key=params.get("api_key"),
                                    model=served_model(deployment))
        try:
            await self._events_and_probe(target, deployment, st, probe_client)
        finally:
            await probe_client.aclose()

    def _cache_config(self, target: str, block_size: int, algo: str) -> None:
        opts = self.plan.options
        wrong = []
        if opts.block_size is not None and opts.block_size != block_size:
            wrong.append(f"kv.block_size is {opts.block_size} but the engine uses {block_size}")
        if opts.hash_algo is not None and opts.hash_algo != algo:
            wrong.append(f"kv.hash_algo is {opts.hash_algo} but the engine uses {algo}")
        if wrong:
            self.report.add("engine.hash_settings", target, Status.ERROR, "; ".join(wrong),
                            "remove kv.block_size / kv.hash_algo from the litellm_kv section (they are read from "
                            "the engine) or make them match the engine's --block-size / --prefix-caching-hash-algo")
            return
        if not BlockHasher(algo=algo, block_size=block_size, hash_seed=opts.hash_seed).exact_possible:
            self.report.add("engine.hash_settings", target, Status.ERROR,
                            f"{algo} seeds its root hash randomly per engine process unless PYTHONHASHSEED is set",
                            "set PYTHONHASHSEED to the same value on every engine and kv.hash_seed to it, or use "
                            "--prefix-caching-hash-algo sha256")
            return
        self.report.add("engine.hash_settings", target, Status.OK,
                        f"block size {block_size}, {algo}: litellm-kv hashes with the same")

    async def _events_and_probe(self, target: str, deployment: dict[str, Any], st: ReplicaState,
                                client: EngineClient) -> None:
        add = self.report.add
        subs = st.subscriber if isinstance(st.subscriber, ReplicaSubscribers) else None
        if subs is None:
            # The proxy would not use this replica either: say why (no publisher, or discovery failed).
            try:
                sources = await client.kv_event_sources()
            except EngineError as exc:
                add("engine.kv_events", target, Status.ERROR, f"GET /kv_event_sources failed: {exc}",
                    "run vLLM 0.32 or later (it serves /kv_event_sources), or set model_info.litellm_kv."
                    "kv_events_endpoint on the deployment")
            else:
                add("engine.kv_events", target, Status.ERROR,
                    "KV events are off (GET /kv_event_sources lists no ZMQ publisher)" if not sources
                    else f"no event subscription: {st.error}", FIX_EVENTS)
        else:
            ranks = ", ".join(s.endpoint for s in subs.subscribers)
            add("engine.kv_events", target, Status.OK, f"publishing on {ranks}")
            if any(not s.replay_endpoint for s in subs.subscribers):
                add("engine.kv_replay", target, Status.WARN, "no replay endpoint: a lost batch purges the replica",
                    "add \"replay_endpoint\" to the engine's --kv-events-config")
            binds = bool(((deployment.get("model_info") or {}).get("litellm_kv") or {}).get("bind"))
            if await _until(lambda: all(s.stats.connected for s in subs.subscribers), self.timeout_s):
                add("events.stream", target, Status.OK, "subscribed")
            elif binds:
                # The engine's publisher connects to one subscriber that binds: a running proxy holds the address.
                add("events.stream", target, Status.WARN,
                    f"could not bind {ranks} (model_info.litellm_kv.bind): a running proxy probably holds it",
                    "read this replica's subscriber in the proxy's GET /litellm-kv/health, or run the doctor "
                    "while the proxy is stopped")
                subs = None
            else:
                add("events.stream", target, Status.ERROR,
                    f"cannot connect to the event stream ({ranks}) within {self.timeout_s:.0f}s",
                    "the publisher endpoint must be reachable from the proxy and indexers (tcp://*:P on the engine "
                    "host, open port; ipc:// only on the same host)")
                subs = None
        stored_before = _blocks_stored(subs)
        messages = probe_messages(st.block_size or 16)
        try:
            first = await client.chat_usage(messages)
        except EngineError as exc:
            add("engine.probe", target, Status.ERROR, f"probe chat completion failed: {exc}",
                "check the deployment's model name and api_key against the engine")
            return
        details = first.get("prompt_tokens_details")
        if not isinstance(details, dict) or details.get("cached_tokens") is None:
            add("engine.prompt_tokens_details", target, Status.ERROR,
                "usage.prompt_tokens_details is missing from the engine's answer", FIX_DETAILS)
        else:
            add("engine.prompt_tokens_details", target, Status.OK, "usage.prompt_tokens_details.cached_tokens reported")
        if subs is None:
            add("routing.prediction", target, Status.SKIP, "no event stream: nothing to predict from")
            return
        if not await _until(lambda: _blocks_stored(subs) > stored_before, self.timeout_s):
            add("events.flow", target, Status.ERROR,
                f"the probe's blocks were not announced on the event stream within {self.timeout_s:.0f}s",
                FIX_PREFIX if st.prefix_caching is False else "check the engine's --kv-events-config topic and that "
                "its publisher is the one /kv_event_sources reports")
            return
        await _settled(subs)
        announced = _blocks_stored(subs) - stored_before
        add("events.flow", target, Status.OK, f"{announced} block(s) announced for the probe")
        checker = subs.checker
        if checker is not None and checker.stats.mismatched_blocks:
            add("events.hashes", target, Status.ERROR, checker.stats.last_mismatch,
                "the engines' hash settings differ from what litellm-kv uses (PYTHONHASHSEED/kv.hash_seed, "
                "--prefix-caching-hash-algo, --block-size)")
        elif checker is not None and checker.stats.checked_blocks:
            add("events.hashes", target, Status.OK,
                f"{checker.stats.checked_blocks} announced block hash(es) recomputed from their tokens: all equal")
        await self._prediction(target, st, client, messages)

    async def _prediction(self, target: str, st: ReplicaState, client: EngineClient,
                          messages: list[dict[str, Any]]) -> None:
        why = self.group.fleet.not_exact_why
        if why:
            self.report.add("routing.prediction", target, Status.SKIP, f"the group routes load-only ({why})")
            return
        deployment_model = str(next(d for d in self.plan.deployments
                                    if replica_id(d["litellm_params"]["api_base"]) == st.replica)
                               ["litellm_params"].get("model") or "")
        result = await self.group.decide(ChatRequest(messages=messages, model=deployment_model), [st.replica])
        predicted = result.predicted_hit_tokens
        try:
            second = await client.chat_usage(messages)
        except EngineError as exc:
            self.report.add("routing.prediction", target, Status.ERROR, f"second probe failed: {exc}")
            return
        cached = (second.get("prompt_tokens_details") or {}).get("cached_tokens")
        if cached is None:
            self.report.add("routing.prediction", target, Status.SKIP,
                            "the engine reports no cached_tokens to compare the prediction with", FIX_DETAILS)
        elif not result.exact:
            self.report.add("routing.prediction", target, Status.ERROR,
                            f"the decision fell back to load ({result.fallback_why}); engine cached {cached} tokens")
        elif int(cached) == predicted and predicted > 0:
            self.report.add("routing.prediction", target, Status.OK,
                            f"predicted {predicted} cached tokens of {result.prompt_tokens} "
                            f"({result.tokenizer} tokenizer); the engine reported {cached}")
        else:
            self.report.add("routing.prediction", target, Status.ERROR,
                            f"predicted {predicted} cached tokens, the engine reported {cached}",
                            "compare the tokenizer (kv.tokenizer_path must be the served model's) and the hash "
                            "settings; docs/troubleshooting.md")

    # -- the group -------------------------------------------------------------------------------------
    def _group_findings(self) -> None:
        name = self.plan.name
        why = self.group.fleet.not_exact_why
        if why:
            self.report.add("routing.exact", name, Status.ERROR,
                            f"the proxy would route this group by load only: {why}", "fix the replica errors above")
        else:
            ready = sum(1 for st in self.group.fleet.replicas.values() if st.ready)
            total = len(self.group.fleet.replicas)
            if ready < total:
                self.report.add("routing.exact", name, Status.WARN,
                                f"routes exactly over {ready} of {total} replica(s); the others still get requests, "
                                "with no cache credit", "fix the replica errors above")
            else:
                self.report.add("routing.exact", name, Status.OK, f"routes exactly over {ready} of {total} replica(s)")
        state = self.group.tokenizer_state
        opts = self.plan.options
        if state.startswith("local"):
            self.report.add("tokenizer", name, Status.OK, state)
        elif opts.tokenizer == "engine" or not opts.tokenizer_path:
            self.report.add("tokenizer", name, Status.WARN,
                            "prompts are tokenized by the engine's /tokenize: exact, one round trip per request",
                            "set kv.tokenizer_path to the served model's tokenizer directory for local tokenization")
        else:
            self.report.add("tokenizer", name, Status.ERROR if opts.tokenizer == "local" else Status.WARN,
                            f"kv.tokenizer_path {opts.tokenizer_path} is not used: {state}",
                            "point kv.tokenizer_path at the directory of the model the engines serve (its "
                            "tokenizer.json and chat template)")


def _blocks_stored(subs: ReplicaSubscribers | None) -> int:
    return sum(s.stats.blocks_stored for s in subs.subscribers) if subs is not None else 0


async def _settled(subs: ReplicaSubscribers) -> None:
    for s in subs.subscribers:
        await s.wait_settled(quiet_s=0.3, timeout_s=5.0)


async def _until(cond: Any, timeout_s: float, every_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(every_s)
