"""The runtime of one KV-routed model group, and its whole routing decision.

A :class:`KVGroup` holds what deciding for one group needs: the fleet of replicas (engine facts, load
gauges, exactness), the tokenizer (local once verified against the engine's ``/tokenize``, spot-checked
while it serves; else the engine's), the router-tracked load (in process, or shared through Redis) and
the :class:`~litellm_kv.routing.router.KVRouter`. :meth:`KVGroup.decide` takes a request as plain values
(:class:`ChatRequest`) and names every reason the prediction cannot be exact in the one
:class:`~litellm_kv.routing.router.RoutingResult` it returns.

Domain code: no LiteLLM imports. The adapter (``litellm_kv.integration.routing_hooks``) turns LiteLLM's
request into a :class:`ChatRequest`, hands in the router's deployment list, and applies the result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from litellm_kv.config import parse_section
from litellm_kv.index.base import KVIndex
from litellm_kv.observability import counter, gauge, histogram
from litellm_kv.redis_client import GuardLimits, RedisGuard, RedisTarget, RedisUse, connect
from litellm_kv.routing.cost import CostModel, CostSettings
from litellm_kv.routing.early_lookup import EarlyAnswer, EarlyLookups
from litellm_kv.routing.early_tokens import EarlyTokens
from litellm_kv.routing.fleet import Fleet
from litellm_kv.routing.load import InMemoryLoadTracker, LoadSettings, LoadTracker, RedisLoadTracker, TrackedLoad
from litellm_kv.routing.options import KVRoutingSettings
from litellm_kv.routing.router import DECISIONS, STAGE_SECONDS, EngineGauges, KVRouter, RoutingRequest, RoutingResult
from litellm_kv.routing.siblings import SiblingIndex, SiblingSettings
from litellm_kv.routing.ttft import EngineTimings, PredictionErrors, RateBook, TtftSettings
from litellm_kv.tasks import cancel_and_wait, spawn_held
from litellm_kv.vllm.engine import EngineClient
from litellm_kv.vllm.hashing import MMFeature
from litellm_kv.vllm.multimodal import (
    IdentifierUnavailable,
    ImageExpansionError,
    ImageItem,
    engine_identifier,
    expand_images,
)
from litellm_kv.vllm.tokenization import (
    CONTENT_FORMATS,
    VERIFY_SAMPLES,
    LocalChatTokenizer,
    PromptTooLong,
    TemplateError,
)

log = logging.getLogger("litellm_kv")

TOKENIZER_MISMATCH = counter(
    "tokenizer_mismatches", "Local tokenization differed from the engine's /tokenize (group switched to engine).",
    ["model_group"],
)
IMAGE_TOKEN_CHECKS = counter(
    "image_token_checks",
    "Image requests routed by cache whose response reported the engine's visual-token count, by outcome: "
    "exact (equal to the count the placeholders were expanded with) or mismatch. After "
    "image_mismatch_limit mismatches the group routes image requests by load (fallback multimodal_mismatch).",
    ["model_group", "outcome"],
)
#: The image placeholder token of the Qwen-VL chat templates (one per image; vLLM expands it).
IMAGE_PAD = "<|image_pad|>"
#: Visual-token mismatches after which a group stops routing image requests by cache.
IMAGE_MISMATCH_LIMIT = 3
#: Rendered prompts longer than this (characters; ~20 ms of encoding on a 2-core machine) are encoded in a worker
#: thread, so that one long prompt does not hold every other request the proxy is serving.
OFF_LOOP_CHARS = 200_000


class _ImagesNeedLocal(Exception):
    """An image request on a group without a verified local tokenizer."""

LOAD_ERRORS = counter(
    "load_store_errors",
    "Failures to read or write router-tracked load (shared mode: Redis unreachable); decisions then use "
    "this proxy's own counts and the scraped engine gauges, and failed writes are retried.",
    ["model_group"],
)

RATE_GAUGE = gauge(
    "replica_rate",
    "Rates the TTFT cost model uses per replica (learned from the engine's metrics and measured TTFTs; the "
    "kv.ttft defaults before): prefill_seconds_per_token, prefill_overhead_seconds, visual_seconds_per_token, "
    "decode_step_seconds, output_tokens, ttft_correction, ttft_offset_seconds.",
    ["model_group", "replica", "rate"],
)
# Signed seconds (measured − predicted). Exact quantiles of the latest errors: KVGroup.ttft_errors (health).
TTFT_ERROR = histogram(
    "ttft_prediction_error_seconds",
    "Measured time to first token (decision to first streamed content chunk, at the proxy) minus the TTFT "
    "predicted for the chosen replica, per streamed response. Exact quantiles of the latest 1,024: ttft_error on "
    "/litellm-kv/health.",
    ["model_group"],
    buckets=(-2.0, -0.5, -0.2, -0.1, -0.05, -0.02, -0.01, 0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 2.0),
)


@dataclass(slots=True, frozen=True)
class ChatRequest:
    """The facts of one chat request that decide its prompt tokens and block hashes, as plain values."""

    messages: Sequence[Mapping[str, Any]] | None  # None: not a chat request (routed by load)
    tools: Sequence[Mapping[str, Any]] | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)  # as the engine derives them
    add_generation_prompt: bool = True  # False when the client continues the final message
    model: str = ""  # the deployment's LiteLLM model string: its served name may be a LoRA adapter
    cache_salt: str | None = None
    has_unhashable_media: bool = False  # media whose engine identifiers or counts cannot be computed
    skip_prefix_cache: bool = False  # prompt_logprobs: the engine will not read the cache
    # Every image of the prompt, in order: the identifier set as its part's uuid and its visual tokens (the
    # count the vision limits checked). Rendered with the OpenAI content form and expanded in place.
    images: Sequence[ImageItem] = ()
    mm_processor_kwargs: Mapping[str, Any] | None = None  # as the engine gets them (they key its identifiers)


def _raw_reply(reply: Any) -> Any:
    return reply


def _no_members() -> list[dict[str, Any]]:
    return []


class KVGroup:
    """Runtime of one KV-routed model group."""

    def __init__(self, name: str, options: KVRoutingSettings, index: KVIndex, redis: str | RedisTarget | None,
                 embedded: bool, backend: str, *,
                 members: Callable[[], list[dict[str, Any]]] = _no_members,
                 redis_limits: GuardLimits | None = None) -> None:
        """``members`` returns the group's deployments as the LiteLLM router lists them now (followed every
        ``discovery_interval_s``, so a config reload adds and removes replicas). ``redis_limits``: deadline
        and circuit breaker of the shared load store's calls (shared mode)."""
        self.name = name
        self.options = options
        self.fleet = Fleet(name, options, index, embedded=embedded)
        where = f"litellm_kv.model_groups.{name}.kv"
        cost_cfg = parse_section(CostSettings, options.cost, f"{where}.cost")
        sib = parse_section(SiblingSettings, options.siblings, f"{where}.siblings")
        load_cfg = parse_section(LoadSettings, options.load, f"{where}.load")
        ttft_cfg = parse_section(TtftSettings, options.ttft, f"{where}.ttft")
        # Learned whichever cost decides, so /litellm-kv/health shows the rates and a switch of cost_model
        # starts calibrated.
        self.rates = RateBook(ttft_cfg)
        self.ttft_errors = PredictionErrors()  # measured minus predicted TTFT, exactly, for /litellm-kv/health
        self.fleet.on_timings = self._timings
        model = CostModel(cost_cfg, ttft=ttft_cfg if options.cost_model == "ttft" else None)
        self.router = KVRouter(name, index, model, SiblingIndex(sib.ttl_s, sib.max_entries), backend=backend,
                               rates=self.rates, followed=not options.shadow)
        self.fleet.on_purge = self.router.siblings.forget
        self.load: LoadTracker
        if embedded:
            self.load = InMemoryLoadTracker(load_cfg)
        else:
            if redis is None:
                raise ValueError(f"group {name}: shared load needs a Redis (litellm_kv.redis or redis_url)")
            client = connect(redis, RedisUse.LOAD)
            guard = RedisGuard(RedisUse.LOAD, redis_limits, scope=name) if redis_limits is not None else None
            self.load = RedisLoadTracker(client, load_cfg, on_error=lambda _exc: LOAD_ERRORS.labels(name).inc(),
                                         guard=guard)
        self._members = members
        self._heartbeat: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.tokenizer: LocalChatTokenizer | None = None
        self.early: EarlyTokens | None = None  # the verified tokenizer's segments encoded before the decision
        self.lookups: EarlyLookups | None = None  # shared mode: round trips made before the decision
        self.litellm_model = ""  # the first deployment's LiteLLM model (what the early lookup hashes an adapter by)
        self.tokenizer_state = "engine"
        self.verify_pending = False  # verification of the local tokenizer could not run yet: retried
        self._candidate_tokenizer: LocalChatTokenizer | None = None
        self._spot_checks: set[asyncio.Task[None]] = set()
        self.deployment_ids: frozenset[str] = frozenset()
        self.sync_lock = asyncio.Lock()
        self.requests = 0
        # Image requests: the engine's visual-token counts compared with ours, and why image routing is off.
        self.image_mismatches = 0
        self.image_routing_off = ""

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.fleet.start()
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._membership()))
        if isinstance(self.load, RedisLoadTracker) and self._heartbeat is None:
            self._heartbeat = loop.create_task(self._beat(self.load, self.load.cfg.ttl_s / 3))

    async def _membership(self) -> None:
        """Follow the router's model list (deployments added or removed by a config reload)."""
        while True:
            await asyncio.sleep(self.options.discovery_interval_s)
            deps = self._members()
            if deps:
                try:
                    await self.sync(deps)
                    if self.verify_pending:  # no replica was ready to verify against, or it failed to answer
                        await self._verify_local_tokenizer()
                except Exception:
                    log.exception("litellm-kv: %s: membership sync failed", self.name)

    async def _beat(self, tracker: RedisLoadTracker, every: float) -> None:
        """Shared mode: renew this proxy's in-flight counts in Redis (a dead proxy's counts fade)."""
        while True:
            try:
                await tracker.heartbeat([self.name])
            except Exception:
                LOAD_ERRORS.labels(self.name).inc()
            await asyncio.sleep(every)

    async def stop(self) -> None:
        for task in [*self._tasks, self._heartbeat]:
            await cancel_and_wait(task, Exception)
        if isinstance(self.load, RedisLoadTracker):
            await self.load.close()
        await self.fleet.stop()

    async def sync(self, deployments: list[dict[str, Any]]) -> None:
        ids = frozenset(str((d.get("model_info") or {}).get("id")) for d in deployments)
        if ids == self.deployment_ids:
            return
        async with self.sync_lock:
            if ids == self.deployment_ids:
                return
            await self.fleet.sync(deployments)
            self.rates.forget(self.fleet.replicas)
            self.deployment_ids = ids
            first = deployments[0] if deployments else {}
            self.litellm_model = str((first.get("litellm_params") or {}).get("model", ""))
            if self.tokenizer is None and self.options.tokenizer != "engine" and self.options.tokenizer_path:
                await self._verify_local_tokenizer()

    # -- tokenizer ---------------------------------------------------------------------------------
    async def _verify_local_tokenizer(self) -> None:
        assert self.options.tokenizer_path
        self.verify_pending = False
        if self._candidate_tokenizer is None:  # loaded once, however often verification is retried
            try:
                self._candidate_tokenizer = LocalChatTokenizer(
                    self.options.tokenizer_path, fast_bpe=self.options.fast_bpe,
                    segment_cache_tokens=self.options.tokenizer_memo_tokens)
            except Exception as exc:
                self.tokenizer_state = f"engine (local tokenizer failed to load: {exc})"
                log.error("litellm-kv: %s: %s", self.name, self.tokenizer_state)
                return
        tok = self._candidate_tokenizer
        client = self._any_client()
        if client is None:
            self.tokenizer_state = "engine (no replica to verify the local tokenizer against yet)"
            self.verify_pending = True
            return
        try:
            wanted = [await client.tokenize_chat(s["messages"], tools=s.get("tools")) for s in VERIFY_SAMPLES]
        except Exception as exc:
            self.tokenizer_state = f"engine (verification failed: {exc}; retrying)"
            self.verify_pending = True
            log.error("litellm-kv: %s: %s", self.name, self.tokenizer_state)
            return
        for fmt in CONTENT_FORMATS:
            tok.content_format = fmt
            try:
                ok = all(
                    tok.chat_tokens(s["messages"], s.get("tools")) == w
                    for s, w in zip(VERIFY_SAMPLES, wanted, strict=True)
                )
            except TemplateError:
                ok = False
            if ok:
                self.tokenizer = tok
                if self.options.early_tokenize_chars > 0:
                    self.early = EarlyTokens(self.name, tok, self.options.early_tokenize_chars)
                    if self.options.early_lookup_max_age_ms > 0 and isinstance(self.load, RedisLoadTracker):
                        self.lookups = EarlyLookups(self.name, self.options.early_lookup_max_age_ms / 1000)
                self.tokenizer_state = f"local (verified, {fmt} content, fast BPE {tok.fast_bpe_state})"
                log.info("litellm-kv: %s tokenizes locally (verified against /tokenize; fast BPE %s)",
                         self.name, tok.fast_bpe_state)
                return
        TOKENIZER_MISMATCH.labels(self.name).inc()
        self.tokenizer_state = "engine (local tokenizer disagrees with /tokenize on start-up samples)"
        log.error("litellm-kv: %s: %s", self.name, self.tokenizer_state)

    def _any_client(self) -> EngineClient | None:
        ready = [st for st in self.fleet.replicas.values() if st.ready]
        return random.choice(ready).client if ready else None

    async def tokens(self, request: ChatRequest, *, images: bool = False
                     ) -> tuple[list[int], str, EarlyAnswer | None]:
        """Prompt token ids of a chat request, which path produced them, and what the early lookup found for the
        same text (:meth:`tokenize_early`; None when none was made). ``images``: rendered with each image's
        placeholder token (not yet expanded), for a request whose images are hashed."""
        messages = list(request.messages or [])
        tools = request.tools
        kwargs = request.chat_template_kwargs
        add_gen = request.add_generation_prompt
        if images:
            # vLLM hands a template that renders images the OpenAI content form; /tokenize cannot check
            # a prompt with images without processing them, so only the verified local tokenizer is used.
            if self.tokenizer is None or self.options.tokenizer == "engine":
                raise _ImagesNeedLocal("image requests need the verified local tokenizer")
            return await self._encode(self._render(self.tokenizer, request, "openai")), "local", None
        if self.tokenizer is not None and self.options.tokenizer != "engine":
            try:
                text = self._render(self.tokenizer, request)
                early = await self._early_answer(text)
                ids = early.ids if early is not None else await self._encode(text)
                self.requests += 1
                if self.options.verify_every and self.requests % self.options.verify_every == 0:
                    spawn_held(self._spot_checks, self._spot_check(messages, tools, add_gen, kwargs, ids))
                return ids, "local", early
            except TemplateError:
                pass
        client = self._any_client()
        if client is None:
            raise RuntimeError("no ready replica to tokenize with")
        ids = await client.tokenize_chat(messages, tools=tools, chat_template_kwargs=kwargs or None,
                                         add_generation_prompt=add_gen)
        return list(ids), "engine", None

    async def _encode(self, text: str) -> list[int]:
        """The local tokenizer's ids for a rendered prompt: the segments encoded early (:meth:`tokenize_early`)
        taken from there, the rest on the event loop; a prompt long enough to hold the loop (``OFF_LOOP_CHARS``)
        has its long segments encoded in a worker thread (without the early table, the whole prompt, and without
        the segment memo, the loop's own)."""
        assert self.tokenizer is not None
        off_loop = len(text) > OFF_LOOP_CHARS
        if self.early is not None and len(self.early):
            return await self.early.encode(text, off_loop)
        if not off_loop:
            return self.tokenizer.encode(text)
        return await asyncio.to_thread(self.tokenizer.encode, text, False)

    def _render(self, tok: LocalChatTokenizer, request: ChatRequest, content_format: str | None = None) -> str:
        """The request's prompt as the local tokenizer renders it for the engine."""
        return tok.render_chat(list(request.messages or []), request.tools, request.add_generation_prompt,
                               request.chat_template_kwargs, content_format, max_tokens=self.fleet.max_model_len())

    def tokenize_early(self, request: ChatRequest) -> int:
        """A chat request just arrived, before LiteLLM's authentication and hooks: queue the long segments of its
        prompt, as :meth:`tokens` will render it, for the early encoder (:mod:`litellm_kv.routing.early_tokens`),
        and in shared mode start its index round trip (:mod:`litellm_kv.routing.early_lookup`). The number of
        segments queued; 0 for anything but a text chat request this group tokenizes locally. Nothing here is
        trusted: the decision uses a segment's ids only for the very text it renders itself, and a round trip's
        answer only for the very hashing inputs it finds itself."""
        early, tok = self.early, self.tokenizer
        if (early is None or tok is None or self.options.tokenizer == "engine" or request.messages is None
                or request.has_unhashable_media or request.images):
            return 0  # media: the decision renders those another way
        text = self._render(tok, request)
        started = early.start(text)
        if self.lookups is not None and not request.skip_prefix_cache:
            self.lookups.start(text, lambda: self._look_up_early(text, request.cache_salt))
        return started

    async def _look_up_early(self, text: str, cache_salt: str | None) -> EarlyAnswer | None:
        """The early task of :meth:`tokenize_early`: ``text``'s ids as the decision would take them, and its round
        trip when the group can hash them exactly now. None when the text could not be encoded."""
        try:
            ids = await self._encode(text)
        except Exception as exc:
            log.debug("litellm-kv: %s: early lookup: encode failed: %s", self.name, exc)
            return None
        answer = EarlyAnswer(ids)
        hasher = self.fleet.hasher()
        limit = self.fleet.max_model_len()
        if hasher is None or not isinstance(self.load, RedisLoadTracker) or (limit and len(ids) > limit):
            return answer
        lora, unknown = self.fleet.adapter(self.litellm_model) if self.litellm_model else (None, "")
        if unknown:
            return answer
        try:
            hashes = hasher.wire_hashes(ids, lora, (), cache_salt)
        except Exception as exc:  # inexact, or a cache salt no engine would take (the body is not checked yet)
            log.debug("litellm-kv: %s: early lookup: not hashed: %s: %s", self.name, type(exc).__name__, exc)
            return answer
        if not hashes:
            return answer
        # The load's raw reply: the decision merges it with this proxy's own counts of that moment.
        rider = dataclasses.replace(self.load.snapshot_rider(self.name, ()), decode=_raw_reply)
        try:
            matches, reply = await self.router.look_up_early(hashes, rider)
        except Exception as exc:
            log.debug("litellm-kv: %s: early lookup failed: %s: %s", self.name, type(exc).__name__, exc)
            answer.failed = True
            return answer
        answer.hasher, answer.lora, answer.cache_salt, answer.hashes = hasher, lora, cache_salt, hashes
        answer.matches, answer.load_reply, answer.at = matches, reply, time.monotonic()
        return answer

    async def _early_answer(self, text: str) -> EarlyAnswer | None:
        """What the early task found for ``text`` (waited for if it still runs), or None."""
        task = self.lookups.take(text) if self.lookups is not None else None
        if task is None or task.cancelled():
            return None
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the task, not this decision, was cancelled (the loop is closing)
                return None
            raise
        except Exception:
            return None

    async def _spot_check(self, messages: Any, tools: Any, add_gen: bool, kwargs: Any, ids: list[int]) -> None:
        client = self._any_client()
        if client is None:
            return
        try:
            want = await client.tokenize_chat(messages, tools=tools, chat_template_kwargs=kwargs or None,
                                              add_generation_prompt=add_gen)
        except Exception:
            return
        if list(want) != ids:
            TOKENIZER_MISMATCH.labels(self.name).inc()
            self.tokenizer = None
            if self.early is not None:
                self.early.clear()
                self.early = None
            if self.lookups is not None:
                self.lookups.clear()
                self.lookups = None
            self.tokenizer_state = "engine (local tokenizer disagreed with /tokenize on a live request)"
            log.error("litellm-kv: %s: %s", self.name, self.tokenizer_state)

    # -- the decision ------------------------------------------------------------------------------
    def reachable(self, replicas: Sequence[str]) -> list[str]:
        """``replicas`` less those whose engine does not answer (not started yet, crashed), unless none
        answers: LiteLLM's cooldown would only learn it from a failed attempt."""
        down = {r for r, st in self.fleet.replicas.items() if not st.reachable}
        if len(down.intersection(replicas)) < len(replicas):
            return [r for r in replicas if r not in down]
        return list(replicas)

    async def decide(self, request: ChatRequest, candidates: Sequence[str]) -> RoutingResult:
        """Choose among ``candidates`` (replica ids) for one request. A prediction that could be wrong is
        never presented as exact: the result is load-only and names why (``tokenize_failed``, ``not_exact``
        and ``unknown_model`` are found here, the reasons of the hashes and the index by
        :meth:`KVRouter.decide`)."""
        candidates = list(candidates)
        path = "none"
        early: EarlyAnswer | None = None
        features: tuple[MMFeature, ...] = ()
        why = ""
        if request.images and not request.has_unhashable_media and self.image_routing_off:
            why = "multimodal_mismatch"
        with_images = bool(request.images) and not request.has_unhashable_media and not why
        try:
            if request.messages is None:
                raise RuntimeError("not a chat request")
            t0 = time.perf_counter()
            try:
                tokens, path, early = await self.tokens(request, images=with_images)
            except _ImagesNeedLocal:
                # Routed by load; the text's tokens still size the request's load.
                with_images, why = False, "multimodal"
                tokens, path, early = await self.tokens(request)
            STAGE_SECONDS.labels(self.name, "tokenize").observe(time.perf_counter() - t0)
        except PromptTooLong as exc:
            log.debug("litellm-kv: %s: routed by load: %s", self.name, exc)
            tokens = []
            why = why or "prompt_too_long"
        except Exception as exc:
            log.debug("litellm-kv: %s: tokenize failed: %s", self.name, exc)
            tokens = []
            why = why or "tokenize_failed"
        else:
            if with_images:
                tokens, features, why = self._expand_images(request, tokens)
            why = why or (self.fleet.not_exact_why and "not_exact")
            limit = self.fleet.max_model_len()
            if not why and limit and len(tokens) > limit:
                why = "prompt_too_long"  # every engine refuses it: nothing to hash or look up
        lora, unknown = self.fleet.adapter(request.model) if request.model else (None, "")
        why = why or unknown
        rreq = RoutingRequest(
            token_ids=tokens,
            lora=lora,
            cache_salt=request.cache_salt,
            mm=features,
            has_unhashable_media=request.has_unhashable_media,
            skip_prefix_cache=request.skip_prefix_cache,
        )
        # Load is read after tokenizing (in shared mode in the index lookup's round trip), never before:
        # concurrent requests must see each other's load (a snapshot taken before tokenizing sent a burst
        # on one hot prefix to one replica).
        wanted = set(candidates)
        gauges = {
            r: EngineGauges(*self._gauges(r, st.waiting, st.running), st.kv_usage)
            for r, st in self.fleet.replicas.items() if r in wanted
        }
        rider = self.load.snapshot_rider(self.name, candidates) if isinstance(self.load, RedisLoadTracker) else None
        result = await self.router.decide(rreq, self.fleet.hasher(), candidates, lambda: self.read_load(candidates),
                                          gauges, not_exact_why=why, load_rider=rider, early=early,
                                          early_max_age_s=self.options.early_lookup_max_age_ms / 1000)
        result.tokenizer = path
        if features and result.exact:
            result.visual_tokens = sum(f.length for f in features)
            bs = result.block_size
            result.images = [
                {"identifier": f.identifier, "offset": f.offset, "tokens": f.length,
                 "blocks": [f.offset // bs, (f.offset + f.length - 1) // bs] if bs else None}
                for f in features
            ]
        return result

    # -- images ------------------------------------------------------------------------------------
    def _expand_images(self, request: ChatRequest, tokens: list[int]) -> tuple[list[int], tuple[MMFeature, ...], str]:
        """The engine's prompt: each image's placeholder expanded to its visual tokens, with the identifier
        the engine keys its blocks by (the proxy's uuid, hashed with the processor kwargs when there are
        any). On anything that would make the hashes differ from the engine's: the tokens as they came, no
        features, and "multimodal" (the request is routed by load, its tokens still size its load)."""
        tok = self.tokenizer
        pad = tok.encode(IMAGE_PAD) if tok is not None else []
        if len(pad) != 1:
            log.debug("litellm-kv: %s: the tokenizer has no single %s token", self.name, IMAGE_PAD)
            return tokens, (), "multimodal"
        kwargs = request.mm_processor_kwargs
        try:
            if kwargs:
                root = self.fleet.model_root()
                if root is None:
                    raise IdentifierUnavailable("the engines' model path is not known (/v1/models)")
                algo = self.options.mm_hasher_algorithm
                items = [ImageItem(engine_identifier(i.identifier, root, kwargs, algo), i.tokens)
                         for i in request.images]
            else:
                items = list(request.images)
            expanded = expand_images(tokens, pad[0], items)
        except (IdentifierUnavailable, ImageExpansionError) as exc:
            log.debug("litellm-kv: %s: image request routed by load: %s", self.name, exc)
            return tokens, (), "multimodal"
        return expanded.token_ids, expanded.features, ""

    def check_image_tokens(self, predicted: int, reported: int) -> None:
        """A response's visual-token count (the engine's) against the one the placeholders were expanded
        with. Mismatches mean the hashes of image blocks are wrong: after ``image_mismatch_limit`` of them
        image requests are routed by load (the count formula or the processor settings disagree)."""
        if predicted == reported:
            IMAGE_TOKEN_CHECKS.labels(self.name, "exact").inc()
            return
        IMAGE_TOKEN_CHECKS.labels(self.name, "mismatch").inc()
        self.image_mismatches += 1
        log.warning("litellm-kv: %s: the engine counted %d visual tokens where %d were predicted", self.name,
                    reported, predicted)
        if self.image_mismatches >= IMAGE_MISMATCH_LIMIT and not self.image_routing_off:
            self.image_routing_off = (
                f"the engine's visual-token counts differed from litellm-kv's on {self.image_mismatches} responses "
                f"(last: {reported} vs {predicted}); image requests are routed by load. Check the group's vision "
                "family and min_pixels/max_pixels against the engine's processor, then restart the proxy.")
            log.error("litellm-kv: %s: %s", self.name, self.image_routing_off)

    # -- learned rates (TTFT cost model) ---------------------------------------------------------------
    def _timings(self, replica: str, timings: EngineTimings) -> None:
        self.rates.observe_engine(replica, timings)
        self._publish_rates(replica)

    def _publish_rates(self, replica: str) -> None:
        """The rates the cost model now uses for ``replica``, as gauges."""
        r = self.rates.rates(replica)
        RATE_GAUGE.labels(self.name, replica, "prefill_seconds_per_token").set(r.prefill_s_per_token)
        RATE_GAUGE.labels(self.name, replica, "prefill_overhead_seconds").set(r.prefill_overhead_s)
        RATE_GAUGE.labels(self.name, replica, "visual_seconds_per_token").set(r.visual_s_per_token)
        RATE_GAUGE.labels(self.name, replica, "decode_step_seconds").set(r.decode_step_s)
        RATE_GAUGE.labels(self.name, replica, "output_tokens").set(r.output_tokens)
        RATE_GAUGE.labels(self.name, replica, "ttft_correction").set(r.correction)
        RATE_GAUGE.labels(self.name, replica, "ttft_offset_seconds").set(r.offset_s)

    def observe_ttft(self, result: RoutingResult, measured_s: float) -> None:
        """A streamed response's first content chunk came ``measured_s`` after the decision."""
        if result.raw_ttft_s > 0:
            predicted = result.predicted_ttft_s.get(result.replica, 0.0)
            TTFT_ERROR.labels(self.name).observe(measured_s - predicted)
            self.ttft_errors.add(measured_s - predicted)
            self.rates.observe_ttft(result.replica, result.raw_ttft_s, measured_s,
                                    visual_tokens=result.uncached_visual_tokens, visual_s=result.raw_visual_s)
            self._publish_rates(result.replica)

    def status(self, ttft_errors_since: int | None = None) -> dict[str, Any]:
        """What /litellm-kv/health shows of the cost model: which one decides, the learned rates, the latest
        decision's predicted TTFT per replica, how far measured TTFTs were from the predictions. With
        ``ttft_errors_since`` (a ``responses`` count read earlier), the errors recorded after it, one by one."""
        tc = self.router.cost.ttft
        error = self.ttft_errors.status()
        if ttft_errors_since is not None:
            errors, dropped = self.ttft_errors.since(ttft_errors_since)
            error["since"] = {"count": ttft_errors_since, "errors_ms": [round(1e3 * e, 2) for e in errors],
                              "dropped": dropped}
        return {"cost_model": self.router.cost.kind, "slo_ttft_s": (tc.slo_ttft_s or None) if tc else None,
                "rates": self.rates.status(),
                "last_predicted_ttft_s": {r: round(t, 4) for r, t in self.router.last_ttft.items()},
                "ttft_error": error,
                "images": self.image_routing_off or ("routed by cache when the group has a vision section of a "
                                                     "Qwen-VL family and a verified local tokenizer")}

    def _gauges(self, replica: str, waiting: int | None, running: int | None) -> tuple[int | None, int | None]:
        return self.fleet.aging.adjust(replica, waiting, running) if self.options.scrape_aging else (waiting, running)

    # -- router-tracked load -----------------------------------------------------------------------
    async def read_load(self, candidates: Sequence[str]) -> Mapping[str, TrackedLoad]:
        """Router-tracked load; when the shared store (Redis) is down, this proxy's own counts (the
        decision still has the scraped gauges)."""
        try:
            return await self.load.snapshot(self.name, candidates)
        except Exception:
            LOAD_ERRORS.labels(self.name).inc()
            return self.load.local_snapshot(self.name, candidates)

    async def begin(self, result: RoutingResult, request_id: str) -> None:
        """The request goes to ``result.replica``: count its uncached prompt tokens there from now on. In
        shadow mode only the decision is recorded (LiteLLM routes, so nothing is counted)."""
        if self.options.shadow:
            DECISIONS.labels(self.name, "shadow").inc()
            return
        # Counted in process at once; in shared mode published to Redis in the background (RedisLoadTracker).
        prefill = max(0, result.prompt_tokens - max(result.predicted_hit_tokens, result.expected_hit_tokens))
        # Images the replica must encode count as the prefill tokens their time is worth, so the requests queued
        # behind them see it.
        prefill += round(result.visual_extra_tokens)
        self.fleet.aging.begin(request_id, result.replica)
        await self._guarded(self.load.begin(self.name, result.replica, request_id, prefill))

    async def first_token(self, request_id: str) -> None:
        self.fleet.aging.first_token(request_id)
        await self._guarded(self.load.first_token(request_id))

    async def end(self, request_id: str) -> None:
        self.fleet.aging.end(request_id)
        await self._guarded(self.load.end(request_id))

    async def _guarded(self, op: Awaitable[None]) -> None:
        # A load store that fails must not fail the request: count it and go on.
        try:
            await op
        except Exception:
            LOAD_ERRORS.labels(self.name).inc()
