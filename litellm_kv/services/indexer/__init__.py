"""``litellm-kv indexer``: feeds the shared Redis KV index from the engines' KV events."""
