"""The pool of compile worker processes, driven from the event loop.

Each worker (worker_main.py) is a fresh interpreter that compiles one job at a time.
It is started with subprocess rather than multiprocessing's 'spawn', which would re-run
the parent's __main__ module in the child (a script embedding the app, pytest, stdin).
`WorkerPool.run` waits for an idle worker, sends it the job and awaits the reply on a
helper thread (a blocked `recv` releases the GIL; the event loop never waits on it).
A worker that runs past the time limit is killed with its whole process group (its
gcc included) and replaced; so is one that crashes. Replacement happens in the
background: a request never waits for a new worker's imports.

Admission is bounded: at most `size` jobs run and `queue_size` wait; one more raises
`QueueFull`, which the service answers with 503 and Retry-After. Idle workers go to
waiting jobs fairly between clients (fairness.py): no client holds more than
`per_client` workers at once.
"""
from __future__ import annotations

import asyncio
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path

from . import worker_main
from .fairness import FairDispatcher

log = logging.getLogger("polyc.server")

READY_TIMEOUT_S = 120  # a new worker imports numpy and islpy; this is generous


class QueueFull(Exception):
    def __init__(self, retry_after_s: int):
        super().__init__(f"compile queue is full; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class CompileTimeout(Exception):
    pass


class WorkerCrashed(Exception):
    """The worker died mid-job; `code` is its exit status (negative: the signal)."""

    def __init__(self, message: str, code: int | None):
        super().__init__(message)
        self.code = code

    @property
    def from_outside(self) -> bool:
        """Killed by a signal no graph sends: an operator's kill, the OOM killer, a
        shutdown. (A graph's own crash is a SIGSEGV or SIGABRT, or an exit; the pool's
        own time-out kill is a CompileTimeout.)"""
        return self.code is not None and -self.code in OUTSIDE_SIGNALS


OUTSIDE_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


WORKER_DIR_PREFIX = "polyc-worker-"  # then the server's pid: polyc-worker-1234-...


def remove_stale_worker_dirs() -> None:
    """The workers' directories of servers that are gone: a server killed outside
    (SIGKILL, the OOM killer) could not remove its workers' (their files and gcc's)."""
    for path in Path(tempfile.gettempdir()).glob(f"{WORKER_DIR_PREFIX}*-*"):
        pid = path.name[len(WORKER_DIR_PREFIX):].split("-")[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


class _Worker:
    def __init__(self, proc, conn, tmp: str):
        self.proc = proc
        self.conn = conn
        self.pid = proc.pid
        self.tmp = tmp  # its TMPDIR
        self.jobs = 0

    def remove_files(self) -> None:
        """Its temporary files, once it is gone: a worker killed in a build (time-out,
        memory, an operator) leaves its build directory and gcc's files behind."""
        shutil.rmtree(self.tmp, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the worker's process group: the worker, its gcc, gcc's cc1 and as."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.kill()
        except ProcessLookupError:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def join(self, timeout: float) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass


class WorkerPool:
    def __init__(self, size: int, *, memory_bytes: int, max_jobs: int, queue_size: int,
                 per_client: int | None = None, metrics=None):
        self.size = size
        # by default one worker is always left for other clients
        self.per_client = per_client or max(1, size - 1)
        self.memory_bytes = memory_bytes
        self.max_jobs = max_jobs
        self.queue_size = queue_size
        self.metrics = metrics
        self._idle: FairDispatcher[_Worker] = FairDispatcher(self.per_client)
        self._busy: set[_Worker] = set()
        self._all: set[_Worker] = set()
        self._closing = False
        self._tasks: set[asyncio.Task] = set()
        self._recent_seconds: list[float] = []  # for Retry-After
        # PR_SET_PDEATHSIG fires when the *thread* that forked a worker exits, so every
        # worker is started from one thread that lives as long as the pool
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="polyc-spawn")
        # one thread per worker blocks in recv(); killing a worker ends its recv
        self._receivers = ThreadPoolExecutor(2 * size + 4, thread_name_prefix="polyc-recv")

    # -- life cycle -----------------------------------------------------------------------
    async def start(self) -> None:
        remove_stale_worker_dirs()
        workers = await asyncio.gather(*(self._spawn() for _ in range(self.size)))
        for w in workers:
            self._idle.put(w)

    async def close(self) -> None:
        self._closing = True
        for t in list(self._tasks):
            t.cancel()
        for w in list(self._all):
            if w not in self._busy:
                try:
                    w.conn.send(None)  # a clean exit for idle workers
                except (OSError, ValueError):
                    pass
        loop = asyncio.get_running_loop()
        deadline = time.monotonic() + 2
        for w in list(self._all):
            await loop.run_in_executor(self._receivers, w.join,
                                       max(0.0, deadline - time.monotonic()))
            if w.alive():
                w.kill()
                await loop.run_in_executor(self._receivers, w.join, 5)
            w.conn.close()
            w.remove_files()
        self._all.clear()
        self._spawner.shutdown(wait=True)
        self._receivers.shutdown(wait=False, cancel_futures=True)

    def _start_process(self) -> _Worker:
        ours, theirs = socket.socketpair()
        # one BLAS thread: the worker does no linear algebra, and each thread reserves
        # address space that would count against RLIMIT_AS
        # its temporary files, and gcc's, in a directory the pool removes once it is gone
        tmp = tempfile.mkdtemp(prefix=f"{WORKER_DIR_PREFIX}{os.getpid()}-")
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "TMPDIR": tmp}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "polyc.server.worker_main", str(theirs.fileno()),
                 str(self.memory_bytes), str(os.getpid())],
                pass_fds=(theirs.fileno(),), start_new_session=True, env=env,
                stdin=subprocess.DEVNULL)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            theirs.close()  # only the worker holds this end: its death is our EOF
        return _Worker(proc, Connection(ours.detach()), tmp)

    async def _spawn(self) -> _Worker:
        loop = asyncio.get_running_loop()
        w = await loop.run_in_executor(self._spawner, self._start_process)
        self._all.add(w)
        try:
            ready = await asyncio.wait_for(loop.run_in_executor(self._receivers, w.conn.recv),
                                           READY_TIMEOUT_S)
        except (EOFError, OSError):
            w.kill()
            w.remove_files()
            self._all.discard(w)
            raise RuntimeError("a compile worker exited while starting (its error is in "
                               "the server's log)") from None
        except BaseException:
            w.kill()
            w.remove_files()
            self._all.discard(w)
            raise
        if ready[0] != "ready":
            w.kill()
            w.remove_files()
            raise RuntimeError(f"compile worker sent {ready!r} instead of 'ready'")
        return w

    def _replace(self, w: _Worker, reason: str) -> None:
        """Kill `w` and start a new worker in the background."""
        w.kill()
        self._all.discard(w)
        if self.metrics is not None:
            self.metrics.worker_restarts.inc(reason=reason)
        if self._closing:
            return
        task = asyncio.get_running_loop().create_task(self._respawn(w))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _respawn(self, old: _Worker) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._receivers, old.join, 10)  # reap the zombie
        old.conn.close()
        old.remove_files()
        while not self._closing:
            try:
                new = await self._spawn()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.error("could not start a compile worker: %s; retrying", e)
                await asyncio.sleep(1)
                continue
            self._idle.put(new)
            return

    # -- jobs -----------------------------------------------------------------------------
    @property
    def busy(self) -> int:
        return len(self._busy)

    @property
    def waiting(self) -> int:
        return self._idle.waiting

    def busy_pids(self) -> list[int]:
        # read from other threads (tests, monitors) while the loop mutates the set: copy()
        # runs under one GIL hold, a Python-level iteration does not
        return [w.pid for w in self._busy.copy()]

    def retry_after(self) -> int:
        """Seconds until a queued job can expect a worker, from recent compile times."""
        recent = self._recent_seconds[-20:] or [1.0]
        per_job = sum(recent) / len(recent)
        return max(1, math.ceil(per_job * (self.waiting + 1) / self.size))

    async def run(self, job: dict, *, timeout_s: float, client: str = "") -> tuple:
        """Run `job` for `client` (its address) in a worker: the worker's reply, or
        CompileTimeout / WorkerCrashed (the worker is then replaced) or QueueFull
        (nothing was started)."""
        if not self._idle.idle and self.waiting >= self.queue_size:
            raise QueueFull(self.retry_after())
        # a queued job waits at most as long as a few compiles may take: if no worker
        # frees up (or none can be started) the client hears so instead of hanging
        w = await self._checkout(client, time.monotonic() + 2 * timeout_s)
        try:
            return await self._run_on(w, job, timeout_s)
        finally:
            self._idle.done(client)

    async def _run_on(self, w: _Worker, job: dict, timeout_s: float) -> tuple:
        self._busy.add(w)
        loop = asyncio.get_running_loop()
        start = time.monotonic()
        try:
            # off the loop: a job carrying a large graph fills the socket buffer
            await loop.run_in_executor(self._receivers, w.conn.send, job)
            reply = await asyncio.wait_for(loop.run_in_executor(self._receivers, w.conn.recv),
                                           timeout_s)
        except asyncio.TimeoutError:
            self._busy.discard(w)
            self._replace(w, "timeout")
            raise CompileTimeout(f"the compile took longer than {timeout_s:g} s") from None
        except (EOFError, OSError) as e:
            self._busy.discard(w)
            await loop.run_in_executor(self._receivers, w.join, 1)
            code = w.proc.returncode
            self._replace(w, "crash")
            how = (f"killed by signal {-code}" if code is not None and code < 0
                   else f"exit code {code}" if code is not None else str(e) or "pipe closed")
            raise WorkerCrashed(f"the compile worker died ({how})", code) from None
        except BaseException:  # cancelled while running: the worker's state is unknown
            self._busy.discard(w)
            self._replace(w, "cancelled")
            raise
        self._busy.discard(w)
        self._recent_seconds = (self._recent_seconds + [time.monotonic() - start])[-20:]
        w.jobs += 1
        if w.jobs >= self.max_jobs or (reply[0] == "error" and
                                       reply[1] == worker_main.OUT_OF_MEMORY):
            self._replace(w, "recycle")
        else:
            self._idle.put(w)
        return reply

    async def _checkout(self, client: str, deadline: float) -> _Worker:
        while True:
            try:
                w = await self._idle.take(client, max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise QueueFull(self.retry_after()) from None
            if w.alive():
                return w
            self._idle.done(client)
            self._replace(w, "died-idle")  # killed while idle: nobody's job was lost
