"""The Redis cache backend (`redis://HOST:PORT/DB`), shared by several replicas.

Replicas coordinate through it so each key is compiled once between them: the replica
that compiles holds a short lock it renews while it works (a heartbeat), so the lock of
a replica that died expires within `lock_ttl_s` and another one takes over.

Every call has a short time-out and goes through a circuit breaker (breaker.py): a
frozen or unreachable Redis costs one time-out, then calls fail at once with
`CacheUnavailable` until a probe succeeds. The client does not retry by itself (its
default of three retries tripled every time-out).
"""
from __future__ import annotations

import secrets

from .breaker import CircuitBreaker

# compare-and-delete, so a replica never deletes what another replica wrote since
_DELETE_IF_EQUAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
# compare-and-extend: the heartbeat of a lock renews only the holder's own lock
_EXTEND_IF_EQUAL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""


class RedisBackend:
    shared = True
    prefix = "polyc:v1:"

    def __init__(self, url: str, *, timeout_s: float, cool_down_s: float):
        import redis.asyncio as aioredis  # only needed when a Redis URL is configured
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        self.url = url
        self.location = url
        self._redis = aioredis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
            retry=Retry(NoBackoff(), 0), health_check_interval=30)
        self.breaker = CircuitBreaker(f"the Redis cache at {url}", cool_down_s=cool_down_s)

    def _bundle(self, key: str) -> str:
        return f"{self.prefix}bundle:{key}"

    def _lock(self, key: str) -> str:
        return f"{self.prefix}lock:{key}"

    def health(self) -> dict:
        if self.breaker.is_open:
            return {"ok": False, "writable": False,
                    "problem": f"unreachable ({self.breaker.last_error}); compiling locally, "
                               f"retried in {self.breaker.retry_after()} s"}
        return {"ok": True, "writable": True, "problem": None}

    async def refresh(self) -> None:
        return None  # the breaker's state is current: it changes with every call

    async def open(self) -> None:
        await self._redis.ping()

    async def close(self) -> None:
        await self._redis.aclose()

    async def get(self, key: str) -> bytes | None:
        return await self.breaker.call(lambda: self._redis.get(self._bundle(key)))

    async def put(self, key: str, blob: bytes) -> None:
        await self.breaker.call(lambda: self._redis.set(self._bundle(key), blob))

    async def delete_if(self, key: str, blob: bytes) -> None:
        await self.breaker.call(
            lambda: self._redis.eval(_DELETE_IF_EQUAL, 1, self._bundle(key), blob))

    async def acquire_lock(self, key: str, ttl_s: float) -> str | None:
        token = secrets.token_hex(16)
        ok = await self.breaker.call(lambda: self._redis.set(
            self._lock(key), token, nx=True, px=max(1, int(ttl_s * 1000))))
        return token if ok else None

    async def extend_lock(self, key: str, token: str, ttl_s: float) -> bool:
        return bool(await self.breaker.call(lambda: self._redis.eval(
            _EXTEND_IF_EQUAL, 1, self._lock(key), token, max(1, int(ttl_s * 1000)))))

    async def release_lock(self, key: str, token: str) -> None:
        await self.breaker.call(
            lambda: self._redis.eval(_DELETE_IF_EQUAL, 1, self._lock(key), token))

    async def lock_held(self, key: str) -> bool:
        return bool(await self.breaker.call(lambda: self._redis.exists(self._lock(key))))
