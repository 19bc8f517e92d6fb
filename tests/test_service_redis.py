"""Replicas sharing one Redis: a graph is compiled once between them, results are shared,
and a corrupt shared entry is caught by the replica that reads it.

Runs against a real redis-server on a free loopback port (`.ci/run` installs it). Without
one these tests skip locally, but fail under CI (env CI set), where it must exist.
"""
from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path

import httpx
import pytest

from polyc.server.bundle import decode_bundle
from polyc.server.testing import RedisProcess, ServerProcess, redis_server_path
from test_compile_scale import chain

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    if redis_server_path() is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed, and CI must run the Redis tests")
        pytest.skip("redis-server is not installed")
    with RedisProcess(tmp_path_factory.mktemp("redis")) as redis:
        yield redis.url


@pytest.fixture(scope="module")
def replicas(redis_url, tmp_path_factory, seeded_cache):
    # the run's prebuilt parts and calibration (unseeded, both replicas built and timed
    # them again at start: 30 s of the suite)
    tmp = tmp_path_factory.mktemp("replicas")
    a, b = (ServerProcess(redis_url, workers=1, log_dir=tmp,
                          env={"POLYC_CACHE_DIR": seeded_cache(tmp / name)})
            for name in "ab")
    with a, b:
        yield a.url, b.url


def compiles(base: str) -> float:
    text = httpx.get(base + "/metrics").text
    m = re.search(r'^polyc_compiles_total\{outcome="ok"\} (\S+)$', text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def counter(base: str, name: str) -> float:
    text = httpx.get(base + "/metrics").text
    m = re.search("^" + re.escape(name) + r" (\S+)$", text, re.MULTILINE)
    return float(m.group(1)) if m else 0.0


def test_two_replicas_compile_a_graph_once_between_them(replicas):
    a, b = replicas
    # a 400-node chain compiles for seconds (its fusion proposals): six requests released
    # together all arrive while it runs, even on a loaded machine
    body = {"graph": chain(400)}
    before = compiles(a) + compiles(b)
    answers = []
    barrier = threading.Barrier(6)

    def post(base):
        barrier.wait()
        answers.append(httpx.post(base + "/v1/compile", json=body, timeout=120))

    threads = [threading.Thread(target=post, args=(base,)) for base in (a, b) * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [r.status_code for r in answers] == [200] * 6, [r.text[:500] for r in answers]
    results = [r.json() for r in answers]
    assert len({r["key"] for r in results}) == 1
    assert len({r["c_source"] for r in results}) == 1
    assert compiles(a) + compiles(b) - before == 1
    assert sum(not r["cache_hit"] and not r["coalesced"] for r in results) == 1
    # all six arrived while the compile ran (seconds): the five others waited for it, in
    # the same replica or through the Redis lock in the other one
    assert sum(r["coalesced"] for r in results) == 5
    assert counter(a, "polyc_compile_coalesced_total") + counter(
        b, "polyc_compile_coalesced_total") == 5
    key = results[0]["key"]
    for base in (a, b):
        assert httpx.post(base + "/v1/compile", json=body).json()["cache_hit"] is True
        assert httpx.get(f"{base}/v1/kernels/{key}/source").text == results[0]["c_source"]


def test_result_compiled_by_one_replica_is_a_hit_on_the_other(replicas):
    a, b = replicas
    body = {"graph": json.loads((EXAMPLES / "softmax.json").read_text())}
    first = httpx.post(a + "/v1/compile", json=body, timeout=120).json()
    assert first["cache_hit"] is False
    before = compiles(b)
    other = httpx.post(b + "/v1/compile", json=body).json()
    assert other["cache_hit"] is True and other["key"] == first["key"]
    assert compiles(b) == before


def test_corrupt_shared_entry_is_dropped_and_recompiled(replicas, redis_url):
    import redis

    a, b = replicas
    body = {"graph": json.loads((EXAMPLES / "log_softmax.json").read_text())}
    first = httpx.post(a + "/v1/compile", json=body, timeout=120).json()
    r = redis.Redis.from_url(redis_url)
    name = f"polyc:v1:bundle:{first['key']}"
    blob = r.get(name)
    r.set(name, blob[: len(blob) // 2])  # truncated, as by a crash mid-copy
    corrupt_before = counter(b, "polyc_cache_corrupt_entries_total")
    again = httpx.post(b + "/v1/compile", json=body, timeout=120).json()
    assert again["cache_hit"] is False and again["c_source"] == first["c_source"]
    assert counter(b, "polyc_cache_corrupt_entries_total") == corrupt_before + 1
    decode_bundle(r.get(name), first["key"])  # republished whole
    r.close()
