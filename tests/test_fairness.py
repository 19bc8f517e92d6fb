"""Compile workers shared fairly between clients: one client's slow compiles (bombs
held until the time limit) cannot take every worker. The dispatcher's rules, then a real
`polyc serve` with two workers, bombed from 127.0.0.1 while 127.0.0.2 asks for a small
graph."""
from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest

from polyc.server.fairness import FairDispatcher
from polyc.server.testing import ServerProcess


def test_a_client_holds_at_most_its_share():
    async def scenario():
        d = FairDispatcher(per_client=1)
        d.put("w1")
        d.put("w2")
        assert await d.take("a", 1) == "w1"
        second_of_a = asyncio.ensure_future(d.take("a", 5))
        await asyncio.sleep(0)
        assert not second_of_a.done() and d.idle == 1  # w2 is kept for someone else
        assert await d.take("b", 1) == "w2"
        d.done("a")
        d.put("w1")
        assert await second_of_a == "w1"
    asyncio.run(scenario())


def test_the_client_holding_fewest_goes_first_then_the_longest_waiting():
    async def scenario():
        d = FairDispatcher(per_client=2)
        d.put("w1")
        assert await d.take("a", 1) == "w1"
        second_of_a = asyncio.ensure_future(d.take("a", 5))
        await asyncio.sleep(0)
        first_of_b = asyncio.ensure_future(d.take("b", 5))
        await asyncio.sleep(0)
        d.put("w2")  # a waited longer, but holds one already
        assert await first_of_b == "w2"
        d.done("a")
        d.put("w1")
        assert await second_of_a == "w1"
        with pytest.raises(asyncio.TimeoutError):
            await d.take("c", 0.05)
        assert d.waiting == 0  # the timed-out waiter is forgotten
    asyncio.run(scenario())


def test_a_worker_is_never_lost_when_its_taker_gives_up():
    async def scenario():
        d = FairDispatcher(per_client=2)
        gone = asyncio.ensure_future(d.take("a", 5))
        await asyncio.sleep(0)
        gone.cancel()  # gave up before any worker came: skipped
        await asyncio.sleep(0)
        nxt = asyncio.ensure_future(d.take("b", 5))
        await asyncio.sleep(0)
        d.put("w1")
        assert await nxt == "w1"
        late = asyncio.ensure_future(d.take("c", 5))
        other = asyncio.ensure_future(d.take("e", 5))
        await asyncio.sleep(0)
        d.put("w2")
        late.cancel()  # as the worker is handed over: either c has it, or it passes on
        try:
            got = await late
        except asyncio.CancelledError:
            assert await other == "w2"
        else:
            assert got == "w2" and not other.done()
            other.cancel()
    asyncio.run(scenario())


def bomb(d: int) -> dict:
    """A graph whose build the slow gcc below holds (its C names the input `bomb`)."""
    return {"name": f"bomb{d}", "inputs": [{"name": "bomb", "shape": [d, d]}],
            "nodes": [{"op": "exp", "inputs": ["bomb"], "outputs": ["y"]}], "outputs": ["y"]}


def slow_gcc(folder) -> str:
    """gcc that takes 30 s over a bomb's source (killed at the time limit): a bomb that
    lasts the same on any host, however loaded, where a costly graph would not."""
    wrapper = folder / "slow-gcc"
    wrapper.write_text('#!/bin/sh\nfor a in "$@"; do case "$a" in *.c) '
                       'grep -q bomb "$a" && sleep 30 ;; esac; done\nexec gcc "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


SMALL = {"name": "small", "inputs": [{"name": "x", "shape": [4, 8]}],
         "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"]}


def test_bombs_from_one_client_leave_a_worker_for_another(tmp_path, seeded_cache):
    # each bomb holds its worker's gcc past the 5 s limit; two of them, from one address
    with ServerProcess(f"sqlite:///{tmp_path}/c.sqlite3", workers=2, log_dir=tmp_path,
                       args=("--compile-timeout", "5"),
                       env={"POLYC_CACHE_DIR": seeded_cache(tmp_path),
                            "POLYC_CC": slow_gcc(tmp_path)}) as server:
        bomber = httpx.Client(base_url=server.url, timeout=30,
                              transport=httpx.HTTPTransport(local_address="127.0.0.1"))
        other = httpx.Client(base_url=server.url, timeout=30,
                             transport=httpx.HTTPTransport(local_address="127.0.0.2"))
        answers = []  # (when, status) of each bomb

        def post_bomb(d):
            status = bomber.post("/v1/compile", json={"graph": bomb(d)}).status_code
            answers.append((time.monotonic(), status))

        bombs = [threading.Thread(target=post_bomb, args=(d,)) for d in (32, 33)]
        for t in bombs:
            t.start()
        time.sleep(0.5)  # both bombs are in (one running, one waiting for a share)
        small = other.post("/v1/compile", json={"graph": SMALL})
        answered = time.monotonic()
        assert small.status_code == 200, small.text
        for t in bombs:
            t.join()
        # before fair sharing it waited for the first bomb's time-out; an order, not a
        # duration, so a loaded host that compiles the small graph slowly still passes
        assert answered < min(when for when, _ in answers), (answered, answers)
        assert [status for _, status in answers] == [504, 504]
        bomber.close()
        other.close()
