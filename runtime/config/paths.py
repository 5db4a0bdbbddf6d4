"""Where edgerun keeps per-user files that can be thrown away: the XDG cache directory.

`$XDG_CACHE_HOME/edgerun` when that is set to an absolute path (the XDG Base Directory
spec says a relative one is to be ignored), `~/.cache/edgerun` otherwise. Standard library.
"""

from __future__ import annotations

import os
from pathlib import Path


def user_cache(*parts: str) -> Path:
    """`$XDG_CACHE_HOME/edgerun/<parts>` (`~/.cache/edgerun/<parts>` without it)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    root = Path(base) if base and os.path.isabs(base) else Path("~/.cache").expanduser()
    return root.joinpath("edgerun", *parts)


def cache_dir(configured: str, *parts: str) -> Path:
    """A configured cache directory (`~` expanded), or the user's cache (`user_cache(parts)`)
    when the setting is empty."""
    return Path(configured).expanduser() if configured else user_cache(*parts)
