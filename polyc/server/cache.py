"""The content-addressed result cache: storage backends and the verified in-memory layer.

A backend stores opaque bundles (see bundle.py) by content key. Two exist:
- `SqliteBackend` (`sqlite:///PATH`): one file on disk, the zero-set-up default. Its calls
  run on one dedicated thread so the event loop never waits on the disk.
- `RedisBackend` (`redis://HOST:PORT/DB`): shared by several replicas, which also
  coordinate through it so that each key is compiled once between them (`acquire_lock`).

`ResultCache` verifies every bundle it reads (a corrupt or truncated one is deleted and
reported as a miss, so it gets recompiled) and keeps recently used entries in memory,
so a hit costs neither a disk read nor a network round trip nor a re-hash.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import sqlite3
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import orjson

from .bundle import OBJECT, RECORD, SOURCE, Bundle, CorruptBundle, decode_bundle

log = logging.getLogger("polyc.server")


class Backend(Protocol):
    """Where bundles live. `shared` backends are seen by several replicas."""

    url: str
    location: str  # where the entries are, for the log (the file, or the Redis URL)
    shared: bool

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def get(self, key: str) -> bytes | None: ...
    async def put(self, key: str, blob: bytes) -> None: ...
    async def delete_if(self, key: str, blob: bytes) -> None:
        """Delete the entry only if it still holds `blob` (a replica may have replaced it)."""
    async def acquire_lock(self, key: str, ttl_s: float) -> str | None:
        """A token if this process may compile `key`; None if another replica is at it."""
    async def release_lock(self, key: str, token: str) -> None: ...
    async def lock_held(self, key: str) -> bool: ...


class SqliteBackend:
    shared = False

    def __init__(self, url: str, path: str | Path):
        self.url = url
        self.path = Path(path).absolute()  # relative to the working directory at start
        self.location = str(self.path)
        # one thread owns the connection: SQLite calls block, the event loop must not
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="polyc-sqlite")
        self._conn: sqlite3.Connection | None = None

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                               timeout=30)
        conn.execute("PRAGMA journal_mode=WAL")  # readers never wait for a writer
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE IF NOT EXISTS bundles (key TEXT PRIMARY KEY, "
                     "bundle BLOB NOT NULL, created REAL NOT NULL)")
        self._conn = conn

    async def open(self) -> None:
        await self._call(self._open)

    async def close(self) -> None:
        if self._conn is not None:
            await self._call(self._conn.close)
            self._conn = None
        self._executor.shutdown(wait=True)

    def _get(self, key: str) -> bytes | None:
        row = self._conn.execute("SELECT bundle FROM bundles WHERE key = ?", (key,)).fetchone()
        return bytes(row[0]) if row else None

    async def get(self, key: str) -> bytes | None:
        return await self._call(self._get, key)

    def _put(self, key: str, blob: bytes) -> None:
        # one statement in autocommit mode: the whole bundle lands, or nothing does
        self._conn.execute("INSERT OR REPLACE INTO bundles (key, bundle, created) "
                           "VALUES (?, ?, ?)", (key, blob, time.time()))

    async def put(self, key: str, blob: bytes) -> None:
        await self._call(self._put, key, blob)

    def _delete_if(self, key: str, blob: bytes) -> None:
        self._conn.execute("DELETE FROM bundles WHERE key = ? AND bundle = ?", (key, blob))

    async def delete_if(self, key: str, blob: bytes) -> None:
        await self._call(self._delete_if, key, blob)

    # one SQLite file serves one server: single flight within the process is enough
    async def acquire_lock(self, key: str, ttl_s: float) -> str | None:
        return "local"

    async def release_lock(self, key: str, token: str) -> None:
        return None

    async def lock_held(self, key: str) -> bool:
        return False


# compare-and-delete, so a replica never deletes what another replica wrote since
_DELETE_IF_EQUAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RedisBackend:
    shared = True
    prefix = "polyc:v1:"

    def __init__(self, url: str):
        import redis.asyncio as aioredis  # only needed when a Redis URL is configured
        self.url = url
        self.location = url
        self._redis = aioredis.Redis.from_url(url, socket_connect_timeout=5,
                                              socket_timeout=30, health_check_interval=30)

    def _bundle(self, key: str) -> str:
        return f"{self.prefix}bundle:{key}"

    def _lock(self, key: str) -> str:
        return f"{self.prefix}lock:{key}"

    async def open(self) -> None:
        await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()

    async def get(self, key: str) -> bytes | None:
        return await self._redis.get(self._bundle(key))

    async def put(self, key: str, blob: bytes) -> None:
        await self._redis.set(self._bundle(key), blob)

    async def delete_if(self, key: str, blob: bytes) -> None:
        await self._redis.eval(_DELETE_IF_EQUAL, 1, self._bundle(key), blob)

    async def acquire_lock(self, key: str, ttl_s: float) -> str | None:
        token = secrets.token_hex(16)
        ok = await self._redis.set(self._lock(key), token, nx=True, px=max(1, int(ttl_s * 1000)))
        return token if ok else None

    async def release_lock(self, key: str, token: str) -> None:
        await self._redis.eval(_DELETE_IF_EQUAL, 1, self._lock(key), token)

    async def lock_held(self, key: str) -> bool:
        return bool(await self._redis.exists(self._lock(key)))


def open_backend(url: str) -> Backend:
    """The backend for a cache URL (not yet opened). Raises ValueError for a bad URL."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not path:
            raise ValueError(f"cache URL {url!r} names no file")
        return SqliteBackend(url, path)
    if url.startswith(("redis://", "rediss://", "unix://")):
        return RedisBackend(url)
    raise ValueError(f"unsupported cache URL {url!r}: use sqlite:///PATH or redis://HOST:PORT/DB")


@dataclass
class Entry:
    """A verified compile result, decoded once."""

    key: str
    created: float
    record: dict  # RECORD part: target, options, graph, kernels, timings, notes, toolchain
    c_source: str
    object: bytes
    manifest: tuple[dict, ...]
    size: int
    bodies: dict = field(default_factory=dict)  # serialised responses, built once each

    @classmethod
    def from_bundle(cls, bundle: Bundle) -> "Entry":
        try:
            record = orjson.loads(bundle.parts[RECORD])
            source = bundle.parts[SOURCE].decode("utf-8")
            obj = bundle.parts[OBJECT]
        except (KeyError, orjson.JSONDecodeError, UnicodeDecodeError) as e:
            raise CorruptBundle(f"bundle lacks a readable part: {e}") from None
        return cls(bundle.key, bundle.created, record, source, obj, bundle.manifest, bundle.size)


class ResultCache:
    def __init__(self, backend: Backend, *, hot_bytes: int, metrics):
        self.backend = backend
        self.metrics = metrics
        self._hot: OrderedDict[str, Entry] = OrderedDict()
        self._hot_bytes = 0
        self._hot_limit = hot_bytes

    @property
    def memory_entries(self) -> int:
        return len(self._hot)

    def hot(self, key: str) -> Entry | None:
        """The entry if it is in memory (no I/O: the fast path of a hit)."""
        entry = self._hot.get(key)
        if entry is not None:
            self._hot.move_to_end(key)
        return entry

    @staticmethod
    def _cost(entry: Entry) -> int:
        return 2 * entry.size  # the decoded parts, plus the serialised hit response

    def _remember(self, entry: Entry) -> None:
        if self._cost(entry) > self._hot_limit:
            return
        self.forget(entry.key)
        self._hot[entry.key] = entry
        self._hot_bytes += self._cost(entry)
        while self._hot_bytes > self._hot_limit:
            _, evicted = self._hot.popitem(last=False)
            self._hot_bytes -= self._cost(evicted)

    def forget(self, key: str) -> None:
        old = self._hot.pop(key, None)
        if old is not None:
            self._hot_bytes -= self._cost(old)

    async def get(self, key: str) -> Entry | None:
        """The verified entry, or None (a corrupt entry is deleted and counts as a miss)."""
        entry = self.hot(key)
        if entry is not None:
            return entry
        try:
            blob = await self.backend.get(key)
        except Exception as e:  # a cache outage degrades to compiling, never to an error
            log.warning("cache get %s failed: %s", key, e)
            self.metrics.cache_errors.inc(op="get")
            return None
        if blob is None:
            return None
        try:
            entry = Entry.from_bundle(decode_bundle(blob, key))
        except CorruptBundle as e:
            log.warning("cache entry %s is corrupt (%s): dropped, will recompile", key, e)
            self.metrics.cache_corrupt.inc()
            try:
                await self.backend.delete_if(key, blob)
            except Exception as e2:
                log.warning("could not delete corrupt entry %s: %s", key, e2)
            return None
        self._remember(entry)
        return entry

    async def put(self, entry: Entry, blob: bytes) -> bool:
        """Publish a bundle; False (and not remembered) when the store failed."""
        try:
            await self.backend.put(entry.key, blob)
        except Exception as e:  # disk full, Redis down: answer, but cache nothing
            log.warning("cache put %s failed: %s", entry.key, e)
            self.metrics.cache_errors.inc(op="put")
            return False
        self._remember(entry)
        return True
