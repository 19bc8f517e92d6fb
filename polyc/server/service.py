"""The compile service: from a request body to a stored, verified result.

    body -> (memo: same bytes seen before -> key) -> parse -> validate (pydantic, then
    polyc's loader) -> content key -> in-memory entry | stored entry | single-flight
    compile in a worker -> publish the bundle -> response bytes

Everything here runs on the event loop except parsing and validating a body and the
compile itself (a worker process). Validation runs on one thread at a time: the GIL is
shared, and one busy thread delays the loop by at most a switch interval where four
would delay it four times as long (`/healthz` stays prompt under any mix of bodies).
"""
from __future__ import annotations

import hashlib
import logging
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import anyio
import anyio.to_thread
import orjson
from pydantic import ValidationError

from .. import targets
from ..errors import GraphError, Problem
from ..frontends import import_akg
from ..graph.load import load_graph
from . import worker_main as wm
from .body import parse_body
from .breaker import CacheUnavailable
from .bundle import CorruptBundle
from .cache import Entry, ResultCache
from .keys import Toolchain, canonical_graph
from .models import CompileRequest
from .problems import ApiProblem, graph_errors, pointer, pydantic_errors
from .settings import Settings
from .verdicts import Verdict, Verdicts
from .singleflight import SingleFlight, across_replicas
from .workers import CompileTimeout, QueueFull, WorkerCrashed, WorkerPool

log = logging.getLogger("polyc.server")

MEMO_ENTRIES = 8192
# a compile whose worker (or gcc) was killed from outside runs again on a fresh worker,
# up to this many times, before the client is asked to retry (503)
RETRIES = 2
HIT, COALESCED, COMPILED = "hit", "coalesced", "compiled"


@dataclass(frozen=True)
class Prepared:
    """A validated compile request and its content key."""

    key: str
    canonical: bytes  # canonical graph JSON
    target: str
    options: dict
    graph_doc: dict  # as the client sent it, for error pointers
    notes: tuple[str, ...]  # the loader's warnings (the canonical graph has no dead nodes)
    root: str = "graph"  # the request's field that holds it ('graph' or 'akg')
    client: str = ""  # who asked (its address): workers are shared fairly between clients


def _invalid_request(errors: list[dict]) -> ApiProblem:
    return ApiProblem(422, "invalid-request", "Invalid Request",
                      "; ".join(f"{x['pointer'] or '/'}: {x['message']}" for x in errors),
                      errors=errors)


def _json_type(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            int: "a number", float: "a number", type(None): "null"}.get(type(v), "a value")


class CompileService:
    def __init__(self, settings: Settings, cache: ResultCache, pool: WorkerPool,
                 toolchain: Toolchain, metrics):
        self.settings = settings
        self.cache = cache
        self.pool = pool
        self.toolchain = toolchain
        self.machines = {name: targets.backend(name).machine() for name in targets.names()}
        self.metrics = metrics
        self._flights: SingleFlight = SingleFlight()
        # sha256 of a request body -> its content key: a repeated identical request skips
        # parsing and validation (the mapping is a pure function of the bytes)
        self._memo: OrderedDict[bytes, tuple[str, tuple[str, ...]]] = OrderedDict()
        # time-outs and repeated crashes, by key: answered at once while remembered
        self.verdicts = Verdicts(settings.remember_failures_s)
        self._validating = anyio.CapacityLimiter(1)

    # -- the compile endpoint ---------------------------------------------------------------
    async def compile_request(self, body: bytes, client: str = "") -> bytes:
        digest = hashlib.sha256(body).digest()
        seen = self._memo.get(digest)
        if seen is not None:
            entry = self.cache.hot(seen[0])
            if entry is not None:
                self.metrics.cache_hits.inc()
                return self.compile_body(entry, HIT, seen[1])
        prepared = replace(await anyio.to_thread.run_sync(self.prepare, body,
                                                          limiter=self._validating),
                           client=client)
        entry, how = await self.resolve(prepared)
        self._memo[digest] = (prepared.key, prepared.notes)
        if len(self._memo) > MEMO_ENTRIES:
            self._memo.popitem(last=False)
        return self.compile_body(entry, how, prepared.notes)

    def prepare(self, body: bytes) -> Prepared:
        """Parse and validate; raises ApiProblem (400/422) naming the offending fields."""
        doc = parse_body(body, max_depth=self.settings.max_json_depth)
        if not isinstance(doc, dict):
            raise ApiProblem(422, "invalid-request", "Invalid Request",
                             f"the body must be a JSON object with 'graph' or 'akg' (and optionally "
                             f"'target' and 'options'), not {_json_type(doc)}",
                             errors=[{"pointer": "", "message": "expected an object"}])
        try:
            request = CompileRequest.model_validate(doc)
        except ValidationError as e:
            raise _invalid_request(pydantic_errors(
                e.errors(include_url=False, include_input=False))) from None
        target = targets.backend(request.target)
        try:
            options = target.options(request.options.model_dump(exclude_unset=True)).to_json()
        except GraphError as e:  # a value the schema's types allow but polyc does not
            raise _invalid_request([{"pointer": pointer(*p.field.split(".")),
                                     "message": p.message} for p in e.problems]) from None
        root, doc = ("akg", request.akg) if request.akg is not None else ("graph", request.graph)
        try:
            graph = (import_akg if root == "akg" else load_graph)(doc, limits=self.settings.limits)
            canonical = canonical_graph(graph)
        except GraphError as e:
            raise self._graph_problem(doc, e.problems, root) from None
        except Exception as e:  # the validator broke on this input: a polyc bug, logged;
            # still the input's doing, so a 4xx (no client input may produce a 500)
            log.exception("polyc's graph validator failed on a request")
            raise ApiProblem(422, "invalid-graph", "Invalid Graph",
                             f"polyc could not validate this graph ({type(e).__name__}: {e}); "
                             "this is a polyc bug and was logged") from None
        key = self.toolchain.key(canonical, request.target, options,
                                 target.key_parts(self.machines[request.target]))
        return Prepared(key, canonical, request.target, options, doc, graph.notes, root)

    @staticmethod
    def _graph_problem(doc: dict, problems: tuple[Problem, ...],
                       root: str = "graph") -> ApiProblem:
        n = len(problems)
        return ApiProblem(422, "invalid-graph", "Invalid Graph",
                          str(problems[0]) + (f" (and {n - 1} more problems)" if n > 1 else ""),
                          errors=graph_errors(doc, problems, (root,)))

    async def resolve(self, p: Prepared) -> tuple[Entry, str]:
        """The entry for a prepared request and how it was obtained."""
        entry = await self.cache.get(p.key)
        if entry is not None:
            self.metrics.cache_hits.inc()
            return entry, HIT
        self.metrics.cache_misses.inc()
        (entry, elsewhere), joined = await self._flights.do(p.key, lambda: self._produce(p))
        if joined or elsewhere:
            self.metrics.coalesced.inc()
            return entry, COALESCED
        return entry, COMPILED

    async def _produce(self, p: Prepared) -> tuple[Entry, bool]:
        """Compile once across replicas: (entry, whether another replica compiled it)."""
        return await across_replicas(
            self.cache.backend, p.key, lookup=lambda: self.cache.get(p.key),
            produce=lambda: self._compile(p),
            ttl_s=self.settings.lock_ttl_s, poll_s=self.settings.lock_poll_s)

    def _remembered(self, verdict: Verdict) -> ApiProblem:
        ago = time.monotonic() - verdict.at
        left = max(1, math.ceil(verdict.expires - time.monotonic()))
        when = (f"{verdict.detail} {ago:.0f} s ago; it is not compiled again for another "
                f"{left} s (remembered with its target, options and polyc's versions)")
        if verdict.kind == "timeout":
            return ApiProblem(504, "compile-timeout", "Compile Timed Out", when)
        return ApiProblem(422, "compile-crashed", "Graph Crashes The Compiler",
                          f"{when}; most likely it needs more memory than the "
                          f"{self.settings.worker_memory_bytes} bytes a worker may use")

    async def _compile(self, p: Prepared) -> Entry:
        if (verdict := self.verdicts.get(p.key)) is not None:
            self.metrics.compiles.inc(outcome=f"remembered-{verdict.kind}")
            raise self._remembered(verdict)
        job = {"key": p.key, "graph": p.canonical, "target": p.target, "options": p.options,
               "limits": self.settings.limits, "timeout_s": self.settings.compile_timeout_s,
               "notes": list(p.notes), "toolchain": self.toolchain.to_json(p.target),
               "secret": self.cache.secret}
        crashed: WorkerCrashed | None = None  # how a clean attempt crashed
        for _attempt in range(RETRIES + 1):
            try:
                reply = await self.pool.run(job, timeout_s=self.settings.compile_timeout_s,
                                            client=p.client)
            except QueueFull as e:
                self.metrics.rejected.inc()
                raise ApiProblem(503, "queue-full", "Service Unavailable",
                                 f"every compile worker is busy and the queue is full; retry "
                                 f"in {e.retry_after_s} s",
                                 headers={"Retry-After": str(e.retry_after_s)}) from None
            except CompileTimeout as e:
                self.metrics.compiles.inc(outcome="timeout")
                self.verdicts.mark(p.key, "timeout", str(e))
                raise ApiProblem(504, "compile-timeout", "Compile Timed Out",
                                 f"{e}; the worker was stopped and nothing was cached (the "
                                 "time-out is remembered: the same request is answered at "
                                 "once for a while)") from None
            except WorkerCrashed as e:
                self.metrics.compiles.inc(outcome="crash")
                if e.from_outside:  # never the graph's doing: run it again
                    log.warning("compile %s: %s from outside; retrying on a fresh worker",
                                p.key, e)
                    continue
                if crashed is not None and crashed.code == e.code:
                    self.verdicts.mark(p.key, "crash", f"this graph crashed a compile worker "
                                       f"twice the same way ({e})")
                    raise self._remembered(self.verdicts.get(p.key)) from None
                crashed = e
                continue
            if reply[0] == "error" and reply[1] == wm.INTERRUPTED:
                self.metrics.compiles.inc(outcome=wm.INTERRUPTED)
                log.warning("compile %s: %s; building again", p.key, reply[2])
                continue
            return await self._publish(p, reply)
        raise ApiProblem(503, "worker-crashed", "Service Unavailable",
                         f"the compile was interrupted {RETRIES + 1} times (its worker or the "
                         "C compiler was killed, not by anything in this graph); nothing was "
                         "cached; retry", headers={"Retry-After": "1"})

    async def _publish(self, p: Prepared, reply: tuple) -> Entry:
        if reply[0] == "ok":
            blob = reply[1]
            try:
                entry = self.cache.decode(blob, p.key)
            except CorruptBundle as e:
                self.metrics.compiles.inc(outcome="internal")
                raise ApiProblem(500, "internal", "Internal Error",
                                 f"a worker returned a damaged result ({e})") from None
            self.metrics.compiles.inc(outcome="ok")
            # the pipeline's own stage times: queueing for a worker is not compiling
            self.metrics.compile_seconds.observe(sum(entry.record["timings"].values()))
            for line in entry.record.get("fallbacks", []):  # "<stage> fallback: ..."
                self.metrics.fallbacks.inc(stage=line.split(" ", 1)[0])
            await self.cache.put(entry, blob)
            return entry
        _, kind, message, problems = reply
        self.metrics.compiles.inc(outcome=kind)
        raise self._worker_problem(p, kind, message, problems)

    def _worker_problem(self, p: Prepared, kind: str, message: str, problems: list) -> ApiProblem:
        if kind == wm.INVALID_GRAPH and problems and all(
                (x["field"] or "").startswith("options.") for x in problems):
            # an edit (options.fuse_force, options.kernel_tile_sizes) isl refused
            return ApiProblem(422, "illegal-edit", "Illegal Edit", message, errors=[
                {"pointer": pointer(*x["field"].split(".")), "message": x["message"],
                 "field": x["field"]} for x in problems])
        if kind == wm.INVALID_GRAPH and problems:
            return self._graph_problem(p.graph_doc, tuple(Problem(**x) for x in problems),
                                       p.root)
        if kind == wm.OUT_OF_MEMORY:
            return ApiProblem(422, "out-of-memory", "Graph Too Large To Compile",
                              f"{message}; the limit is {self.settings.worker_memory_bytes} "
                              "bytes per worker")
        if kind == wm.DISK_FULL:
            return ApiProblem(503, "disk-full", "Service Unavailable",
                              f"{message}; nothing was cached", headers={"Retry-After": "60"})
        return ApiProblem(500, "internal", "Internal Compiler Error",
                          f"polyc failed on a valid graph (a polyc bug, not yours): {message}")

    # -- stored results -----------------------------------------------------------------------
    async def lookup(self, key: str) -> Entry:
        try:
            entry = await self.cache.fetch(key)
        except CacheUnavailable as e:
            raise ApiProblem(503, "cache-unavailable", "Service Unavailable",
                             f"{e}: the entry may be stored; retry in {e.retry_after_s} s",
                             headers={"Retry-After": str(e.retry_after_s)}) from None
        if entry is None:
            raise ApiProblem(404, "unknown-key", "Not Found",
                             f"no compiled result is stored under key {key}")
        return entry

    # -- response bodies (built once per entry and kind, then served as bytes) --------------
    def compile_body(self, entry: Entry, how: str, notes: tuple[str, ...] = ()) -> bytes:
        """The compile answer. `notes` are this request's (dropped nodes do not change the
        key, so two requests for one entry may differ in them)."""
        body = None if notes else entry.bodies.get(how)
        if body is None:
            rec = entry.record
            body = orjson.dumps({
                "key": entry.key, "cache_hit": how == HIT, "coalesced": how == COALESCED,
                "target": rec["target"], "options": rec["options"],
                "graph_name": rec["graph_name"], "c_source": entry.c_source,
                "kernels": [{"name": k["name"], "nodes": k["nodes"],
                             "schedule_tree": k["schedule_tree"],
                             "fusion_report": k["fusion_report"]} for k in rec["kernels"]],
                "timings": rec["timings"], "notes": list(notes),
                "fallbacks": rec.get("fallbacks", [])})
            if how == HIT and not notes:  # served over and over; the others are one-offs
                entry.bodies[how] = body
        return body

    @staticmethod
    def record_body(entry: Entry) -> bytes:
        return orjson.dumps({"key": entry.key, "created": entry.created, **entry.record,
                             "c_source": entry.c_source, "parts": list(entry.manifest)})

    @staticmethod
    def schedule_body(entry: Entry) -> bytes:
        return orjson.dumps({"key": entry.key, "kernels": [
            {"name": k["name"], "schedule_tree": k["schedule_tree"], "trees": k["trees"],
             "schedule_text": k["schedule_text"]} for k in entry.record["kernels"]]})
