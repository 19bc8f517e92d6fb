"""polyc on the simulated NPU: what the cycle model says each kernel costs.

    python benchmarks/bench_npu.py [--cases matmul,softmax] [--out DIR]

For each case, compiled for `target="npu"` and run once in the simulator (the result
checked against the numpy reference executor first, at float16's tolerance where the
tensors are float16): cycles, the fraction of the peak of the unit that does the work
(the cube at the operand type it ran, or the vector unit), the fraction of the GM bound
(the bytes moved between GM and the chip at 64 B/cycle: what a memory-bound kernel is
measured against), each pipe's busy cycles, the high-water mark of every level, and the
tiles the compiler chose. "2 AI cores" cases split the work over two cores that share
the GM bandwidth. The simulated numbers are deterministic: the host's speed changes how
long the run takes, never what it reports.
"""
from __future__ import annotations

import sys
import time

import numpy as np

from polyc import GraphBuilder
from polyc.compiler import compile
from polyc.targets.npu.machine import npu_machine
from simulated import check, main, tiles

CAPACITY = {level.name: level.capacity for level in npu_machine().levels if level.name != "GM"}


def cases():
    """name -> (graph, inputs, options, what the case is measured against)"""
    rng = np.random.default_rng(0)

    def rand(shape, dtype):
        return rng.uniform(-1, 1, shape).astype(dtype)

    out = {}
    for dtype in ("float16", "float32"):
        b = GraphBuilder("matmul")
        g = b.build([b.matmul(b.input("a", (1024, 1024), dtype), b.input("w", (1024, 1024), dtype),
                              out="y")])
        out[f"matmul 1024^3 {dtype}"] = (g, {"a": rand((1024, 1024), dtype),
                                             "w": rand((1024, 1024), dtype)}, {}, "peak")
    b = GraphBuilder("linear_gelu")
    g = b.build([b.gelu(b.linear(b.input("x", (1024, 1024), "float16"),
                                 b.input("w", (1024, 4096), "float16"),
                                 b.input("b", (4096,), "float16")), approximate="tanh", out="y")])
    out["linear+gelu 1024x1024 @ 1024x4096 float16"] = (
        g, {"x": rand((1024, 1024), "float16"), "w": rand((1024, 4096), "float16"),
            "b": rand((4096,), "float16")}, {}, "peak")
    x = rand((4096, 4096), "float16")
    b = GraphBuilder("softmax")
    sm = b.build([b.softmax(b.input("x", (4096, 4096), "float16"), out="y")])
    b = GraphBuilder("layer_norm")
    ln = b.build([b.layer_norm(b.input("x", (4096, 4096), "float16"),
                               b.input("g", (4096,), "float16"), b.input("b", (4096,), "float16"),
                               out="y")])
    norm = {"x": x, "g": rand((4096,), "float16"), "b": rand((4096,), "float16")}
    for cores in (1, 2, 4):
        on = "" if cores == 1 else f" ({cores} AI cores)"
        out[f"softmax 4096x4096 float16{on}"] = (sm, {"x": x}, {"cores": cores}, "gm")
        out[f"layer_norm 4096x4096 float16{on}"] = (ln, norm, {"cores": cores}, "gm")
    return out


def run(name, graph, inputs, options, bound) -> dict:
    start = time.perf_counter()
    compiled = compile(graph, "npu", options=options)
    seconds = time.perf_counter() - start
    profile = compiled.profile(**inputs)
    check(name, graph, inputs, profile["outputs"])
    moved = profile["bytes"]
    gm_bytes = moved["gm->l1"] + moved["gm->ub"] + moved["ub->gm"]
    over = {lv: n for lv, n in profile["high_water"].items() if n > CAPACITY[lv]}
    if over:
        raise SystemExit(f"{name}: over capacity: {over}")
    return {"case": name, "kernels": len(compiled.kernels), "compile_s": seconds,
            "cycles": profile["cycles"], "flops": profile["flops"],
            "peak_fraction": profile["peak_fraction"], "units": profile["units"],
            "gm_bound_fraction": gm_bytes / 64 / profile["cycles"], "bound": bound,
            "bytes": moved, "busy": profile["busy"], "transfers": profile["transfers"],
            "high_water": profile["high_water"], "tiles": tiles(compiled)}


def table(rows: list[dict]) -> str:
    head = (f"{'case':46} {'cycles':>10} {'peak':>6} {'GM bnd':>6} {'MiB GM':>7} "
            f"{'cube':>8} {'vector':>8} {'L1/L0A/L0B/L0C/UB KiB':>24}  tiles")
    lines = [head, "-" * len(head)]
    for r in rows:
        m = r["bytes"]
        hw = "/".join(f"{r['high_water'][lv] / 1024:.0f}" for lv in ("L1", "L0A", "L0B", "L0C", "UB"))
        lines.append(f"{r['case']:46} {r['cycles']:>10,} {r['peak_fraction']:>6.1%} "
                     f"{r['gm_bound_fraction']:>6.1%} "
                     f"{(m['gm->l1'] + m['gm->ub'] + m['ub->gm']) / 2**20:>7.1f} "
                     f"{r['busy']['cube']:>8,} {r['busy']['vector']:>8,} {hw:>24}  "
                     + "; ".join(r["tiles"]))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main(__doc__, cases, run, table, name="bench_npu", bound="gm_bound_fraction"))
