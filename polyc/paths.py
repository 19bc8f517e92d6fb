"""Where polyc keeps what it builds and measures: one cache directory per user."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def cache_dir() -> Path:
    """POLYC_CACHE_DIR, else the user's cache directory (XDG_CACHE_HOME or ~/.cache)."""
    root = os.environ.get("POLYC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "polyc")
    return Path(root)


def read_cache_json(name: str) -> dict:
    """The JSON object in cache file `name`, or {} when it is missing or damaged (a
    cache that cannot be read is measured again)."""
    try:
        return json.loads((cache_dir() / name).read_text())
    except (OSError, ValueError):
        return {}


def write_cache_json(name: str, data: dict) -> None:
    """Replaces cache file `name` atomically: processes that measure at once may race,
    and a reader never sees half a file."""
    path = cache_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(f.name, path)
