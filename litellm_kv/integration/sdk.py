"""KV-aware routing for applications that build a ``litellm.Router`` in their own process (no proxy).

```python
import litellm
from litellm_kv.integration.sdk import enable_kv_routing

router = litellm.Router(model_list=model_list)            # vLLM replicas as deployments of one model_name
kv = await enable_kv_routing(router, {"model_groups": {"qwen": {"routing": "kv",
                                                                "kv": {"tokenizer_path": "/models/qwen"}}}})
response = await router.acompletion(model="qwen", messages=messages)   # routed to the replica holding the prefix
await kv.close()
```

The same callback object the proxy loads (:class:`~litellm_kv.integration.callback.LiteLLMKV`) joins
``litellm.callbacks``, with the KV routing handler only, reading the application's router's model list instead
of the proxy's: replica choice (``async_filter_deployments``), ``kv_cache_report_mode`` on each attempt and
the prediction check against the engine's ``cached_tokens`` are the proxy's own code. Per-key governance
(reasoning budgets, visual-token limits, tenant salts from a key or team) needs the proxy's virtual keys and is
not available here; docs/sdk.md says what is and is not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import litellm

from litellm_kv.config import Settings, guarded_sections, parse_section
from litellm_kv.errors import ConfigError
from litellm_kv.integration.callback import LiteLLMKV
from litellm_kv.integration.routing_hooks import KVRoutingHandler

log = logging.getLogger("litellm_kv")


class KVRouting:
    """KV routing attached to one ``litellm.Router``: started by :func:`enable_kv_routing`, ended by
    :meth:`close`. Its :meth:`health` is the proxy's ``/litellm-kv/health`` routing section."""

    def __init__(self, router: Any, settings: Settings) -> None:
        self.router = router
        self.settings = settings
        self.handler = KVRoutingHandler(settings, deployments=self._model_list, proxy=False)
        self.callback = LiteLLMKV(settings, handlers=[self.handler])

    def _model_list(self) -> list[dict[str, Any]]:
        # LiteLLM 1.110 lists deployments through registry() (Router.model_list is deprecated there).
        registry = getattr(self.router, "registry", None)
        entries = registry().all() if callable(registry) else getattr(self.router, "model_list", None)
        return [dict(e) for e in entries or ()]

    async def start(self) -> None:
        await self.callback.ensure_started()
        if self.callback not in litellm.callbacks:
            litellm.callbacks.append(self.callback)

    async def wait_exact(self, timeout_s: float = 60.0) -> None:
        """Wait until every KV-routed group routes exactly with each replica ready (engines that started a
        moment ago, event streams still connecting); ``TimeoutError`` names the groups that do not."""
        deadline = time.monotonic() + timeout_s
        while True:
            groups = self.health()["groups"]
            waiting = {name: g["not_exact_why"] or "a replica is not ready" for name, g in groups.items()
                       if not g["exact"] or not all(r["ready"] for r in g["replicas"])}
            if not waiting:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(f"KV routing is not exact for {waiting}")
            await asyncio.sleep(0.2)

    def health(self) -> dict[str, Any]:
        return self.handler.health()

    async def explain(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """The routing decision for a chat request body (``model``, ``messages``, ...) without sending it."""
        return await self.handler.explain(body)

    async def close(self) -> None:
        """Stop routing (the router keeps working with LiteLLM's own choice) and the event subscribers."""
        while self.callback in litellm.callbacks:
            litellm.callbacks.remove(self.callback)
        await self.handler.shutdown()


def proxy_only_settings(settings: Settings) -> list[str]:
    """The settings that only the proxy applies (reasoning and vision limits, tenant cache isolation), by their path
    in the ``litellm_kv`` section."""
    return [f"model_groups.{name}.{'kv.' if section == 'tenant_isolation' else ''}{section}"
            for name, sections in guarded_sections(settings).items() for section in sections]


async def enable_kv_routing(router: Any, kv_settings: Mapping[str, Any] | Settings) -> KVRouting:
    """KV-aware replica choice for ``router``'s groups marked ``routing: kv`` in ``kv_settings`` (the
    ``litellm_kv`` section of a proxy config, as a dict). Only the routing handler runs: governance needs the
    proxy's keys, so settings only the proxy applies (:func:`proxy_only_settings`) raise :class:`ConfigError`
    rather than be silently ignored. Returns once the groups' replicas were contacted (see
    :meth:`KVRouting.wait_exact`)."""
    settings = kv_settings if isinstance(kv_settings, Settings) else parse_section(Settings, dict(kv_settings),
                                                                                 "litellm_kv")
    unenforced = proxy_only_settings(settings)
    if unenforced:
        raise ConfigError(
            f"{', '.join(unenforced)}: an application's own litellm.Router has no virtual keys or clients to tell "
            "apart, so these would not be applied; remove them from the settings given here, or send the requests "
            "through the proxy, which applies them.")
    routing = KVRouting(router, settings)
    await routing.start()
    return routing
