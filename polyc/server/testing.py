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


class _LoopbackProcess:
    """A child process on a free loopback port, logging to `log_path`, started with
    `start()` (which waits until `ready()`) and stopped by its own pid."""

    name = "process"

    def __init__(self, log_path: Path, env: dict[str, str] | None = None):
        self.port = free_port()
        self.log_path = log_path
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def start(self, timeout: float = 60):
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.command(), env=self.env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log}")
            if self.ready():
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"{self.name} did not answer within {timeout} s:\n{self.log}")

    def stop(self) -> None:
        if self.proc is not None:
            _stop(self.proc)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class ServerProcess(_LoopbackProcess):
    """`python -m polyc.cli serve` on 127.0.0.1; `url` is its base URL."""

    name = "polyc serve"

    def __init__(self, cache_url: str, *, workers: int = 1, log_dir: str | Path | None = None,
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None):
        log_dir = Path(log_dir or tempfile.mkdtemp(prefix="polyc-serve-"))
        super().__init__(log_dir / "serve.log", env)
        self.cache_url = cache_url
        self.workers = workers
        self.args = args

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "polyc.cli", "serve", "--host", "127.0.0.1",
                "--port", str(self.port), "--workers", str(self.workers),
                "--cache", self.cache_url, "--log-level", "warning", *self.args]

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=1) as r:
                return r.status == 200
        except OSError:
            return False


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


class RedisProcess(_LoopbackProcess):
    """A private redis-server: loopback only, no persistence, data dir in `dir`."""

    name = "redis-server"

    def __init__(self, dir: str | Path):
        self.dir = Path(dir)
        super().__init__(self.dir / "redis.log")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        exe = redis_server_path()
        if exe is None:
            raise RuntimeError("redis-server is not installed")
        return [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--save", "", "--appendonly", "no", "--protected-mode", "yes"]

    def ready(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False
