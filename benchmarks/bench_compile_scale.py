"""Compile time against graph size: elementwise chains, fans and matmul chains.

    python benchmarks/bench_compile_scale.py [--quick] [--sizes 25 50 100 ...]

Each graph is compiled once, gcc included, with a fresh build cache (nothing is served
from an earlier run). For each shape and n it prints the fusion time, the kernels'
passes, gcc, the total, the number of kernels, and the total per node: a flat last
column is linear growth. Shapes:

- chain: n unary ops, each reading the one before (64x64 float32);
- fan: n unary ops of one input, each an output (the "100 outputs of one input" case);
- matmul: n chained 32x32 matmuls, each with a weight of its own.

Absolute times depend on the machine and on what else runs on it; read the growth.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

UNARY = ("exp", "tanh", "neg", "abs", "sigmoid")


def chain(b, n: int) -> list[str]:
    t = b.input("x", [64, 64])
    for i in range(n):
        t = b.op(UNARY[i % len(UNARY)], t)
    return [t]


def fan(b, n: int) -> list[str]:
    x = b.input("x", [64, 64])
    return [b.op(UNARY[i % len(UNARY)], x) for i in range(n)]


def matmul(b, n: int) -> list[str]:
    t = b.input("x", [32, 32])
    for i in range(n):
        t = b.matmul(t, b.input(f"w{i}", [32, 32]))
    return [t]


SHAPES = {"chain": chain, "fan": fan, "matmul": matmul}


def measure(shape: str, n: int) -> dict:
    from polyc import GraphBuilder
    from polyc.compiler import compile

    b = GraphBuilder(f"{shape}{n}")
    graph = b.build(outputs=SHAPES[shape](b, n))
    start = time.perf_counter()
    result = compile(graph, "cpu")
    total = time.perf_counter() - start
    timings = result.trace.timings
    fuse, build = timings.get("fuse", 0.0), timings.get("build", 0.0)
    return {"fuse": fuse, "build": build, "passes": total - fuse - build, "total": total,
            "kernels": len(result.kernels)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="sizes 25 100 400")
    parser.add_argument("--sizes", type=int, nargs="+", default=[25, 50, 100, 200, 500, 1000])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = parser.parse_args()
    sizes = [25, 100, 400] if args.quick else args.sizes
    # a fresh build cache: gcc runs for every graph, as on a cold service
    os.environ["POLYC_CACHE_DIR"] = tempfile.mkdtemp(prefix="polyc-bench-scale-")
    print(f"{'shape':8}{'n':>6}{'fuse s':>9}{'passes s':>10}{'gcc s':>8}{'total s':>9}"
          f"{'kernels':>9}{'ms/node':>9}")
    for shape in args.shapes:
        for n in sizes:
            m = measure(shape, n)
            print(f"{shape:8}{n:>6}{m['fuse']:>9.2f}{m['passes']:>10.2f}{m['build']:>8.2f}"
                  f"{m['total']:>9.2f}{m['kernels']:>9}{1000 * m['total'] / n:>9.2f}",
                  flush=True)


if __name__ == "__main__":
    main()
