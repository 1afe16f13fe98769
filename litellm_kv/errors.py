"""Errors litellm-kv raises towards callers and operators.

A :class:`PolicyViolation` becomes an HTTP error of the proxy (400, 413 or 429) whose
message names the limit, the value and where the limit was set. Anything else raised by
litellm-kv inside a request is an internal failure: the integration layer logs and counts
it and lets the request continue (routing falls back to load-only choice).
"""

from __future__ import annotations

from dataclasses import dataclass, field


class LiteLLMKVError(Exception):
    """Base class of every error litellm-kv defines."""


class ConfigError(LiteLLMKVError):
    """Invalid litellm-kv configuration (config file or per-key metadata)."""


@dataclass
class PolicyViolation(LiteLLMKVError):
    """A request rejected by a per-key, per-team or per-group limit.

    ``source`` says where the limit was set, e.g. ``"key 'team-a-bot'"``, ``"team 'research'"``
    or ``"config model_groups.qwen.vision"``.
    """

    status_code: int
    message: str
    limit_name: str = ""
    limit: object = None
    value: object = None
    source: str = ""
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


class MetadataError(PolicyViolation):
    """Malformed litellm-kv settings in key or team metadata (fail closed: HTTP 400... by default)."""


class IncompatibleLiteLLM(LiteLLMKVError):
    """The installed LiteLLM is not a version litellm-kv is tested with (raised when the callback loads)."""
