"""Visual-token limits in the proxy: count and enforce before the call, charge after it.

Before the call (:meth:`VisionHandler.pre_call`): find every image (and video) in the request,
read each inline image's size from its header (remote images are not fetched unless the group
allows a host; otherwise they count at the ceiling the group's ``max_pixels`` guarantees), count
visual tokens with the group's model family, resolve the key/team/group limits and either reject
(400 naming the limit, the value and where it was set; 429 when a period budget is spent) or
downscale: pick the largest ``max_pixels`` that fits every limit, which
:meth:`VisionHandler.pre_deployment` sends to vLLM deployments as ``mm_processor_kwargs.max_pixels``
so the engine itself resizes. The decision is kept by the proxy under the call's id
(:meth:`GovernanceHandler.keep_decision`): a call the proxy decided nothing for is charged nothing.

After the call (streams included): the engine's own count (vLLM
``usage.prompt_tokens_details.multimodal_tokens``) when reported, else ours, is written to
``usage.prompt_tokens_details.image_tokens`` so LiteLLM prices it at ``input_cost_per_image_token``;
the period budgets are charged and a per-request breakdown goes to the spend log metadata.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit

from litellm_kv.config import Settings, parse_section
from litellm_kv.errors import MetadataError, PolicyViolation
from litellm_kv.governance.budgets import FAIL_OPEN_NOTE, BudgetState, BudgetStoreError, PeriodBudgets
from litellm_kv.governance.images import (
    ImageBounds,
    ImageError,
    ImageInfo,
    ImagePart,
    VideoPart,
    find_media,
    image_info,
    payload_bytes,
)
from litellm_kv.governance.policy import PolicyLayer
from litellm_kv.governance.vision import ENGINE_RESIZABLE
from litellm_kv.governance.vision_policy import (
    POLICY_FIELDS,
    Counted,
    GroupVisionSettings,
    PixelBounds,
    TokenCap,
    VisionPolicy,
    ceiling_tokens,
    engine_bounds,
    fit_max_pixels,
    image_tokens,
    processor_kwargs_of,
    recount,
    resolve_policy,
    take_processor_kwargs,
)
from litellm_kv.integration import litellm_data, stream_usage
from litellm_kv.integration.billing import record_breakdown, set_image_tokens
from litellm_kv.integration.governance import GovernanceHandler, release_holds, store_failure, unmetered_endpoint
from litellm_kv.integration.hooks import ProxyRequest
from litellm_kv.observability import counter, histogram
from litellm_kv.vllm.multimodal import image_identifier

log = logging.getLogger("litellm_kv.governance.vision")

METER = "visual_tokens"
#: The call record holding the fetched remote images' bytes (as ``data:`` URLs) until the engine is called.
FETCHED_RECORD = "vision_fetched"
HEADER_TOKENS = "x-litellm-kv-visual-tokens"
HEADER_DOWNSCALED = "x-litellm-kv-vision-downscaled"
#: Inline images with more base64 characters than this are decoded off the event loop.
OFFLOAD_CHARS = 256 * 1024

IMAGES = counter("vision_images", "Images seen in requests, by model group and kind.", ["model_group", "kind"])
TOKENS_CHARGED = counter(
    "vision_tokens_charged",
    "Visual tokens written into usage and charged to period budgets, by model group and source "
    "(engine: the engine's own multimodal_tokens; formula: litellm-kv's count).",
    ["model_group", "source"],
)
REJECTED = counter("vision_rejections", "Requests rejected by a vision limit or bad image.", ["model_group", "limit"])
INVALID_METADATA = counter(
    "vision_invalid_metadata", "Requests with malformed vision settings in key/team metadata.", ["action"]
)
DOWNSCALED = counter(
    "vision_downscales", "Requests sent with a lower mm_processor_kwargs.max_pixels to fit a limit.",
    ["model_group", "limit"],
)
ESTIMATE_DELTA = histogram(
    "vision_estimate_delta_tokens",
    "Engine-reported visual tokens minus litellm-kv's pre-call count, per request.",
    ["model_group"],
    buckets=(-1000, -100, -10, -1, 0, 1, 10, 100, 1000),
)
COUNT_SECONDS = histogram(
    "vision_count_seconds", "Time to find, measure and count the images of one request.", ["model_group"],
    buckets=(0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5),
)


class VisionHandler(GovernanceHandler[GroupVisionSettings]):
    """Per-key visual-token limits and charging (schema: ``docs/vision.md``)."""

    name = "vision"
    section = "vision"
    meter = METER
    group_settings_cls = GroupVisionSettings
    policy_fields = POLICY_FIELDS

    def __init__(self, settings: Settings, budgets: PeriodBudgets | None = None) -> None:
        super().__init__(settings, budgets)
        self._streams_done: dict[str, float] = {}

    def check_policy(self, config: PolicyLayer) -> None:
        resolve_policy(PolicyLayer("start-up check", "metadata", {}, True), None, config, key_scope="key:check",
                       team_scope=None)

    # -- before the call -------------------------------------------------------------------------
    def _policy(self, req: ProxyRequest, gs: GroupVisionSettings) -> VisionPolicy:
        try:
            key, team, config, key_scope, team_scope = self.policy_layers(req)
            return resolve_policy(key, team, config, key_scope=key_scope, team_scope=team_scope)
        except MetadataError:
            if gs.invalid_metadata == "reject":
                INVALID_METADATA.labels("reject").inc()
                raise
            INVALID_METADATA.labels("ignore").inc()
            log.warning("litellm-kv: ignoring malformed vision metadata of %s", req.caller.key_label, exc_info=True)
            empty = PolicyLayer(req.caller.key_label, "metadata", {}, True)
            return resolve_policy(empty, None, self.config_layer(req), key_scope=self.key_scope(req), team_scope=None)

    def _reject(self, req: ProxyRequest, status: int, limit_name: str, message: str, limit: object, value: object,
                source: str, headers: dict[str, str] | None = None) -> PolicyViolation:
        REJECTED.labels(req.model_group, limit_name).inc()
        return PolicyViolation(status, message, limit_name=limit_name, limit=limit, value=value, source=source,
                               headers=headers or {})

    def _check_endpoint(self, req: ProxyRequest) -> None:
        """Every endpoint but /v1/chat/completions is refused: images are found in the requests of some
        (/v1/responses, /v1/messages), but what the call used is charged from /v1/chat/completions' usage only."""
        endpoint = unmetered_endpoint(req.call_type)
        if endpoint is None:
            return
        group = req.model_group
        raise self._reject(
            req, 400, "vision.endpoint",
            f"Model '{group}' has visual-token limits, which are counted and charged on /v1/chat/completions "
            f"only; {endpoint} is refused on it (limit vision.endpoint; use /v1/chat/completions).",
            "/v1/chat/completions", endpoint,
            f"config model_groups.{group}.vision",
        )

    async def pre_call(self, req: ProxyRequest) -> None:
        self._check_endpoint(req)
        gs = self.group_settings(req.model_group)
        started = time.perf_counter()
        b = self._processor_bounds(req, gs)
        images = self._find_images(req, gs)
        if not images:
            return
        _drop_client_uuids(images)
        policy = self._policy(req, gs)
        self._check_image_count(req, policy, len(images))
        counted = await self._measure(req, images, gs, b)
        resizable = gs.family in ENGINE_RESIZABLE and gs.engine_resize
        downscale = policy.downscale and resizable
        why_not = "" if resizable else (
            f" (downscaling needs a vLLM deployment of a Qwen-VL family; this is {gs.family})"
        )
        need_pixel_cap = self._check_pixels(req, policy, counted, resizable, downscale, why_not)
        caps, charges = await self._token_caps(req, policy)
        self.track_holds(req, charges)
        max_pixels, downscaled_by, total = self._plan(
            req, gs, policy, counted, b, caps, need_pixel_cap=need_pixel_cap, downscale=downscale, why_not=why_not
        )
        await self._hold(req, policy, charges, total)
        if max_pixels is None and resizable and b.max_pixels is not None and any(c.how == "ceiling" for c in counted):
            # Unmeasured remote images were counted at the ceiling of the group's max_pixels: make the
            # engine honour that ceiling even if the deployment was started with a larger one.
            max_pixels = b.max_pixels
        litellm_data.ask_stream_usage(req.data)
        decision = {
            "model_group": req.model_group, "family": gs.family, "tokens": total,
            "images": [c.to_json() for c in counted], "max_pixels": max_pixels, "downscaled_by": downscaled_by,
            "charges": charges,
        }
        self.keep_decision(req, decision)
        fetched = {i: c.inline_url for i, c in enumerate(counted) if c.inline_url}
        if fetched:
            assert req.record_key is not None
            self.records.put(req.record_key, FETCHED_RECORD, fetched)
        req.response_headers[HEADER_TOKENS] = str(total)
        COUNT_SECONDS.labels(req.model_group).observe(time.perf_counter() - started)

    def _processor_bounds(self, req: ProxyRequest, gs: GroupVisionSettings) -> PixelBounds:
        """The bounds images are counted with; the client's ``mm_processor_kwargs`` (top level and
        ``extra_body``) are taken out and, when valid, replaced by exactly those bounds at top level."""
        try:
            client = take_processor_kwargs(req.data)
            b = engine_bounds(client, gs)
        except PolicyViolation as exc:
            REJECTED.labels(req.model_group, exc.limit_name).inc()
            raise
        if client:
            req.data["mm_processor_kwargs"] = processor_kwargs_of(b)
        return b

    def _find_images(self, req: ProxyRequest, gs: GroupVisionSettings) -> list[ImagePart]:
        """The request's images; its videos are refused unless the group allows them."""
        group = req.model_group
        try:
            images, videos = find_media(req.data)
        except ImageError as exc:
            REJECTED.labels(group, exc.limit_name).inc()
            raise
        _drop_client_uuids(videos)
        if videos and gs.videos == "reject":
            raise self._reject(
                req, 400, "vision.videos",
                f"{videos[0].where}: video input is not accepted on model '{group}' (vision.videos=reject in "
                f"config model_groups.{group}.vision)", "reject", len(videos), f"config model_groups.{group}.vision",
            )
        return images

    def _check_image_count(self, req: ProxyRequest, policy: VisionPolicy, images: int) -> None:
        lim = policy.max_images
        if lim is not None and images > lim.value:
            raise self._reject(
                req, 400, "vision.max_images_per_request",
                f"Request has {images} images; the limit is {lim.value} images per request for "
                f"{req.caller.key_label} on model '{req.model_group}' (set in {lim.source}).",
                lim.value, images, lim.source,
            )

    async def _measure(
        self, req: ProxyRequest, images: list[ImagePart], gs: GroupVisionSettings, b: PixelBounds
    ) -> list[Counted]:
        try:
            counted = await count_images(images, gs, b)
        except ImageError as exc:
            REJECTED.labels(req.model_group, exc.limit_name).inc()
            raise
        for c in counted:
            IMAGES.labels(req.model_group, c.how).inc()
        return counted

    def _check_pixels(self, req: ProxyRequest, policy: VisionPolicy, counted: list[Counted], resizable: bool,
                      downscale: bool, why_not: str) -> bool:
        """Refuse images over ``max_pixels_per_image`` that cannot be downscaled; True when the engine
        must be capped to satisfy it."""
        cap_pixels = policy.max_pixels
        if cap_pixels is None:
            return False
        who, group = req.caller.key_label, req.model_group
        need_pixel_cap = False
        for c in counted:
            if c.width is None or c.height is None:
                if resizable:
                    need_pixel_cap = True  # unknown size: let the engine guarantee the cap
                    continue
                raise self._reject(
                    req, 400, "vision.max_pixels_per_image",
                    f"{c.where}: the size of a remote image cannot be checked against the limit of "
                    f"{cap_pixels.value} pixels per image for {who} on model '{group}' (set in "
                    f"{cap_pixels.source}); send it inline.", cap_pixels.value, None, cap_pixels.source,
                )
            pixels = c.width * c.height
            if pixels > cap_pixels.value:
                if not downscale:
                    raise self._reject(
                        req, 400, "vision.max_pixels_per_image",
                        f"{c.where}: image of {c.width}x{c.height} = {pixels} pixels exceeds the limit of "
                        f"{cap_pixels.value} pixels per image for {who} on model '{group}' (set in "
                        f"{cap_pixels.source}){why_not}.", cap_pixels.value, pixels, cap_pixels.source,
                    )
                need_pixel_cap = True
        return need_pixel_cap

    async def _token_caps(
        self, req: ProxyRequest, policy: VisionPolicy
    ) -> tuple[list[TokenCap], list[dict[str, Any]]]:
        """The per-request token limit and what is left of each period budget (429 when one is spent),
        and the budgets to charge after the call."""
        now = datetime.now(timezone.utc)
        caps: list[TokenCap] = []
        if policy.max_tokens is not None:
            caps.append(TokenCap.per_request(policy.max_tokens, req.caller.key_label))
        charges: list[dict[str, Any]] = []
        metered = True
        for pl in policy.periods:
            charges.append({"scope": pl.scope, "period": pl.period.value, "limit": pl.limit.value,
                            "source": pl.limit.source, "at": now.isoformat()})
            if not metered:
                # The store failed open: asking it again for the other periods would only add waits.
                state = self.budgets.fail_open_hold(pl.scope, METER, pl.period, pl.limit.value, 0, "", now).state
            else:
                try:
                    state = await self.budgets.check(pl.scope, METER, pl.period, pl.limit.value, now=now)
                except BudgetStoreError as exc:
                    message, headers = store_failure("Visual-token", exc)
                    raise self._reject(req, 503, "vision.store", message, None, None, "", headers) from None
                metered = state.metered
            if not state.metered:
                charges[-1]["unmetered"] = True
            reset = state.reset_at.strftime("%Y-%m-%dT%H:%M:%SZ")
            retry = state.retry_after_seconds(now)
            headers = {"Retry-After": str(retry), "x-litellm-kv-vision-reset": reset}
            if state.exhausted:
                raise self._reject(
                    req, 429, f"vision.tokens_per_{pl.period.value}",
                    f"Visual-token budget spent: {pl.scope_label} has used {state.used} of {state.limit} visual "
                    f"tokens this {pl.period.value}{_seen(state)} on model '{req.model_group}' (limit set in "
                    f"{pl.limit.source}). "
                    f"It resets at {reset} (in {retry} s).", state.limit, state.used, pl.limit.source, headers,
                )
            caps.append(TokenCap(state.remaining, f"vision.tokens_per_{pl.period.value}", pl.limit, 429, headers,
                                 f"the {state.remaining} visual tokens left of the {pl.period.value} budget of "
                                 f"{pl.scope_label} (resets {reset}{_seen(state)})"))
        return caps, charges

    async def _hold(
        self, req: ProxyRequest, policy: VisionPolicy, charges: list[dict[str, Any]], total: int
    ) -> None:
        """Reserve the request's visual tokens in every period budget before the call (settled after it):
        concurrent requests that each fit what was left cannot together spend more than is left."""
        failed_open = False
        for pl, ch in zip(policy.periods, charges, strict=True):
            if not total:
                return
            hold_id = uuid.uuid4().hex  # ours, not the client's call id: a client cannot aim at another hold
            at = datetime.fromisoformat(ch["at"])
            if failed_open or ch.get("unmetered"):
                # The store failed open: asking it again would only add waits; this proxy holds what it knows.
                held = self.budgets.fail_open_hold(pl.scope, METER, pl.period, pl.limit.value, total, hold_id, at)
            else:
                try:
                    held = await self.budgets.reserve(pl.scope, METER, pl.period, pl.limit.value, total, hold_id,
                                                      now=at)
                except BudgetStoreError as exc:
                    await release_holds(self.budgets, METER, charges)
                    message, headers = store_failure("Visual-token", exc)
                    raise self._reject(req, 503, "vision.store", message, None, None, "", headers) from None
            failed_open = failed_open or not held.metered
            if held.granted:
                ch["hold"], ch["held"] = hold_id, held.granted
                if not held.metered:
                    ch["unmetered"] = True
            if held.granted < total:
                await release_holds(self.budgets, METER, charges)
                state, now = held.state, datetime.now(timezone.utc)
                reset = state.reset_at.strftime("%Y-%m-%dT%H:%M:%SZ")
                retry = state.retry_after_seconds(now)
                raise self._reject(
                    req, 429, f"vision.tokens_per_{pl.period.value}",
                    f"Request needs {total} visual tokens; {pl.scope_label} has {state.remaining} left of "
                    f"{state.limit} visual tokens this {pl.period.value} ({state.used} used, {state.held} held by "
                    f"requests in flight{_seen(state)}) on model '{req.model_group}' (limit set in {pl.limit.source}). "
                    f"It resets at {reset} (in {retry} s).", state.limit, total, pl.limit.source,
                    {"Retry-After": str(retry), "x-litellm-kv-vision-reset": reset},
                )

    def _plan(
        self, req: ProxyRequest, gs: GroupVisionSettings, policy: VisionPolicy, counted: list[Counted],
        b: PixelBounds, caps: list[TokenCap], *, need_pixel_cap: bool, downscale: bool, why_not: str,
    ) -> tuple[int | None, str | None, int]:
        """Refuse a request over its tightest token cap, or pick the engine's ``max_pixels`` that fits every
        limit: (max_pixels or None, what it was lowered for, the visual tokens at that size)."""
        group = req.model_group
        total = sum(c.tokens for c in counted)
        tightest = min(caps, key=lambda cap: cap.tokens) if caps else None
        over_tokens = tightest is not None and total > tightest.tokens
        if not (over_tokens or need_pixel_cap):
            return None, None, total
        if over_tokens and not downscale:
            assert tightest is not None
            raise self._reject(
                req, tightest.status, tightest.limit_name,
                f"Request needs {total} visual tokens ({len(counted)} images, counted for {gs.family}); that "
                f"exceeds {tightest.what} on model '{group}' (set in {tightest.limit.source}){why_not}.",
                tightest.tokens, total, tightest.limit.source, dict(tightest.headers),
            )
        cap_pixels = policy.max_pixels
        fit = fit_max_pixels(counted, gs, b, tightest.tokens if tightest else None,
                             cap_pixels.value if cap_pixels is not None and need_pixel_cap else None)
        if fit is None:
            assert tightest is not None
            raise self._reject(
                req, tightest.status, tightest.limit_name,
                f"Request needs {total} visual tokens ({len(counted)} images) and cannot be downscaled within "
                f"{tightest.what} on model '{group}' (set in {tightest.limit.source}): even at the processor's "
                "minimum size it needs more.", tightest.tokens, total, tightest.limit.source, dict(tightest.headers),
            )
        sources = []
        if need_pixel_cap and cap_pixels is not None:
            sources.append(f"max_pixels_per_image ({cap_pixels.source})")
            DOWNSCALED.labels(group, "vision.max_pixels_per_image").inc()
        if over_tokens and tightest is not None:
            sources.append(f"{tightest.limit_name.removeprefix('vision.')} ({tightest.limit.source})")
            DOWNSCALED.labels(group, tightest.limit_name).inc()
        downscaled_by = "; ".join(sources)
        total = recount(counted, gs, b, fit)
        req.response_headers[HEADER_DOWNSCALED] = f"max_pixels={fit}; by={downscaled_by}"
        return fit, downscaled_by, total

    def _decision_of(self, data: Mapping[str, Any]) -> Mapping[str, Any] | None:
        kept = self.decision_of(data)
        return kept if isinstance(kept, Mapping) else None

    async def pre_deployment(self, kwargs: dict[str, Any]) -> None:
        """vLLM deployments only (other providers would reject the fields): the downscale's ``max_pixels``
        and each counted image's identifier as the part's ``uuid``."""
        decision = self._decision_of(kwargs)
        if decision is None or not litellm_data.is_vllm_deployment(kwargs):
            return
        mm = engine_processor_kwargs(kwargs.get("mm_processor_kwargs"), decision)
        if mm is not None:
            kwargs["mm_processor_kwargs"] = mm
        set_image_uuids(kwargs, decision, self.records.get(litellm_data.call_key(kwargs), FETCHED_RECORD) or {})

    # -- after the call --------------------------------------------------------------------------
    def _apply(self, targets: list[Mapping[str, Any]], decision: Mapping[str, Any], usage: Any) -> int:
        """Write the visual tokens into ``usage`` and the breakdown into each target's spend-log metadata."""
        group = str(decision.get("model_group") or "")
        estimate = int(decision.get("tokens") or 0)
        engine = engine_image_tokens(usage)
        if engine is not None:
            tokens, source = engine, "engine"
            ESTIMATE_DELTA.labels(group).observe(engine - estimate)
        else:
            tokens, source = estimate, "formula"
        gs = self.group_settings(group) if self.settings.group(group) else GroupVisionSettings()
        if tokens:
            set_image_tokens(usage, tokens, add_to_prompt=engine is None and not gs.prompt_includes_images)
            TOKENS_CHARGED.labels(group, source).inc(tokens)
        breakdown = {
            "visual_tokens": tokens,
            "measured_by": source,
            "estimated_tokens": estimate,
            "family": decision.get("family"),
            "images": decision.get("images"),
            "max_pixels": decision.get("max_pixels"),
            "downscaled_by": decision.get("downscaled_by"),
            "charged_to": [f"{c['scope']}/{c['period']}" for c in decision.get("charges") or []],
        }
        for target in targets:
            record_breakdown(target, "vision", breakdown)
        return tokens

    def _charge(self, decision: Mapping[str, Any], tokens: int) -> None:
        # Every hold is settled, even at zero tokens: it must stop counting against the budget.
        self.settle_later(METER, list(decision.get("charges") or []), tokens)

    async def log_failure(self, kwargs: dict[str, Any], response: Any) -> None:
        """The call failed: give its holds back (a retry that succeeds still charges what it used)."""
        decision = self._decision_of(kwargs)
        if decision is not None:
            await release_holds(self.budgets, METER, list(decision.get("charges") or []))

    def _first_settle(self, key: str) -> bool:
        """True the first time ``key`` (a call id) is settled: a stream may be seen by two hooks."""
        if key in self._streams_done:
            return False
        self._streams_done[key] = time.monotonic()
        if len(self._streams_done) > 4096:  # bounded: forget the oldest half
            for old in sorted(self._streams_done, key=self._streams_done.__getitem__)[:2048]:
                self._streams_done.pop(old, None)
        return True

    async def post_success_deployment(self, request_data: dict[str, Any], response: Any) -> None:
        decision = self._decision_of(request_data)
        usage = litellm_data.usage_of(response)
        if decision is not None and usage is not None:
            self._charge(decision, self._apply([request_data], decision, usage))

    async def stream_start(self, data: dict[str, Any], stream: Any) -> None:
        """Patch the usage chunk LiteLLM records for pricing (no hook sees it: LiteLLM strips it first)."""
        decision = self._decision_of(data)
        if decision is None:
            return
        targets: list[Mapping[str, Any]] = [data]
        call_id = litellm_data.call_id(data) or str(id(data))

        def on_usage(usage: Any, chunk: Any) -> None:
            if not self._first_settle(call_id):
                return
            tokens = self._apply(targets, decision, usage)
            self._charge(decision, tokens)  # off the stream's path (the list append cannot await)

        details = stream_usage.watch(stream, on_usage)
        if details:
            targets.append(details)

    async def log_success(self, kwargs: dict[str, Any], response: Any) -> None:
        """A stream whose usage chunk never came (the client went away mid-stream; LiteLLM then logs
        what was streamed as a success): the engine has read the images, so our count is charged and
        the holds settled rather than left until they expire."""
        if not kwargs.get("stream"):
            return
        decision = self._decision_of(kwargs)
        call_id = litellm_data.call_id(kwargs)
        if decision is None or not call_id or not self._first_settle(call_id):
            return
        usage = litellm_data.usage_of(response)
        targets: list[Mapping[str, Any]] = list(litellm_data.logged_call_targets(kwargs))
        tokens = self._apply(targets, decision, usage if usage is not None else {})
        self._charge(decision, tokens)

    async def stream_chunk_deployment(self, request_data: dict[str, Any], chunk: Any) -> None:
        # Providers whose usage chunk does reach the deployment hook (LiteLLM keeps it when the
        # client asked for include_usage on some paths): settle once.
        decision = self._decision_of(request_data)
        usage = litellm_data.usage_of(chunk)
        if decision is None or usage is None or not int(litellm_data.field(usage, "prompt_tokens") or 0):
            return
        call_id = litellm_data.call_id(request_data) or str(id(request_data))
        if self._first_settle(call_id):
            self._charge(decision, self._apply([request_data], decision, usage))


async def _fetch(part: ImagePart, gs: GroupVisionSettings, bounds: ImageBounds) -> tuple[ImageInfo, bytes] | None:
    """A remote image's header and bytes, when the group allows fetching from its host."""
    try:
        host = (urlsplit(part.source).hostname or "").lower()
    except ValueError as exc:  # "http://[::1": an unclosed IPv6 host
        raise ImageError.of("invalid_url", part.where, f"image URL cannot be parsed ({exc})",
                            part.source[:64]) from None
    if not gs.fetch.allow_hosts or host not in {h.lower() for h in gs.fetch.allow_hosts}:
        return None
    import httpx

    cap = min(gs.fetch.max_bytes, bounds.max_bytes)
    buf = bytearray()
    try:
        async with asyncio.timeout(gs.fetch.timeout_s), httpx.AsyncClient(
            follow_redirects=False, timeout=gs.fetch.timeout_s
        ) as client, client.stream("GET", part.source) as resp:
            if resp.status_code != 200:
                log.info("litellm-kv: fetching %s gave %s; counting the ceiling", part.where, resp.status_code)
                return None
            async for chunk in resp.aiter_bytes():
                buf += chunk
                if len(buf) > cap:
                    raise ImageError.of("too_large", part.where,
                                        f"remote image is larger than the fetch cap of {cap} bytes", len(buf))
    except (httpx.HTTPError, TimeoutError):
        log.info("litellm-kv: fetching %s failed; counting the ceiling", part.where)
        return None
    except httpx.InvalidURL as exc:
        # Not an HTTPError: httpx refuses the URL itself (a NUL byte, a bad port), so would the engine.
        raise ImageError.of("invalid_url", part.where, f"image URL cannot be fetched ({exc})",
                            part.source[:64]) from None
    info = image_info(buf, part.where, ImageBounds(max_bytes=cap, max_pixels=bounds.max_pixels))
    return info, bytes(buf)


async def count_images(images: list[ImagePart], gs: GroupVisionSettings, b: PixelBounds) -> list[Counted]:
    """Each image's visual tokens within the bounds ``b`` and its identifier: inline images from their
    header and bytes, remote ones fetched when the group allows their host, else at the ceiling."""
    limits = ImageBounds(max_bytes=gs.max_image_bytes, max_pixels=gs.max_image_pixels)
    out: list[Counted] = []
    for part in images:
        if part.inline:
            # Decoding a large image takes long enough to stall every other request: do it in a thread.
            if len(part.source) > OFFLOAD_CHARS:
                info, ident = await asyncio.to_thread(_inline, part, limits)
            else:
                info, ident = _inline(part, limits)
            out.append(Counted(part.where, image_tokens(gs, info.width, info.height, part.detail, b, part.where),
                               info.width, info.height, "header", part.detail, ident))
            continue
        fetched = await _fetch(part, gs, limits)
        if fetched is not None:
            info, raw = fetched
            w, h = info.width, info.height
            inline = f"data:image/{info.format};base64,{base64.b64encode(raw).decode('ascii')}"
            out.append(Counted(part.where, image_tokens(gs, w, h, part.detail, b, part.where), w, h, "fetched",
                               part.detail, image_identifier(raw), inline))
        else:
            out.append(Counted(part.where, ceiling_tokens(gs, part.detail, b, part.where), None, None, "ceiling",
                               part.detail))
    return out


def _seen(state: BudgetState) -> str:
    """What a refusal adds when its state is this proxy's own view (the budget store failed open)."""
    return "" if state.metered else f"; {FAIL_OPEN_NOTE}"


def _inline(part: ImagePart, limits: ImageBounds) -> tuple[ImageInfo, str]:
    """An inline image's size (from its header) and identifier (a digest of its decoded bytes)."""
    raw = payload_bytes(part, limits)
    return image_info(raw, part.where, limits), image_identifier(raw)


async def explain_record(settings: Settings, group: str, data: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the vision count would record for ``data`` (a request body) with no key's limits (so no
    downscale): the family, each image's tokens and identifier, the processor kwargs. For
    ``/litellm-kv/route``, which explains without sending. None when the group has no vision section."""
    g = settings.group(group)
    if g is None or not g.vision:
        return None
    raw = {k: v for k, v in dict(g.vision).items() if k not in POLICY_FIELDS}
    gs = parse_section(GroupVisionSettings, raw, f"litellm_kv.model_groups.{group}.vision")
    body = dict(data)
    if isinstance(body.get("extra_body"), Mapping):
        body["extra_body"] = dict(body["extra_body"])
    client = take_processor_kwargs(body)
    b = engine_bounds(client, gs)
    images, _videos = find_media(body)
    counted = await count_images(images, gs, b)
    return {"model_group": group, "family": gs.family, "images": [c.to_json() for c in counted],
            "max_pixels": None, "mm_processor_kwargs": processor_kwargs_of(b) if client else None}


def _drop_client_uuids(parts: list[ImagePart] | list[VideoPart]) -> None:
    """A client's ``uuid`` on a media part would name the engine's cached item for that part: another
    image's blocks (or processed pixels) could be reused for it. Only the proxy sets one."""
    for part in parts:
        if isinstance(part.ref, dict):
            part.ref.pop("uuid", None)


def engine_processor_kwargs(current: object, decision: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``mm_processor_kwargs`` a vLLM deployment gets for a call with this vision ``decision``: the
    request's (the client's, checked and rewritten by :meth:`VisionHandler.pre_call`) with the downscale's
    ``max_pixels``; None when there are none. Routing hashes with exactly these (the engine's image
    identifiers depend on them, key order included)."""
    mm = dict(current) if isinstance(current, Mapping) else {}
    if decision.get("max_pixels") is not None:
        mm["max_pixels"] = int(decision["max_pixels"])
    return mm or None


def set_image_uuids(data: Mapping[str, Any], decision: Mapping[str, Any], fetched: Mapping[int, str]) -> None:
    """Give each image part of ``data`` the identifier it was counted with as its ``uuid`` (the engine
    then keys its blocks by it, without hashing pixels); a part counted without one gets none. A remote
    image the proxy fetched is sent as the bytes it counted (``fetched``: image index -> ``data:`` URL): an
    engine fetching the URL again could get other bytes (a server answering the proxy with a small image
    and the engine with a large one), processed under an identifier that is not theirs. Nothing is set
    when the parts do not line up with the decision's images (the request changed after the count)."""
    counted = decision.get("images")
    if not isinstance(counted, list):
        return
    try:
        images, _videos = find_media(data)
    except ImageError:
        return
    if len(images) != len(counted):
        log.warning("litellm-kv: %d images in the request, %d counted; image identifiers not set",
                    len(images), len(counted))
        return
    for i, (part, c) in enumerate(zip(images, counted, strict=True)):
        ident = c.get("identifier") if isinstance(c, Mapping) else None
        ref = part.ref
        if not isinstance(ref, dict):
            continue
        inline = fetched.get(i)
        if inline is not None:
            spec = ref.get("image_url")
            if isinstance(spec, dict):
                ref["image_url"] = {**spec, "url": inline}
            elif isinstance(spec, str):
                ref["image_url"] = inline
            else:
                ident = None  # another shape: the engine fetches it; its bytes are not the counted ones
        if isinstance(ident, str):
            ref["uuid"] = ident
        else:
            ref.pop("uuid", None)


def engine_image_tokens(usage: Any) -> int | None:
    """vLLM's ``prompt_tokens_details.multimodal_tokens`` ({"image": n} in vLLM 0.32; a bare int elsewhere)."""
    details = litellm_data.field(usage, "prompt_tokens_details")
    mm = litellm_data.field(details, "multimodal_tokens")
    if isinstance(mm, Mapping):
        value = mm.get("image")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
    if isinstance(mm, int) and not isinstance(mm, bool) and mm >= 0:
        return mm
    extra = getattr(details, "model_extra", None)  # pydantic keeps unknown fields here
    if isinstance(extra, Mapping) and extra.get("multimodal_tokens") is not None:
        return engine_image_tokens({"prompt_tokens_details": {"multimodal_tokens": extra["multimodal_tokens"]}})
    return None
