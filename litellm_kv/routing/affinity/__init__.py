"""Prompt-cache affinity: send a conversation back to the deployment whose prompt cache holds it.

For deployments that publish no KV events (OpenAI, Anthropic, Bedrock, Azure, a vLLM without
events) the only lever is to remember which deployment served a prefix. This package is the domain
part of that, with no LiteLLM import (``litellm_kv.integration.affinity_hooks`` adapts it):

* ``options``: :class:`AffinitySettings`, the group's ``affinity`` section.
* ``keys``: :func:`conversation_prefixes` turns a chat request into chained digests, one per prefix
  boundary (tools, each message, each ``cache_control``-marked block), each with its token count.
* ``profiles`` and ``meters``: :class:`CacheProfile` and :class:`TokenMeter` say which boundaries
  the provider would actually cache (minimum prompt length, increments); shorter prefixes create no pins.
* ``ttl``: the cache TTL a request asks for, which the pins follow.
* ``pins``: :class:`PinStore` (in-process :class:`MemoryPinStore`, shared :class:`RedisPinStore`)
  resolves a request atomically: follow the longest live pin, else claim every boundary for a
  proposed deployment *before* the call, so a burst of identical new prefixes lands on one deployment.
* ``inflight``: :class:`InFlightCounter` counts in-flight attempts per deployment and remembers recent
  failures (the load cap; not :class:`litellm_kv.routing.load.LoadTracker`, which KV routing uses).
* ``router``: :class:`AffinityRouter` puts them together for one request.
"""

from litellm_kv.routing.affinity.inflight import Clock, DeploymentId, InFlightCounter
from litellm_kv.routing.affinity.keys import KEY_VERSION, Prefix, PrefixDigest, conversation_prefixes, select_keys
from litellm_kv.routing.affinity.meters import (
    EstimateMeter,
    HFMeter,
    TiktokenMeter,
    TokenMemo,
    TokenMeter,
    make_meter,
    openai_encoding,
)
from litellm_kv.routing.affinity.options import AffinitySettings
from litellm_kv.routing.affinity.pins import Candidates, MemoryPinStore, Outcome, PinStore, RedisPinStore, Resolution
from litellm_kv.routing.affinity.profiles import CacheProfile, profile_for, provider_of
from litellm_kv.routing.affinity.router import AffinityRouter, PinDecision
from litellm_kv.routing.affinity.ttl import parse_ttl, request_ttl

__all__ = [
    "KEY_VERSION",
    "AffinityRouter",
    "AffinitySettings",
    "CacheProfile",
    "Candidates",
    "Clock",
    "DeploymentId",
    "EstimateMeter",
    "HFMeter",
    "InFlightCounter",
    "MemoryPinStore",
    "Outcome",
    "PinDecision",
    "PinStore",
    "Prefix",
    "PrefixDigest",
    "RedisPinStore",
    "Resolution",
    "TiktokenMeter",
    "TokenMemo",
    "TokenMeter",
    "conversation_prefixes",
    "make_meter",
    "openai_encoding",
    "parse_ttl",
    "profile_for",
    "provider_of",
    "request_ttl",
    "select_keys",
]
