"""The compile worker: a child process that runs the pipeline and gcc for one job at a time.

It lives in a process of its own because isl holds the GIL through long calls: in a
thread it would stall the event loop. The server starts it as `python -m
polyc.server.worker_main` in a new session, so it leads its own process group, and gcc
runs inside that group: on a time-out the server kills the worker and its gcc together
with one `killpg`. Its address space is bounded (RLIMIT_AS, inherited by gcc), and it
dies with the server (PR_SET_PDEATHSIG). Jobs and replies travel as pickles over a
socket pair (multiprocessing's Connection framing).

A job is a dict (see `run_job`); the reply is `("ok", bundle_bytes)` or
`("error", kind, message, problems)`, where `kind` is one of the ERROR_KINDS below.
"""
from __future__ import annotations

import ctypes
import errno
import os
import resource
import signal
import tempfile
import time
from pathlib import Path
from typing import Callable

# error kinds a worker reports; the service maps each to an HTTP status
INVALID_GRAPH = "invalid-graph"  # GraphError: the client's graph (422)
OUT_OF_MEMORY = "out-of-memory"  # the graph needs more memory than a worker may use (422)
DISK_FULL = "disk-full"  # the server's disk is full (503, never cached)
INTERRUPTED = "interrupted"  # gcc was killed from outside: build again (503 if it recurs)
INTERNAL = "internal"  # a polyc bug: BuildError, InternalError, anything else (500)
ERROR_KINDS = (INVALID_GRAPH, OUT_OF_MEMORY, DISK_FULL, INTERRUPTED,
               INTERNAL)

GCC_OUTPUT_LIMIT = 256 << 20  # RLIMIT_FSIZE of gcc: no object is anywhere near this


def _die_with_parent(parent_pid: int) -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the server's shutdown still kills us
        pass
    if os.getppid() != parent_pid:  # the server died before prctl took effect
        os._exit(1)


def main(fd: int, memory_bytes: int, parent_pid: int) -> None:
    """Serve jobs on the socket `fd` until it closes. The server started this process in
    a new session (so it leads its own process group) from a thread that lives as long
    as the pool (PR_SET_PDEATHSIG fires when the forking thread exits)."""
    from multiprocessing.connection import Connection
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle
    conn = Connection(fd)
    # import the pipeline before taking jobs, so a job's time limit never pays for it
    from ..compiler import compile  # noqa: F401
    if memory_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    conn.send(("ready", os.getpid()))
    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        conn.send(run_job(job))


def run_job(job: dict) -> tuple:
    """Compile `job["graph"]` (canonical JSON text) and build it; never raises."""
    from ..errors import BuildError, BuildInterrupted, GraphError, InternalError
    try:
        if job.get("kind") == "run":  # a stored result on random inputs
            from .run_worker import run_job as run_stored
            return ("ok", run_stored(job))
        return ("ok", _compile_bundle(job))
    except BuildInterrupted as e:
        return ("error", INTERRUPTED, str(e), [])
    except GraphError as e:
        return ("error", INVALID_GRAPH, str(e), [
            {"message": p.message, "node": p.node, "op": p.op, "field": p.field}
            for p in e.problems])
    except MemoryError:
        return ("error", OUT_OF_MEMORY, "compiling this graph needs more memory than a "
                "worker may use", [])
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            return ("error", DISK_FULL, f"the server's disk is full: {e}", [])
        return ("error", INTERNAL, f"{type(e).__name__}: {e}", [])
    except (BuildError, InternalError) as e:
        return ("error", INTERNAL, str(e), [])
    except Exception as e:  # any other escape is a polyc bug; the message names it
        text = str(e).lower()
        # isl's isl.Error names the failed allocation; one inside islpy's conversion of
        # an argument (a Map passed as a UnionMap) arrives as a TypeError that does not,
        # while the compile's memory is still held here, at the limit
        if "allocation failure" in text or "out of memory" in text or near_memory_limit():
            return ("error", OUT_OF_MEMORY, "compiling this graph needs more memory than "
                    f"a worker may use ({type(e).__name__}: {e})", [])
        return ("error", INTERNAL, f"{type(e).__name__}: {e}", [])


def near_memory_limit(margin: int = 16 << 20) -> bool:
    """Is this process's address space within `margin` bytes of its RLIMIT_AS?"""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return False
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmSize:")[1].split()[0]) * 1024 + margin > soft


def _compile_bundle(job: dict) -> bytes:
    import orjson

    from .. import targets
    from ..compiler import translate
    from ..graph.load import load_graph
    from .bundle import OBJECT, RECORD, SOURCE, encode_bundle

    graph = load_graph(orjson.loads(job["graph"]), limits=job["limits"])
    result, check = translate(graph, job["target"], options=job["options"])
    start = time.perf_counter()
    toolchain = targets.backend(job["target"]).toolchain(result.machine)
    obj = build_object(result.c_source, toolchain, timeout_s=job["timeout_s"], during=check)
    timings = {**result.trace.timings, "build": time.perf_counter() - start}
    record = {
        "target": job["target"],
        "options": job["options"],
        # the canonical text as it came (parsed and written again, a ResNet layer's
        # weights took 0.11 s)
        "graph": orjson.Fragment(job["graph"]),
        "graph_name": result.graph.name,
        "kernels": [{**k.to_json(), "timings": result.trace.timings_of(k.name)}
                    for k in result.kernels],
        "timings": timings,
        "notes": job["notes"],
        "fallbacks": list(result.fallbacks),
        "toolchain": job["toolchain"],
    }
    return encode_bundle(job["key"], {RECORD: orjson.dumps(record),
                                      SOURCE: result.c_source.encode("utf-8"), OBJECT: obj},
                         secret=job.get("secret"))


def _limit_gcc(cpu_seconds: int) -> None:
    """In the forked gcc, before exec: CPU time, output size and no core dumps.
    RLIMIT_AS is inherited from the worker."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (GCC_OUTPUT_LIMIT, GCC_OUTPUT_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def build_object(source: str, toolchain, *, timeout_s: float,
                 during: Callable[[], None] | None = None) -> bytes:
    """gcc `source` into a shared object and return its bytes, doing `during` while gcc
    runs (the compile's schedule checks: `compiler.translate`).

    Unlike the in-process build (`codegen.build.build_shared_object`), gcc stays in the
    worker's process group (no new session), so killing the group on a time-out kills
    gcc and its cc1/as too; and the object is built fresh, so the bundle never inherits
    a damaged file."""
    from ..codegen.build import compile_c

    with tempfile.TemporaryDirectory(prefix="polyc-build-") as tmp:
        so = Path(tmp) / "kernels.so"
        cpu = max(1, int(timeout_s) + 1)
        compile_c(source, toolchain, so, timeout_s=timeout_s, new_session=False,
                  preexec_fn=lambda: _limit_gcc(cpu), during=during)
        return so.read_bytes()


if __name__ == "__main__":  # python -m polyc.server.worker_main FD MEMORY_BYTES PARENT_PID
    import sys
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
