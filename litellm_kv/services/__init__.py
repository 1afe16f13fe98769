"""Processes litellm-kv runs beside the proxy (today: ``litellm-kv indexer``, which feeds the shared index)."""
