"""One symbolic compile against one static compile per size, in one run.

    python benchmarks/bench_symbolic.py [--threads 1] [--sizes 1,7,64,1000,4096] [--cases linear_gelu,softmax,layer_norm]

For linear+gelu (`["N", 1024] @ [1024, 4096]`), softmax and layer_norm over
`["N", 4096]`: one compile of the symbolic graph, and one static compile per N; at each
N both are checked against the reference executor, then timed in turns
(`machine.best_times`); the ratio is the symbolic kernel's time over the static one's
(1.00: as fast; the target is within 1.10 at N >= 64). Compile times are cold (a fresh
object cache; one untimed compile per side first, for the imports and polyc's gemm
calibration, which a service does once) and summed over the sizes for the static compiles; with PyTorch
installed, the same for `torch.compile(dynamic=True)`: its first call at each size (it
compiles at the first two and may recompile later).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import best_times, set_threads  # noqa: E402

import polyc  # noqa: E402
from polyc.graph.reference import run_reference  # noqa: E402

SYMBOLS = {"N": {"min": 1, "max": 8192}}


def linear_gelu(n):
    return {"name": "linear_gelu",
            "inputs": [{"name": "x", "shape": [n, 1024]}, {"name": "w", "shape": [1024, 4096]},
                       {"name": "b", "shape": [4096]}],
            "nodes": [{"op": "linear", "inputs": ["x", "w", "b"], "outputs": ["h"]},
                      {"op": "gelu", "inputs": ["h"], "outputs": ["y"],
                       "attrs": {"approximate": "tanh"}}],
            "outputs": ["y"]}


def one_op(op):
    def make(n):
        return {"name": op, "inputs": [{"name": "x", "shape": [n, 4096]}],
                "nodes": [{"op": op, "inputs": ["x"], "outputs": ["y"]}], "outputs": ["y"]}
    return make


def torch_fn(name):
    import torch
    import torch.nn.functional as F
    if name == "linear_gelu":
        return lambda x, w, b: F.gelu(torch.addmm(b, x, w), approximate="tanh")
    if name == "softmax":
        return lambda x: torch.softmax(x, -1)
    return lambda x: F.layer_norm(x, (4096,), eps=1e-5)


CASES = {"linear_gelu": linear_gelu, "softmax": one_op("softmax"),
         "layer_norm": one_op("layer_norm")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", default="1,7,64,1000,4096")
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    set_threads(args.threads)
    os.environ["POLYC_CACHE_DIR"] = tempfile.mkdtemp(prefix="polyc-bench-")  # cold compiles
    try:
        import torch
    except ImportError:
        torch = None
    # once per process, not timed, on both sides: imports (sympy, Inductor's toolchain)
    # and polyc's per-machine calibration of the gemm kernels, which builds them
    polyc.compile({**one_op("log_softmax")("N"), "symbols": SYMBOLS})  # no case's source
    polyc.compile(linear_gelu(8))
    if torch is not None:
        torch.compile(lambda x: torch.tanh(x) * 2 + 1, dynamic=True)(torch.ones(3, 5))
    print(f"{args.threads} thread(s); sizes {sizes}")
    head = f"{'case':12} {'N':>5} {'symbolic ms':>11} {'static ms':>10} {'ratio':>6} {'max err':>9}"
    print(head)
    print("-" * len(head))
    compile_rows = []
    for name in args.cases.split(","):
        make = CASES[name]
        start = time.perf_counter()
        symbolic = polyc.compile({**make("N"), "symbols": SYMBOLS})
        sym_s = time.perf_counter() - start
        # the fallbacks taken, and the versions by size (or why a range has none)
        note = [line for k in symbolic.kernels for line in k.fusion_report
                if line.startswith("symbolic shapes") or " since " in line
                or line.startswith("version ") and ": decided at " in line]
        static_s = 0.0
        rng = np.random.default_rng(0)
        for n in sizes:
            doc = make(n)
            start = time.perf_counter()
            static = polyc.compile(doc)
            static_s += time.perf_counter() - start
            graph = polyc.load_graph(doc)
            inputs = {t.name: rng.standard_normal(t.type.shape).astype(np.float32)
                      for t in graph.inputs}
            want = run_reference(graph, inputs)["y"]
            out_sym, out_static = {"y": np.empty_like(want)}, {"y": np.empty_like(want)}
            symbolic.program(inputs, out_sym)
            static.program(inputs, out_static)
            err = float(np.max(np.abs(out_sym["y"] - want)))
            np.testing.assert_allclose(out_sym["y"], want, rtol=1e-4, atol=2e-4)
            np.testing.assert_allclose(out_static["y"], want, rtol=1e-4, atol=2e-4)
            times = best_times({"symbolic": lambda: symbolic.program(inputs, out_sym),
                                "static": lambda: static.program(inputs, out_static)},
                               rounds=3, budget_s=4.0)
            print(f"{name:12} {n:5} {times['symbolic'] * 1e3:11.3f} {times['static'] * 1e3:10.3f} "
                  f"{times['symbolic'] / times['static']:6.2f} {err:9.2e}", flush=True)
        torch_s = None
        if torch is not None:
            torch._dynamo.reset()
            fn = torch.compile(torch_fn(name), dynamic=True)
            start = time.perf_counter()
            for n in sizes:
                graph = polyc.load_graph(make(n))
                fn(*(torch.randn(*t.type.shape) for t in graph.inputs))
            torch_s = time.perf_counter() - start
        compile_rows.append((name, sym_s, static_s, torch_s, note))
    print()
    print(f"compile seconds for the {len(sizes)} sizes:")
    print(f"{'case':12} {'symbolic x1':>11} {'static x' + str(len(sizes)):>10} "
          f"{'torch dynamic':>13}")
    for name, sym_s, static_s, torch_s, note in compile_rows:
        t = f"{torch_s:13.2f}" if torch_s is not None else f"{'-':>13}"
        print(f"{name:12} {sym_s:11.2f} {static_s:10.2f} {t}")
        for line in note:
            print(f"  {name}: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
