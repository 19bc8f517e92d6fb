"""Fused memory-bound kernels against numpy's composition and PyTorch eager.

    python benchmarks/bench_fusion.py [--quick] [--cases ...] [--no-columns]

For log_softmax 4096x4096, softmax 4096x4096 and layer_norm 8192x1024 (float32), at 1 and
2 threads, in one run: polyc with a reused output buffer (`out=`) and with a fresh one,
numpy's composition of ufuncs, PyTorch eager (when importable). Each result is given as
GB/s of compulsory traffic (every input read once, the output written once) and as a
fraction of the STREAM triad bandwidth that `machine.py` measures right after each row
(the machine's state drifts), plus the speed-up of polyc (reused output) over numpy and
PyTorch. The libraries take turns (`machine.best_times`), so a noisy spell on this shared
machine hits them alike: read ratios, not absolute times.

A second table puts each column form (softmax and log_softmax over axis 0 of 1024x4096,
and over the middle axis of 16x1024x256) beside the same op over the last axis of the
transposed input, in turns: the ratio of their times, and how many kernels each is.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import best_times, set_threads, stream_triad_gbs  # noqa: E402

from polyc import GraphBuilder  # noqa: E402
from polyc.compiler import compile  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def np_log_softmax(x):
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def np_softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_layer_norm(x, gamma, beta, eps=1e-5):
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + eps) * gamma + beta


CASES = {
    # name: (shape, op, numpy version, torch version)
    "log_softmax": ((4096, 4096), "log_softmax", np_log_softmax,
                    lambda x: torch.log_softmax(x, dim=-1)),
    "softmax": ((4096, 4096), "softmax", np_softmax, lambda x: torch.softmax(x, dim=-1)),
    "layer_norm": ((8192, 1024), "layer_norm", np_layer_norm,
                   lambda x, g, b: torch.nn.functional.layer_norm(x, (x.shape[-1],), g, b)),
}


def build(name: str):
    shape, op, _, _ = CASES[name]
    b = GraphBuilder(name)
    ins = [b.input("x", shape)]
    if op == "layer_norm":
        ins += [b.input("gamma", shape[-1:]), b.input("beta", shape[-1:])]
    return b.build([b.op(op, *ins, out="y")])


COLUMN_CASES = [  # (op, shape, axis): the row form reduces the last axis of the transpose
    ("softmax", (1024, 4096), 0), ("log_softmax", (1024, 4096), 0),
    ("softmax", (16, 1024, 256), 1), ("log_softmax", (16, 1024, 256), 1)]


def _one_op(op: str, shape, axis: int):
    b = GraphBuilder(op)
    return b.build([b.op(op, b.input("x", shape), out="y", axis=axis)])


def columns(rounds: int, rng) -> None:
    header = (f"{'case':34} {'thr':>3} | {'kernels':>7} {'column ms':>10} {'row ms':>8} "
              f"{'column / row':>12}")
    print("\n" + header)
    print("-" * len(header))
    for op, shape, axis in COLUMN_CASES:
        rows_shape = tuple(n for d, n in enumerate(shape) if d != axis) + (shape[axis],)
        col, row = _one_op(op, shape, axis), _one_op(op, rows_shape, -1)
        col_c, row_c = compile(col), compile(row)
        x = rng.standard_normal(shape).astype(np.float32)
        xt = np.ascontiguousarray(np.moveaxis(x, axis, -1))
        want = (np_log_softmax if op == "log_softmax" else np_softmax)(xt)
        outs = {"col": {"y": np.empty_like(x)}, "row": {"y": np.empty_like(xt)}}
        col_c.program({"x": x}, outs["col"])
        row_c.program({"x": xt}, outs["row"])
        np.testing.assert_allclose(np.moveaxis(outs["col"]["y"], axis, -1), want, rtol=1e-3,
                                   atol=1e-5)
        np.testing.assert_allclose(outs["row"]["y"], want, rtol=1e-3, atol=1e-5)
        for threads in (1, 2):
            set_threads(threads)
            times = best_times({"col": lambda: col_c.program({"x": x}, outs["col"]),
                                "row": lambda: row_c.program({"x": xt}, outs["row"])},
                               rounds=rounds)
            name = f"{op} axis {axis} of {'x'.join(map(str, shape))}"
            print(f"{name:34} {threads:>3} | {len(col_c.kernels):>3} {len(row_c.kernels):>3} "
                  f"{times['col'] * 1e3:10.3f} {times['row'] * 1e3:8.3f} "
                  f"{times['col'] / times['row']:11.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--no-columns", action="store_true", help="skip the column table")
    args = parser.parse_args()
    rounds = 2 if args.quick else 5
    rng = np.random.default_rng(0)

    print(f"torch: {torch.__version__ if torch else 'not importable'}")
    header = (f"{'case':12} {'thr':>3} | {'polyc out=':>12} {'polyc fresh':>12} {'numpy':>12} "
              f"{'torch':>12} | {'STREAM':>12} {'%STREAM':>7} {'x numpy':>8} {'x torch':>8}")
    print(header)
    print("-" * len(header))
    for name in args.cases:
        graph = build(name)
        compiled = compile(graph)
        _, _, np_fn, torch_fn = CASES[name]
        inputs = {t.name: rng.standard_normal(t.type.shape).astype(np.float32)
                  for t in graph.inputs}
        traffic = sum(a.nbytes for a in inputs.values()) + inputs["x"].nbytes
        out = {"y": np.empty_like(inputs["x"])}
        np_args = [inputs[t.name] for t in graph.inputs]
        torch_args = [torch.from_numpy(a) for a in np_args] if torch else None
        for threads in (1, 2):
            set_threads(threads)
            fns = {"reused": lambda: compiled.program(inputs, out),
                   "fresh": lambda: compiled.program(inputs), "numpy": lambda: np_fn(*np_args)}
            if torch:
                fns["torch"] = lambda: torch_fn(*torch_args)
            times = best_times(fns, rounds=rounds)
            reused, fresh, numpy_t, torch_t = (times.get(k)
                                               for k in ("reused", "fresh", "numpy", "torch"))
            stream = stream_triad_gbs(threads)  # right after: the same state of the machine

            def gbs(t):
                return f"{traffic / t / 1e9:7.2f} GB/s" if t else f"{'-':>12}"

            print(f"{name:12} {threads:>3} | {gbs(reused)} {gbs(fresh)} {gbs(numpy_t)} "
                  f"{gbs(torch_t)} | {stream:7.2f} GB/s {traffic / reused / 1e9 / stream:7.0%} "
                  f"{numpy_t / reused:8.2f} "
                  + (f"{torch_t / reused:8.2f}" if torch_t else f"{'-':>8}"))
        np.testing.assert_allclose(out["y"], np_fn(*np_args), rtol=1e-3, atol=1e-4)
    if not args.no_columns:
        columns(rounds, rng)


if __name__ == "__main__":
    main()
