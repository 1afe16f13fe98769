"""Oracles that answer with vLLM's own code, run in the engine venv (``.venv-engine``)."""
