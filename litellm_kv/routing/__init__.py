"""Replica choice for KV-routed model groups: cost model, sibling prediction, load tracking.

Domain code: no LiteLLM imports. :class:`~litellm_kv.routing.group.KVGroup` is one model group's runtime
and decision; the integration layer (``litellm_kv.integration.routing_hooks``) hands it each request as
plain values and applies the result.
"""

from litellm_kv.routing.cost import (
    Candidate,
    CostConfig,
    CostModel,
    RoutingDecision,
    replica_load,
)
from litellm_kv.routing.load import (
    InMemoryLoadTracker,
    LoadConfig,
    LoadTracker,
    RedisLoadTracker,
    TrackedLoad,
)
from litellm_kv.routing.siblings import SiblingConfig, SiblingIndex

__all__ = [
    "Candidate",
    "CostConfig",
    "CostModel",
    "InMemoryLoadTracker",
    "LoadConfig",
    "LoadTracker",
    "RedisLoadTracker",
    "RoutingDecision",
    "SiblingConfig",
    "SiblingIndex",
    "TrackedLoad",
    "replica_load",
]
