"""Helpers the tests use to start real servers (redis, litellm proxy, vLLM, fakes) on 127.0.0.1."""
