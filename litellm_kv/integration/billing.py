"""Make LiteLLM charge what litellm-kv measured: token counts in ``usage``, a breakdown in the spend log.

LiteLLM 1.110 prices only what ``usage`` reports (``litellm_core_utils/llm_cost_calc/utils.py``):

* ``usage.completion_tokens_details.reasoning_tokens`` at ``output_cost_per_reasoning_token``
  (else the output rate); the remaining ``completion_tokens - reasoning_tokens`` at
  ``output_cost_per_token``. So ``completion_tokens`` must *include* the reasoning tokens, as it
  does for vLLM, OpenAI and Anthropic.
* ``usage.prompt_tokens_details.image_tokens`` at ``input_cost_per_image_token`` (else the input
  rate); the rest of ``prompt_tokens`` at ``input_cost_per_token``.

Writing these fields in ``async_post_call_success_deployment_hook`` (and in the final usage chunk of
a stream) runs before LiteLLM computes the cost, so the price flows into ``x-litellm-response-cost``,
the spend log and key/team ``max_budget``.

The per-request breakdown goes into the request's ``metadata.spend_logs_metadata.litellm_kv.<feature>``,
which LiteLLM stores in ``LiteLLM_SpendLogs.metadata.spend_logs_metadata``.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from litellm_kv.integration.litellm_data import field, metadata_dicts

SPEND_LOG_KEY = "litellm_kv"


def _set(obj: Any, name: str, value: Any) -> None:
    if isinstance(obj, MutableMapping):
        obj[name] = value
    else:
        setattr(obj, name, value)


def reported_reasoning_tokens(usage: Any) -> int | None:
    """``usage.completion_tokens_details.reasoning_tokens`` when the provider reported a positive count."""
    value = field(field(usage, "completion_tokens_details"), "reasoning_tokens")
    return value if isinstance(value, int) and value > 0 else None


def _details(usage: Any, name: str, factory: type | None) -> Any:
    details = field(usage, name)
    if details is None:
        details = {} if isinstance(usage, MutableMapping) or factory is None else factory()
        _set(usage, name, details)
    return details


def set_reasoning_tokens(usage: Any, tokens: int, *, add_to_completion: bool) -> None:
    """Write ``tokens`` as the reasoning tokens of ``usage`` (LiteLLM ``Usage`` or a dict).

    ``add_to_completion``: the provider's ``completion_tokens`` did not include them; add them
    (and to ``total_tokens``) so text tokens are not billed at zero.
    """
    factory: type | None = None
    if not isinstance(usage, MutableMapping):
        from litellm.types.utils import CompletionTokensDetailsWrapper

        factory = CompletionTokensDetailsWrapper
    details = _details(usage, "completion_tokens_details", factory)
    _set(details, "reasoning_tokens", tokens)
    if add_to_completion:
        _set(usage, "completion_tokens", int(field(usage, "completion_tokens") or 0) + tokens)
        _set(usage, "total_tokens", int(field(usage, "total_tokens") or 0) + tokens)
    elif int(field(usage, "completion_tokens") or 0) < tokens:
        # A provider that under-reports: never let the text part go negative.
        delta = tokens - int(field(usage, "completion_tokens") or 0)
        _set(usage, "completion_tokens", tokens)
        _set(usage, "total_tokens", int(field(usage, "total_tokens") or 0) + delta)


def set_image_tokens(usage: Any, tokens: int, *, add_to_prompt: bool) -> None:
    """Write ``tokens`` as ``usage.prompt_tokens_details.image_tokens`` (for visual-token billing)."""
    factory: type | None = None
    if not isinstance(usage, MutableMapping):
        from litellm.types.utils import PromptTokensDetailsWrapper

        factory = PromptTokensDetailsWrapper
    details = _details(usage, "prompt_tokens_details", factory)
    _set(details, "image_tokens", tokens)
    if add_to_prompt:
        _set(usage, "prompt_tokens", int(field(usage, "prompt_tokens") or 0) + tokens)
        _set(usage, "total_tokens", int(field(usage, "total_tokens") or 0) + tokens)


def record_breakdown(request_data: Mapping[str, Any], feature: str, breakdown: Mapping[str, Any]) -> None:
    """Put ``breakdown`` under ``spend_logs_metadata.litellm_kv.<feature>`` of the request's metadata."""
    for md in metadata_dicts(request_data):
        slm = md.get("spend_logs_metadata")
        if not isinstance(slm, MutableMapping):
            slm = {}
            md["spend_logs_metadata"] = slm
        ours = slm.get(SPEND_LOG_KEY)
        if not isinstance(ours, MutableMapping):
            ours = {}
            slm[SPEND_LOG_KEY] = ours
        ours[feature] = dict(breakdown)
