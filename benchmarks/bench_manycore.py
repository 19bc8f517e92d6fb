"""polyc on the simulated many-core chip: what the cycle model says each kernel costs.

    python benchmarks/bench_manycore.py [--cases matmul,softmax] [--out DIR]

For each case, compiled for `target="manycore"` and run once in the simulator (results
checked against the reference executor first): cycles, flops, `peak_fraction` (flops /
(cycles x 16 x 64)), the DMA bytes each way and their ratio to the least the chosen tiles need (every tile's
footprint per promoted array, counted with isl), the fraction of the DMA bound (bytes /
32 B per cycle: what a memory-bound kernel is measured against), the LDM high-water mark,
and the tiles the compiler chose. The simulated numbers are deterministic: the host's
speed changes how long the run takes, never what it reports.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from polyc import GraphBuilder
from polyc.compiler import compile
from simulated import check, main, tiles


def cases():
    """name -> (graph, inputs, what the case is measured against)"""
    rng = np.random.default_rng(0)

    def rand(*shape):
        return rng.uniform(-1, 1, shape).astype(np.float32)

    b = GraphBuilder("matmul")
    mm = b.build([b.matmul(b.input("a", (2048, 2048)), b.input("w", (2048, 2048)), out="y")])
    b = GraphBuilder("linear_gelu")
    lg = b.build([b.gelu(b.linear(b.input("x", (1024, 1024)), b.input("w", (1024, 4096)),
                                  b.input("b", (4096,))), approximate="tanh", out="y")])
    b = GraphBuilder("softmax")
    sm = b.build([b.softmax(b.input("x", (4096, 4096)), out="y")])
    b = GraphBuilder("layer_norm")
    ln = b.build([b.layer_norm(b.input("x", (4096, 4096)), b.input("g", (4096,)),
                               b.input("b", (4096,)), out="y")])
    x = rand(4096, 4096)
    return {
        "matmul 2048^3": (mm, {"a": rand(2048, 2048), "w": rand(2048, 2048)}, "peak"),
        "linear+gelu 1024x1024 @ 1024x4096": (
            lg, {"x": rand(1024, 1024), "w": rand(1024, 4096), "b": rand(4096)}, "peak"),
        "softmax 4096x4096": (sm, {"x": x}, "dma"),
        "layer_norm 4096x4096": (ln, {"x": x, "g": rand(4096), "b": rand(4096)}, "dma"),
    }


def least_bytes(compiled) -> dict[str, int]:
    """What the chosen tiles must move at least: every tile's footprint of every promoted
    array, got where it is read and put where it is written (counted with isl)."""
    out = {"main->ldm": 0, "ldm->main": 0}
    for k in compiled.kernels:
        for p in k.promotions:
            n = p.footprint.wrap().count_val().to_python() * p.element_bytes
            if p.direction in ("in", "inout"):
                out["main->ldm"] += n
            if p.direction in ("out", "inout"):
                out["ldm->main"] += n
    return out


def run(name, graph, inputs, bound) -> dict:
    start = time.perf_counter()
    compiled = compile(graph, "manycore")
    seconds = time.perf_counter() - start
    profile = compiled.profile(**inputs)
    check(name, graph, inputs, profile["outputs"])
    moved = sum(profile["bytes"].values())
    least = least_bytes(compiled)
    return {"case": name, "kernels": len(compiled.kernels), "compile_s": seconds,
            "cycles": profile["cycles"], "flops": profile["flops"],
            "peak_fraction": profile["peak_fraction"], "bytes": profile["bytes"],
            "least_bytes": least, "bytes_ratio": moved / max(1, sum(least.values())),
            "dma_bound_fraction": moved / 32 / profile["cycles"], "bound": bound,
            "transfers": profile["transfers"], "high_water": profile["high_water"],
            "tiles": tiles(compiled)}


def table(rows: list[dict]) -> str:
    head = (f"{'case':34} {'cycles':>11} {'peak':>6} {'DMA bnd':>7} {'MiB in':>8} "
            f"{'MiB out':>8} {'x least':>7} {'LDM KiB':>7}  tiles")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:34} {r['cycles']:>11,} {r['peak_fraction']:>6.1%} "
                     f"{r['dma_bound_fraction']:>7.1%} {r['bytes']['main->ldm'] / 2**20:>8.1f} "
                     f"{r['bytes']['ldm->main'] / 2**20:>8.1f} {r['bytes_ratio']:>7.2f} "
                     f"{r['high_water']['LDM'] / 1024:>7.1f}  "
                     + "; ".join(r["tiles"]))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(__doc__, cases, run, table, name="bench_manycore", bound="dma_bound_fraction"))
