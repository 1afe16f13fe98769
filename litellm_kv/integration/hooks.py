"""The interface between the LiteLLM callback and each litellm-kv feature.

LiteLLM runs one callback object (:mod:`litellm_kv.integration.callback`); that object fans each
hook out to a list of :class:`Handler` objects, one per feature (KV routing, affinity, reasoning,
vision). A handler overrides only the steps it needs. The callback guarantees:

* a :class:`~litellm_kv.errors.PolicyViolation` raised in :meth:`Handler.pre_call` becomes the
  HTTP error the caller sees;
* any other exception in :meth:`Handler.pre_call` of a handler that :attr:`~Handler.fails_closed`
  (the governance handlers: a limit is at stake) refuses the request with HTTP 500 naming the limits
  that could not be applied;
* any other exception from a handler is logged, counted in
  ``litellm_kv_internal_errors_total{handler,hook}`` and swallowed: the request goes on as if the
  handler had no opinion (for routing: LiteLLM's own choice among the healthy deployments).

What a handler decides for one call it keeps in :attr:`Handler.records` (one table shared by every
handler of the callback, keyed by LiteLLM's call id and a token of the proxy's own), never in the
client-writable request metadata.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from litellm_kv.config import ModelGroupSettings, Settings
from litellm_kv.integration.call_records import CallRecords


@dataclass(slots=True)
class Caller:
    """Who sent a request, as the proxy authenticated it (virtual key and its team)."""

    key_hash: str | None = None
    key_alias: str | None = None
    team_id: str | None = None
    team_alias: str | None = None
    key_metadata: Mapping[str, Any] = field(default_factory=dict)
    team_metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key_label(self) -> str:
        """How errors name the key: its alias, else a prefix of its hash."""
        if self.key_alias:
            return f"key '{self.key_alias}'"
        if self.key_hash:
            return f"key {self.key_hash[:12]}…"
        return "key (unnamed)"

    @property
    def team_label(self) -> str:
        return f"team '{self.team_alias or self.team_id}'"


@dataclass(slots=True)
class ProxyRequest:
    """One request in ``async_pre_call_hook``: handlers read and mutate ``data`` in place."""

    data: dict[str, Any]
    caller: Caller
    model_group: str
    call_type: str
    settings: Settings
    group: ModelGroupSettings | None
    record_key: str | None = None  # the key of this call's records (litellm_data.stamp_call)
    response_headers: dict[str, str] = field(default_factory=dict)


class Handler:
    """Base class of a feature's part of the request path. Every method is a no-op by default."""

    name = "handler"
    #: True when a failure of :meth:`pre_call` must refuse the request: sending it on would skip a limit.
    fails_closed = False

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # Replaced by the callback with the table it shares among its handlers.
        self.records = CallRecords()

    def enabled_for(self, group: ModelGroupSettings | None) -> bool:
        """Whether this handler acts on requests of a model group."""
        return True

    def check_config(self) -> None:
        """Parse every group section this handler reads, raising :class:`~litellm_kv.errors.ConfigError`
        naming the option: called when the proxy loads the callback, so a typo stops it there instead of
        failing requests later."""

    async def startup(self) -> None:
        """Called once, lazily, before the first request this process handles."""

    async def shutdown(self) -> None:
        """Called at proxy shutdown (best effort)."""

    async def pre_call(self, req: ProxyRequest) -> None:
        """Before routing: check limits (raise PolicyViolation), clamp or add fields in ``req.data``."""

    def abandon(self, record_key: str | None) -> None:
        """The call ``record_key`` will not run, or failed for good: a later handler refused it, a
        ``pre_call`` failed or was cancelled, or LiteLLM gave up on it. Give back at once whatever this
        handler reserved for it (budget holds). Synchronous so that it also runs in a cancelled task:
        any waiting must happen in a task of the handler's own."""

    async def filter_deployments(
        self,
        model_group: str,
        deployments: list[dict[str, Any]],
        messages: list[dict[str, Any]] | None,
        request_kwargs: dict[str, Any],
    ) -> list[dict[str, Any]] | None:
        """Choose among healthy deployments; return a (usually one-element) list, or None for no opinion."""
        return None

    async def pre_deployment(self, kwargs: dict[str, Any]) -> None:
        """After a deployment is chosen, once per attempt: add per-deployment body fields to ``kwargs``."""

    async def post_success_deployment(self, request_data: dict[str, Any], response: Any) -> None:
        """After a successful upstream call, before LiteLLM computes the cost: rewrite ``response.usage``."""

    async def stream_chunk_deployment(self, request_data: dict[str, Any], chunk: Any) -> None:
        """Each streamed chunk (mutate in place; the final usage chunk carries ``usage``)."""

    async def post_failure_deployment(self, request_data: Mapping[str, Any], exception: Exception) -> None:
        """A failed attempt on one deployment (release in-flight load, re-pin)."""

    async def post_success(self, data: dict[str, Any], response: Any) -> None:
        """Proxy level, after success: last changes to the response the caller sees."""

    async def stream_start(self, data: dict[str, Any], stream: Any) -> None:
        """Proxy level, once before a stream's first chunk; ``stream`` is LiteLLM's stream wrapper
        (its recorded ``chunks`` are what LiteLLM prices, after this hook no other sees the usage chunk)."""

    async def stream_chunk(self, data: dict[str, Any], chunk: Any) -> None:
        """Proxy level, each streamed chunk the caller receives (mutate in place)."""

    async def response_headers(self, data: dict[str, Any], response: Any) -> dict[str, str]:
        """Headers to add to the caller's response."""
        return {}

    async def log_success(self, kwargs: dict[str, Any], response: Any) -> None:
        """After LiteLLM logged the call and its cost."""

    async def log_failure(self, kwargs: dict[str, Any], response: Any) -> None:
        """After LiteLLM logged a failed call."""
