"""litellm-kv: exact KV-cache-aware routing and per-key reasoning/vision governance for the LiteLLM proxy."""

import sys

__version__ = "0.1.0"

# The floor pyproject.toml declares, checked here too for a checkout used without pip: on 3.10 the code
# would fail later, mid-request (asyncio.timeout, binascii.a2b_base64(strict_mode=)), not at start-up.
if sys.version_info < (3, 11):  # noqa: UP036  # pragma: no cover - the test machines run 3.11
    raise ImportError(f"litellm-kv needs Python 3.11 or newer; this is {sys.version.split()[0]} (docs/install.md)")
