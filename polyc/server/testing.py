"""Real processes on loopback for tests and benchmarks: a `polyc serve` server and a
throw-away redis-server. Both bind 127.0.0.1 on a free port, log to a file, and are
stopped (by their own pid) when the `with` block ends."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class ServerProcess:
    """`python -m polyc.cli serve` on 127.0.0.1; `url` is its base URL."""

    def __init__(self, cache_url: str, *, workers: int = 1, port: int | None = None,
                 log_dir: str | Path | None = None, args: tuple[str, ...] = (),
                 env: dict[str, str] | None = None):
        self.cache_url = cache_url
        self.workers = workers
        self.port = port or free_port()
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="polyc-serve-"))
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> str:
        path = self.log_dir / f"serve-{self.port}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 60) -> "ServerProcess":
        cmd = [sys.executable, "-m", "polyc.cli", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--workers", str(self.workers),
               "--cache", self.cache_url, "--log-level", "warning", *self.args]
        log = open(self.log_dir / f"serve-{self.port}.log", "ab")
        self.proc = subprocess.Popen(cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"polyc serve exited with {self.proc.returncode}:\n{self.log}")
            try:
                with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"polyc serve did not answer within {timeout} s:\n{self.log}")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


class RedisProcess:
    """A private redis-server: loopback only, no persistence, data dir in `dir`."""

    def __init__(self, dir: str | Path):
        self.dir = Path(dir)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def start(self, timeout: float = 20) -> "RedisProcess":
        exe = redis_server_path()
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.dir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "no", "--protected-mode", "yes"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            if self.ping():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"redis-server did not answer within {timeout} s")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)

    def __enter__(self) -> "RedisProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
