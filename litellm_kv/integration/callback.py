"""The LiteLLM callback: declare ``litellm_kv.integration.callback.proxy_handler`` in config.yaml.

```yaml
litellm_settings:
  callbacks: ["litellm_kv.integration.callback.proxy_handler"]
```

It fans every hook out to the feature handlers (:mod:`litellm_kv.integration.hooks`) and contains
their failures: a bug or an unreachable dependency in routing or affinity never fails a request. Where
a limit is at stake (a governance handler's ``pre_call`` on a governed group) a failure refuses the
request instead: sending it on would skip the limit. Whatever the client wrote under litellm-kv's
names in the request metadata is dropped before any handler runs; decisions and response headers
live in the callback's :class:`~litellm_kv.integration.call_records.CallRecords`.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import os
import sys
import time
from collections.abc import AsyncGenerator, Mapping
from typing import Any

from litellm.integrations.custom_logger import CustomLogger
from litellm.proxy._types import ProxyException

from litellm_kv.config import Settings, load_settings
from litellm_kv.errors import ConfigError, PolicyViolation
from litellm_kv.integration import litellm_data
from litellm_kv.integration.call_records import CallRecords
from litellm_kv.integration.governance import GroupNames
from litellm_kv.integration.hooks import Caller, Handler, ProxyRequest
from litellm_kv.integration.refusals import RecentRefusals
from litellm_kv.integration.workers import report as report_workers
from litellm_kv.observability import counter, histogram
from litellm_kv.redis_eviction import keep_watching, watch
from litellm_kv.tasks import spawn_held

log = logging.getLogger("litellm_kv")

INTERNAL_ERRORS = counter(
    "internal_errors", "Exceptions inside litellm-kv that were contained (request continued).", ["handler", "hook"]
)
REJECTIONS = counter(
    "policy_rejections", "Requests rejected by a litellm-kv limit.", ["limit", "status"]
)

#: The record under which pre_call keeps the response headers the handlers chose.
HEADERS_RECORD = "headers"
#: Under a call's record: the group whose limits the governance handlers applied in the pre-call hook.
GOVERNED_RECORD = "governed"

# Order matters in pre_call: vision may downscale (changing prompt tokens) before routing sees them.
HANDLER_PATHS = (
    "litellm_kv.integration.vision_hooks:VisionHandler",
    "litellm_kv.integration.reasoning_hooks:ReasoningHandler",
    "litellm_kv.integration.affinity_hooks:AffinityHandler",
    "litellm_kv.integration.routing_hooks:KVRoutingHandler",
)


def _settings_path() -> str | None:
    path = os.environ.get("LITELLM_KV_CONFIG")
    if path:
        return path
    try:
        from litellm.proxy import proxy_server

        return getattr(proxy_server, "user_config_file_path", None) or os.environ.get("CONFIG_FILE_PATH")
    except Exception:  # pragma: no cover - proxy not importable
        return None


def _litellm_secret(reference: str) -> Any:
    """An ``os.environ/NAME`` value read by LiteLLM's own ``get_secret``: the environment, or the secret
    manager the proxy's config set up, with LiteLLM's conversions, so litellm-kv's section and LiteLLM's
    settings read one config file alike."""
    from litellm.secret_managers.main import get_secret

    return get_secret(reference)


class LiteLLMKV(CustomLogger):
    """One object LiteLLM calls; it calls the feature handlers in order."""

    def __init__(self, settings: Settings | None = None, handlers: list[Handler] | None = None) -> None:
        super().__init__()
        self._settings = settings
        self.records = CallRecords()
        #: The last requests refused here (the admin page lists a key's or team's).
        self.refusals = RecentRefusals()
        self._handlers = handlers
        if handlers is not None:
            self._share_records(handlers)
        self._started: asyncio.Lock | None = None
        self._ready = False
        self._group_names: GroupNames | None = None

    # -- set-up -----------------------------------------------------------------------------
    @property
    def settings(self) -> Settings:
        """The ``litellm_kv`` settings; an invalid section raises :class:`ConfigError` (see ``_install``)."""
        if self._settings is None:
            self._settings = load_settings(_settings_path(), lookup=_litellm_secret)
        return self._settings

    @property
    def handlers(self) -> list[Handler]:
        if self._handlers is None:
            handlers: list[Handler] = []
            for path in HANDLER_PATHS:
                module_name, _, cls_name = path.partition(":")
                try:
                    cls = getattr(importlib.import_module(module_name), cls_name)
                except (ImportError, AttributeError):
                    log.exception("litellm-kv: cannot load handler %s", path)
                    continue
                handlers.append(cls(self.settings))
            self._share_records(handlers)
            self._handlers = handlers
        return self._handlers

    def _share_records(self, handlers: list[Handler]) -> None:
        # One table for the call: the callback checks call-id reuse and keeps headers in the same one.
        for h in handlers:
            h.records = self.records

    @property
    def group_names(self) -> GroupNames:
        if self._group_names is None:
            self._group_names = GroupNames(self.settings)
        return self._group_names

    def handler(self, name: str) -> Handler | None:
        return next((h for h in self.handlers if h.name == name), None)

    async def ensure_started(self) -> None:
        if self._ready:
            return
        if self._started is None:
            self._started = asyncio.Lock()
        async with self._started:
            if self._ready:
                return
            for h in self.handlers:
                try:
                    await h.startup()
                except Exception:
                    INTERNAL_ERRORS.labels(h.name, "startup").inc()
                    log.exception("litellm-kv: %s failed to start", h.name)
            self._ready = True
            report_workers(self.settings)  # what each of several workers would keep for itself: said once
            # Whether a Redis the stores use may delete their keys (redis_eviction): read now and then regularly.
            if [watch(p.redis, p.use) for p in self.settings.stores() if p.redis is not None]:
                spawn_held(_background, keep_watching(self.settings.redis_eviction_check_s))
            watch_gc_pauses()
            if self.settings.freeze_startup_heap:
                _freeze_startup_heap()

    def _contain(self, h: Handler, hook: str) -> None:
        INTERNAL_ERRORS.labels(h.name, hook).inc()
        log.exception("litellm-kv: %s.%s failed; continuing without it", h.name, hook)

    def _refusal(self, exc: PolicyViolation, caller: Caller, model: str) -> ProxyException:
        REJECTIONS.labels(exc.limit_name or "unknown", str(exc.status_code)).inc()
        log.info("litellm-kv: rejected (%s): %s", exc.limit_name, exc.message)
        self.refusals.add(
            key_hash=caller.key_hash, key_label=caller.key_label, team_id=caller.team_id,
            team_label=caller.team_label if caller.team_id else None, model=model,
            limit=exc.limit_name or "unknown", status=exc.status_code, message=exc.message,
        )
        return ProxyException(
            message=exc.message,
            type="litellm_kv_limit" if exc.status_code != 400 else "invalid_request_error",
            param=exc.limit_name or None,
            code=exc.status_code,
            headers=dict(exc.headers),
        )

    # -- proxy-level hooks (must be defined on this class itself, not inherited) -------------
    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> Any:
        await self.ensure_started()
        # Before any handler: a client-sent decision, route or header record under our names is never read.
        litellm_data.drop_client_entries(data)
        caller = litellm_data.caller_from_auth(user_api_key_dict)
        call = str(getattr(call_type, "value", call_type))  # a CallTypes member or its string
        try:
            # An upstream the client chose (only where the operator allows client-side credentials) is no way past them.
            upstreams = litellm_data.client_upstreams(data)
            await self.group_names.check_client_upstreams(upstreams)
            # The group LiteLLM will serve the name from (an alias followed), so its limits hold.
            model_group = await self._governed_as(data, call, caller.team_id, bool(upstreams))
        except PolicyViolation as exc:
            raise self._refusal(exc, caller, litellm_data.model_group(data)) from None
        group = self.settings.group(model_group)
        acting = [h for h in self.handlers if h.enabled_for(group)]
        # Only a call some handler acts on can have records (an ungoverned call's body stays as sent).
        record_key = litellm_data.stamp_call(data) if acting else None
        req = ProxyRequest(
            data=data,
            caller=caller,
            model_group=model_group,
            call_type=call,
            settings=self.settings,
            group=group,
            record_key=record_key,
        )
        try:
            for h in acting:
                try:
                    await h.pre_call(req)
                except PolicyViolation as exc:
                    raise self._refusal(exc, caller, model_group) from None
                except Exception as exc:
                    if not h.fails_closed:
                        self._contain(h, "pre_call")
                        continue
                    log.exception("litellm-kv: %s.pre_call failed on governed model '%s'; refusing the request",
                                  h.name, model_group)
                    raise self._refusal(PolicyViolation(
                        500, f"The {h.name} limits of model '{model_group}' could not be applied to this request "
                        f"({type(exc).__name__}), so it was refused rather than sent without them; the proxy log "
                        "has the details.", limit_name=f"{h.name}.internal_error", source="litellm-kv",
                    ), caller, model_group) from None
        except BaseException:
            # Refused, failed or cancelled (the client went away): the call will not run, so what an
            # earlier handler reserved for it (a vision hold before reasoning refuses) is given back now.
            self._abandon(acting, record_key)
            raise
        if req.response_headers and record_key:
            self.records.put(record_key, HEADERS_RECORD, dict(req.response_headers))
        if record_key and any(h.fails_closed for h in acting):
            self.records.put(record_key, GOVERNED_RECORD, model_group)
        return data

    async def _governed_as(self, data: dict, call_type: str, team_id: str | None, own_upstream: bool) -> str:
        """The group a call is governed as. A batch may run on the model its input file was uploaded for
        rather than the one its body names (:func:`litellm_data.batch_models`): of the groups it may reach,
        one with limits is the one governed, so a batch bound for governed engines is refused when it is
        created, not line by line at the deployments."""
        names = (litellm_data.batch_models(data) if call_type == "acreate_batch" else []) or [
            litellm_data.model_group(data)]
        await self.group_names.prepare(names, team_id)
        groups = [self.group_names.resolve(n, team_id, own_upstream) for n in names]
        return next((g for g in groups if g in self.group_names.limited), groups[0])

    def _abandon(self, handlers: list[Handler], record_key: str | None) -> None:
        """The call ``record_key`` is over without a result: each handler gives back what it reserved."""
        for h in handlers:
            try:
                h.abandon(record_key)
            except Exception:
                self._contain(h, "abandon")
        self.records.forget(record_key)

    async def async_post_call_failure_hook(
        self, request_data: dict, original_exception: Exception, user_api_key_dict: Any,
        traceback_str: str | None = None,
    ) -> Any:
        # The call is over (every retry and fallback failed, or pre_call refused it): its holds are given
        # back (LiteLLM does not log a failure event for every such call) and its records are done.
        self._abandon(self.handlers, litellm_data.call_key(request_data))
        return None

    async def async_post_call_success_hook(self, data: dict, user_api_key_dict: Any, response: Any) -> Any:
        for h in self.handlers:
            try:
                await h.post_success(data, response)
            except Exception:
                self._contain(h, "post_success")
        return response

    async def async_post_call_streaming_iterator_hook(
        self, user_api_key_dict: Any, response: Any, request_data: dict
    ) -> AsyncGenerator[Any, None]:
        for h in self.handlers:
            try:
                await h.stream_start(request_data, response)
            except Exception:
                self._contain(h, "stream_start")
        async for chunk in response:
            for h in self.handlers:
                try:
                    await h.stream_chunk(request_data, chunk)
                except Exception:
                    self._contain(h, "stream_chunk")
            yield chunk

    async def async_post_call_response_headers_hook(
        self,
        data: dict,
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, Any] | None = None,
    ) -> dict[str, str] | None:
        record_key = litellm_data.call_key(data)
        headers = dict(self.records.get(record_key, HEADERS_RECORD) or {})
        for h in self.handlers:
            try:
                headers.update(await h.response_headers(data, response))
            except Exception:
                self._contain(h, "response_headers")
        if not data.get("stream"):
            # The last hook of a plain call that reads its records (a stream's run until it is logged).
            self.records.forget(record_key)
        return headers or None

    # -- router-level hooks --------------------------------------------------------------------
    async def async_filter_deployments(
        self,
        model: str,
        healthy_deployments: list,
        messages: Any,
        request_kwargs: dict | None = None,
        parent_otel_span: Any = None,
    ) -> list[dict]:
        await self.ensure_started()
        chosen: list[dict] | None = None
        for h in self.handlers:
            if chosen is not None:
                break
            try:
                chosen = await h.filter_deployments(model, healthy_deployments, messages, request_kwargs or {})
            except Exception:
                self._contain(h, "filter_deployments")
        return chosen if chosen else healthy_deployments

    async def async_pre_call_deployment_hook(self, kwargs: dict, call_type: Any) -> dict | None:
        await self._refuse_unchecked(kwargs, str(getattr(call_type, "value", call_type)))
        for h in self.handlers:
            try:
                await h.pre_deployment(kwargs)
            except Exception:
                self._contain(h, "pre_deployment")
        return kwargs

    async def _refuse_unchecked(self, kwargs: Mapping[str, Any], call_type: str) -> None:
        """A client's call on its way to a governed group's deployment whose limits the pre-call hook did not apply
        is refused: one that skipped the hook (LiteLLM runs the lines of its own batches and its pass-through routes
        through the router without it), or a fallback to another group that the client asked for (the router calls
        the fallback's deployment within the same call, after the hook applied the first group's limits; the
        operator's router fallbacks go on). Calls LiteLLM makes itself (health checks) name no group."""
        if not any(h.fails_closed for h in self.handlers) or not self.group_names.limited:
            return  # no limits configured, or no governance here (an application's own Router)
        key = litellm_data.call_key(kwargs)
        applied = self.records.get(key, GOVERNED_RECORD) if key is not None else None
        caller = litellm_data.caller_from_request_metadata(litellm_data.request_metadata(kwargs))
        try:
            names = [litellm_data.deployment_group(kwargs), *litellm_data.deployment_model_groups(kwargs)]
            await self.group_names.prepare(names, caller.team_id)
            # A KV-routed group's tenant isolation is given to such a call where it is routed (routing_hooks).
            groups = sorted({g for name in names if name
                             for g in self.group_names.groups_reached(name, caller.team_id)
                             if g in self.group_names.limited})
            # A fallback the operator configured goes on: the operator's choice, as the limits are.
            fallback = applied is not None and bool(groups) and applied not in groups
            operator_fallbacks = litellm_data.configured_fallbacks(str(applied)) if fallback else set()
        except Exception as exc:
            log.exception("litellm-kv: cannot tell whether a call to a deployment reaches a model group with limits")
            raise self._refusal(PolicyViolation(
                500, "Whether this call reaches the deployments of a model group with limits could not be checked "
                f"({type(exc).__name__}), so it was refused; the proxy log has the details.",
                limit_name="governance.internal_error", source="litellm-kv"), caller, "") from None
        if not groups or applied in groups:
            return
        if set(groups) <= operator_fallbacks:
            return
        model = ", ".join(f"'{g}'" for g in groups)
        how = (f"as a fallback of model '{applied}', whose limits were applied instead" if applied is not None else
               "without passing the checks that apply them (LiteLLM runs the lines of its batches and its pass-through "
               "routes without them)")
        raise self._refusal(PolicyViolation(
            400, f"This call ({call_type[:64]}) reached the deployments of model {model}, which has litellm-kv limits, "
            f"{how}, so it was refused (limit governance.unchecked_call). Send the request to {model} itself, on "
            "/v1/chat/completions.",
            limit_name="governance.unchecked_call", value=call_type, source=f"config model_groups.{groups[0]}",
        ), caller, groups[0])

    async def async_post_call_success_deployment_hook(
        self, request_data: dict, response: Any, call_type: Any
    ) -> Any:
        for h in self.handlers:
            try:
                await h.post_success_deployment(request_data, response)
            except Exception:
                self._contain(h, "post_success_deployment")
        return response

    async def async_post_call_streaming_deployment_hook(
        self, request_data: dict, response_chunk: Any, call_type: Any
    ) -> Any:
        for h in self.handlers:
            try:
                await h.stream_chunk_deployment(request_data, response_chunk)
            except Exception:
                self._contain(h, "stream_chunk_deployment")
        return response_chunk

    async def async_post_call_failure_deployment_hook(
        self, request_data: Any, exception: Exception, call_type: Any, fallback_depth: int | None = None
    ) -> None:
        for h in self.handlers:
            try:
                await h.post_failure_deployment(request_data, exception)
            except Exception:
                self._contain(h, "post_failure_deployment")

    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        for h in self.handlers:
            try:
                await h.log_success(kwargs, response_obj)
            except Exception:
                self._contain(h, "log_success")
        if kwargs.get("stream"):
            self.records.forget(litellm_data.call_key(kwargs))

    async def async_log_failure_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        for h in self.handlers:
            try:
                await h.log_failure(kwargs, response_obj)
            except Exception:
                self._contain(h, "log_failure")


GC_PAUSE_SECONDS = histogram(
    "gc_pause_seconds",
    "Garbage-collection pauses of this proxy process by generation, seconds (they stall the event loop, "
    "LiteLLM's work and routing decisions alike; see freeze_startup_heap).",
    ["generation"],
    buckets=(0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5),
)
_gc_started = 0.0


def _gc_timer(phase: str, info: dict[str, Any]) -> None:
    global _gc_started
    if phase == "start":
        _gc_started = time.perf_counter()
    elif _gc_started:
        GC_PAUSE_SECONDS.labels(str(info.get("generation"))).observe(time.perf_counter() - _gc_started)


def watch_gc_pauses() -> None:
    """Time every collection (litellm_kv_gc_pause_seconds); installed once per process."""
    if _gc_timer not in gc.callbacks:
        gc.callbacks.append(_gc_timer)


def _freeze_startup_heap() -> None:
    """Move every object alive after start-up (LiteLLM's model tables, modules, the router) out of the
    collector's reach: full collections then walk only what requests create, which took tens of
    milliseconds off the proxy's p99 (docs/performance.md)."""
    gc.collect()
    gc.freeze()
    log.info("litellm-kv: start-up heap frozen (%d objects outside the garbage collector's walks)",
             gc.get_freeze_count())


async def _start_when_router_exists(handler: LiteLLMKV, timeout_s: float = 120.0) -> None:
    """Start subscribers and discovery as soon as the proxy has built its router, not at the first request."""
    from litellm.proxy import proxy_server

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while getattr(proxy_server, "llm_router", None) is None and loop.time() < deadline:
        await asyncio.sleep(0.2)
    await handler.ensure_started()


_background: set[asyncio.Task[None]] = set()


def _install(handler: LiteLLMKV) -> None:
    if "litellm.proxy.proxy_server" not in sys.modules:
        # Not loaded by a proxy (an application's own Router, scripts, tests): no routes to add, no config
        # to read, and importing the proxy's server module here would only cost start-up time.
        return
    try:
        from litellm_kv.integration.admin import register

        register(handler)
    except Exception:  # not inside a proxy (tests, scripts)
        log.debug("litellm-kv: admin routes not registered (no proxy app)")
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    # Inside the proxy (its config is being loaded): an invalid litellm_kv section stops the proxy from
    # starting, with the path of the bad option, rather than running without the limits it declares.
    # Every group section the handlers parse is checked now too (kv, reasoning, vision), for the same reason.
    try:
        handler.settings  # noqa: B018 - loads and validates
        for h in handler.handlers:
            h.check_config()
    except ConfigError as exc:
        log.error("litellm-kv: invalid configuration: %s", exc)
        raise
    _background.add(loop.create_task(_start_when_router_exists(handler)))


proxy_handler = LiteLLMKV()
_install(proxy_handler)
