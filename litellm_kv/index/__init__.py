"""KV-block index backends behind one Protocol: in-memory (embedded) and Redis (shared)."""

from litellm_kv.index.base import KVIndex, ReplicaMatch, Tier, tier_of_medium

__all__ = ["KVIndex", "ReplicaMatch", "Tier", "tier_of_medium"]
