"""Per-key and per-team governance: limits from key ▸ team ▸ config, period budgets, reasoning budgets,
visual-token formulas, vision limits and the downscale plan, image headers. Writing the measured tokens
into LiteLLM's usage (so LiteLLM charges them) is ``litellm_kv.integration.billing``.

Domain code: imports nothing from LiteLLM; ``litellm_kv.integration`` adapts LiteLLM's request dicts to it.
"""
