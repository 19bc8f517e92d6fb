"""polyc's version: part of every cache key.

`__version__` is the release; `build_version()` adds a digest of the package's own
files, so two builds of one release (a checkout a commit later, a local patch) never
share a service's cached results: a cache that outlives an upgrade does not serve what
the older code generated."""
from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__version__ = "0.1.0"

# the files that make up what polyc generates and serves
_SOURCES = (".py", ".c", ".h", ".html", ".js", ".css")


@functools.lru_cache(maxsize=None)
def build_version() -> str:
    """`__version__` and a digest of the package's sources, e.g. `0.1.0+3f2a9c41d07b5e68`."""
    return f"{__version__}+{source_digest(Path(__file__).resolve().parent)}"


def source_digest(root: Path) -> str:
    """The first 16 hex digits of a sha256 over the source files below `root`: their
    paths and contents, in path order, each part preceded by its length."""
    h = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.suffix in _SOURCES and p.is_file()):
        for part in (path.relative_to(root).as_posix().encode(), path.read_bytes()):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return h.hexdigest()[:16]
