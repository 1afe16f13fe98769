"""The hook table LiteLLM's ``proxy/hooks`` reads from ``enterprise.enterprise_hooks``: only managed files."""

from litellm_enterprise.proxy.hooks.managed_files import PROXY_LiteLLMManagedFiles

ENTERPRISE_PROXY_HOOKS = {"managed_files": PROXY_LiteLLMManagedFiles}
