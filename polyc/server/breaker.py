"""A circuit breaker in front of a shared cache: when the cache stops answering, calls fail
at once for a while instead of each waiting out a socket time-out.

    closed --(a call fails or times out)--> open --(cool_down_s later)--> half-open
    half-open: one call probes; success closes the circuit, failure opens it again

While the circuit is open every call raises `CacheUnavailable` without touching the
network, so a frozen Redis costs the first request one short time-out and later ones
nothing: the service compiles locally and answers from its in-memory tier.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Awaitable, Callable, TypeVar

log = logging.getLogger("polyc.server")
T = TypeVar("T")


class CacheUnavailable(Exception):
    """The cache cannot be reached now; `retry_after_s` is when it is tried again."""

    def __init__(self, message: str, retry_after_s: int):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class CircuitBreaker:
    def __init__(self, name: str, *, cool_down_s: float, clock=time.monotonic):
        self.name = name
        self.cool_down_s = cool_down_s
        self._clock = clock
        self._open_until = 0.0  # 0: closed
        self._probing = False
        self.last_error: str | None = None
        self.trips = 0  # how often the circuit opened

    @property
    def is_open(self) -> bool:
        return self._open_until > 0.0

    def retry_after(self) -> int:
        return max(1, math.ceil(self._open_until - self._clock()))

    async def call(self, fn: Callable[[], Awaitable[T]]) -> T:
        if self.is_open:
            if self._probing or self._clock() < self._open_until:
                raise CacheUnavailable(f"{self.name} is unavailable ({self.last_error})",
                                       self.retry_after())
            self._probing = True  # half-open: this call is the probe
        try:
            result = await fn()
        except Exception as e:
            self._trip(e)
            raise CacheUnavailable(f"{self.name} is unavailable ({self.last_error})",
                                   self.retry_after()) from e
        finally:
            self._probing = False
        if self.is_open:
            log.warning("%s answers again; the circuit is closed", self.name)
            self._open_until = 0.0
            self.last_error = None
        return result

    def _trip(self, e: Exception) -> None:
        self.last_error = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if not self.is_open:
            self.trips += 1
            log.warning("%s failed (%s): not used for %g s, compiling locally meanwhile",
                        self.name, self.last_error, self.cool_down_s)
        self._open_until = self._clock() + self.cool_down_s
