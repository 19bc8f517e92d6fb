"""A Redis that freezes, replicas that die holding a lock, and entries written into Redis
by someone else: against a real redis-server on loopback (frozen with SIGSTOP) and real
`polyc serve` replicas. Skipped without redis-server locally; CI must have it.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from polyc.server.breaker import CacheUnavailable
from polyc.server.bundle import OBJECT, RECORD, SOURCE, encode_bundle
from polyc.server.cache import ResultCache, open_backend
from polyc.server.metrics import Metrics
from polyc.server.testing import RedisProcess, ServerProcess, redis_server_path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
KEY_A, KEY_B = "a" * 64, "b" * 64
PARTS = {RECORD: b'{"target": "cpu"}', SOURCE: b"void k(void) {}\n", OBJECT: b"\x7fELF"}


def small_graph(name: str) -> dict:
    return {"name": name, "inputs": [{"name": "x", "shape": [4, 8]}],
            "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"]}


def _need_redis_server() -> None:
    if redis_server_path() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed, and CI must run the Redis tests")
        pytest.skip("redis-server is not installed")


@pytest.fixture
def redis_proc(tmp_path):
    _need_redis_server()
    with RedisProcess(tmp_path / "redis") as redis:
        try:
            yield redis
        finally:
            redis.proc.send_signal(signal.SIGCONT)  # a stopped server cannot take SIGTERM


def run(coro):
    return asyncio.run(coro)


def test_entry_copied_under_another_key_is_refused(redis_proc):
    import redis

    async def scenario():
        backend = open_backend(redis_proc.url)
        await backend.open()
        try:
            cache = ResultCache(backend, hot_bytes=1 << 20, metrics=Metrics())
            await backend.put(KEY_A, encode_bundle(KEY_A, PARTS))
            r = redis.Redis.from_url(redis_proc.url)
            r.set(f"polyc:v1:bundle:{KEY_B}", r.get(f"polyc:v1:bundle:{KEY_A}"))
            assert await cache.fetch(KEY_B) is None  # refused, and deleted
            assert r.get(f"polyc:v1:bundle:{KEY_B}") is None
            assert cache.metrics.cache_corrupt.value() == 1
            assert (await cache.fetch(KEY_A)).c_source == PARTS[SOURCE].decode()
            r.close()
        finally:
            await backend.close()
    run(scenario())


def test_with_a_secret_only_entries_signed_with_it_are_served(redis_proc):
    async def scenario():
        backend = open_backend(redis_proc.url)
        await backend.open()
        try:
            cache = ResultCache(backend, hot_bytes=1 << 20, metrics=Metrics(), secret=b"s3cret")
            # a well-formed entry whose writer does not know the secret: plain checksums,
            # or another secret
            await backend.put(KEY_A, encode_bundle(KEY_A, PARTS))
            await backend.put(KEY_B, encode_bundle(KEY_B, PARTS, secret=b"guess"))
            assert await cache.fetch(KEY_A) is None and await cache.fetch(KEY_B) is None
            assert await backend.get(KEY_A) is None and await backend.get(KEY_B) is None
            await backend.put(KEY_A, encode_bundle(KEY_A, PARTS, secret=b"s3cret"))
            assert (await cache.fetch(KEY_A)).object == PARTS[OBJECT]
        finally:
            await backend.close()
    run(scenario())


def test_frozen_redis_trips_the_breaker_after_one_short_time_out(redis_proc):
    async def scenario():
        backend = open_backend(redis_proc.url, timeout_s=0.5, cool_down_s=1.0)
        await backend.open()
        cache = ResultCache(backend, hot_bytes=1 << 20, metrics=Metrics())
        try:
            redis_proc.proc.send_signal(signal.SIGSTOP)
            start = time.monotonic()
            with pytest.raises(CacheUnavailable):
                await cache.fetch(KEY_A)
            first = time.monotonic() - start
            start = time.monotonic()
            for _ in range(20):  # the circuit is open: no network, no waiting
                assert await cache.get(KEY_A) is None
            rest = time.monotonic() - start
            assert backend.health()["ok"] is False
            assert first < 2.0 and rest < 0.1, (first, rest)
            redis_proc.proc.send_signal(signal.SIGCONT)
            await asyncio.sleep(1.1)  # the cool-down: then one probe closes the circuit
            assert await cache.fetch(KEY_A) is None
            assert backend.health()["ok"] is True
        finally:
            redis_proc.proc.send_signal(signal.SIGCONT)
            await backend.close()
    run(scenario())


def test_service_on_a_frozen_redis_compiles_locally_and_answers_503_for_stored_keys(
        redis_proc, tmp_path, seeded_cache):
    with ServerProcess(redis_proc.url, workers=1, log_dir=tmp_path,
                       args=("--cache-retry", "2"),
                       env={"POLYC_CACHE_DIR": seeded_cache(tmp_path)}) as server:
        client = httpx.Client(base_url=server.url, timeout=60)
        stored = client.post("/v1/compile", json={"graph": small_graph("stored")}).json()
        redis_proc.proc.send_signal(signal.SIGSTOP)
        try:
            start = time.monotonic()
            fresh = client.post("/v1/compile", json={"graph": small_graph("during")})
            took = time.monotonic() - start
            assert fresh.status_code == 200 and fresh.json()["cache_hit"] is False, fresh.text
            # one 1 s time-out, then the circuit is open (the attack saw 90 s)
            assert took < 5.0, took
            start = time.monotonic()
            again = client.post("/v1/compile", json={"graph": small_graph("during")}).json()
            assert again["cache_hit"] is True and time.monotonic() - start < 1.0
            # a key this replica does not hold may be in Redis: 503, not 404
            missing = client.get(f"/v1/kernels/{'c' * 64}/source")
            assert missing.status_code == 503, missing.text
            assert int(missing.headers["retry-after"]) >= 1
            # what it holds in memory is still served
            assert client.get(f"/v1/kernels/{stored['key']}/source").text == stored["c_source"]
            detail = client.get("/healthz", params={"detail": 1}).json()
            assert detail["status"] == "degraded" and "unreachable" in detail["cache"]["problem"]
            assert "polyc_cache_ok 0" in client.get("/metrics").text
        finally:
            redis_proc.proc.send_signal(signal.SIGCONT)
        time.sleep(2.2)  # the cool-down: the next call probes Redis again
        assert client.get(f"/v1/kernels/{'c' * 64}/source").status_code == 404
        assert client.get("/healthz", params={"detail": 1}).json()["status"] == "ok"
        client.close()


def test_lock_of_a_killed_replica_lapses_within_seconds(redis_proc, tmp_path, seeded_cache):
    import redis

    body = {"graph": json.loads((EXAMPLES / "attention.json").read_text())}
    common = dict(workers=1, log_dir=tmp_path, args=("--lock-ttl", "2"))
    a = ServerProcess(redis_proc.url, env={"POLYC_CACHE_DIR": seeded_cache(tmp_path / "a")},
                      **common)
    b = ServerProcess(redis_proc.url, env={"POLYC_CACHE_DIR": seeded_cache(tmp_path / "b")},
                      **common)
    r = redis.Redis.from_url(redis_proc.url)

    def post_to_a():
        with pytest.raises(httpx.HTTPError):  # a is killed before it answers
            httpx.post(a.url + "/v1/compile", json=body, timeout=60)

    with a, b:
        threading.Thread(target=post_to_a, daemon=True).start()
        deadline = time.monotonic() + 30
        while not r.keys("polyc:v1:lock:*"):
            assert time.monotonic() < deadline, "replica a never took the compile lock"
            time.sleep(0.005)
        a.proc.kill()  # mid-compile, holding the lock
        a.proc.wait(10)
        assert r.keys("polyc:v1:lock:*"), "the compile finished before the kill"
        start = time.monotonic()
        answer = httpx.post(b.url + "/v1/compile", json=body, timeout=120)
        took = time.monotonic() - start
        assert answer.status_code == 200 and answer.json()["cache_hit"] is False
        # at most one 2 s TTL of waiting, then b's own compile (~2 s); the lock of a
        # dead replica used to hold for 90 s
        assert took < 15, took
    r.close()


def test_a_redis_server_outlives_no_killed_process_that_started_it(tmp_path):
    """A test worker that crashes never leaves its `with RedisProcess` block: the server
    must go with it, not keep its port and memory until the machine is shut down."""
    _need_redis_server()
    owner = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from polyc.server.testing import RedisProcess\n"
         f"r = RedisProcess({str(tmp_path)!r}).start(); print(r.proc.pid, flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE, text=True)
    try:
        server = int(owner.stdout.readline())
        os.kill(server, 0)  # it runs
    finally:
        owner.kill()
        owner.wait(10)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:  # gone, or a zombie where no init reaps it
            if Path(f"/proc/{server}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return
        except FileNotFoundError:
            return
        time.sleep(0.05)
    os.kill(server, signal.SIGKILL)
    pytest.fail(f"redis-server {server} still runs 20 s after the process that started it was killed")
