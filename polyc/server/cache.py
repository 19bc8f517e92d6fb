"""The content-addressed result cache: storage backends and the verified in-memory layer.

A backend stores opaque bundles (see bundle.py) by content key. Two exist:
- `SqliteBackend` (`sqlite:///PATH`): one file on disk, the zero-set-up default. Its calls
  run on one dedicated thread so the event loop never waits on the disk.
- `RedisBackend` (`redis://HOST:PORT/DB`, redis_backend.py): shared by several replicas,
  which also coordinate through it so that each key is compiled once between them.

`ResultCache` verifies every bundle it reads (a corrupt or truncated one is deleted and
reported as a miss, so it gets recompiled) and keeps recently used entries in memory,
so a hit costs neither a disk read nor a network round trip nor a re-hash. The memory
tier also keeps what the backend could not store (a read-only file, Redis down), so a
repeat is still answered without compiling.
"""
from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import orjson

from .breaker import CacheUnavailable
from .bundle import OBJECT, RECORD, SOURCE, Bundle, CorruptBundle, decode_bundle

log = logging.getLogger("polyc.server")


class Backend(Protocol):
    """Where bundles live. `shared` backends are seen by several replicas."""

    url: str
    location: str  # where the entries are, for the log (the file, or the Redis URL)
    shared: bool

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    def health(self) -> dict:
        """{"ok", "writable", "problem"}: the state last seen, without I/O."""
    async def get(self, key: str) -> bytes | None: ...
    async def put(self, key: str, blob: bytes) -> None: ...
    async def delete_if(self, key: str, blob: bytes) -> None:
        """Delete the entry only if it still holds `blob` (a replica may have replaced it)."""
    async def acquire_lock(self, key: str, ttl_s: float) -> str | None:
        """A token if this process may compile `key`; None if another replica is at it."""
    async def extend_lock(self, key: str, token: str, ttl_s: float) -> bool: ...
    async def refresh(self) -> None:
        """Look again at the storage, so that `health` is current."""
    async def release_lock(self, key: str, token: str) -> None: ...
    async def lock_held(self, key: str) -> bool: ...


class SqliteBackend:
    """A file that cannot be written (read-only file or folder) is read if it can be and
    written never: the service starts, says so once, and keeps results in memory. A file
    deleted or replaced while the service runs is noticed at the next write and created
    again (SQLite would go on writing into the unlinked file, lost at the next start)."""

    shared = False

    def __init__(self, url: str, path: str | Path):
        self.url = url
        self.path = Path(path).absolute()  # relative to the working directory at start
        self.location = str(self.path)
        # one thread owns the connection: SQLite calls block, the event loop must not
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="polyc-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._inode: tuple[int, int] | None = None
        self.writable = False
        self.problem: str | None = None

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _connect(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                               timeout=30)
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # readers never wait for a writer
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("CREATE TABLE IF NOT EXISTS bundles (key TEXT PRIMARY KEY, "
                         "bundle BLOB NOT NULL, created REAL NOT NULL)")
            conn.execute("BEGIN IMMEDIATE")  # a write lock: fails on a read-only file
            conn.execute("ROLLBACK")
        except BaseException:
            conn.close()
            raise
        return conn

    def _connect_read_only(self) -> sqlite3.Connection | None:
        try:
            conn = sqlite3.connect(f"{self.path.as_uri()}?mode=ro", uri=True,
                                   check_same_thread=False, isolation_level=None)
            conn.execute("SELECT 1 FROM bundles LIMIT 1")
            return conn
        except sqlite3.Error:
            return None

    def _open(self) -> None:
        try:
            self._conn = self._connect()
            self.writable = True
            st = self.path.stat()
            self._inode = (st.st_dev, st.st_ino)
        except (OSError, sqlite3.Error) as e:
            self._conn = self._connect_read_only()
            self.writable = False
            reading = ("its entries are read" if self._conn is not None
                       else "nothing can be read from it")
            self.problem = (f"the cache file {self.path} cannot be written ({e}): {reading}, "
                            "new results are kept in memory only")

    async def open(self) -> None:
        await self._call(self._open)

    def health(self) -> dict:
        return {"ok": self.problem is None, "writable": self.writable, "problem": self.problem}

    async def close(self) -> None:
        if self._conn is not None:
            await self._call(self._conn.close)
            self._conn = None
        self._executor.shutdown(wait=True)

    def _get(self, key: str) -> bytes | None:
        if self._conn is None:
            return None
        row = self._conn.execute("SELECT bundle FROM bundles WHERE key = ?", (key,)).fetchone()
        return bytes(row[0]) if row else None

    async def get(self, key: str) -> bytes | None:
        return await self._call(self._get, key)

    def _check_file(self) -> None:
        """Create the file again if it was deleted or replaced since it was opened."""
        try:
            st = self.path.stat()
            if (st.st_dev, st.st_ino) == self._inode:
                return
        except FileNotFoundError:
            pass
        self._conn.close()
        self._conn = None
        lost = time.strftime("%Y-%m-%d %H:%M:%S")
        self._open()
        if self.writable:
            self.problem = (f"the cache file {self.path} was deleted or replaced while in "
                            f"use (noticed at {lost}); it was created again, entries stored "
                            "before are gone")
        log.warning("%s", self.problem)

    def _put(self, key: str, blob: bytes) -> None:
        if not self.writable:
            return  # reported once at start: the memory tier keeps the result
        self._check_file()
        if self.writable:
            # one statement in autocommit mode: the whole bundle lands, or nothing does
            self._conn.execute("INSERT OR REPLACE INTO bundles (key, bundle, created) "
                               "VALUES (?, ?, ?)", (key, blob, time.time()))

    async def put(self, key: str, blob: bytes) -> None:
        await self._call(self._put, key, blob)

    def _delete_if(self, key: str, blob: bytes) -> None:
        if self.writable:
            self._conn.execute("DELETE FROM bundles WHERE key = ? AND bundle = ?", (key, blob))

    async def delete_if(self, key: str, blob: bytes) -> None:
        await self._call(self._delete_if, key, blob)

    async def refresh(self) -> None:
        """Look at the file now (for /healthz and /metrics): a deleted file is noticed
        here rather than at the next write."""
        if self.writable:
            await self._call(self._check_file)

    # one SQLite file serves one server: single flight within the process is enough
    async def acquire_lock(self, key: str, ttl_s: float) -> str | None:
        return "local"

    async def extend_lock(self, key: str, token: str, ttl_s: float) -> bool:
        return True

    async def release_lock(self, key: str, token: str) -> None:
        return None

    async def lock_held(self, key: str) -> bool:
        return False


def open_backend(url: str, *, timeout_s: float = 1.0, cool_down_s: float = 5.0) -> Backend:
    """The backend for a cache URL (not yet opened). Raises ValueError for a bad URL.
    `timeout_s` and `cool_down_s` apply to a network cache (see redis_backend.py)."""
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):]
        if not path:
            raise ValueError(f"cache URL {url!r} names no file")
        return SqliteBackend(url, path)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from .redis_backend import RedisBackend
        return RedisBackend(url, timeout_s=timeout_s, cool_down_s=cool_down_s)
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
    def __init__(self, backend: Backend, *, hot_bytes: int, metrics,
                 secret: bytes | None = None):
        self.backend = backend
        self.secret = secret  # entries must carry its HMAC (see bundle.py)
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

    def decode(self, blob: bytes, key: str) -> Entry:
        """The entry in a stored blob; CorruptBundle if it is damaged, filed under another
        key, or (with a secret) not signed with this service's secret."""
        return Entry.from_bundle(decode_bundle(blob, key, secret=self.secret))

    async def get(self, key: str) -> Entry | None:
        """The verified entry, or None: a miss, a corrupt entry (deleted) or a cache that
        cannot be reached (compiling again is the way out of all three)."""
        try:
            return await self.fetch(key)
        except CacheUnavailable:
            return None

    async def fetch(self, key: str) -> Entry | None:
        """As `get`, but a cache that cannot be reached raises CacheUnavailable: a GET by
        key must not answer "not stored" when the entry may well be."""
        entry = self.hot(key)
        if entry is not None:
            return entry
        try:
            blob = await self.backend.get(key)
        except CacheUnavailable:  # the breaker said so once, in the log
            self.metrics.cache_errors.inc(op="get")
            raise
        except Exception as e:
            log.warning("cache get %s failed: %s", key, e)
            self.metrics.cache_errors.inc(op="get")
            raise CacheUnavailable(f"the cache could not be read ({e})", 1) from e
        if blob is None:
            return None
        try:
            entry = self.decode(blob, key)
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
        """Publish a bundle; False when the store failed. Either way the entry is kept in
        memory, so a repeat is answered without compiling."""
        self._remember(entry)
        try:
            await self.backend.put(entry.key, blob)
        except CacheUnavailable:
            self.metrics.cache_errors.inc(op="put")
            return False
        except Exception as e:  # disk full: answer, and keep it in memory only
            log.warning("cache put %s failed: %s", entry.key, e)
            self.metrics.cache_errors.inc(op="put")
            return False
        return True
