"""Fair hand-out of compile workers between clients.

A first-come queue lets one client that sends many slow compiles (bombs, each held until
the time limit) take every worker, and everyone else waits behind them. `FairDispatcher`
hands an idle worker to a waiting client by two rules:

- a client holds at most `per_client` workers at once (the pool keeps it below the
  pool's size, so one worker is always left for the others);
- among the clients that may take one, the client holding the fewest goes first, and
  between equals the one that has waited longest.

Clients are told apart by their address (behind a proxy that is the proxy's: give each
team its own replica, or raise the share).

    d = FairDispatcher(per_client=1); d.put(w1); d.put(w2)
    a takes w1; a's second request waits although w2 is idle;
    b, arriving after it, gets w2 at once
"""
from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict, deque
from typing import Generic, TypeVar

T = TypeVar("T")


class FairDispatcher(Generic[T]):
    def __init__(self, per_client: int):
        if per_client < 1:
            raise ValueError("per_client must be at least 1")
        self.per_client = per_client
        self._idle: deque[T] = deque()
        self._holding: dict[str, int] = defaultdict(int)
        # per client: (arrival number, future) in arrival order
        self._waiters: dict[str, deque[tuple[int, asyncio.Future]]] = defaultdict(deque)
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(len(q) for q in self._waiters.values())

    @property
    def idle(self) -> int:
        return len(self._idle)

    def put(self, item: T) -> None:
        """An item (a worker) is free."""
        self._idle.append(item)
        self._dispatch()

    def done(self, client: str) -> None:
        """`client` gave back (or lost) an item it took."""
        self._holding[client] -= 1
        if self._holding[client] <= 0:
            del self._holding[client]
        self._dispatch()

    async def take(self, client: str, timeout_s: float) -> T:
        """An item for `client`; asyncio.TimeoutError if none comes within `timeout_s`.
        The caller calls `done(client)` once it is finished with it."""
        future = asyncio.get_running_loop().create_future()
        self._waiters[client].append((next(self._arrivals), future))
        self._dispatch()
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout_s)
        except BaseException:
            if future.done() and not future.cancelled():
                # handed over as we gave up waiting: pass it on
                self.done(client)
                self.put(future.result())
            else:
                future.cancel()
                self._forget(client, future)
            raise

    def _forget(self, client: str, future: asyncio.Future) -> None:
        queue = self._waiters.get(client)
        if queue is None:
            return
        for entry in queue:
            if entry[1] is future:
                queue.remove(entry)
                break
        if not queue:
            del self._waiters[client]

    def _dispatch(self) -> None:
        while self._idle:
            eligible = [(self._holding.get(c, 0), q[0][0], c) for c, q in self._waiters.items()
                        if q and self._holding.get(c, 0) < self.per_client]
            if not eligible:
                return
            _, _, client = min(eligible)
            _, future = self._waiters[client].popleft()
            if not self._waiters[client]:
                del self._waiters[client]
            if future.done():  # given up on already
                continue
            self._holding[client] += 1
            future.set_result(self._idle.popleft())
