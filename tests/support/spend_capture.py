"""A test-only LiteLLM callback that appends each call's standard logging payload to a JSONL file.

The payload is what LiteLLM writes to ``LiteLLM_SpendLogs`` (``response_cost``, ``metadata.
spend_logs_metadata``, usage): the database cannot run here, so tests read this file instead.
Declare ``tests.support.spend_capture.capture`` in ``litellm_settings.callbacks`` and set
``LITELLM_KV_SPEND_CAPTURE`` to the file path.
"""

from __future__ import annotations

import json
import os
from typing import Any

from litellm.integrations.custom_logger import CustomLogger


class SpendCapture(CustomLogger):
    async def async_log_success_event(self, kwargs: Any, response_obj: Any, start_time: Any, end_time: Any) -> None:
        path = os.environ.get("LITELLM_KV_SPEND_CAPTURE")
        payload = kwargs.get("standard_logging_object") or {}
        if path:
            with open(path, "a") as f:
                f.write(json.dumps({
                    "response_cost": kwargs.get("response_cost"),
                    "model_group": payload.get("model_group"),
                    "stream": kwargs.get("stream"),
                    "spend_logs_metadata": (payload.get("metadata") or {}).get("spend_logs_metadata"),
                    "usage": payload.get("response", {}).get("usage") if isinstance(payload.get("response"), dict)
                    else None,
                    "prompt_tokens": payload.get("prompt_tokens"),
                    "completion_tokens": payload.get("completion_tokens"),
                    "key_alias": (payload.get("metadata") or {}).get("user_api_key_alias"),
                }, default=str) + "\n")


capture = SpendCapture()
