"""Trace-replay simulator of a vLLM fleet, comparing litellm-kv with the field's routers.

Entry point for the CLI: :func:`cli_main` (``litellm-kv bench replay ...``).
"""

from collections.abc import Sequence


def cli_main(argv: Sequence[str] | None = None) -> int:
    """Run ``litellm-kv bench <command> ...``; ``argv`` excludes the ``bench`` word."""
    from litellm_kv.simulator.cli import cli_main as main

    return main(argv)


__all__ = ["cli_main"]
