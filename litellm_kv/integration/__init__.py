"""The only layer that imports LiteLLM: hook adapters, admin routes and the proxy callback.

Importing it first checks that the installed LiteLLM is a version litellm-kv is tested with
(:mod:`litellm_kv.integration.litellm_version`): the proxy refuses to load the callback otherwise.
"""

from litellm_kv.integration.litellm_version import check_litellm_version

check_litellm_version()
