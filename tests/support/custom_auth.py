"""``general_settings.custom_auth`` for tests: presents keys with chosen metadata to the hooks.

Keys come from the JSON file named by ``LITELLM_KV_TEST_KEYS``: ``{api_key: {UserAPIKeyAuth fields}}``.
The master key is accepted too (as an admin with no metadata). Unknown keys get 401.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from fastapi import HTTPException
from litellm.proxy._types import LitellmUserRoles, UserAPIKeyAuth

_keys: dict[str, dict[str, Any]] | None = None


def _load() -> dict[str, dict[str, Any]]:
    global _keys
    if _keys is None:
        path = os.environ.get("LITELLM_KV_TEST_KEYS")
        _keys = json.loads(Path(path).read_text()) if path else {}
    return _keys


async def user_api_key_auth(request: Any, api_key: str) -> UserAPIKeyAuth:
    key = api_key.removeprefix("Bearer ").strip()
    if key == "sk-litellm-kv-test-master":
        return UserAPIKeyAuth(api_key=key, user_role=LitellmUserRoles.PROXY_ADMIN)
    fields = _load().get(key)
    if fields is None:
        raise HTTPException(status_code=401, detail="unknown test key")
    return UserAPIKeyAuth(api_key=key, token=f"hashed-{key}", **fields)
