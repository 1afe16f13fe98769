"""Prometheus metrics of litellm-kv.

Every module declares its own metrics through :func:`counter`, :func:`gauge` and
:func:`histogram`. They register in prometheus-client's default registry, which is what
LiteLLM's ``/metrics`` serves, so our metrics appear there with no extra wiring. Names get
the ``litellm_kv_`` prefix. Declaring the same metric twice (a module re-imported by the
LiteLLM callback loader) returns the existing object instead of raising.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

PREFIX = "litellm_kv_"
log = logging.getLogger("litellm_kv")

_declared: dict[str, Any] = {}


def _declare(kind: type, name: str, doc: str, labels: Sequence[str], **kw: Any) -> Any:
    full = PREFIX + name
    existing = _declared.get(full)
    if existing is not None:
        return existing
    try:
        metric = kind(full, doc, list(labels), registry=REGISTRY, **kw)
    except ValueError:
        # Already registered by an earlier import of this module under another name.
        collector = REGISTRY._names_to_collectors.get(full) or REGISTRY._names_to_collectors.get(
            full + "_total"
        )
        if collector is None:
            raise
        metric = collector
    _declared[full] = metric
    return metric


def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
    """A counter named ``litellm_kv_<name>`` (Prometheus shows it with ``_total``)."""
    metric: Counter = _declare(Counter, name, doc, labels)
    return metric


def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Gauge:
    metric: Gauge = _declare(Gauge, name, doc, labels)
    return metric


def histogram(
    name: str, doc: str, labels: Sequence[str] = (), buckets: Sequence[float] | None = None
) -> Histogram:
    kw: dict[str, Any] = {}
    if buckets is not None:
        kw["buckets"] = list(buckets)
    metric: Histogram = _declare(Histogram, name, doc, labels, **kw)
    return metric


def declared_metrics() -> dict[str, str]:
    """Name -> help text of every metric declared so far (used by the docs test)."""
    out: dict[str, str] = {}
    for full, metric in _declared.items():
        out[full] = getattr(metric, "_documentation", "")
    return out
