"""Compatibility path for the public API: visual-token formulas lives in :mod:`litellm_kv.governance.vision`."""

from litellm_kv.governance.vision import *  # noqa: F403  (kept importable at its old path)
