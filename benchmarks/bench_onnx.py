"""ONNX models through polyc against onnxruntime, in one run.

    python benchmarks/bench_onnx.py [--threads 1] [--out DIR]

For each model of `examples/onnx_models.py` (an MLP, a small CNN, a transformer block,
a ResNet block):
polyc's import + compile time, the number of kernels, and the time per call of polyc's
kernels and of an onnxruntime session (CPU provider, the same thread count), measured in
turns (`machine.best_times`) after checking that both give the same answer; the ratio
is onnxruntime's time over polyc's (above 1: polyc is faster). The table goes to `--out`
as bench_onnx.json with its plot.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from machine import best_times, set_threads  # noqa: E402
from report import RESULTS, save_table  # noqa: E402
from onnx_models import MODELS  # noqa: E402

import polyc  # noqa: E402


def main() -> int:
    import onnxruntime as ort

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where the table's JSON and plot go (default: %(default)s)")
    args = parser.parse_args()
    set_threads(args.threads)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = args.threads
    print(f"onnxruntime {ort.__version__}, {args.threads} thread(s)")
    head = (f"{'model':12} {'compile s':>9} {'kernels':>7} {'polyc ms':>9} {'ort ms':>9} "
            f"{'ort / polyc':>11}")
    print(head)
    print("-" * len(head))
    rows = []
    for name, make in MODELS.items():
        m = make()
        shape = [d.dim_value for d in m.graph.input[0].type.tensor_type.shape.dim]
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        start = time.perf_counter()
        compiled = polyc.compile(polyc.import_onnx(m))
        seconds = time.perf_counter() - start
        session = ort.InferenceSession(m.SerializeToString(), opts,
                                       providers=["CPUExecutionProvider"])
        want = session.run(None, {"x": x})[0]
        out = {"y": np.empty_like(want)}
        compiled.program({"x": x}, out)
        np.testing.assert_allclose(out["y"], want, rtol=1e-4, atol=1e-4)
        times = best_times({"polyc": lambda: compiled.program({"x": x}, out),
                            "ort": lambda: session.run(None, {"x": x})})
        print(f"{name:12} {seconds:9.2f} {len(compiled.kernels):7} {times['polyc'] * 1e3:9.3f} "
              f"{times['ort'] * 1e3:9.3f} {times['ort'] / times['polyc']:11.2f}")
        rows.append({"case": name, "threads": args.threads, "unit": "ms per call",
                     "compile_s": seconds, "kernels": len(compiled.kernels),
                     "values": {"polyc": times["polyc"] * 1e3, "onnxruntime": times["ort"] * 1e3}})
    path = save_table("bench_onnx", f"ONNX models: polyc vs onnxruntime {ort.__version__}", rows,
                      better="lower", out_dir=args.out)
    print(f"wrote {path} (and its plot)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
