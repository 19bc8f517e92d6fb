"""Where polyc keeps what it builds and measures: one cache directory per user."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """POLYC_CACHE_DIR, else the user's cache directory (XDG_CACHE_HOME or ~/.cache)."""
    root = os.environ.get("POLYC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polyc")
    return Path(root)
