"""Freeing large request-path dictionaries a slice at a time.

Dropping a dict of ~100K entries frees them all in one go: a pause of several milliseconds inside
whatever request happened to drop it. Generational caches (the hash memo, the sibling index) hand a
retired generation to :func:`free_some` instead, and call it on each use with a budget at least as
large as what that use added, so memory stays bounded and no single call pays for the whole drop.
"""

from __future__ import annotations

from typing import Any


def free_some(retiring: list[dict[Any, Any]], budget: int) -> None:
    """Pop up to ``budget`` entries from the retired dicts, newest first; drop emptied ones."""
    while retiring and budget > 0:
        gen = retiring[-1]
        n = min(budget, len(gen))
        for _ in range(n):
            gen.popitem()
        budget -= n
        if not gen:
            retiring.pop()
