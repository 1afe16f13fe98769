"""KV-aware replica choice inside the LiteLLM proxy (model groups with ``routing: kv``): the adapter.

The decision is :class:`litellm_kv.routing.group.KVGroup`'s; these hooks turn LiteLLM's request into its
plain values and apply its result. Hook by hook:

* ``pre_call``: tenant cache isolation (inject a keyed ``cache_salt``) and client media uuids dropped; a call
  that skipped it (a batch line LiteLLM runs itself) gets the same in ``filter_deployments``/``pre_deployment``.
* ``filter_deployments``: the group decides (exact tokens → block hashes → one index lookup → cost) and
  the chosen replica's deployment is returned. Any internal failure → load-only choice and a metric; the
  request never fails because of us.
* ``pre_deployment``: ``vllm_xargs.kv_cache_report_mode = "full"`` while the index may lack blocks
  (``kv.report_mode_full``, :meth:`Fleet.reannounce_requested`).
* ``post_success_deployment`` / streamed usage: predicted vs engine-reported ``cached_tokens``
  (the verification metric), release of the in-flight load.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from litellm_kv.config import REDIS_SOURCES, ModelGroupSettings, Settings, parse_section, salt_secret
from litellm_kv.errors import PolicyViolation
from litellm_kv.governance.images import ImageError, content_parts, drop_part_uuids, find_media, part_kind
from litellm_kv.index.base import KVIndex
from litellm_kv.integration.hooks import Handler, ProxyRequest
from litellm_kv.integration.litellm_data import (
    call_key,
    caller_from_request_metadata,
    carries_output,
    deployment_model_groups,
    dig,
    field,
    request_metadata,
    routed_call_id,
    usage_of,
    with_upstream,
)
from litellm_kv.integration.vision_hooks import (
    VisionHandler,
    engine_image_tokens,
    engine_processor_kwargs,
    explain_record,
)
from litellm_kv.observability import counter, histogram
from litellm_kv.redis_client import RedisUse
from litellm_kv.redis_eviction import problem as eviction_problem
from litellm_kv.routing.fleet import replica_id
from litellm_kv.routing.group import ChatRequest, KVGroup
from litellm_kv.routing.options import KVRoutingSettings
from litellm_kv.routing.router import DECISION_CPU_SECONDS, DECISION_SECONDS, RoutingResult
from litellm_kv.tasks import spawn_held
from litellm_kv.vllm.hashing import NATIVE_HASHING
from litellm_kv.vllm.multimodal import ImageItem
from litellm_kv.vllm.tokenization import chat_template_kwargs_for

log = logging.getLogger("litellm_kv")

PREDICTION = counter(
    "prediction_checks",
    "Responses whose engine-reported cached_tokens were compared with the routing prediction: "
    "outcome exact, under (engine hit more than predicted), over (engine hit less), or missing "
    "(engine did not report cached_tokens: run it with --enable-prompt-tokens-details).",
    ["model_group", "outcome"],
)
PREDICTED_TOKENS = counter(
    "predicted_cached_tokens", "Sum of predicted cached prompt tokens on the chosen replica.", ["model_group"]
)
ACTUAL_TOKENS = counter(
    "actual_cached_tokens", "Sum of engine-reported cached prompt tokens (usage.prompt_tokens_details).",
    ["model_group"],
)
ISOLATED_LATE = counter(
    "isolated_at_deployment",
    "Calls to a KV-routed group that reached its deployments without passing the pre-call hook (lines of a batch "
    "LiteLLM runs itself, fallbacks from other groups), given their tenant's cache_salt and stripped of client media "
    "uuids there.",
    ["model_group"],
)
#: The call types of /v1/responses, whose upstream body LiteLLM builds from the Responses fields it knows.
RESPONSES_CALL_TYPES = frozenset({"aresponses", "responses"})
#: The call record of what pre_call isolated: the salt it gave the call ("" without tenant isolation).
ISOLATED_RECORD = "isolated"
PROMPT_TOKENS = counter("routed_prompt_tokens", "Sum of prompt tokens of KV-routed requests.", ["model_group"])
PREDICTION_ERROR = histogram(
    "prediction_error_tokens",
    "engine cached_tokens minus predicted, per response (0 = exact).",
    ["model_group"],
    buckets=(-4096, -512, -64, -1, 0, 1, 64, 512, 4096),
)

SHADOW_TOKENS = counter(
    "shadow_tokens",
    "Shadow mode: prompt tokens (kind=prompt), tokens the KV decision predicted cached on the replica it "
    "would have chosen (would_have_cached), and engine-reported cached tokens on LiteLLM's own choice "
    "(litellm_cached). would_have_cached / prompt vs litellm_cached / prompt is the trial's answer.",
    ["model_group", "kind"],
)

_CALLS_KEPT = 20_000


@dataclass(slots=True)
class _Route:
    group: str
    replica: str
    deployment_id: str
    result: RoutingResult
    shadow: bool
    started: float
    released: bool = False
    first_token: bool = False
    verified: bool = False


def _has_media(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any content part (nested tool-result content included) is something other than text by vLLM's
    own rule (``part_kind``: an untyped part with an ``image_url`` is an image)."""
    return any(part_kind(p) not in (None, "text") for p in content_parts(messages))


class KVRoutingHandler(Handler):
    name = "kv"

    def __init__(self, settings: Settings, deployments: Callable[[], list[dict[str, Any]]] | None = None,
                 *, proxy: bool = True) -> None:
        """``deployments``: the LiteLLM router's model list as it is now (default: the proxy's router; an
        application's own ``litellm.Router`` in :mod:`litellm_kv.integration.sdk`). ``proxy``: calls come from
        clients through the proxy's pre-call hook, so one that skipped it is isolated later; an application's own
        router has no such hook and no clients to keep apart."""
        super().__init__(settings)
        self._deployments = deployments or _router_deployments
        self._proxy = proxy
        self.options: dict[str, KVRoutingSettings] = {}
        for name, g in settings.model_groups.items():
            if g.routing == "kv":
                self.options[name] = parse_section(KVRoutingSettings, g.kv, f"litellm_kv.model_groups.{name}.kv")
        self.groups: dict[str, KVGroup] = {}
        self.index: KVIndex | None = None
        self.routes: OrderedDict[str, _Route] = OrderedDict()
        self.backend = "memory" if settings.mode == "embedded" else "redis"
        self._tasks: set[asyncio.Task[None]] = set()
        self._salt_secret: bytes | None = None
        if any(o.tenant_isolation != "none" for o in self.options.values()):
            self._salt_secret = salt_secret(settings)

    def enabled_for(self, group: ModelGroupSettings | None) -> bool:
        return group is not None and group.routing == "kv"

    async def startup(self) -> None:
        if not self.options:
            return
        embedded = self.settings.mode == "embedded"
        if embedded:
            from litellm_kv.index.memory import InMemoryIndex

            self.index = InMemoryIndex()
        else:
            redis = self.settings.redis_for("index")
            if redis is None:
                raise RuntimeError(f"litellm_kv.mode: shared needs a Redis: {REDIS_SOURCES}")
            from litellm_kv.index.redis import RedisIndex
            from litellm_kv.redis_client import RedisGuard

            self.index = RedisIndex(redis,
                                    guard=RedisGuard(RedisUse.INDEX, self.settings.redis_routing))
        for name, opts in self.options.items():
            self.groups[name] = KVGroup(name, opts, self.index, self.settings.redis_for("load"), embedded,
                                        self.backend,
                                        members=functools.partial(self._group_deployments, name),
                                        redis_limits=self.settings.redis_routing)
        if not embedded:
            index_redis = self.settings.redis_for("index")
            for g in self.groups.values():
                g.fleet.index_problem = functools.partial(eviction_problem, index_redis, RedisUse.INDEX.value)
        for name, g in self.groups.items():
            deps = self._group_deployments(name)
            if deps:
                await g.sync(deps)
            g.start()
        _register_admin_routes(self)

    def _group_deployments(self, group: str) -> list[dict[str, Any]]:
        """The group's deployments, each with the ``api_base`` its calls go to (from a LiteLLM credential it names,
        where it names no ``api_base`` itself)."""
        return [with_upstream(d) for d in self._deployments() if d.get("model_name") == group]

    async def shutdown(self) -> None:
        for g in self.groups.values():
            await g.stop()

    # -- pre_call: tenant isolation -------------------------------------------------------------
    def _secret(self) -> bytes:
        if self._salt_secret is None:
            # Checked again here for settings built without load_settings: no isolation with a guessable secret.
            self._salt_secret = salt_secret(self.settings)
        return self._salt_secret

    async def pre_call(self, req: ProxyRequest) -> None:
        opts = self.options.get(req.model_group)
        if opts is None:
            return
        c = req.caller
        extra = req.data.get("extra_body")
        extra = dict(extra) if isinstance(extra, Mapping) else {}
        responses = req.call_type in RESPONSES_CALL_TYPES
        client_salt = req.data.get("cache_salt") or (extra.get("cache_salt") if responses else None)
        salt = self._isolate(opts, req.data, c.team_id, c.key_hash or c.key_alias, client_salt)
        if salt and responses:
            # LiteLLM sends a Responses call to vLLM's own /v1/responses with the fields it knows, and cache_salt
            # is not one of them: the salt rides in extra_body, which it sends as written.
            req.data["extra_body"] = {**extra, "cache_salt": salt}
        if req.record_key:
            self.records.put(req.record_key, ISOLATED_RECORD, salt or "")

    def _isolate(self, opts: KVRoutingSettings, data: dict[str, Any], team_id: str | None, key: str | None,
                 client_salt: Any) -> str | None:
        """Take out of a call to a KV-routed group's engines what it must not carry from the client; returns the
        salt it was given (``None`` without tenant isolation).

        * The engines are vLLM: a client's media ``uuid`` would name what vLLM cached for another client's image
          (blocks, processed pixels, encoder output; the cache salt does not cover the latter two). With a vision
          section, the proxy sets its own identifiers afterwards.
        * With ``tenant_isolation``, ``cache_salt`` is keyed by the tenant, the client's salt folded in (callers
          without a key are one tenant, ``anonymous``)."""
        drop_part_uuids(data)
        if opts.tenant_isolation == "none":
            return None
        tenant = (f"team:{team_id}" if opts.tenant_isolation == "team" and team_id
                  else f"key:{key or 'anonymous'}")
        material = tenant if not client_salt else f"{tenant}\x00{client_salt}"
        salt = data["cache_salt"] = hmac.new(self._secret(), material.encode(), hashlib.sha256).hexdigest()[:48]
        return salt

    def _isolate_unchecked(self, group: str | None, kwargs: dict[str, Any]) -> bool:
        """Isolate a call on its way to a KV-routed group's engines that the pre-call hook did not isolate (a line
        of a batch LiteLLM runs itself, a fallback from a group without KV routing), from the verified caller
        LiteLLM wrote into its metadata; True when it was one. The client's own salt is not folded in here, so
        the routing decision and the engine see one salt however often this runs for the call. A call the hook
        isolated keeps its salt (found by the proxy's own token of the call, which a client cannot copy)."""
        opts = self.options.get(group) if group else None
        if opts is None or not self._proxy:
            return False
        done = self.records.get(call_key(kwargs), ISOLATED_RECORD)
        if done is not None:
            if done:
                kwargs["cache_salt"] = done
            return False
        caller = caller_from_request_metadata(request_metadata(kwargs))
        self._isolate(opts, kwargs, caller.team_id, caller.key_hash or caller.key_alias, None)
        return True

    # -- replica choice ----------------------------------------------------------------------------
    async def filter_deployments(
        self,
        model_group: str,
        deployments: list[dict[str, Any]],
        messages: list[dict[str, Any]] | None,
        request_kwargs: dict[str, Any],
    ) -> list[dict[str, Any]] | None:
        g = self.groups.get(model_group)
        if g is None or not deployments:
            return None
        t0, cpu0 = time.perf_counter(), time.thread_time()
        self._isolate_unchecked(model_group, request_kwargs)  # hashed with the salt the engine will get
        # Membership comes from the router's full model list: a deployment missing from the healthy list
        # is only cooling down, and purging its replica would throw away a cache that is still there.
        if not {str((d.get("model_info") or {}).get("id")) for d in deployments} <= g.deployment_ids:
            await g.sync(self._group_deployments(model_group) or deployments)
        by_replica: dict[str, dict[str, Any]] = {}
        for d in deployments:
            api_base = (with_upstream(d).get("litellm_params") or {}).get("api_base")
            if api_base:
                by_replica.setdefault(replica_id(api_base), d)
        if not by_replica:
            return None
        req = dict(request_kwargs)
        if messages is not None:
            req["messages"] = messages
        # Images are hashed with what the vision count kept for this call (identifiers and visual tokens).
        vision = self.records.get(call_key(request_kwargs), VisionHandler.section)
        result = await g.decide(_chat_request(req, deployments, vision), g.reachable(list(by_replica)))
        chosen = by_replica[result.replica]
        dep_id = str((chosen.get("model_info") or {}).get("id"))
        cid = routed_call_id(request_kwargs) or f"anon-{time.monotonic_ns()}"
        route = _Route(model_group, result.replica, dep_id, result, g.options.shadow, time.time())
        self._remember(cid, route)
        md = request_kwargs.get("metadata")
        if isinstance(md, dict):
            md["litellm_kv_call_id"] = cid
            md["litellm_kv_route"] = {
                "replica": result.replica, "reason": result.reason, "predicted_cached_tokens":
                result.predicted_hit_tokens, "prompt_tokens": result.prompt_tokens, "shadow": g.options.shadow,
                "fallback": result.fallback_why or None,
                "predicted_ttft_s": round(result.predicted_ttft_s.get(result.replica, 0.0), 4) or None,
                "visual_tokens": result.visual_tokens or None,
            }
        await g.begin(result, cid)
        cpu = time.thread_time() - cpu0
        DECISION_SECONDS.labels(model_group, result.tokenizer).observe(time.perf_counter() - t0)
        DECISION_CPU_SECONDS.labels(model_group).observe(cpu)
        # Shadow mode: the decision is recorded, LiteLLM routes as it would have.
        return None if g.options.shadow else [chosen]

    def _remember(self, cid: str, route: _Route) -> None:
        self.routes[cid] = route
        self.routes.move_to_end(cid)
        ttl = self.options[route.group].inflight_ttl_s
        while self.routes:
            old_cid, old = next(iter(self.routes.items()))
            if len(self.routes) <= _CALLS_KEPT and route.started - old.started < ttl:
                break
            del self.routes[old_cid]
            g = self.groups.get(old.group)
            if g is not None and not old.released and not old.shadow:
                # Never saw its end (lost callback): stop counting its load.
                self._spawn(g.end(old_cid))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background, holding a reference until it is done."""
        spawn_held(self._tasks, work)

    def _route_of(self, data: Mapping[str, Any]) -> tuple[str, _Route] | None:
        cid = routed_call_id(data)
        if cid is None or cid not in self.routes:
            cid = request_metadata(data).get("litellm_kv_call_id")
        if cid is None:
            return None
        r = self.routes.get(cid)
        return (cid, r) if r is not None else None

    # -- per-deployment fields -------------------------------------------------------------------
    async def pre_deployment(self, kwargs: dict[str, Any]) -> None:
        group = next((g for g in deployment_model_groups(kwargs) if g in self.options), None)
        if self._isolate_unchecked(group, kwargs):
            ISOLATED_LATE.labels(group).inc()
        opts = self.options.get(group) if group else None
        if opts is None or not opts.report_mode_full:
            return
        g = self.groups.get(group) if group else None
        if g is not None and not g.fleet.reannounce_requested():
            return
        xargs = dict(kwargs.get("vllm_xargs") or {})
        xargs["kv_cache_report_mode"] = "full"
        kwargs["vllm_xargs"] = xargs

    # -- after the call -----------------------------------------------------------------------------
    def _verify(self, route: _Route, usage: Any) -> None:
        if route.verified:
            return
        route.verified = True
        group = route.group
        if route.shadow:
            # What routing would have achieved vs what LiteLLM's own choice got (the shadow trial).
            actual_shadow = dig(usage, "prompt_tokens_details", "cached_tokens")
            SHADOW_TOKENS.labels(group, "would_have_cached").inc(route.result.predicted_hit_tokens)
            SHADOW_TOKENS.labels(group, "prompt").inc(route.result.prompt_tokens)
            if actual_shadow is not None:
                SHADOW_TOKENS.labels(group, "litellm_cached").inc(int(actual_shadow))
            return
        if route.result.visual_tokens:
            reported = engine_image_tokens(usage)
            g = self.groups.get(group)
            if reported is not None and g is not None:
                g.check_image_tokens(route.result.visual_tokens, reported)
        predicted = route.result.predicted_hit_tokens
        actual = dig(usage, "prompt_tokens_details", "cached_tokens")
        if actual is None:
            PREDICTION.labels(group, "missing").inc()
            g = self.groups.get(group)
            st = g.fleet.replicas.get(route.replica) if g else None
            if st is not None and not st.prompt_details_missing:
                st.prompt_details_missing = True
                log.warning("litellm-kv: %s reports no cached_tokens; start it with --enable-prompt-tokens-details "
                            "to verify predictions", route.replica)
            return
        actual = int(actual)
        if not route.result.exact:
            PREDICTION.labels(group, "fallback").inc()
        else:
            outcome = "exact" if actual == predicted else ("under" if actual > predicted else "over")
            PREDICTION.labels(group, outcome).inc()
            PREDICTION_ERROR.labels(group).observe(actual - predicted)
        PREDICTED_TOKENS.labels(group).inc(predicted)
        ACTUAL_TOKENS.labels(group).inc(actual)
        PROMPT_TOKENS.labels(group).inc(route.result.prompt_tokens)

    async def _finish(self, data: Mapping[str, Any], usage: Any) -> None:
        found = self._route_of(data)
        if found is None:
            return
        cid, route = found
        if usage is not None:
            self._verify(route, usage)
        if not route.released:
            route.released = True
            g = self.groups.get(route.group)
            if g is not None and not route.shadow:
                await g.end(cid)

    async def post_success_deployment(self, request_data: dict[str, Any], response: Any) -> None:
        if request_data.get("stream"):
            return
        await self._finish(request_data, usage_of(response))

    async def stream_chunk(self, data: dict[str, Any], chunk: Any) -> None:
        # Proxy level, every chunk the caller receives: the first one with output is the caller's time to
        # first token. (LiteLLM calls the deployment-level stream hook on the final chunk only.)
        if not carries_output(chunk):
            return
        found = self._route_of(data)
        if found is not None and not found[1].first_token:
            await self._first_token(*found, measured_s=time.time() - found[1].started)

    async def stream_chunk_deployment(self, request_data: dict[str, Any], chunk: Any) -> None:
        found = self._route_of(request_data)
        if found is None:
            return
        cid, route = found
        if not route.first_token:
            # No proxy-level chunk was seen (an application's own litellm.Router): the prefill is over, but
            # the time is the stream's whole length, not a time to first token.
            await self._first_token(cid, route, measured_s=None)
        usage = usage_of(chunk)
        if usage is not None and field(usage, "prompt_tokens") is not None:
            await self._finish(request_data, usage)

    async def _first_token(self, cid: str, route: _Route, *, measured_s: float | None) -> None:
        """The routed request's prefill is over: its load moves from prefill to decode, and a measured time
        to first token is set against the one the cost model predicted."""
        route.first_token = True
        g = self.groups.get(route.group)
        if g is None or route.shadow:
            return
        if measured_s is not None:
            g.observe_ttft(route.result, measured_s)
        await g.first_token(cid)

    async def post_failure_deployment(self, request_data: Mapping[str, Any], exception: Exception) -> None:
        await self._finish(request_data, None)

    async def log_success(self, kwargs: dict[str, Any], response: Any) -> None:
        # Streams: LiteLLM strips the upstream usage chunk before deployment hooks see it, but the
        # logged response carries the assembled usage.
        usage = usage_of(response)
        if field(usage, "prompt_tokens") is None:
            usage = None
        await self._finish(kwargs, usage)

    async def log_failure(self, kwargs: dict[str, Any], response: Any) -> None:
        await self._finish(kwargs, None)

    # -- admin views ---------------------------------------------------------------------------------
    def tokenize_early(self, body: Mapping[str, Any]) -> int:
        """A chat body as it arrives, before authentication (``early_tokenize``): its long prompt segments queued
        for the early encoder of the KV group it names; the number queued."""
        model = body.get("model")
        g = self.groups.get(model) if isinstance(model, str) else None
        return g.tokenize_early(_chat_request(body, ())) if g is not None else 0

    def health(self, ttft_errors_since: int | None = None) -> dict[str, Any]:
        """What ``GET /litellm-kv/health`` shows of routing; ``ttft_errors_since``: see :meth:`KVGroup.status`."""
        return {
            "mode": self.settings.mode,
            # How sha256 block hashes are computed: the compiled chain (litellm_kv/vllm/_chain.c) or Python.
            # Exact either way; the Python path is slower on never-seen prompts (docs/hashing.md).
            "hashing": "native" if NATIVE_HASHING else "python (litellm_kv/vllm/_chain.c not built)",
            "groups": {
                name: {**g.fleet.status(), "tokenizer": g.tokenizer_state, "shadow": g.options.shadow,
                       **g.status(ttft_errors_since)}
                for name, g in self.groups.items()
            },
        }

    async def explain(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Which replica holds this prompt: the routing decision for a request body, without sending it."""
        group = str(body.get("model") or "")
        g = self.groups.get(group)
        if g is None:
            return {"error": f"model group {group!r} is not KV-routed"}
        # The same request facts as a real call (LoRA adapter, salt, media), or the answer would not be its.
        # Images are counted as the vision count would count them, without a key's limits (no downscale).
        try:
            vision = await explain_record(self.settings, group, body) if _has_media(body.get("messages") or []) \
                else None
        except PolicyViolation as exc:
            return {"error": exc.message}
        if vision is not None:
            # The client's processor kwargs as the call sends them: checked and rewritten to the bounds the
            # images were counted with (VisionHandler.pre_call), which key the engine's image identifiers.
            body = {**body, "mm_processor_kwargs": vision.get("mm_processor_kwargs")}
        result = await g.decide(_chat_request(body, self._group_deployments(group), vision), list(g.fleet.replicas))
        hasher = g.fleet.hasher()
        out = asdict(result)
        out["block_size"] = hasher.block_size if hasher else None
        out["cost_model"] = g.router.cost.kind
        return out


def _chat_request(req: Mapping[str, Any], deployments: Sequence[Mapping[str, Any]],
                  vision: Mapping[str, Any] | None = None) -> ChatRequest:
    """LiteLLM's request dict as the facts that decide the engine's block hashes: the prompt as the chat
    template renders it, the served model (a LoRA adapter's name and path), the cache salt, media (with the
    call's vision count: each image's identifier and visual tokens), prompt logprobs."""
    messages = req.get("messages")
    litellm_model = str((deployments[0].get("litellm_params") or {}).get("model", "")) if deployments else ""
    media = _has_media(messages or [])
    images = _image_items(req, vision) if media and vision is not None else None
    return ChatRequest(
        messages=None if messages is None else list(messages),
        tools=req.get("tools") or None,
        chat_template_kwargs=chat_template_kwargs_for(req),
        add_generation_prompt=not bool(req.get("continue_final_message")),
        model=litellm_model,
        cache_salt=req.get("cache_salt"),
        has_unhashable_media=media and images is None,
        skip_prefix_cache=req.get("prompt_logprobs") is not None,
        images=images or (),
        mm_processor_kwargs=engine_processor_kwargs(req.get("mm_processor_kwargs"), vision)
        if images and vision is not None else None,
    )


#: Vision families whose images are routed by cache: the Qwen-VL chat templates render one ``<|image_pad|>``
#: per image and vLLM expands it to the count ``governance.vision`` reproduces.
HASHED_FAMILIES = frozenset({"qwen2_5_vl", "qwen3_vl"})


def _image_items(req: Mapping[str, Any], vision: Mapping[str, Any]) -> tuple[ImageItem, ...] | None:
    """The request's images as routing hashes them, from the call's vision count; None when any cannot be
    (an unfetched remote image, a video, a family whose placeholders are not modelled, a count that does
    not line up with the request's images): the request is then routed by load."""
    if vision.get("family") not in HASHED_FAMILIES:
        return None
    counted = vision.get("images")
    try:
        images, videos = find_media(req)
    except ImageError:
        return None
    if videos or not isinstance(counted, list) or len(counted) != len(images) or not images:
        return None
    out: list[ImageItem] = []
    for c in counted:
        ident = c.get("identifier") if isinstance(c, Mapping) else None
        tokens = c.get("tokens") if isinstance(c, Mapping) else None
        if not isinstance(ident, str) or isinstance(tokens, bool) or not isinstance(tokens, int) or tokens <= 0:
            return None
        out.append(ImageItem(ident, tokens))
    return tuple(out)


def _router_deployments() -> list[dict[str, Any]]:
    try:
        from litellm.proxy import proxy_server

        router = getattr(proxy_server, "llm_router", None)
        return list(getattr(router, "model_list", None) or [])
    except Exception:
        return []


def _register_admin_routes(handler: KVRoutingHandler) -> None:
    try:
        from litellm_kv.integration.admin import register

        register(handler)
    except Exception:
        log.exception("litellm-kv: admin routes not registered")
