"""Faults: a worker killed mid-compile, a compile past its time limit (gcc killed with its
worker), corrupt cache entries, a full disk. None may be served or cached as a result,
and the service must keep working afterwards."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import threading
import time
import warnings
from pathlib import Path

import pytest

from polyc.server import Settings, create_app
from polyc.targets.cpu import cpu_machine
from polyc.targets.cpu.plan import measured

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def graph(name: str, shape=(4, 8), op: str = "exp") -> dict:
    return {"name": name, "inputs": [{"name": "x", "shape": list(shape)}],
            "nodes": [{"op": op, "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"]}


def metric_line(client, prefix: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def group_members(pgid: int) -> list[str]:
    """Names of the live processes in a process group (from /proc)."""
    names = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            names.append(comm)
    return names


def wait_busy(pool, timeout=10.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = pool.busy_pids()
        if pids:
            return pids[0]
        time.sleep(0.002)
    raise AssertionError("no worker became busy")


def in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    return t, out


def test_workers_killed_from_outside_are_not_blamed_on_the_graph(tmp_path):
    # the attack: two kill -9 of the worker during one valid compile once made the graph
    # answer 422 "crashes the compiler" for the life of the process
    app = create_app(Settings(cache_url=f"sqlite:///{tmp_path}/c.sqlite3", workers=1))
    body = {"graph": json.loads((EXAMPLES / "attention.json").read_text())}
    with TestClient(app) as c:
        pool = app.state.service.pool
        t, out = in_thread(lambda: c.post("/v1/compile", json=body))
        victims = []
        for _ in range(2):  # the first attempt's worker, then the retry's fresh one
            victim = wait_busy(pool, timeout=60)
            while victim in victims:
                victim = wait_busy(pool, timeout=60)
            os.kill(victim, signal.SIGKILL)
            victims.append(victim)
        t.join()
        r = out[0]
        assert r.status_code == 200, r.text  # the third attempt compiled it
        assert r.json()["cache_hit"] is False
        assert len(app.state.service.verdicts) == 0
        text = c.get("/metrics").text
        assert 'polyc_worker_restarts_total{reason="crash"} 2' in text
        assert 'polyc_compiles_total{outcome="crash"} 2' in text
        assert c.post("/v1/compile", json=body).json()["cache_hit"] is True


def test_a_graph_is_marked_only_when_it_crashes_the_same_way_twice(tmp_path):
    app = create_app(Settings(cache_url=f"sqlite:///{tmp_path}/c.sqlite3", workers=1,
                              remember_failures_s=1.5))
    body = {"graph": graph("segv")}
    with TestClient(app) as c:
        pool = app.state.service.pool

        def crash_each_attempt():
            seen = set()
            while t.is_alive():
                pids = set(pool.busy_pids()) - seen
                for pid in pids:  # what a graph that crashes the compiler does
                    os.kill(pid, signal.SIGSEGV)
                seen |= pids
                time.sleep(0.001)
            return len(seen)

        t, out = in_thread(lambda: c.post("/v1/compile", json=body))
        assert crash_each_attempt() == 2
        r = out[0]
        assert r.status_code == 422 and r.json()["type"].endswith("compile-crashed"), r.text
        assert "twice the same way" in r.json()["detail"] and "signal 11" in r.json()["detail"]
        again = c.post("/v1/compile", json=body)  # at once, costing no worker
        assert again.status_code == 422 and "not compiled again" in again.json()["detail"]
        time.sleep(1.6)  # the mark expires
        ok = c.post("/v1/compile", json=body)
        assert ok.status_code == 200 and ok.json()["cache_hit"] is False


def calibrate_with_gcc() -> None:
    """The host's gemm calibration, which a service measures at its start unless the
    run's cache has it, measured now with the real gcc: a test's wrapper around gcc
    would hang or be killed in it (as it was when such a test ran first)."""
    measured(cpu_machine())


def test_a_killed_gcc_is_built_again_not_called_a_polyc_bug(tmp_path, monkeypatch):
    marker = tmp_path / "kill-once"
    marker.touch()
    wrapper = tmp_path / "killed-gcc"
    wrapper.write_text(f'#!/bin/sh\ncase "$*" in *-shared*) ;; *) exec gcc "$@" ;; esac\n'
                       f'if [ -e "{marker}" ]; then rm "{marker}"; kill -9 $$; fi\n'
                       'exec gcc "$@"\n')
    wrapper.chmod(0o755)
    calibrate_with_gcc()
    monkeypatch.setenv("POLYC_CC", str(wrapper))
    app = create_app(Settings(cache_url=f"sqlite:///{tmp_path}/c.sqlite3", workers=1))
    with TestClient(app) as c:
        r = c.post("/v1/compile", json={"graph": graph("gcc-killed")})
        assert r.status_code == 200, r.text
        assert not marker.exists()  # gcc was killed once, then built it
        assert 'polyc_compiles_total{outcome="interrupted"} 1' in c.get("/metrics").text


def test_compile_past_its_time_limit_is_504_and_kills_gcc(tmp_path, monkeypatch):
    # The C compiler is a wrapper that runs gcc and then, when it builds a shared object
    # and while a marker file exists, hangs: a stand-in for a gcc that takes too long,
    # and deterministic (asked for its version or its flags, it answers at once)
    marker = tmp_path / "hang"
    marker.touch()
    wrapper = tmp_path / "slow-gcc"
    wrapper.write_text(f'#!/bin/sh\ngcc "$@" || exit $?\n'
                       f'case "$*" in *-shared*) ;; *) exit 0 ;; esac\n'
                       f'while [ -e "{marker}" ]; do sleep 0.05; done\n')
    wrapper.chmod(0o755)
    calibrate_with_gcc()
    monkeypatch.setenv("POLYC_CC", str(wrapper))  # read by the workers when they start
    settings = Settings(cache_url=f"sqlite:///{tmp_path}/c.sqlite3", workers=1,
                        compile_timeout_s=2, remember_failures_s=3)
    app = create_app(settings)
    body = {"graph": graph("timeout")}
    with TestClient(app) as c:
        service = app.state.service
        key = service.prepare(json.dumps(body).encode()).key
        t, out = in_thread(lambda: c.post("/v1/compile", json=body))
        worker = wait_busy(service.pool)
        tmp = Path(next(w.tmp for w in service.pool._all if w.pid == worker))
        seen: set[str] = set()
        health_ms = []
        building = False  # the worker's build directory is in its own TMPDIR
        while t.is_alive():
            seen.update(group_members(worker))
            building = building or any(tmp.glob("polyc-build-*"))
            start = time.perf_counter()
            assert c.get("/healthz").status_code == 200  # liveness never waits on a compile
            health_ms.append((time.perf_counter() - start) * 1e3)
            time.sleep(0.01)
        t.join()
        r = out[0]
        assert r.status_code == 504, r.text
        assert r.json()["type"].endswith("compile-timeout") and "2 s" in r.json()["detail"]
        assert "slow-gcc" in seen, seen  # the compiler ran in the worker's process group
        deadline = time.monotonic() + 10
        while group_members(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert group_members(worker) == []  # the worker and its compiler are all gone
        while tmp.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert building and not tmp.exists()  # and so are its build's files
        assert sorted(health_ms)[len(health_ms) // 2] < 50, health_ms
        assert c.get(f"/v1/kernels/{key}").status_code == 404  # nothing was cached
        # the time-out is remembered: the same request is answered at once
        start = time.perf_counter()
        again = c.post("/v1/compile", json=body)
        assert again.status_code == 504 and "not compiled again" in again.json()["detail"]
        assert time.perf_counter() - start < 1.0
        # the replacement worker compiles it once the compiler behaves and the mark expired
        marker.unlink()
        time.sleep(3)
        ok = c.post("/v1/compile", json=body)
        assert ok.status_code == 200 and ok.json()["key"] == key
        assert ok.json()["cache_hit"] is False
        assert 'polyc_worker_restarts_total{reason="timeout"} 1' in c.get("/metrics").text


def _truncate(blob: bytes) -> bytes:
    return blob[:len(blob) - 100]


def _flip(blob: bytes) -> bytes:
    i = len(blob) - 500  # inside the shared object
    return blob[:i] + bytes([blob[i] ^ 0x40]) + blob[i + 1:]


def _garbage(blob: bytes) -> bytes:
    return b"\0" * len(blob)


@pytest.mark.parametrize("damage", [_truncate, _flip, _garbage],
                         ids=["truncated", "bit-flip", "garbage"])
def test_corrupt_entry_is_dropped_and_recompiled(tmp_path, damage):
    db = tmp_path / "c.sqlite3"
    settings = Settings(cache_url=f"sqlite:///{db}", workers=1)
    body = {"graph": graph("corrupt")}
    with TestClient(create_app(settings)) as c:
        first = c.post("/v1/compile", json=body).json()
    key = first["key"]
    with sqlite3.connect(db) as conn:
        (blob,) = conn.execute("SELECT bundle FROM bundles WHERE key = ?", (key,)).fetchone()
        conn.execute("UPDATE bundles SET bundle = ? WHERE key = ?", (damage(bytes(blob)), key))
    # a restarted server must not serve it
    with TestClient(create_app(settings)) as c:
        assert c.get(f"/v1/kernels/{key}/source").status_code == 404
        assert metric_line(c, "polyc_cache_corrupt_entries_total") == 1
        r = c.post("/v1/compile", json=body).json()
        assert r["cache_hit"] is False and r["c_source"] == first["c_source"]
        assert c.get(f"/v1/kernels/{key}").status_code == 200
    with sqlite3.connect(db) as conn:
        (blob,) = conn.execute("SELECT bundle FROM bundles WHERE key = ?", (key,)).fetchone()
    from polyc.server.bundle import decode_bundle
    decode_bundle(bytes(blob), key)  # republished intact


def test_disk_full_when_publishing_keeps_the_result_in_memory(tmp_path):
    app = create_app(Settings(cache_url=f"sqlite:///{tmp_path}/c.sqlite3", workers=1))
    body = {"graph": graph("disk-full")}
    with TestClient(app) as c:
        backend = app.state.service.cache.backend

        async def full(key, blob):
            raise sqlite3.OperationalError("database or disk is full")
        real_put, backend.put = backend.put, full
        r = c.post("/v1/compile", json=body)
        assert r.status_code == 200 and r.json()["cache_hit"] is False  # the answer is good
        key = r.json()["key"]
        assert 'polyc_cache_errors_total{op="put"} 1' in c.get("/metrics").text
        # not on disk, but kept in memory: repeats are not compiled again (#26)
        assert c.get(f"/v1/kernels/{key}").status_code == 200
        assert c.post("/v1/compile", json=body).json()["cache_hit"] is True
        backend.put = real_put
        with sqlite3.connect(tmp_path / "c.sqlite3") as db:
            assert db.execute("SELECT count(*) FROM bundles WHERE key = ?",
                              (key,)).fetchone() == (0,)


def test_disk_full_in_the_worker_is_503_and_caches_nothing(tmp_path):
    app = create_app(Settings(cache_url=f"sqlite:///{tmp_path}/c.sqlite3", workers=1))
    body = {"graph": graph("disk-full-worker")}
    with TestClient(app) as c:
        service = app.state.service
        key = service.prepare(json.dumps(body).encode()).key

        async def full(job, *, timeout_s, client=""):
            return ("error", "disk-full", "the server's disk is full: [Errno 28]", [])
        real_run, service.pool.run = service.pool.run, full
        r = c.post("/v1/compile", json=body)
        assert r.status_code == 503 and r.headers["retry-after"] == "60"
        assert r.json()["type"].endswith("disk-full")
        assert c.get(f"/v1/kernels/{key}").status_code == 404
        service.pool.run = real_run
        assert c.post("/v1/compile", json=body).json()["cache_hit"] is False


@pytest.mark.slow
def test_worker_memory_is_bounded(tmp_path):
    # The limit is set 4 MiB above what an idle worker maps, so a graph of 200 nodes runs
    # out of it. isl then reports an allocation failure (422 at once), or the worker
    # dies of it (503, retry); a graph that kills a worker twice is refused with 422.
    # Either way the worker is replaced and the server carries on.
    url = f"sqlite:///{tmp_path}/c.sqlite3"
    app = create_app(Settings(cache_url=url, workers=1))
    with TestClient(app):
        pid = next(iter(app.state.service.pool._all)).pid
        status = Path(f"/proc/{pid}/status").read_text()
        idle = int(status.split("VmSize:")[1].split()[0]) * 1024
    limit = idle + (4 << 20)
    app = create_app(Settings(cache_url=url, workers=1, worker_memory_bytes=limit))
    # a broadcast add in every node: fusion asks isl (elementwise chains are answered
    # without it, and fit in far less)
    nodes = [{"op": "add", "inputs": ["x" if i == 0 else f"t{i - 1}", "v"],
              "outputs": [f"t{i}"]} for i in range(200)]
    big = {"name": "chain", "inputs": [{"name": "x", "shape": [64, 64]},
                                       {"name": "v", "shape": [64]}],
           "nodes": nodes, "outputs": ["t199"]}
    with TestClient(app) as c:
        pid = next(iter(app.state.service.pool._all)).pid
        assert f"{limit}" in Path(f"/proc/{pid}/limits").read_text()
        statuses = []
        for _ in range(3):
            r = c.post("/v1/compile", json={"graph": big})
            statuses.append(r.status_code)
            if r.status_code != 503:
                break
            assert r.json()["type"].endswith("worker-crashed")
        assert statuses[-1] == 422 and len(statuses) <= 2, (statuses, r.text)
        kind = r.json()["type"].rsplit(":", 1)[1]
        assert kind in ("out-of-memory", "compile-crashed") and str(limit) in r.json()["detail"]
        assert "polyc_worker_restarts_total{" in c.get("/metrics").text
        # refused from now on without costing a worker (if it crashed them), or compiled
        # again to the same answer; the server is alive either way
        again = c.post("/v1/compile", json={"graph": big})
        assert again.status_code == 422
        assert c.get("/healthz").status_code == 200
