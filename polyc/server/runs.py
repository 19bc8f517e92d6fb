"""Running a stored result on seeded random inputs, checked against the reference.

The stored shared object runs in a compile worker (`run_worker.py`), never in the
server: a kernel that crashes then takes a worker down, not the service, and the
worker's memory limit holds.
"""
from __future__ import annotations

import orjson

from .cache import Entry
from .models import RunRequest
from .problems import ApiProblem
from .workers import CompileTimeout, QueueFull, WorkerCrashed

async def run_entry(service, entry: Entry, request: RunRequest, client: str = "") -> bytes:
    """In the server: the run's answer as JSON bytes, or an ApiProblem. `client` (its
    address) shares the workers fairly with everyone else's compiles and runs."""
    rec = entry.record
    job = {"kind": "run", "graph": rec["graph"], "target": rec["target"],
           "options": rec["options"], "object": entry.object, "seed": request.seed,
           "repeat": request.repeat, "symbols": request.symbols,
           "limits": service.settings.limits}
    timeout = service.settings.compile_timeout_s
    try:
        reply = await service.pool.run(job, timeout_s=timeout, client=client)
    except QueueFull as e:
        raise ApiProblem(503, "queue-full", "Service Unavailable",
                         f"every worker is busy and the queue is full; retry in "
                         f"{e.retry_after_s} s", headers={"Retry-After": str(e.retry_after_s)}
                         ) from None
    except CompileTimeout as e:
        raise ApiProblem(504, "run-timeout", "Run Timed Out", f"{e}; the worker was stopped"
                         ) from None
    except WorkerCrashed as e:
        raise ApiProblem(500, "run-crashed", "Run Crashed",
                         f"{e} while running the kernels (a polyc bug; the worker was "
                         "replaced)") from None
    if reply[0] != "ok":
        _, kind, message, _ = reply
        status = 422 if kind in ("invalid-graph", "out-of-memory") else 500
        raise ApiProblem(status, kind, "Run Failed", message)
    return orjson.dumps({"key": entry.key, "target": rec["target"], "seed": request.seed,
                         **reply[1]}, option=orjson.OPT_SERIALIZE_NUMPY)
