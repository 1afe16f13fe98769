"""The only layer that imports LiteLLM: hook adapters, admin routes and the proxy callback."""
