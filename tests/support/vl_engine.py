"""The vision-language engine venv (``.venv-engine-vl``) for the tests that serve the tiny Qwen2.5-VL model.

``scripts/test.sh`` builds it and runs pytest with ``LITELLM_KV_VL_ENGINE=1``: in that run a missing venv is a
failure, not a skip, so a broken set-up cannot pass as tests that did not apply. Elsewhere (a developer's
``pytest`` without it, or ``LITELLM_KV_VL_ENGINE=0``) those tests skip and say why.
"""

from __future__ import annotations

import os

import pytest

from tools.harness.engines import VL_ENGINE_PY


def require_vl_engine() -> None:
    if VL_ENGINE_PY.exists():
        return
    why = f"{VL_ENGINE_PY} is missing (built by scripts/test.sh or LITELLM_KV_VL_ENGINE=1 scripts/setup.sh)"
    if os.environ.get("LITELLM_KV_VL_ENGINE") == "1":
        pytest.fail(f"{why}, and this run asked for it (LITELLM_KV_VL_ENGINE=1)")
    pytest.skip(why)
