"""The service's figures under the faults of issue #26, on loopback with a real
redis-server and real `polyc serve` replicas (each run starts its own, in a temp dir).

  1. Redis frozen (SIGSTOP): seconds to the answer of a cold compile, of a repeat, and
     of a GET by key the replica does not hold (the attack saw 90 s, -, 30 s and a 404);
  2. a replica killed while it holds the compile lock: seconds until another replica
     has answered the same graph (the lock used to hold for 90 s);
  3. /healthz latency while a client trickles 200 connections (header time-out).

    python benchmarks/bench_service_faults.py
"""
from __future__ import annotations

import json
import signal
import socket
import tempfile
import threading
import time
from pathlib import Path

import httpx

from polyc.server.testing import RedisProcess, ServerProcess, redis_server_path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def small(name: str) -> dict:
    return {"graph": {"name": name, "inputs": [{"name": "x", "shape": [4, 8]}],
                      "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["y"]}],
                      "outputs": ["y"]}}


def timed(fn):
    start = time.monotonic()
    result = fn()
    return result, time.monotonic() - start


def frozen_redis(tmp: Path) -> None:
    with RedisProcess(tmp / "redis1") as redis, \
            ServerProcess(redis.url, workers=1, log_dir=tmp / "s1",
                          env={"POLYC_CACHE_DIR": str(tmp / "s1")}) as server:
        client = httpx.Client(base_url=server.url, timeout=120)
        _, warm = timed(lambda: client.post("/v1/compile", json=small("warm")))
        redis.proc.send_signal(signal.SIGSTOP)
        try:
            cold, t_cold = timed(lambda: client.post("/v1/compile", json=small("cold")))
            repeat, t_repeat = timed(lambda: client.post("/v1/compile", json=small("cold")))
            get, t_get = timed(lambda: client.get(f"/v1/kernels/{'c' * 64}"))
        finally:
            redis.proc.send_signal(signal.SIGCONT)
        print(f"Redis frozen: cold compile {cold.status_code} in {t_cold:.2f} s (the same "
              f"compile with Redis up: {warm:.2f} s); repeat {repeat.status_code} "
              f"(cache_hit={repeat.json()['cache_hit']}) in {t_repeat * 1000:.0f} ms; GET "
              f"of a key not in memory {get.status_code} (Retry-After "
              f"{get.headers.get('retry-after')}) in {t_get * 1000:.0f} ms")
        client.close()


def dead_lock_holder(tmp: Path) -> None:
    import redis as redis_py

    body = {"graph": json.loads((EXAMPLES / "attention.json").read_text())}
    with RedisProcess(tmp / "redis2") as redis:
        a = ServerProcess(redis.url, workers=1, log_dir=tmp / "a",
                          env={"POLYC_CACHE_DIR": str(tmp / "a")})
        b = ServerProcess(redis.url, workers=1, log_dir=tmp / "b",
                          env={"POLYC_CACHE_DIR": str(tmp / "b")})
        r = redis_py.Redis.from_url(redis.url)
        with a, b:
            threading.Thread(target=lambda: _quietly(a.url, body), daemon=True).start()
            while not r.keys("polyc:v1:lock:*"):
                time.sleep(0.005)
            a.proc.kill()
            answer, took = timed(lambda: httpx.post(b.url + "/v1/compile", json=body,
                                                    timeout=120))
            _, alone = timed(lambda: httpx.post(b.url + "/v1/compile",
                                                json={"graph": {**body["graph"],
                                                                "name": "again"}},
                                                timeout=120))
        r.close()
        print(f"replica killed holding the lock: the other answered {answer.status_code} "
              f"after {took:.2f} s (at most the lock's 5 s TTL, then its own compile; a "
              f"compile of the graph alone takes {alone:.2f} s)")


def _quietly(url: str, body: dict) -> None:
    try:
        httpx.post(url + "/v1/compile", json=body, timeout=120)
    except httpx.HTTPError:
        pass


def trickling_connections(tmp: Path) -> None:
    with ServerProcess(f"sqlite:///{tmp}/c.sqlite3", workers=1, log_dir=tmp / "s3",
                       env={"POLYC_CACHE_DIR": str(tmp / "s3")}) as server:
        socks = []
        for _ in range(200):
            s = socket.create_connection(("127.0.0.1", server.port))
            s.sendall(b"POST /v1/compile HTTP/1.1\r\nHost: x\r\n")
            socks.append(s)
        start = time.monotonic()
        cut: set[int] = set()
        latencies = []
        probe = httpx.Client(base_url=server.url)
        for s in socks:
            s.setblocking(False)
        while time.monotonic() - start < 15 and len(cut) < len(socks):
            latencies.append(timed(lambda: probe.get("/healthz"))[1])
            for i, s in enumerate(socks):
                if i in cut:
                    continue
                try:
                    s.sendall(b"X: 1\r\n")  # a header line now and then
                    if s.recv(4096).startswith(b"HTTP/1.1 408"):
                        cut.add(i)
                except BlockingIOError:
                    pass
                except OSError:
                    cut.add(i)
            time.sleep(0.2)
        print(f"200 trickling connections: {len(cut)} cut off with 408 after "
              f"{time.monotonic() - start:.1f} s (header time-out 10 s); /healthz meanwhile "
              f"median {sorted(latencies)[len(latencies) // 2] * 1000:.1f} ms")
        probe.close()
        for s in socks:
            s.close()


def main() -> int:
    if redis_server_path() is None:
        print("redis-server is not installed")
        return 1
    with tempfile.TemporaryDirectory(prefix="polyc-faults-") as tmp:
        frozen_redis(Path(tmp))
        dead_lock_holder(Path(tmp))
        trickling_connections(Path(tmp))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
