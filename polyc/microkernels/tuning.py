"""The tuning cache: the best tile sizes `polyc tune` measured, per (kernel, target,
machine, team size), in one JSON file under the build cache directory. Compiles look a
kernel up here before falling back to the memory model's choice. The team is part of
the key because the best blocks differ: two threads share one L3 and split each block.

The kernel's key hashes its printed statements (shapes, accesses, epilogue), so any
graph that produces the same kernel reuses the measurement.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path

from ..codegen.build import cache_dir
from ..kernel import Kernel
from ..target import Target


def machine_id(target: Target) -> str:
    """The CPU model, core count, and the arch and features the code is built for: where
    a measurement holds."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    feats = ",".join(sorted(f for f in target.features if f.startswith(("avx", "fma", "sse"))))
    return (f"{model}|{os.cpu_count()}|{target.arch}|"
            f"{hashlib.sha256(feats.encode()).hexdigest()[:12]}")


def team(options, target: Target) -> int:
    """The threads a compile with `options` plans its parallel loops for: `threads`,
    else one per core (what OpenMP starts when OMP_NUM_THREADS is unset); 1 when
    parallel loops are off."""
    if not getattr(options, "parallel", True):
        return 1
    return int(getattr(options, "threads", 0) or 0) or max(1, target.cores)


def kernel_key(kernel: Kernel, target: Target, threads: int) -> str:
    text = "\n".join(str(s).split("  #")[0] for s in kernel.statements)
    where = f"{target.name}\n{machine_id(target)}\n{threads} threads"
    return hashlib.sha256(f"{text}\n{where}".encode()).hexdigest()


def _path() -> Path:
    return cache_dir() / "tuning.json"


def _load() -> dict:
    try:
        return json.loads(_path().read_text())
    except (OSError, ValueError):
        return {}


def fingerprint() -> str:
    """Changes whenever `polyc tune` stores a result: compile keys that cover it are
    never served code built with older tiles. A stat, not a read: it is on the path of
    every cache hit."""
    try:
        st = _path().stat()
    except OSError:
        return ""
    return f"{st.st_mtime_ns}:{st.st_size}"


def lookup(kernel: Kernel, target: Target, threads: int) -> dict | None:
    """The stored measurement of `kernel`: {"microkernel": name, "tiles": {...},
    "seconds": ...}, or None."""
    return _load().get(kernel_key(kernel, target, threads))


def store(kernel: Kernel, target: Target, threads: int, microkernel: str,
          tiles: dict[str, int], seconds: float) -> None:
    """Record the fastest microkernel and tiles for `kernel` run by `threads` threads
    (written atomically: tuners may race)."""
    data = _load()
    data[kernel_key(kernel, target, threads)] = {
        "kernel": kernel.name, "microkernel": microkernel, "tiles": tiles, "seconds": seconds,
        "machine": machine_id(target), "threads": threads}
    path = _path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(f.name, path)


def candidates(plan_tiles: dict[str, int], m: int, n: int, k: int, mr: int, nr: int,
               budget: int, vary_nc: bool = True) -> list[dict[str, int]]:
    """Tile sizes around the memory model's choice: kc and mc halved and doubled, nc
    halved (unless B is read in place, with no block for nc to size), the model's own
    first; each clipped to the extents and made legal."""
    kc0, mc0, nc0 = plan_tiles["kc"], plan_tiles["mc"], plan_tiles["nc"]
    out: list[dict[str, int]] = []
    for kc in (kc0, kc0 // 2, kc0 * 2):
        for mc in (mc0, mc0 // 2, mc0 * 2):
            for nc in (nc0, nc0 // 2) if vary_nc else (nc0,):
                t = {"kc": max(8, min(kc, k)), "mc": max(mr, min(mc - mc % mr, m + mr - 1)),
                     "nc": max(nr, min(nc - nc % nr, n + nr - 1))}
                t["mc"] -= t["mc"] % mr
                t["nc"] -= t["nc"] % nr
                if t not in out:
                    out.append(t)
    return out[:max(1, budget)]


def kernel_candidates(plan, kernels, target: Target, budget: int, vary_nc: bool
                      ) -> list[tuple[str, dict[str, int]]]:
    """(microkernel, tiles) pairs to measure for a contraction `plan`: for each gemm
    kernel in `kernels`, tiles around the memory model's choice for that kernel, taken
    in turns (every kernel's own model tiles first) up to `budget`."""
    from .tiles import model_tiles
    per_kernel = []
    for mk in kernels:
        model = model_tiles(plan.m, plan.n, plan.k, mk, target).to_json()
        per_kernel.append([(mk.name, t) for t in candidates(
            model, plan.m, plan.n, plan.k, mk.mr, mk.nr, budget, vary_nc)])
    out = []
    for turn in range(max(map(len, per_kernel), default=0)):
        out += [cands[turn] for cands in per_kernel if turn < len(cands)]
    return out[:max(1, budget)]


def tune_graph(graph, *, options, budget: int = 24, repeat: int = 5, progress=None) -> list[str]:
    """Measure (microkernel, tile sizes) candidates for each microkernel contraction of
    `graph`, each kernel timed alone, and keep each one's fastest in the tuning cache;
    returns report lines. The candidates cover every gemm kernel the target can run
    (within `options.microkernel_isa`, or only `options.gemm_kernel` when set).
    `progress(done, total, text)` is called after each measurement."""
    import dataclasses

    from ..cli import random_inputs
    from ..compiler import compile
    from ..target import cpu_target, host_can_run
    from .match import GemmPlan
    from .registry import ISAS, REGISTRY

    target = cpu_target()
    threads = team(options, target)
    # measured with exactly the team the key names, whatever OMP_NUM_THREADS says
    options = dataclasses.replace(options, threads=threads)
    base = compile(graph, options=options, build=False)
    kernels = [m for m in REGISTRY if m.kind == "gemm" and set(m.features) <= target.features
               and (not options.microkernel_isa or m.name in ISAS[options.microkernel_isa])
               and (not options.gemm_kernel or m.name == options.gemm_kernel)]
    if not host_can_run(target.arch):
        return [f"this host cannot run -march={target.arch} code: nothing to measure"]
    todo = []
    for index, kr in enumerate(base.kernels):
        for mark in kr.marks("gemm"):
            plan = GemmPlan.parse(mark)
            usable = [m for m in kernels if plan.b != "rows" or m.b_rows_variant]
            todo.append((index, kr.kernel, kernel_candidates(plan, usable, target, budget,
                                                             vary_nc=plan.b == "packed")))
    if not todo:
        return ["no microkernel contraction in this graph: nothing to tune"]
    total = sum(len(cands) for *_, cands in todo)
    inputs = random_inputs(base.graph)
    lines: list[str] = []
    done = 0
    for index, kernel, cands in todo:
        best: tuple[float, str, dict] | None = None
        for name, tiles in cands:
            # the choice applies to every contraction of the graph; only this one is timed
            opts = dataclasses.replace(options, gemm_kernel=name,
                                       microkernel_tiles=tuple(sorted(tiles.items())))
            seconds = _time_kernel(compile(graph, options=opts), index, inputs, repeat)
            text = f"{kernel.name} {name} {_tiles_text(tiles)}: {seconds * 1e3:.3f} ms"
            lines.append(text)
            if best is None or seconds < best[0]:
                best = (seconds, name, tiles)
            done += 1
            if progress:
                progress(done, total, text)
        seconds, name, tiles = best
        store(kernel, target, threads, name, tiles, seconds)
        lines.append(f"{kernel.name}: best: {name} {_tiles_text(tiles)} ({seconds * 1e3:.3f} ms)")
    lines.append(f"kept for {len(todo)} kernel(s) on {machine_id(target)} with {threads} thread(s)")
    return lines


def _tiles_text(tiles: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in tiles.items())


def _time_kernel(compiled, index: int, inputs, repeat: int) -> float:
    """Seconds of the fastest of `repeat` calls of kernel `index` alone, its inputs
    written by one run of the whole graph first."""
    import time

    import numpy as np

    out = {o: np.empty(compiled.graph.types[o].shape, compiled.graph.types[o].dtype)
           for o in compiled.graph.outputs}
    _, calls = compiled.program.bind(inputs, out)
    for call in calls:
        call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        calls[index]()
        times.append(time.perf_counter() - start)
    return min(times)
