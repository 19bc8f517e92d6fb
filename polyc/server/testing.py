"""Real processes on loopback for tests and benchmarks: a `polyc serve` server, a
throw-away redis-server and a one-machine Ray cluster. Each listens on free ports, logs
to a file, and is stopped (by its own pid) when the `with` block ends, or when the process
that started it dies without ending the block (a crashed test worker)."""
from __future__ import annotations

import ctypes
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


_PR_SET_PDEATHSIG = 1


def _stopped_with_parent() -> None:
    """In the child before exec: SIGTERM when the parent dies. A `with` block's exit never
    runs in a worker killed by a crash or a signal, and its redis-server or Ray head
    would keep their ports, files and memory for as long as the machine runs."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


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
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         preexec_fn=_stopped_with_parent)
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


class RayHeadProcess(_LoopbackProcess):
    """A one-machine Ray cluster: `ray start --head --block` with `cpus` CPUs, its
    sessions under `dir`, every port it opens chosen free (so two can run at once), no
    dashboard. `url` is its Ray Client address, `address` its GCS one. Stopping the blocking `ray start`
    stops every process it started. Its workers import polyc from `pythonpath`."""

    name = "ray head"

    def __init__(self, dir: str | Path, *, cpus: int = 2, pythonpath: str = "",
                 env: dict[str, str] | None = None):
        self.dir = Path(dir)
        path = os.pathsep.join(p for p in (pythonpath, os.environ.get("PYTHONPATH")) if p)
        super().__init__(self.dir / "ray.log", {**(env or {}), "PYTHONPATH": path})
        self.cpus = cpus
        self.gcs_port, self.agent_port, self.runtime_env_port = (free_port() for _ in range(3))

    @property
    def url(self) -> str:
        return f"ray://127.0.0.1:{self.port}"

    @property
    def address(self) -> str:
        """The GCS address, for a driver on this machine (no Ray Client in between)."""
        return f"127.0.0.1:{self.gcs_port}"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port),
                "--ray-client-server-port", str(self.port),
                "--dashboard-agent-listen-port", str(self.agent_port),
                "--runtime-env-agent-port", str(self.runtime_env_port),
                # workers on ports the system picks (Ray's default range is shared by
                # every cluster on the machine)
                "--min-worker-port", "0", "--max-worker-port", "0",
                "--num-cpus", str(self.cpus), "--include-dashboard", "false",
                "--object-store-memory", str(100 << 20), "--temp-dir", str(self.dir),
                "--disable-usage-stats"]

    def ready(self) -> bool:
        if "Ray runtime started" not in self.log:
            return False
        try:
            for port in (self.gcs_port, self.port):
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False
