"""polyc on the simulated many-core chip: what the cycle model says each kernel costs.

    python benchmarks/bench_manycore.py [--cases matmul,softmax] [--json out.json]

For each case, compiled for `target="manycore"` and run once in the simulator (results
checked against numpy first): cycles, flops, `peak_fraction` (flops / (cycles x 16 x 64)),
the DMA bytes each way and their ratio to the least the chosen tiles need (every tile's
footprint per promoted array, counted with isl), the fraction of the DMA bound (bytes /
32 B per cycle: what a memory-bound kernel is measured against), the LDM high-water mark,
and the tiles the compiler chose. The simulated numbers are deterministic: the host's
speed changes how long the run takes, never what it reports.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from polyc import GraphBuilder
from polyc.compiler import compile


def _gelu(h):
    return 0.5 * h * (1.0 + np.tanh(np.float32(0.7978845608028654) * (h + np.float32(0.044715) * h ** 3)))


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _layer_norm(x, g, b):
    m = x.mean(axis=-1, keepdims=True)
    return (x - m) / np.sqrt(((x - m) ** 2).mean(axis=-1, keepdims=True) + 1e-5) * g + b


def cases():
    """name -> (graph, inputs, numpy reference, what the case is measured against)"""
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
        "matmul 2048^3": (mm, {"a": rand(2048, 2048), "w": rand(2048, 2048)},
                          lambda a, w: a @ w, "peak"),
        "linear+gelu 1024x1024 @ 1024x4096": (
            lg, {"x": rand(1024, 1024), "w": rand(1024, 4096), "b": rand(4096)},
            lambda x, w, b: _gelu(x @ w + b), "peak"),
        "softmax 4096x4096": (sm, {"x": x}, _softmax, "dma"),
        "layer_norm 4096x4096": (ln, {"x": x, "g": rand(4096), "b": rand(4096)}, _layer_norm,
                                 "dma"),
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


def run(name, graph, inputs, reference, bound) -> dict:
    start = time.perf_counter()
    compiled = compile(graph, "manycore")
    seconds = time.perf_counter() - start
    profile = compiled.profile(**inputs)
    got, want = profile["outputs"]["y"], reference(*inputs.values())
    err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
    if not err <= 1e-4:
        raise SystemExit(f"{name}: the simulated result differs from numpy's ({err:.1e})")
    moved = sum(profile["bytes"].values())
    least = least_bytes(compiled)
    tiles = [line for k in compiled.kernels for line in k.fusion_report
             if line.startswith(("contraction ", "tiles of "))]
    return {"case": name, "kernels": len(compiled.kernels), "compile_s": seconds,
            "cycles": profile["cycles"], "flops": profile["flops"],
            "peak_fraction": profile["peak_fraction"], "bytes": profile["bytes"],
            "least_bytes": least, "bytes_ratio": moved / max(1, sum(least.values())),
            "dma_bound_fraction": moved / 32 / profile["cycles"], "bound": bound,
            "transfers": profile["transfers"], "high_water": profile["high_water"],
            "tiles": tiles}


def _tiles(line: str) -> str:
    """The tile sizes a kernel's report line names."""
    if line.startswith("contraction "):
        return line.split(": ", 1)[1].split(": the fewest")[0]
    return line.split(" for the compute cores")[0]


def table(rows: list[dict]) -> str:
    head = (f"{'case':34} {'cycles':>11} {'peak':>6} {'DMA bnd':>7} {'MiB in':>8} "
            f"{'MiB out':>8} {'x least':>7} {'LDM KiB':>7}  tiles")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['case']:34} {r['cycles']:>11,} {r['peak_fraction']:>6.1%} "
                     f"{r['dma_bound_fraction']:>7.1%} {r['bytes']['main->ldm'] / 2**20:>8.1f} "
                     f"{r['bytes']['ldm->main'] / 2**20:>8.1f} {r['bytes_ratio']:>7.2f} "
                     f"{r['high_water']['LDM'] / 1024:>7.1f}  "
                     + "; ".join(_tiles(t) for t in r["tiles"]))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="", help="comma-separated substrings of case names")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    wanted = [w for w in args.cases.split(",") if w]
    rows = []
    for name, (graph, inputs, reference, bound) in cases().items():
        if wanted and not any(w in name for w in wanted):
            continue
        rows.append(run(name, graph, inputs, reference, bound))
        print(f"  {name}: done", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
