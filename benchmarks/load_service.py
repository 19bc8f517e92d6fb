"""Load benchmark of the compile service, on loopback only, bounded in time and count.

Starts `polyc serve` on a free loopback port with a fresh cache (or uses --url, which
must be a loopback address), then measures:
  1. cold-compile latency of each example graph (first request: a cache miss), and the
     latency of the first hit that follows;
  2. cache-hit throughput and latency: --connections keep-alive connections send the
     examples' compile requests round-robin for --duration seconds (at most
     --max-requests), after a short warm-up that is not counted.

The client is a minimal HTTP/1.1 client on asyncio streams (uvloop when installed): an
off-the-shelf client would spend more CPU per request than the server, and on a 2-core
machine the two share the cores.

    python benchmarks/load_service.py                # targets: >= 1000 hits/s, p99 < 20 ms
    python benchmarks/load_service.py --json out.json
"""
from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_loopback(host: str) -> None:
    try:
        ok = ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        ok = False
    if not ok:
        sys.exit(f"refusing to load {host!r}: this benchmark only targets loopback addresses")


def start_server(port: int, workers: int, tmp: str) -> subprocess.Popen:
    env = {**os.environ, "POLYC_CACHE_DIR": tmp}
    cmd = [sys.executable, "-m", "polyc.cli", "serve", "--host", "127.0.0.1", "--port",
           str(port), "--workers", str(workers), "--cache", f"sqlite:///{tmp}/bench.sqlite3",
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the server exited with code {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read()
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("the server did not come up within 60 s")


def request_bytes(host: str, body: bytes) -> bytes:
    return (f"POST /v1/compile HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status = int((await reader.readline()).split(b" ", 2)[1])
    length = 0
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return status, await reader.readexactly(length)


async def one_request(host: str, port: int, body: bytes) -> tuple[int, dict, float]:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        start = time.perf_counter()
        writer.write(request_bytes(host, body))
        status, data = await read_response(reader)
        return status, json.loads(data), time.perf_counter() - start
    finally:
        writer.close()


async def hammer(host: str, port: int, requests: list[bytes], *, connections: int,
                 duration: float, max_requests: int, warmup: float) -> dict:
    latencies: list[float] = []
    errors = 0
    sent = 0
    counting = False

    async def client(offset: int):
        nonlocal errors, sent
        reader, writer = await asyncio.open_connection(host, port)
        i = offset
        try:
            while not stop.is_set():
                if counting:
                    if sent >= max_requests:
                        break
                    sent += 1
                start = time.perf_counter()
                writer.write(requests[i % len(requests)])
                status, _ = await read_response(reader)
                if counting:
                    latencies.append(time.perf_counter() - start)
                    errors += status != 200
                i += 1
        finally:
            writer.close()

    stop = asyncio.Event()
    tasks = [asyncio.create_task(client(k)) for k in range(connections)]
    await asyncio.sleep(warmup)
    counting = True
    begin = time.perf_counter()
    await asyncio.wait(tasks, timeout=duration)  # all done early if max_requests is reached
    stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    elapsed = time.perf_counter() - begin
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))] * 1e3

    return {"connections": connections, "requests": len(latencies), "errors": errors,
            "seconds": elapsed, "requests_per_s": len(latencies) / elapsed,
            "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99),
            "max_ms": latencies[-1] * 1e3 if latencies else 0.0}


async def run(args, host: str, port: int) -> dict:
    bodies = {}
    for path in sorted(EXAMPLES.glob("*.json")):
        bodies[path.stem] = json.dumps({"graph": json.loads(path.read_text())}).encode()
    cold = {}
    for name, body in bodies.items():
        status, answer, seconds = await one_request(host, port, body)
        if status != 200:
            sys.exit(f"{name}: HTTP {status}: {answer}")
        _, hit, hit_seconds = await one_request(host, port, body)
        cold[name] = {"cache_hit": answer["cache_hit"], "cold_ms": seconds * 1e3,
                      "server_stage_ms": {k: round(v * 1e3, 2)
                                          for k, v in answer["timings"].items()},
                      "first_hit_ms": hit_seconds * 1e3, "hit": hit["cache_hit"],
                      "response_bytes": len(json.dumps(answer))}
    requests = [request_bytes(host, body) for body in bodies.values()]
    load = await hammer(host, port, requests, connections=args.connections,
                        duration=args.duration, max_requests=args.max_requests,
                        warmup=args.warmup)
    return {"cold": cold, "hits": load}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running service on loopback (default: start one)")
    parser.add_argument("--workers", type=int, default=2, help="compile workers (own server)")
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds of hit load")
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()
    if not 0 < args.duration <= 120 or not 0 < args.max_requests <= 1_000_000:
        sys.exit("keep the load bounded: --duration in (0, 120], --max-requests <= 1e6")
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    server = None
    with tempfile.TemporaryDirectory(prefix="polyc-bench-") as tmp:
        if args.url:
            url = urllib.parse.urlsplit(args.url)
            host, port = url.hostname or "127.0.0.1", url.port or 80
            check_loopback(host)
        else:
            host, port = "127.0.0.1", free_port()
            server = start_server(port, args.workers, tmp)
        try:
            results = asyncio.run(run(args, host, port))
        finally:
            if server is not None:
                server.terminate()
                server.wait(30)
    print(f"{'example':<14} {'cold ms':>9} {'gcc ms':>8} {'1st hit ms':>10}")
    for name, r in results["cold"].items():
        print(f"{name:<14} {r['cold_ms']:9.1f} {r['server_stage_ms'].get('build', 0):8.1f} "
              f"{r['first_hit_ms']:10.2f}")
    h = results["hits"]
    print(f"cache hits: {h['requests']} requests in {h['seconds']:.2f} s over "
          f"{h['connections']} connections = {h['requests_per_s']:.0f} req/s; latency p50 "
          f"{h['p50_ms']:.2f} ms, p90 {h['p90_ms']:.2f} ms, p99 {h['p99_ms']:.2f} ms, max "
          f"{h['max_ms']:.2f} ms; {h['errors']} errors")
    ok = h["requests_per_s"] >= 1000 and h["p99_ms"] < 20 and h["errors"] == 0
    print("targets (>= 1000 req/s, p99 < 20 ms): " + ("met" if ok else "NOT met"))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
