"""What a running service is configured with: one frozen record, built from the command
line of `polyc serve` or, in tests, directly.

The cache is chosen by `cache_url` (flag `--cache`, else `POLYC_CACHE_URL`):
`sqlite:///PATH` or `redis://HOST:PORT/DB`. PATH is taken as written, as SQLAlchemy
does: `sqlite:////var/cache/polyc.db` is absolute, `sqlite:///cache.db` is relative to
the working directory. The default is a SQLite file under the user's cache
directory, so a bare `polyc serve` needs nothing else installed or running.

`cache_secret` (environment only, `POLYC_CACHE_SECRET`: a secret on a command line is
visible to every user of the machine) makes every entry carry an HMAC; replicas sharing
a Redis must all have the same one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..codegen.build import cache_dir
from ..graph.load import Limits


def default_cache_url() -> str:
    return os.environ.get("POLYC_CACHE_URL") or f"sqlite:///{cache_dir() / 'service.sqlite3'}"


def default_cache_secret() -> bytes | None:
    return os.environ.get("POLYC_CACHE_SECRET", "").encode() or None


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class Settings:
    cache_url: str = field(default_factory=default_cache_url)
    # compile worker processes (isl holds the GIL: threads would not run in parallel)
    workers: int = field(default_factory=default_workers)
    # wall-clock limit of one compile in a worker, gcc included; past it: 504
    compile_timeout_s: float = 60.0
    # compiles that may wait for a free worker; one more answers 503 with Retry-After
    queue_size: int = 64
    # workers one client (address) may hold at once; None: all but one (fair sharing)
    workers_per_client: int | None = None
    # address-space limit (RLIMIT_AS) of each worker, inherited by its gcc
    worker_memory_bytes: int = 4 << 30
    # a worker is replaced after this many compiles, so slow leaks cannot build up
    max_jobs_per_worker: int = 500
    # request bodies above this answer 413
    max_body_bytes: int = 16 << 20
    # JSON nested deeper than this answers 400 (no graph needs more than ~6 levels)
    max_json_depth: int = 64
    # verified cache entries kept in memory, so hits touch neither disk nor network
    hot_cache_bytes: int = 256 << 20
    # graph size limits, as the loader defines them
    limits: Limits = field(default_factory=Limits)
    # how long a time-out or a repeated crash is remembered for its key (answered at once)
    remember_failures_s: float = 600.0
    # how often a replica waiting on another replica's compile looks for its result
    lock_poll_s: float = 0.05
    # a replica's compile lock lapses this long after its last heartbeat (sent every
    # third of it), so the lock of a replica that died is taken over within seconds
    lock_ttl_s: float = 5.0
    # connect and read time-out of each call to a network cache (Redis)
    cache_timeout_s: float = 1.0
    # after a network cache fails, it is left alone this long (then probed once)
    cache_retry_s: float = 5.0
    # a request's headers must arrive within this (from its first byte; 408 and closed)
    header_timeout_s: float = 10.0
    # its body within this (from the first read of it; 408 and closed)
    body_timeout_s: float = 20.0
    # open connections and requests served at once; past it, requests answer 503
    max_connections: int = 1000
    # with a shared (Redis) cache: how often the tunings kept there are pulled
    # (`polyc tune --cache`, server/tunings.py)
    tuning_sync_s: float = 30.0
    # HMAC key of cache entries (None: plain checksums)
    cache_secret: bytes | None = field(default_factory=default_cache_secret, repr=False)

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError("workers must be at least 1")
        if self.compile_timeout_s <= 0:
            raise ValueError("compile_timeout_s must be positive")
        if self.queue_size < 0:
            raise ValueError("queue_size must be >= 0")
        for name in ("lock_ttl_s", "cache_timeout_s", "cache_retry_s", "header_timeout_s",
                     "body_timeout_s", "max_connections", "tuning_sync_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
