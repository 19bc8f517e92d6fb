"""polyc's CPU kernels beside numpy (OpenBLAS), PyTorch eager and torch.compile.

    python benchmarks/bench_cpu.py [--threads 1,2] [--rounds 5] [--no-compile]
                                   [--cases conv2d,1024] [--suite main|resnet50] [--out DIR]

Prints one table, measured in one run: for each case and thread count, the best time per
call (one thread: the thread's CPU time, which leaves out the time other tenants of a
shared machine hold the core; two: the wall clock) as GFLOP/s (contractions: 2*M*N*K) or GB/s (reductions: bytes read), the libraries
taking `--rounds` turns (at least 3 calls and 50 ms each) so that a noisy spell on this
shared machine hits them alike (`machine.best_times`), round r of every case before round
r + 1 of any, so that a slow spell of minutes falls on one round of several cases
(`machine.spread_best_times`), and polyc's result as a fraction
of the machine's FMA peak or read bandwidth, both measured first by two small C programs
built here with gcc (the peak on the widest vectors the host has). For contractions,
polyc also runs on each gemm kernel it did not choose (pinned with `gemm_kernel`), in
the same turns: the chosen one should be the fastest. A convolution polyc computes by
Winograd's F(2x2, 3x3) is timed as the direct convolution too (`winograd=False`: the
alternative "direct", in both suites) and, where the plan would take it if allowed, as
F(4x4, 3x3) ("winograd 4x4": `winograd_max_tile=4`, whose rounding is about seven times
F(2x2, 3x3)'s); its GFLOP/s, as every column's, count the direct convolution's
multiply-adds, which is why they can pass the FMA peak. Each thread count runs in its own
process (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and torch's threads set before anything
starts a thread pool).
PyTorch columns show "-" when torch is not importable; torch.compile needs a C++
compiler and takes a while per case.

`--suite resnet50` measures instead the convolutions of ResNet-50's four stages (the 3x3
and the 1x1 ones, the strided ones of each stage's first block), batch 1 and 8, each with
its bias and relu fused, against PyTorch eager (oneDNN) and torch.compile. As in a model's
inference graph the weights are constants (polyc packs them on the first call); the
peers are given them as tensors.
The table is written with the machine's description to `--out` (benchmarks/results/)
as bench_cpu[_SUITE].json and plotted (.png, .svg); the issue's goals are printed as
met or not. A fused epilogue's cost is measured apart, as the case's time over its
contraction's alone call by call (`machine.paired_ratio`): a few percent is below what
two rows of best times can tell apart (linear+gelu's, the issue's goal; conv2d's bias
and silu, a heavy epilogue of B read in place, printed without one). Each case with a
torch column is also timed against torch eager call by call, and that ratio printed
beside the one of best times (with how many cases meet their goal that way): a slow
spell of the host, which best times give to whichever library it spared, moves both
calls of a pair.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import clock_for, clock_name, paired_ratio, spread_best_times  # noqa: E402
from report import RESULTS, goal_lines, save_table  # noqa: E402

# --- the machine's limits ----------------------------------------------------------------

PEAK_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <omp.h>
/* 12 independent FMA chains per thread on the widest vectors the host has (zmm with
   AVX-512, else ymm): enough to cover the FMA latency of every x86-64 core, so the loop
   runs at the FMA units' throughput */
#if defined(__AVX512F__)
#define R(n) "%%zmm" #n
#define LANES 16
#else
#define R(n) "%%ymm" #n
#define LANES 8
#endif
#define FMA(n) "vfmadd231ps " R(14) "," R(15) "," R(n) "\n"
#define ZERO(n) "vxorps " R(n) "," R(n) "," R(n) "\n"
#include <time.h>
static double cpu_now(void) {
  struct timespec t; clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
/* each thread's own CPU time: the FMA units' rate while the thread runs, whoever else
   shares the machine */
static double chains(long n) {
  double t = cpu_now();
  __asm__ volatile(
    ZERO(0) ZERO(1) ZERO(2) ZERO(3) ZERO(4) ZERO(5) ZERO(6) ZERO(7) ZERO(8) ZERO(9)
    ZERO(10) ZERO(11) ZERO(14) ZERO(15)
    "mov %0, %%rcx\n"
    "1:\n"
    FMA(0) FMA(1) FMA(2) FMA(3) FMA(4) FMA(5) FMA(6) FMA(7) FMA(8) FMA(9) FMA(10) FMA(11)
    "dec %%rcx\n jnz 1b\n"
    :: "r"(n) : "rcx", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7",
       "xmm8", "xmm9", "xmm10", "xmm11", "xmm14", "xmm15", "cc");
  return cpu_now() - t;
}
int main(void) {
  long n = 40000000;
  double best = 0;
  for (int rep = 0; rep < 5; rep++) {
    double slowest = 0;
#pragma omp parallel reduction(max:slowest)
    slowest = chains(n);
    double flops = 12.0 * 2.0 * LANES * n * omp_get_max_threads();
    if (flops / slowest > best) best = flops / slowest;
  }
  printf("%.3f\n", best / 1e9);
  return 0;
}
"""

BANDWIDTH_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <omp.h>
/* read bandwidth: sum a 512 MiB array (far beyond every cache), 4 x 8 lanes per thread */
typedef float v8 __attribute__((vector_size(32)));
int main(void) {
  long n = 1L << 27;
  float *x = aligned_alloc(64, n * sizeof(float));
#pragma omp parallel for schedule(static)
  for (long i = 0; i < n; i++) x[i] = 1.0f;
  double best = 0, sink = 0;
  for (int rep = 0; rep < 7; rep++) {
    double t = omp_get_wtime(), total = 0;
#pragma omp parallel for schedule(static) reduction(+:total)
    for (long b = 0; b < n; b += 8192) {
      v8 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
      for (long i = b; i < b + 8192; i += 32) {
        a0 += *(const v8 *)(x + i); a1 += *(const v8 *)(x + i + 8);
        a2 += *(const v8 *)(x + i + 16); a3 += *(const v8 *)(x + i + 24);
      }
      v8 a = (a0 + a1) + (a2 + a3);
      for (int l = 0; l < 8; l++) total += a[l];
    }
    t = omp_get_wtime() - t;
    sink += total;
    if (n * 4.0 / t > best) best = n * 4.0 / t;
  }
  printf("%.3f\n", best / 1e9 + 0 * sink);
  return 0;
}
"""


def machine_limits(threads: int, workdir: Path) -> tuple[float, float]:
    """(FMA peak GFLOP/s, read bandwidth GB/s) with `threads` threads."""
    out = []
    for name, src in (("peak", PEAK_C), ("bandwidth", BANDWIDTH_C)):
        exe = workdir / name
        if not exe.exists():
            c = workdir / f"{name}.c"
            c.write_text(src)
            subprocess.run([os.environ.get("POLYC_CC", "gcc"), "-O3", "-march=native", "-fopenmp",
                            "-o", str(exe), str(c)], check=True)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="spread")
        out.append(float(subprocess.run([str(exe)], capture_output=True, text=True, env=env,
                                        check=True).stdout))
    return out[0], out[1]


# --- the cases -----------------------------------------------------------------------------

def _gelu_np(h):
    return 0.5 * h * (1.0 + np.tanh(np.float32(0.7978845608028654) * (h + np.float32(0.044715) * h * h * h)))


def _conv_silu_np(x, w, b):
    y = _conv_np(x, w) + b[:, None, None]
    return y / (1 + np.exp(-y))


def _conv_np(x, w, b=None, stride=1, pad=1):
    kh, kw = w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    win = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    win = win[:, :, ::stride, ::stride]
    y = np.tensordot(win, w, axes=([1, 4, 5], [1, 2, 3])).transpose(0, 3, 1, 2)
    return y if b is None else np.maximum(y + b[:, None, None], 0)


# the goals: polyc / peer at least this, per case (every thread count)
# (fused case, its contraction alone, the most the fused work may add to its time)
# (fused case, its contraction alone, goal or None)
EPILOGUES = (("linear+gelu 1024x1024 @ 1024x4096", "matmul 1024x1024 @ 1024x4096", 0.03),
             ("conv2d+bias+silu 1x64x56x56, 64 3x3", "conv2d 1x64x56x56, 64 3x3", None))
GOALS = {"linear+gelu 1024x1024 @ 1024x4096": {"numpy": 1.2, "torch.compile": 1.15},
         "conv2d 1x64x56x56, 64 3x3": {"torch": 1.05}}
CONV_GOAL = {"torch": 1.05}


def _rand(rng, *shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def cases():
    """name -> (graph builder, inputs, work, unit, numpy fn, torch fn (on torch tensors))"""
    import polyc
    rng = np.random.default_rng(0)

    def rand(*shape):
        return _rand(rng, *shape)

    out = []

    def matmul(name, sa, sb):
        def build():
            b = polyc.GraphBuilder(name)
            return b.build([b.matmul(b.input("a", sa), b.input("w", sb))])
        m, k = sa[-2:]
        n = sb[-1]
        batch = int(np.prod(sa[:-2])) if len(sa) > 2 else 1
        out.append((name, build, {"a": rand(*sa), "w": rand(*sb)}, 2.0 * batch * m * n * k,
                    "GFLOP/s", lambda a, w: a @ w, lambda t, a, w: t.matmul(a, w)))

    matmul("matmul 1024^3", (1024, 1024), (1024, 1024))
    matmul("matmul 512^3", (512, 512), (512, 512))
    matmul("matmul 127x255x383", (127, 383), (383, 255))
    matmul("batched 16x(256x64 @ 64x256)", (16, 256, 64), (16, 64, 256))
    # linear+gelu's matmul alone: the fused epilogue's cost is the difference
    matmul("matmul 1024x1024 @ 1024x4096", (1024, 1024), (1024, 4096))

    def linear_gelu():
        b = polyc.GraphBuilder("linear_gelu")
        x, w, bias = b.input("x", (1024, 1024)), b.input("w", (1024, 4096)), b.input("b", (4096,))
        return b.build([b.gelu(b.linear(x, w, bias), approximate="tanh")])
    out.append(("linear+gelu 1024x1024 @ 1024x4096", linear_gelu,
                {"x": rand(1024, 1024), "w": rand(1024, 4096), "b": rand(4096)},
                2.0 * 1024 * 1024 * 4096, "GFLOP/s", lambda x, w, b: _gelu_np(x @ w + b),
                lambda t, x, w, b: t.nn.functional.gelu(t.addmm(b, x, w), approximate="tanh")))

    def conv():
        b = polyc.GraphBuilder("conv2d")
        return b.build([b.conv2d(b.input("x", (1, 64, 56, 56)), b.input("w", (64, 64, 3, 3)),
                                 pads=[1, 1, 1, 1])])
    out.append(("conv2d 1x64x56x56, 64 3x3", conv,
                {"x": rand(1, 64, 56, 56), "w": rand(64, 64, 3, 3)},
                2.0 * 64 * 56 * 56 * 64 * 9, "GFLOP/s", _conv_np,
                lambda t, x, w: t.nn.functional.conv2d(x, w, padding=1)))

    def conv_silu():
        b = polyc.GraphBuilder("conv2d_silu")
        return b.build([b.silu(b.conv2d(b.input("x", (1, 64, 56, 56)), b.input("w", (64, 64, 3, 3)),
                                        b.input("b", (64,)), pads=[1, 1, 1, 1]))])
    out.append(("conv2d+bias+silu 1x64x56x56, 64 3x3", conv_silu,
                {"x": rand(1, 64, 56, 56), "w": rand(64, 64, 3, 3), "b": rand(64)},
                2.0 * 64 * 56 * 56 * 64 * 9, "GFLOP/s", _conv_silu_np,
                lambda t, x, w, b: t.nn.functional.silu(
                    t.nn.functional.conv2d(x, w, b, padding=1))))

    def rsum():
        b = polyc.GraphBuilder("reduce_sum")
        return b.build([b.reduce_sum(b.input("x", (8192, 8192)), axes=[1])])
    out.append(("reduce_sum 8192x8192 axis 1", rsum, {"x": rand(8192, 8192)}, 8192 * 8192 * 4.0,
                "GB/s", lambda x: x.sum(axis=1), lambda t, x: x.sum(dim=1)))
    return out


# ResNet-50's convolutions (torchvision's v1.5: the stride on each stage's first 3x3):
# (stage, input channels, input size, output channels, kernel, stride)
RESNET50_CONVS = [
    ("conv2", 64, 56, 64, 3, 1), ("conv2", 64, 56, 64, 1, 1), ("conv2", 256, 56, 64, 1, 1),
    ("conv2", 64, 56, 256, 1, 1),
    ("conv3", 128, 56, 128, 3, 2), ("conv3", 128, 28, 128, 3, 1), ("conv3", 512, 28, 128, 1, 1),
    ("conv3", 256, 56, 512, 1, 2),
    ("conv4", 256, 28, 256, 3, 2), ("conv4", 256, 14, 256, 3, 1), ("conv4", 1024, 14, 256, 1, 1),
    ("conv4", 512, 28, 1024, 1, 2),
    ("conv5", 512, 14, 512, 3, 2), ("conv5", 512, 7, 512, 3, 1), ("conv5", 2048, 7, 512, 1, 1),
    ("conv5", 1024, 14, 2048, 1, 2),
]


def resnet50_cases(batches=(1, 8)):
    """conv2d + bias + relu, one graph each, as ResNet-50 runs them in inference: the
    weights are constants of the graph (what an exported model's initializers become),
    which polyc packs once; the peers take them as tensors on every call."""
    import polyc
    rng = np.random.default_rng(0)
    out = []
    for batch in batches:
        for stage, c, size, o, k, stride in RESNET50_CONVS:
            pad = k // 2
            name = f"{stage} {batch}x{c}x{size}x{size}, {o} {k}x{k}" + (f" /{stride}" if stride > 1
                                                                       else "")
            w = _rand(rng, o, c, k, k) / np.float32(np.sqrt(c * k * k))

            def build(batch=batch, c=c, size=size, w=w, stride=stride, pad=pad):
                b = polyc.GraphBuilder("conv_bias_relu")
                weights = b.constant("w", w.shape, w.ravel().tolist())
                y = b.conv2d(b.input("x", (batch, c, size, size)), weights,
                             b.input("b", (w.shape[0],)), pads=[pad] * 4, strides=[stride, stride])
                return b.build([b.relu(y)])
            osize = (size + 2 * pad - k) // stride + 1
            out.append((name, build, {"x": _rand(rng, batch, c, size, size), "w": w,
                                      "b": _rand(rng, o)},
                        2.0 * batch * o * osize * osize * c * k * k, "GFLOP/s",
                        lambda x, w, b, s=stride, p=pad: _conv_np(x, w, b, s, p),
                        lambda t, x, w, b, s=stride, p=pad: t.relu(
                            t.nn.functional.conv2d(x, w, b, stride=s, padding=p))))
    return out


SUITES = {"main": cases, "resnet50": resnet50_cases}


def _gemm_kernels() -> list[str]:
    """The gemm microkernels the cpu target can build and this host can run."""
    from polyc.microkernels import registry
    from polyc.targets.cpu import cpu_machine, host_can_run
    target = cpu_machine()
    if not host_can_run(target.arch):
        return []
    return [m.name for m in registry.REGISTRY
            if m.kind == "gemm" and set(m.features) <= target.features]


def calibration(streaming: bool = False) -> str:
    """The measured speed of each gemm kernel, in cache or with B streaming from L2:
    what chose the default."""
    from polyc.microkernels import registry
    from polyc.targets.cpu import calibrate
    from polyc.targets.cpu import cpu_machine
    names = _gemm_kernels()
    rates = calibrate.rates(cpu_machine(), tuple(registry.by_name(n) for n in names), streaming)
    return ", ".join(f"{n} {rates[n]:.1f}" for n in names if n in rates)


def _check_result(case: str, got: np.ndarray, want: np.ndarray) -> None:
    """A speed of wrong results is no result: polyc's output must match numpy's."""
    if got.shape != want.shape:
        raise SystemExit(f"{case}: polyc's result has shape {got.shape}, numpy's {want.shape}")
    err = float(np.abs(got - want).max()) / max(float(np.abs(want).max()), 1e-30)
    if not err <= 1e-4:
        raise SystemExit(f"{case}: polyc's result differs from numpy's (relative error {err:.1e})")


def worker(threads: int, rounds: int, use_compile: bool, only: str = "",
           suite: str = "main") -> dict:
    """Runs in a process whose thread pools were sized by the environment."""
    from polyc.compiler import Options, compile
    try:
        import torch
        torch.set_num_threads(threads)
    except ImportError:
        torch = None
    rows, timed = {}, {}
    wanted = [w for w in only.split(",") if w]
    for name, build, inputs, work, unit, np_fn, torch_fn in SUITES[suite]():
        if wanted and not any(w in name for w in wanted):
            continue
        row: dict = {"unit": unit, "work": work}
        graph = build()
        compiled = compile(graph, options=Options(threads=threads))
        used = sorted({m for k in compiled.kernels for m in k.microkernels})
        row["kernel"] = ",".join(used) or "-"
        out = {o: np.empty(graph.types[o].shape, graph.types[o].dtype) for o in graph.outputs}
        args = list(inputs.values())  # the peers' arguments; polyc's, the graph's inputs
        inputs = {t.name: inputs[t.name] for t in graph.inputs}
        want = np_fn(*args)
        _check_result(name, compiled.program(inputs, out)[graph.outputs[0]], want)
        fns = {"polyc": lambda compiled=compiled, inputs=inputs, out=out:
               compiled.program(inputs, out)}
        # the gemm kernels polyc did not choose, each pinned, timed beside the choice (the
        # main suite only: the ResNet set is about the peers)
        others = {}
        # a Winograd convolution's alternatives: the direct one, and the other tile where
        # the plan takes it when allowed (F(4x4, 3x3): options.winograd_max_tile=4)
        over = {}
        if "winograd_f2x3" in used:
            over = {"direct": ({"winograd": False}, ""),
                    "winograd 4x4": ({"winograd_max_tile": 4}, "winograd_f4x3")}
        elif "winograd_f4x3" in used:
            over = {"direct": ({"winograd": False}, ""),
                    "winograd 2x2": ({"winograd_tile": 2}, "winograd_f2x3")}
        for alt, (asked, runs_on) in over.items():
            other = compile(graph, options=Options(threads=threads, **asked))
            if runs_on and all(runs_on not in k.microkernels for k in other.kernels):
                continue  # the plan does not take that tile here
            _check_result(f"{name} {alt}", other.program(inputs, out)[graph.outputs[0]], want)
            others[alt] = lambda other=other, inputs=inputs, out=out: other.program(inputs, out)
        if suite == "main":
            fns["numpy"] = lambda np_fn=np_fn, args=args: np_fn(*args)
            for alt in _gemm_kernels() if any(m.startswith("sgemm") for m in used) else ():
                if alt in used:
                    continue
                other = compile(graph, options=Options(threads=threads, gemm_kernel=alt))
                _check_result(f"{name} on {alt}", other.program(inputs, out)[graph.outputs[0]],
                              want)
                others[alt] = lambda other=other, inputs=inputs, out=out: \
                    other.program(inputs, out)
        if torch is not None:
            targs = [torch.from_numpy(a) for a in args]
            fns["torch"] = lambda torch_fn=torch_fn, targs=targs: torch_fn(torch, *targs)
            if use_compile:
                try:
                    cfn = torch.compile(lambda *a, torch_fn=torch_fn: torch_fn(torch, *a))
                    with torch.no_grad():
                        _check_result(f"{name} (torch.compile)", cfn(*targs).numpy(), want)
                    fns["torch.compile"] = lambda cfn=cfn, targs=targs: cfn(*targs)
                except Exception as e:  # no C++ compiler, an unsupported op, ...
                    row["torch.compile error"] = str(e).splitlines()[0][:80]
        rows[name], timed[name] = (row, fns, others), {**fns, **others}

    def progress(r: int) -> None:
        print(f"  [{threads} thread(s)] round {r + 1} of {rounds}: done", file=sys.stderr,
              flush=True)
    with torch.no_grad() if torch is not None else contextlib.nullcontext():
        times = spread_best_times(timed, rounds=rounds, clock=clock_for(threads),
                                  progress=progress)
        epilogues = {fused: _paired_epilogue(rows, threads, fused, alone)
                     for fused, alone, _ in EPILOGUES if fused in rows and alone in rows}
        paired = {name: paired_with(fns, "torch", times[name]["polyc"], threads)
                  for name, (_, fns, _) in rows.items() if "torch" in fns}
    results = {}
    for name, (row, fns, others) in rows.items():
        work = row.pop("work")
        row["values"] = {lib: work / t / 1e9 for lib, t in times[name].items() if lib in fns}
        row["alternatives"] = {alt: work / times[name][alt] / 1e9 for alt in others}
        if name in paired:
            row["paired"] = paired[name]
        results[name] = row
    for fused, epilogue in epilogues.items():
        results[fused]["epilogue"] = epilogue
    return results


def _paired_epilogue(rows: dict, threads: int, fused: str, alone: str) -> dict:
    """The fused epilogue's cost measured call by call (`paired_ratio`): the fused case's
    polyc over its contraction's alone, less one, as quartiles."""
    pairs = 40
    median, q1, q3 = paired_ratio(rows[fused][1]["polyc"], rows[alone][1]["polyc"],
                                  pairs=pairs, clock=clock_for(threads))
    return {"alone": alone, "pairs": pairs, "cost": median - 1, "quartiles": [q1 - 1, q3 - 1]}


# seconds a case's pairs of calls may take, and the fewest and most pairs
PAIRED_S, PAIRS = 4.0, (10, 40)


def paired_with(fns: dict, peer: str, best_s: float, threads: int) -> dict:
    """polyc's speed over `peer`'s (torch eager, torch.compile), call by call
    (`paired_ratio`): beside the ratio of best times, one that a slow spell of the host
    cannot give to either side (it moves both calls of a pair). Pools are left to go
    idle before each call at two threads (a few ms of libgomp's spinning), then woken
    by untimed calls."""
    pairs = max(PAIRS[0], min(PAIRS[1], int(PAIRED_S / (2 * best_s))))
    median, q1, q3 = paired_ratio(fns[peer], fns["polyc"], pairs=pairs,
                                  clock=clock_for(threads),
                                  settle_s=0.02 if threads > 1 else 0.0)
    return {"peer": peer, "pairs": pairs, "ratio": median, "quartiles": [q1, q3]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--suite", default="main", choices=list(SUITES))
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where the table's JSON and plots go (default: %(default)s)")
    parser.add_argument("--cases", default="",
                        help="comma-separated substrings: run only the cases whose name has one")
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.rounds, not args.no_compile, args.cases,
                                args.suite)))
        return 0
    counts = [int(t) for t in args.threads.split(",")]
    limits, results = {}, {}
    with tempfile.TemporaryDirectory(prefix="polyc-bench-") as tmp:
        for t in counts:
            limits[t] = machine_limits(t, Path(tmp))
            env = dict(os.environ, OMP_NUM_THREADS=str(t), OPENBLAS_NUM_THREADS=str(t),
                       MKL_NUM_THREADS=str(t))
            cmd = [sys.executable, __file__, "--worker", str(t), "--rounds", str(args.rounds),
                   "--suite", args.suite]
            cmd += ["--no-compile"] if args.no_compile else []
            cmd += ["--cases", args.cases] if args.cases else []
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
            results[t] = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"gemm kernels measured in cache (GFLOP/s, 1 thread): {calibration()}")
    print(f"... and streaming from L2: {calibration(streaming=True)}")
    rows = table_rows(counts, limits, results, args.suite)
    print(table(counts, limits, rows))
    name = "bench_cpu" + ("" if args.suite == "main" else f"_{args.suite}")
    title = ("polyc's CPU kernels vs numpy, PyTorch eager, torch.compile" if args.suite == "main"
             else "ResNet-50 convolutions (+bias+relu) vs PyTorch eager (oneDNN)")
    path = save_table(name, title, rows, out_dir=args.out)
    print("goals:", *goal_lines({"better": "higher", "rows": rows}), *epilogue_lines(rows),
          *paired_lines(rows), sep="\n")
    print(f"wrote {path} (and its plot)")
    return 0


def paired_lines(rows: list[dict]) -> list[str]:
    """Each case's speed over its peer's call by call (`paired_with`), and how many cases
    of each thread count pass their goal against that peer that way."""
    lines, passed = [], {}
    for r in rows:
        p = r.get("paired")
        if not p:
            continue
        goal = r.get("goals", {}).get(p["peer"])
        q1, q3 = p["quartiles"]
        lines.append(f"  {r['case']} ({r['threads']} thr): in pairs of calls {p['ratio']:.2f}x "
                     f"{p['peer']} (median of {p['pairs']}, quartiles {q1:.2f}x {q3:.2f}x)")
        if goal:
            key = (r["threads"], p["peer"])
            n, total = passed.get(key, (0, 0))
            passed[key] = (n + (p["ratio"] >= goal), total + 1)
    lines += [f"  in pairs of calls, {n} of {total} cases at {t} thread(s) meet their goal "
              f"against {peer}" for (t, peer), (n, total) in passed.items()]
    return lines


def epilogue_lines(rows: list[dict]) -> list[str]:
    """The fused epilogue's cost: polyc's time on the fused case over its time on the
    contraction alone, call by call in the same run (`_paired_epilogue`), less one."""
    lines = []
    for fused, alone, goal in EPILOGUES:
        for r in rows:
            e = r.get("epilogue")
            if r["case"] == fused and e:
                q1, q3 = e["quartiles"]
                verdict = "" if goal is None else (f", goal under {100 * goal:.0f}%: "
                                                   + ("met" if e["cost"] < goal else "NOT met"))
                lines.append(f"  {fused} ({r['threads']} thr): its epilogue "
                             f"{100 * e['cost']:+.1f}% over {alone} (median of {e['pairs']} "
                             f"pairs of calls, quartiles {100 * q1:+.1f}% {100 * q3:+.1f}%)"
                             + verdict)
    return lines


def table_rows(counts, limits, results, suite: str) -> list[dict]:
    """The report's rows, case-major, with the machine's limit and the issue's goals."""
    rows = []
    for name in results[counts[0]]:
        for t in counts:
            r = results[t][name]
            peak, bw = limits[t]
            limit = ({"label": "read bandwidth", "value": bw} if r["unit"] == "GB/s"
                     else {"label": "FMA peak", "value": peak})
            goals = CONV_GOAL if suite == "resnet50" else GOALS.get(name, {})
            rows.append({"case": name, "threads": t, "unit": r["unit"], "values": r["values"],
                         "limit": limit, "goals": goals, "kernel": r["kernel"],
                         "clock": clock_name(t),
                         "alternatives": r["alternatives"],
                         **{k: r[k] for k in ("epilogue", "paired") if k in r}})
    return rows


def table(counts, limits, rows) -> str:
    def f(v):
        return "-" if v is None else f"{v:.1f}"

    lines = ["machine: " + ", ".join(f"{t} thread(s): FMA peak {limits[t][0]:.1f} GFLOP/s, "
                                     f"read bandwidth {limits[t][1]:.1f} GB/s" for t in counts)]
    head = (f"{'case':36} {'thr':>3} {'unit':>7} {'polyc':>7} {'numpy':>7} {'torch':>7} "
            f"{'compile':>7} {'x numpy':>7} {'x torch':>7} {'x comp.':>7} {'of peak':>7}  kernel "
            "[the others, pinned]")
    lines += [head, "-" * len(head)]
    for r in rows:
        v = r["values"]

        def vs(peer):
            return f"{v['polyc'] / v[peer]:.2f}x" if v.get(peer) else "-"
        lines.append(f"{r['case']:36} {r['threads']:>3} {r['unit']:>7} {f(v['polyc']):>7} "
                     f"{f(v.get('numpy')):>7} {f(v.get('torch')):>7} "
                     f"{f(v.get('torch.compile')):>7} {vs('numpy'):>7} {vs('torch'):>7} "
                     f"{vs('torch.compile'):>7} {100 * v['polyc'] / r['limit']['value']:>6.0f}%  "
                     f"{r['kernel']}"
                     + (" [" + ", ".join(f"{k.removeprefix('sgemm_')} {f(x)}" for k, x in
                                         r["alternatives"].items()) + "]"
                        if r.get("alternatives") else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
