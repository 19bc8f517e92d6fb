"""`polyc tune`: measure each contraction's microkernel and tile sizes, keep the fastest.

The driver of the cpu target's tuning (the targets `targets.tunable()` lists). For each
contraction of a graph (its kernel timed alone, after the kernels before it
have written its inputs), every gemm microkernel the host can run is measured with tile
sizes around the memory model's choice for it; a 3x3 convolution Winograd can compute
is measured that way as the direct convolution and as each of Winograd's tiles up to
`options.winograd_max_tile` (the rounding the user accepts), its products on each gemm
kernel. The fastest goes to the cpu target's tuning cache
(`polyc/targets/cpu/tuning.py`), which later compiles read.

Where the candidates are measured is a `Measure`: here, one after the other
(`measure_here`), or on the machines of a Ray cluster of this machine's CPU kind
(`cluster.py`). `shared.py` keeps the results in the service's Redis, where its
replicas pull them.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import numpy as np

from ..compiler import compile
from ..graph.check import warm_up
from ..graph.reference import random_inputs
from ..machine import Machine
from ..microkernels.registry import ISAS, REGISTRY
from ..schedule_tree.marks import Gemm
from ..targets import backend
from ..targets.cpu import host_can_run
from ..targets.cpu.tiles import model_tiles
from ..targets.cpu.tuning import kernel_key, machine_id, store, team
from ..targets.cpu.winograd import TILES, conv_of


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


def kernel_candidates(plan, kernels, machine: Machine, budget: int, vary_nc: bool
                      ) -> list[tuple[str, dict[str, int]]]:
    """(microkernel, tiles) pairs to measure for a contraction `plan`: for each gemm
    kernel in `kernels`, tiles around the memory model's choice for that kernel, taken
    in turns (every kernel's own model tiles first) up to `budget`."""
    per_kernel = []
    for mk in kernels:
        model = model_tiles(plan.m, plan.n, plan.k, mk, machine, in_place=plan.b == "rows",
                            alone=plan.par in ("none", "batch"),
                            const_a=plan.a == "const").to_json()
        per_kernel.append([(mk.name, t) for t in candidates(
            model, plan.m, plan.n, plan.k, mk.mr, mk.nr, budget, vary_nc)])
    out = []
    for turn in range(max(map(len, per_kernel), default=0)):
        out += [cands[turn] for cands in per_kernel if turn < len(cands)]
    return out[:max(1, budget)]


@dataclass(frozen=True)
class Measurement:
    """One candidate: kernel `index` of the compiled graph timed alone with `microkernel`
    and `tiles` (the choice applies to every contraction of the graph); for a 3x3
    convolution, `winograd` is the tile of Winograd's asked for (its products on
    `microkernel`), or 0 for the direct convolution."""

    index: int
    microkernel: str
    tiles: tuple[tuple[str, int], ...]
    winograd: int | None = None

    def options(self, options):
        asked = {} if self.winograd is None else {"winograd": self.winograd > 0,
                                                  "winograd_tile": self.winograd}
        return dataclasses.replace(options, gemm_kernel=self.microkernel,
                                   microkernel_tiles=self.tiles, **asked)

    @property
    def text(self) -> str:
        how = ("" if self.winograd is None else "direct " if not self.winograd else
               f"winograd {self.winograd}x{self.winograd} ")
        return f"{how}{self.microkernel} {_tiles_text(dict(self.tiles))}".rstrip()


# measure(graph, target, options, measurements, repeat) -> (measurement, seconds) pairs, in
# any order: here one after the other; `polyc.tune.cluster` on the machines of a Ray cluster
Measure = Callable[..., Iterable[tuple[Measurement, float]]]


def measure_here(graph, target: str, options, measurements: list[Measurement], repeat: int
                 ) -> Iterator[tuple[Measurement, float]]:
    """Each measurement on this machine, one after the other."""
    inputs = None
    for m in measurements:
        compiled = compile(graph, target, options=m.options(options))
        if inputs is None:  # the same inputs for every candidate
            inputs = random_inputs(compiled.graph)
        yield m, _time_kernel(compiled, m.index, inputs, repeat)


def tune_graph(graph, *, target: str = "cpu", options, budget: int = 24, repeat: int = 5,
               progress=None, measure: Measure = measure_here,
               stored: list[tuple[str, dict]] | None = None) -> list[str]:
    """Measure (microkernel, tile sizes) candidates for each microkernel contraction of
    `graph`, each kernel timed alone, and keep each one's fastest in the tuning cache;
    returns report lines. The candidates cover every gemm kernel the target can run
    (within `options.microkernel_isa`, or only `options.gemm_kernel` when set).
    `measure` runs them (see `Measure`); `progress(done, total, text)` is called after
    each measurement; `stored` receives the (key, record) of each kept result."""
    machine = backend(target).machine()
    threads = team(options, machine)
    # measured with exactly the team the key names, whatever OMP_NUM_THREADS says
    options = dataclasses.replace(options, threads=threads)
    base = compile(graph, target, options=options, build=False)
    kernels = [m for m in REGISTRY if m.kind == "gemm" and set(m.features) <= machine.features
               and (not options.microkernel_isa or m.name in ISAS[options.microkernel_isa])
               and (not options.gemm_kernel or m.name == options.gemm_kernel)]
    if not host_can_run(machine.arch):
        return [f"this host cannot run -march={machine.arch} code: nothing to measure"]
    # a 3x3 convolution's direct plan, where the graph's kernels are the same without
    # Winograd (they are: fusion does not ask)
    direct = (compile(graph, target, options=dataclasses.replace(options, winograd=False),
                      build=False)
              if options.winograd and any(conv_of(k.kernel) for k in base.kernels) else None)
    if direct is not None and _keys(direct, machine, threads) != _keys(base, machine, threads):
        direct = None
    todo = []
    for index, kr in enumerate(base.kernels):
        if direct is not None and conv_of(kr.kernel) is not None:
            tiles = ((options.winograd_tile,) if options.winograd_tile else
                     tuple(t for t in TILES if t <= options.winograd_max_tile))
            todo.append((index, kr.kernel, _convolution(index, direct.kernels[index], tiles,
                                                        kernels, machine, budget)))
            continue
        for plan in kr.marks(Gemm):
            todo.append((index, kr.kernel, _contraction(index, plan, kernels, machine, budget)))
    if not todo:
        return ["no microkernel contraction in this graph: nothing to tune"]
    everything = [m for *_, cands in todo for m in cands]
    seconds: dict[Measurement, float] = {}
    for m, s in measure(graph, target, options, everything, repeat):
        seconds[m] = s
        if progress:
            progress(len(seconds), len(everything), _line(base, m, s))
    lines: list[str] = []
    for index, kernel, cands in todo:
        lines += [_line(base, m, seconds[m]) for m in cands]
        best = min(cands, key=seconds.__getitem__)
        kept = store(kernel, machine, threads, best.microkernel, dict(best.tiles),
                     seconds[best], best.winograd)
        if stored is not None:
            stored.append(kept)
        lines.append(f"{kernel.name}: best: {best.text} ({seconds[best] * 1e3:.3f} ms)")
    lines.append(f"kept for {len(todo)} kernel(s) on {machine_id(machine)} with {threads} thread(s)")
    return lines


def _contraction(index: int, plan: Gemm, kernels, machine: Machine, budget: int,
                 winograd: int | None = None) -> list[Measurement]:
    usable = [m for m in kernels if plan.b != "rows" or m.b_rows_variant]
    return [Measurement(index, name, tuple(sorted(tiles.items())), winograd)
            for name, tiles in kernel_candidates(plan, usable, machine, budget,
                                                 vary_nc=plan.b != "rows")]


def _convolution(index: int, direct, tiles: tuple[int, ...], kernels, machine: Machine,
                 budget: int) -> list[Measurement]:
    """A 3x3 convolution's candidates: each Winograd tile of `tiles` on each gemm kernel
    for its products (up to half the budget), then its direct plan's (`direct`: its
    kernel compiled without Winograd) up to the budget."""
    winograd = [Measurement(index, m.name, (), tile) for m in kernels if not m.window
                for tile in tiles][:max(1, budget // 2)]
    return winograd + [m for plan in direct.marks(Gemm)[:1] for m in _contraction(
        index, plan, kernels, machine, budget - len(winograd), winograd=0)]


def _keys(compiled, machine: Machine, threads: int) -> list[str]:
    return [kernel_key(k.kernel, machine, threads) for k in compiled.kernels]


def _line(base, m: Measurement, seconds: float) -> str:
    return f"{base.kernels[m.index].kernel.name} {m.text}: {seconds * 1e3:.3f} ms"


def _tiles_text(tiles: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in tiles.items())


# the least a timed run of calls lasts
MIN_RUN_S = 0.01


def _time_kernel(compiled, index: int, inputs, repeat: int) -> float:
    """Seconds a call of kernel `index` alone takes: the fastest of `repeat` runs of
    calls in a row, each at least MIN_RUN_S long, once its calls run at speed
    (`warm_up`: the team's cores slept while the candidate's gcc ran); its inputs are
    written by one run of the whole graph first."""
    out = {o: np.empty(compiled.graph.types[o].shape, compiled.graph.types[o].dtype)
           for o in compiled.graph.outputs}
    _, calls = compiled.program.bind(inputs, out)
    for call in calls:
        call()
    kernel = calls[index]
    number = max(1, int(MIN_RUN_S / warm_up([kernel])))
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            kernel()
        times.append((time.perf_counter() - start) / number)
    return min(times)
