"""The LiteLLM versions litellm-kv is tested with, checked once when the integration layer is imported.

litellm-kv reads LiteLLM's request, metadata, usage and router shapes (``litellm_data``) and writes into its
spend logs; those shapes change between LiteLLM releases without notice. A proxy that loads the callback
over another LiteLLM would route, limit or charge on shapes nobody has checked, so it refuses to start and
says which version to install. ``LITELLM_KV_ALLOW_UNTESTED_LITELLM=1`` turns the refusal into a warning for
whoever wants to try a newer release at their own risk.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os

from litellm_kv import __version__
from litellm_kv.errors import IncompatibleLiteLLM

log = logging.getLogger("litellm_kv")

#: Every LiteLLM release the test suite has run against (the ``proxy`` extra pins it).
TESTED_LITELLM = ("1.110.2",)

#: Set to 1 (or true/yes) to start over an untested LiteLLM with a warning instead of an error.
ALLOW_UNTESTED_ENV = "LITELLM_KV_ALLOW_UNTESTED_LITELLM"


def installed_litellm() -> str | None:
    """The version of the installed ``litellm`` distribution, or None when none is installed."""
    try:
        return importlib.metadata.version("litellm")
    except importlib.metadata.PackageNotFoundError:
        return None


def check_litellm_version(installed: str | None = None) -> None:
    """Raise :class:`IncompatibleLiteLLM` when the installed LiteLLM is not one of :data:`TESTED_LITELLM`."""
    version = installed if installed is not None else installed_litellm()
    if version in TESTED_LITELLM:
        return
    tested = ", ".join(TESTED_LITELLM)
    found = f"LiteLLM {version}" if version is not None else "no installed litellm distribution"
    message = (
        f"litellm-kv {__version__} is tested with LiteLLM {tested} only, and this environment has {found}. "
        f"Install the tested version (pip install 'litellm=={TESTED_LITELLM[-1]}', or litellm-kv's `proxy` "
        f"extra; docs/install.md), or set {ALLOW_UNTESTED_ENV}=1 to start anyway, unsupported."
    )
    if os.environ.get(ALLOW_UNTESTED_ENV, "").strip().lower() in {"1", "true", "yes"}:
        log.warning("litellm-kv: %s (starting anyway: %s is set)", message, ALLOW_UNTESTED_ENV)
        return
    log.error("litellm-kv: %s", message)
    raise IncompatibleLiteLLM(message)
