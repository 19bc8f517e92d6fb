"""Identical concurrent requests compile once.

Within one server: `SingleFlight` maps a key to the task computing it; later callers
await the same task. The task is shielded, so a client that hangs up does not cancel a
compile others wait for (and its result is still published).

Across replicas (a shared backend such as Redis): `across_replicas` takes the backend's
lock for the key before compiling; a replica that finds the lock taken polls the cache
for the result instead, and compiles itself only if the lock goes away with no result
(the holder failed or died). The lock's TTL is short (seconds) and the holder renews it
while it compiles (a heartbeat), so a compile may take minutes while a dead holder's
lock lapses within one TTL.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Generic, TypeVar

from .breaker import CacheUnavailable

log = logging.getLogger("polyc.server")
T = TypeVar("T")


class SingleFlight(Generic[T]):
    def __init__(self):
        self._calls: dict[str, asyncio.Task] = {}

    def __len__(self) -> int:
        return len(self._calls)

    async def do(self, key: str, fn: Callable[[], Awaitable[T]]) -> tuple[T, bool]:
        """(result of fn, whether this call joined one already under way)."""
        task = self._calls.get(key)
        joined = task is not None
        if task is None:
            task = asyncio.ensure_future(fn())
            self._calls[key] = task
            task.add_done_callback(lambda t: self._finished(key, t))
        return await asyncio.shield(task), joined

    def _finished(self, key: str, task: asyncio.Task) -> None:
        if self._calls.get(key) is task:
            del self._calls[key]
        if not task.cancelled():
            task.exception()  # retrieved: every waiter may have gone away


async def across_replicas(backend, key: str, *, lookup: Callable[[], Awaitable[T | None]],
                          produce: Callable[[], Awaitable[T]], ttl_s: float,
                          poll_s: float) -> tuple[T, bool]:
    """(result, whether another replica produced it). `lookup` reads the cache;
    `produce` compiles and publishes."""
    while True:
        try:
            token = await backend.acquire_lock(key, ttl_s)
        except CacheUnavailable:  # the cache is down (the breaker said so once): compile
            return await produce(), False
        except Exception as e:
            log.warning("could not take the compile lock for %s: %s", key, e)
            return await produce(), False
        if token is not None:
            heartbeat = asyncio.ensure_future(_renew(backend, key, token, ttl_s))
            try:
                found = await lookup()  # published between our miss and our lock?
                if found is not None:
                    return found, True
                return await produce(), False
            finally:
                heartbeat.cancel()
                try:
                    await backend.release_lock(key, token)
                except CacheUnavailable:
                    pass  # it lapses by itself, its heartbeat stopped
                except Exception as e:
                    log.warning("could not release the compile lock for %s: %s", key, e)
        # another replica holds the lock: wait for its result, or for its lock to go
        deadline = time.monotonic() + ttl_s
        while time.monotonic() < deadline:
            await asyncio.sleep(poll_s)
            found = await lookup()
            if found is not None:
                return found, True
            try:
                if not await backend.lock_held(key):
                    break
            except Exception:
                break


async def _renew(backend, key: str, token: str, ttl_s: float) -> None:
    """Extend the lock every third of its TTL for as long as the compile runs."""
    while True:
        await asyncio.sleep(ttl_s / 3)
        try:
            if not await backend.extend_lock(key, token, ttl_s):
                log.warning("the compile lock for %s lapsed; another replica may compile "
                            "it too", key)
                return
        except Exception:  # the cache is down (the breaker logged it): compile regardless
            continue
