"""Build hook for the one native part: litellm_kv/vllm/_chain.c (vLLM's sha256 block-hash chain in C,
linked to OpenSSL's libcrypto). It is optional: without a compiler or the OpenSSL headers the build
goes on and litellm-kv hashes in pure Python (exact either way; /litellm-kv/health says which)."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("litellm_kv.vllm._chain", ["litellm_kv/vllm/_chain.c"], libraries=["crypto"], optional=True,
                  extra_compile_args=["-O2"]),
    ],
)
