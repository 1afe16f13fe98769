"""The vLLM engine contract: block hashing, tokenization, the engine's HTTP surface, KV events and
their subscription, and the live checks that our hashes still match the engine's.

Imports nothing from LiteLLM and nothing from routing or governance; everything above builds on it.
"""
