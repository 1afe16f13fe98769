"""LiteLLM's pass-through routes, closed where they would reach the engines of a group with limits.

LiteLLM 1.110.2 forwards a request on its provider pass-through routes (``/vllm/*``, ``/azure/*``, ``/openai/*``
and two dozen more) or on an operator's ``general_settings.pass_through_endpoints`` to an upstream as the client
wrote it: a body naming a router model is relayed to that model's deployment (``POST /vllm/v1/chat/completions``
with ``"model": "qwen"``), so is a model named in the path (``/azure/openai/deployments/qwen/chat/completions``),
and anything else goes to the route's own target (``VLLM_API_BASE``, an endpoint's ``target``). None of them calls
LiteLLM's pre-call hook: a group's reasoning and vision limits would not be applied (the client's
``chat_template_kwargs``, ``max_tokens`` and images reach the engine unread) and nothing would be charged.

So litellm-kv checks these requests in front of the proxy's app, where groups with limits exist: a request on a
pass-through route is refused (400 ``governance.passthrough``) when a model it names (``model`` in the body, the
query or the ``x-litellm-model`` header, or a run of one to three segments of its path) is served by, or shares
the engines of, a group with ``reasoning`` or ``vision`` limits, or when the body names no model the router knows
and the route's own target is the server of such a group's deployment. A name configured under
``litellm_kv.model_groups`` without limits passes, as it does on ``/v1/chat/completions``. Where the check cannot be
made (the router cannot be asked) the request is refused (500): a limit is at stake.

Which paths are pass-through routes: the prefixes LiteLLM registers them under (its lazily loaded
``llm_passthrough`` and ``codex_passthrough`` features; a copy of LiteLLM 1.110.2's list when that cannot be
read) and the configured endpoints' paths, less the proxy's own routes under ``/openai/`` (Azure-style
``/openai/deployments/{model}/chat/completions`` and the Responses and realtime routes), which run the hooks, unless
``LITELLM_BUILTIN_PASS_THROUGH_ROUTES_FIRST`` puts the pass-through routes ahead of them.
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from litellm_kv.integration import litellm_data
from litellm_kv.integration.asgi import (
    ASGIApp,
    BodyTooLarge,
    Receive,
    Scope,
    Send,
    answer,
    app_path,
    read_body,
    replay,
    wrap_app,
)
from litellm_kv.integration.governance import GroupNames
from litellm_kv.observability import counter

log = logging.getLogger("litellm_kv.governance")

#: Largest body of a pass-through request read for the model it names; a larger one is refused (413) while
#: groups with limits exist, never forwarded unread.
MAX_BODY_BYTES = 64 << 20

#: LiteLLM 1.110.2's pass-through prefixes, used when its own list (``litellm.proxy._lazy_features``) cannot be read.
FALLBACK_PREFIXES = (
    "/anthropic/", "/assemblyai/", "/azure/", "/azure_ai/", "/azure_speech/", "/bedrock/", "/cohere/",
    "/comprehendmedical", "/cursor/", "/deepgram/", "/eu.assemblyai/", "/fal_ai/", "/gemini/", "/gigachat/",
    "/milvus/", "/mistral/", "/nvidia_nim/", "/openai/", "/openai_passthrough/", "/tinyfish/", "/transcribe",
    "/typesafe/", "/eu_jev/", "/laya/", "/bespoke/", "/openrouter/", "/vertex-ai/", "/vertex_ai/", "/vllm/",
    "/watsonx/", "/backend-api/codex/",
)
_PASSTHROUGH_FEATURES = ("llm_passthrough", "codex_passthrough")

#: The proxy's own routes under a pass-through prefix: they run the pre-call hook (and so the limits).
_HOOKED = re.compile(r"/openai/deployments/.+/(chat/completions|completions|embeddings)"
                     r"|/openai/v1/(responses|realtime|live)(/.*)?")

#: Runs of path segments tried as model names (``org/model`` names span two).
_MAX_RUN = 3
#: Path segments read; a pass-through path with more is refused while groups with limits exist (LiteLLM's Azure
#: relay tries every segment as a model name, so none may go unread).
MAX_SEGMENTS = 128

REFUSED = counter(
    "passthrough_refused",
    "Requests on LiteLLM pass-through routes refused because they would reach the engines of a model group with "
    "reasoning or vision limits, by that group.",
    ["model_group"],
)


@dataclass(frozen=True, slots=True)
class PassThrough:
    """A pass-through route a request is on: the prefix it matched and where the route sends what names no model."""

    prefix: str
    targets: tuple[str, ...]


def provider_prefixes() -> tuple[str, ...]:
    """The prefixes of LiteLLM's provider pass-through routes."""
    try:
        from litellm.proxy._lazy_features import LAZY_FEATURES

        found = tuple(p for f in LAZY_FEATURES if f.name in _PASSTHROUGH_FEATURES for p in f.path_prefixes)
    except Exception:  # another LiteLLM layout: the copy below
        found = ()
    return found or FALLBACK_PREFIXES


def _env_target(prefix: str) -> str | None:
    """The upstream LiteLLM's ``/<provider>/`` route sends to when no router model is named: ``<PROVIDER>_API_BASE``."""
    name = re.sub(r"[^A-Za-z0-9]+", "_", prefix.strip("/")).upper()
    value = os.environ.get(f"{name}_API_BASE")
    return value or None


def configured_endpoints() -> list[tuple[str, str]]:
    """``(path, target)`` of the proxy's ``general_settings.pass_through_endpoints``."""
    try:
        from litellm.proxy import proxy_server

        raw = (getattr(proxy_server, "general_settings", None) or {}).get("pass_through_endpoints") or []
    except Exception:
        return []
    out: list[tuple[str, str]] = []
    for ep in raw if isinstance(raw, list) else []:
        get = ep.get if isinstance(ep, Mapping) else (lambda k, e=ep: getattr(e, k, None))
        path, target = get("path"), get("target")
        if isinstance(path, str) and path:
            out.append((path.rstrip("/") or "/", target if isinstance(target, str) else ""))
    return out


def pass_through_of(path: str, prefixes: Iterable[str], configured: Iterable[tuple[str, str]]) -> PassThrough | None:
    """The pass-through route ``path`` is on, or ``None``."""
    for ep_path, target in configured:
        if path == ep_path or path.startswith(ep_path + "/"):
            return PassThrough(ep_path, (target,) if target else ())
    for prefix in prefixes:
        if path == prefix.rstrip("/") or path.startswith(prefix):
            first = os.environ.get("LITELLM_BUILTIN_PASS_THROUGH_ROUTES_FIRST", "false").lower() == "true"
            if _HOOKED.fullmatch(path) and not first:
                return None
            env = _env_target(prefix)
            return PassThrough(prefix, (env,) if env else ())
    return None


class TooManySegments(ValueError):
    """A pass-through path with more segments than :data:`MAX_SEGMENTS`."""


def named_models(path: str, prefix: str, query: str, headers: Mapping[str, str], body: bytes,
                 content_type: str) -> tuple[list[str], str | None]:
    """Every model name a pass-through request may be routed by, and the body's ``model`` (JSON or a form), the one
    LiteLLM's relays route by: that, ``model`` in the query and the ``x-litellm-model`` header, then each run of up
    to three segments of the path after the prefix. Raises :class:`TooManySegments`."""
    names: list[str] = []
    if body and "multipart/" not in content_type:
        found: Any = None
        try:
            parsed = json.loads(body)
            found = parsed.get("model") if isinstance(parsed, dict) else None
        except (ValueError, RecursionError, UnicodeDecodeError):
            try:
                found = next(iter(parse_qs(body.decode("latin-1")).get("model") or []), None)
            except ValueError:
                found = None
        if isinstance(found, str):
            names.append(found)
    body_model = names[0].strip() or None if names else None
    names += parse_qs(query).get("model", [])
    header = headers.get("x-litellm-model")
    if header:
        names.append(header)
    segments = [s for s in path[len(prefix.rstrip("/")):].split("/") if s]
    if len(segments) > MAX_SEGMENTS:
        raise TooManySegments(f"{len(segments)} path segments")
    for n in range(1, _MAX_RUN + 1):
        for i in range(len(segments) - n + 1):
            run = "/".join(segments[i:i + n])
            names.append(run)
            if ":" in segments[i + n - 1]:
                # Google's and Bedrock's paths put an action after the model: ``models/qwen:generateContent``.
                names.append(run.rsplit(":", 1)[0])
    return _distinct(names), body_model


def _distinct(names: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(n.strip() for n in names if n.strip()))


def groups_reached(names: GroupNames, route: PassThrough, models: Sequence[str], routed: bool) -> tuple[
        list[str], str]:
    """The groups with limits the request would reach and what reaches them (for the message); ``([], "")``.
    ``routed``: the body names a model the router knows, so LiteLLM relays the request to that model's deployment,
    not to the route's target."""
    if not routed:
        for target in route.targets:
            groups = names.groups_served_at(target)
            if groups:
                log.info("litellm-kv: pass-through route %s sends to %s, an engine of governed group(s) %s",
                         route.prefix, target, ", ".join(groups))
                return groups, "the route's own target"
    for model in models:
        groups = names.groups_reached(model)
        if groups:
            return groups, f"model '{model[:64]}'"
    return [], ""


def router_knows(model: str | None) -> bool:
    """Whether LiteLLM's router has deployments for ``model`` (its relays then route the request by it)."""
    return model is not None and bool(litellm_data.router_deployments(model))


def refusal(status: int, message: str, param: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "litellm_kv_limit", "param": param, "code": str(status)}}


class PassThroughGate:
    """ASGI wrapper in front of the proxy's app: refuses a pass-through request that would reach a governed engine,
    and otherwise replays the body to the app unchanged."""

    def __init__(self, app: ASGIApp, group_names: Callable[[], GroupNames]) -> None:
        self.app = app
        self.group_names = group_names
        self._prefixes: tuple[str, ...] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = None
        if scope.get("type") == "http":
            if self._prefixes is None:
                self._prefixes = provider_prefixes()
            route = pass_through_of(app_path(scope), self._prefixes, configured_endpoints())
        names = self.group_names() if route is not None else None
        if route is None or names is None or not names.governed:
            await self.app(scope, receive, send)
            return
        try:
            raw = await read_body(receive, MAX_BODY_BYTES)
        except BodyTooLarge:
            await answer(send, 413, refusal(413, f"litellm-kv reads a pass-through request for the model it names, up "
                                            f"to {MAX_BODY_BYTES} bytes; this one is larger", "governance.passthrough"))
            return
        if raw is None:
            return  # the client went away: nothing to forward
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        try:
            models, body_model = named_models(app_path(scope), route.prefix,
                                              bytes(scope.get("query_string") or b"").decode("latin-1"), headers, raw,
                                              headers.get("content-type", ""))
            await names.prepare(models, urls=route.targets)
            groups, what = groups_reached(names, route, models, router_knows(body_model))
        except TooManySegments as exc:
            await answer(send, 400, refusal(
                400, f"litellm-kv reads every segment of a pass-through path for the model it may name, up to "
                f"{MAX_SEGMENTS}; this one has {exc}", "governance.passthrough"))
            return
        except Exception as exc:
            log.exception("litellm-kv: cannot tell whether a request on the pass-through route %s reaches a model "
                          "group with limits", route.prefix)
            await answer(send, 500, refusal(
                500, f"litellm-kv could not check whether this request on the pass-through route {route.prefix} "
                f"reaches the engines of a model group with limits ({type(exc).__name__}), so it was refused rather "
                "than sent without them; the proxy log has the details.", "governance.internal_error"))
            return
        if groups:
            REFUSED.labels(groups[0]).inc()
            named = ", ".join(f"'{g}'" for g in groups)
            await answer(send, 400, refusal(
                400, f"{route.prefix} is a pass-through route, which LiteLLM sends on as written without applying "
                f"litellm-kv limits, and {what} reaches the engines of model {named}, which has them: the request "
                "was refused (limit governance.passthrough). Use /v1/chat/completions.", "governance.passthrough"))
            return
        await self.app(scope, replay(raw, receive), send)


def install(app: Any, group_names: Callable[[], GroupNames]) -> None:
    """Put the gate in front of ``app`` (a Starlette/FastAPI app), once (see :func:`asgi.wrap_app`)."""
    wrap_app(app, "litellm_kv_passthrough_gate", lambda inner: PassThroughGate(inner, group_names), PassThroughGate,
             group_names=group_names)
