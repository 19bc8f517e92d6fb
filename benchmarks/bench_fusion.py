"""Fused memory-bound kernels against numpy's composition, PyTorch eager and Inductor.

    python benchmarks/bench_fusion.py [--quick] [--cases ...] [--no-columns] [--no-compile]
                                      [--out DIR]

For log_softmax, softmax, layer_norm and rms_norm on 4096x4096 and attention of 8 heads
x 512 x 64 (causal and not), float32, at 1 and 2 threads, in one run: polyc with a
reused output buffer (`out=`) and with a fresh one, numpy's composition of ufuncs,
PyTorch eager, torch.compile (Inductor, compiled for each thread count) and, for
attention, `F.scaled_dot_product_attention` (the torch columns when torch is importable).
Every result is checked against numpy before anything is timed. The norms are given as
GB/s of compulsory traffic (every input read once, the output written once) beside the
STREAM triad bandwidth that `machine.py` measures right after each row (the machine's
state drifts; the best of the run's measurements, as a busy neighbour only lowers one);
attention, which is not memory-bound, as GFLOP/s (4 x heads x Lq x Lk x D)
beside the FMA peak. The libraries take turns (`machine.best_times`), so a noisy spell
on this shared machine hits them alike, on one thread in the thread's CPU time
(`machine.clock_for`): read ratios, not absolute times. The issue's
goals (2x torch.compile; attention 1.5x scaled_dot_product_attention) are printed as met
or not; beside them, polyc against torch.compile call by call (the median of back-to-back
pairs, `machine.paired_ratio`: a slow spell of the host moves both calls of a pair, not
two separate best times). The table goes to `--out` as bench_fusion.json with its plot.

A second table puts each column form (softmax and log_softmax over axis 0 of 1024x4096,
over the middle axis of 16x1024x256, and over the first of three, whose middle axis the
kernel's outer band keeps) beside the same op over the last axis of the transposed
input, in turns: the ratio of their times, and how many kernels each is.
"""
from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import machine_limits, paired_lines, paired_with  # noqa: E402
from machine import best_times, clock_for, clock_name, set_threads, stream_triad_gbs  # noqa: E402
from report import RESULTS, goal_lines, save_table  # noqa: E402

from polyc import GraphBuilder  # noqa: E402
from polyc.compiler import compile  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = F = None


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


def np_rms_norm(x, gamma, eps=1e-5):
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps) * gamma


def np_attention(q, k, v, causal=False):
    s = q @ np.swapaxes(k, -1, -2) * np.float32(1 / np.sqrt(q.shape[-1]))
    if causal:
        s = np.where(np.triu(np.ones(s.shape[-2:], bool), 1), -np.inf, s)
    return np_softmax(s) @ v


def torch_attention(q, k, v, causal=False):
    """PyTorch eager's composition: what a model written without SDPA runs."""
    s = q @ k.transpose(-1, -2) * (1 / q.shape[-1] ** 0.5)
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v


HEADS, SEQ, DIM = 8, 512, 64
ATTENTION_FLOPS = 4.0 * HEADS * SEQ * SEQ * DIM
CASES = {
    # name: (op, input shapes, attrs, numpy version, torch version, goals)
    "log_softmax": ("log_softmax", [(4096, 4096)], {}, np_log_softmax,
                    lambda x: torch.log_softmax(x, dim=-1), {"torch.compile": 2.0}),
    "softmax": ("softmax", [(4096, 4096)], {}, np_softmax, lambda x: torch.softmax(x, dim=-1),
                {"torch.compile": 2.0}),
    "layer_norm": ("layer_norm", [(4096, 4096), (4096,), (4096,)], {}, np_layer_norm,
                   lambda x, g, b: F.layer_norm(x, (x.shape[-1],), g, b), {"torch.compile": 2.0}),
    "rms_norm": ("rms_norm", [(4096, 4096), (4096,)], {}, np_rms_norm,
                 lambda x, g: F.rms_norm(x, (x.shape[-1],), g, eps=1e-5), {"torch.compile": 2.0}),
    "attention": ("attention", [(HEADS, SEQ, DIM)] * 3, {}, np_attention, torch_attention,
                  {"torch.compile": 2.0, "sdpa": 1.5}),
    "attention causal": ("attention", [(HEADS, SEQ, DIM)] * 3, {"causal": True},
                         lambda q, k, v: np_attention(q, k, v, True),
                         lambda q, k, v: torch_attention(q, k, v, True),
                         {"torch.compile": 2.0, "sdpa": 1.5}),
}
INPUT_NAMES = {"layer_norm": ["x", "gamma", "beta"], "rms_norm": ["x", "gamma"],
               "attention": ["q", "k", "v"]}


def build(name: str):
    op, shapes, attrs, *_ = CASES[name]
    b = GraphBuilder(name.replace(" ", "_"))
    ins = [b.input(n, s) for n, s in zip(INPUT_NAMES.get(op, ["x"]), shapes)]
    return b.build([b.op(op, *ins, out="y", **attrs)])


def sdpa(name: str):
    causal = CASES[name][2].get("causal", False)
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def inductor(fn):
    """torch.compile of `fn`, compiled now (outside the timed turns), for the thread count
    set now: Inductor bakes it into its OpenMP code, and dynamo would reuse a compilation
    made for another count."""
    torch._dynamo.reset()
    return torch.compile(fn)


COLUMN_CASES = [  # (op, shape, axis): the row form reduces the last axis of the transpose
    ("softmax", (1024, 4096), 0), ("log_softmax", (1024, 4096), 0),
    ("softmax", (16, 1024, 256), 1), ("log_softmax", (16, 1024, 256), 1),
    ("softmax", (64, 256, 256), 0), ("log_softmax", (128, 64, 512), 0)]


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


def _check(name: str, got, want) -> None:
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-3, atol=1e-4,
                               err_msg=f"{name}: differs from numpy's")


def measure(name: str, threads: int, rounds: int, rng, use_compile: bool,
            flops_peak: float) -> dict:
    """One row of the table: every library's speed on case `name` at `threads` threads."""
    op, _, _, np_fn, torch_fn, goals = CASES[name]
    graph = build(name)
    compiled = compile(graph)
    inputs = {t.name: rng.standard_normal(t.type.shape).astype(np.float32)
              for t in graph.inputs}
    np_args = [inputs[t.name] for t in graph.inputs]
    want = np_fn(*np_args)
    out = {"y": np.empty_like(want)}
    _check(f"{name} polyc", compiled.program(inputs, out)["y"], want)
    fns = {"polyc": lambda: compiled.program(inputs, out),
           "polyc (fresh out)": lambda: compiled.program(inputs), "numpy": lambda: np_fn(*np_args)}
    if torch is not None:
        targs = [torch.from_numpy(a) for a in np_args]
        peers = {"torch": torch_fn}
        if op == "attention":
            peers["sdpa"] = sdpa(name)
        if use_compile:
            peers["torch.compile"] = inductor(sdpa(name) if op == "attention" else torch_fn)
        for peer, fn in peers.items():
            with torch.no_grad():
                _check(f"{name} {peer}", fn(*targs), want)
            fns[peer] = lambda fn=fn: fn(*targs)
    with torch.no_grad() if torch is not None else contextlib.nullcontext():
        times = best_times(fns, rounds=rounds, clock=clock_for(threads))
        paired = (paired_with(fns, "torch.compile", times["polyc"], threads)
                  if "torch.compile" in fns else None)
    if op == "attention":
        unit, work = "GFLOP/s", ATTENTION_FLOPS
        limit = {"label": "FMA peak", "value": flops_peak}
    else:  # compulsory traffic: every input once, the output once
        unit, work = "GB/s", sum(a.nbytes for a in np_args) + want.nbytes
        # right after: the same state of the machine
        limit = {"label": "STREAM triad", "value": stream_triad_gbs(threads)}
    row = {"case": name, "threads": threads, "unit": unit, "limit": limit, "goals": goals,
           "kernels": len(compiled.kernels), "clock": clock_name(threads),
           "values": {lib: work / t / 1e9 for lib, t in times.items()}}
    return {**row, "paired": paired} if paired else row


def print_row(row: dict) -> None:
    v = row["values"]

    def cell(lib):
        return f"{v[lib]:8.2f}" if v.get(lib) else f"{'-':>8}"

    def vs(lib):
        return f"{v['polyc'] / v[lib]:7.2f}x" if v.get(lib) else f"{'-':>8}"
    print(f"{row['case']:16} {row['threads']:>3} {row['unit']:>7} {row['kernels']:>3} | "
          + " ".join(cell(lib) for lib in LIBS) + f" | {row['limit']['value']:8.1f} "
          f"{v['polyc'] / row['limit']['value']:6.0%} | " + " ".join(vs(lib) for lib in LIBS[2:]),
          flush=True)


LIBS = ["polyc", "polyc (fresh out)", "numpy", "torch", "torch.compile", "sdpa"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--no-columns", action="store_true", help="skip the column table")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where the table's JSON and plot go (default: %(default)s)")
    args = parser.parse_args()
    rounds = 2 if args.quick else 5
    rng = np.random.default_rng(0)

    print(f"torch: {torch.__version__ if torch else 'not importable'}")
    header = (f"{'case':16} {'thr':>3} {'unit':>7} {'krn':>3} | {'polyc':>8} {'fresh':>8} "
              f"{'numpy':>8} {'torch':>8} {'compile':>8} {'sdpa':>8} | {'limit':>8} {'%limit':>6} "
              f"| {'x numpy':>8} {'x torch':>8} {'x comp.':>8} {'x sdpa':>8}")
    print(header)
    print("-" * len(header))
    rows = []
    with tempfile.TemporaryDirectory(prefix="polyc-bench-") as tmp:
        for threads in (1, 2):
            set_threads(threads)
            peak = machine_limits(threads, Path(tmp))[0]
            stream_triad_gbs(threads)  # the first row's limit is the better of two too
            for name in args.cases:
                rows.append(measure(name, threads, rounds, rng, not args.no_compile, peak))
                print_row(rows[-1])
    path = save_table("bench_fusion", "Fused kernels vs numpy, PyTorch eager, torch.compile "
                      "(Inductor), SDPA", rows, out_dir=args.out)
    print("goals:", *goal_lines({"better": "higher", "rows": rows}), *paired_lines(rows),
          sep="\n")
    print(f"wrote {path} (and its plot)")
    if not args.no_columns:
        columns(rounds, rng)


if __name__ == "__main__":
    main()
