"""Replica choice for KV-routed model groups: cost model, sibling prediction, load tracking.

Domain code: no LiteLLM imports. :class:`~litellm_kv.routing.group.KVGroup` is one model group's runtime
and decision; the integration layer (``litellm_kv.integration.routing_hooks``) hands it each request as
plain values and applies the result.
"""

from litellm_kv.routing.cost import (
    Candidate,
    CostModel,
    CostSettings,
    RoutingDecision,
    replica_load,
)
from litellm_kv.routing.load import (
    InMemoryLoadTracker,
    LoadSettings,
    LoadTracker,
    RedisLoadTracker,
    TrackedLoad,
)
from litellm_kv.routing.siblings import SiblingIndex, SiblingSettings

__all__ = [
    "Candidate",
    "CostModel",
    "CostSettings",
    "InMemoryLoadTracker",
    "LoadSettings",
    "LoadTracker",
    "RedisLoadTracker",
    "RoutingDecision",
    "SiblingIndex",
    "SiblingSettings",
    "TrackedLoad",
    "replica_load",
]
