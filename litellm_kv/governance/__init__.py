"""Per-key and per-team governance: limits from key ▸ team ▸ config, period budgets, reasoning budgets,
visual-token formulas and image headers, and the usage rewriting that charges them.

Domain code: imports nothing from LiteLLM; ``litellm_kv.integration`` adapts LiteLLM's request dicts to it.
"""
