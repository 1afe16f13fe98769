"""The cache TTL a request asks the provider for (``cache_control.ttl``, ``prompt_cache_retention``)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

_TTL_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d)?\s*$")
_TTL_UNIT = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_ttl(value: Any) -> float | None:
    """Seconds of a cache TTL such as ``"5m"``, ``"1h"``, ``"24h"`` or ``300``; None if unreadable."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value > 0 else None
    if not isinstance(value, str):
        return None
    m = _TTL_RE.match(value)
    if m is None:
        return None
    seconds = float(m.group(1)) * _TTL_UNIT[m.group(2)]
    return seconds if seconds > 0 else None


def _marks(value: Any) -> Iterable[Mapping[str, Any]]:
    if isinstance(value, Mapping):
        cc = value.get("cache_control")
        if isinstance(cc, Mapping):
            yield cc
        for k, v in value.items():
            if k != "cache_control":
                yield from _marks(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _marks(v)


def request_ttl(messages: Sequence[Any] | None, tools: Sequence[Any] | None, retention: Any = None) -> float | None:
    """The longest cache TTL a request asks the provider for (``cache_control.ttl``, ``prompt_cache_retention``).

    A marker without ``ttl`` means the provider default (5 minutes for Anthropic).
    """
    ttls = [parse_ttl(cc.get("ttl", "5m")) for cc in _marks([tools or [], messages or []])]
    if retention is not None:
        ttls.append(parse_ttl(retention))
    known = [t for t in ttls if t is not None]
    return max(known) if known else None
