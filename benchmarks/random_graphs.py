"""Random graphs of medium size, compiled and run against the reference executor.

    python benchmarks/random_graphs.py [--seconds 600 | --graphs N] [--seed 0] [--out DIR]
                                       [--targets cpu,manycore,npu]

Where `tests/test_hypothesis_graphs.py` draws small chains (dims up to 6, the gcc build
the cost), these reach the paths only larger shapes take: matmuls and linear layers on
the gemm microkernels with their epilogues, convolutions of every pad, stride and
dilation (Winograd's tiles among them, asked for or allowed at random), softmax,
log_softmax, the norms and logsumexp over any axis, attention (causal or not), and
reductions over several axes with a consumer of the input beside them; on the cpu at 1
or 2 threads. Values keep the outputs well conditioned (weights scaled by their fan-in,
a layer_norm over 16 values or more), so an output off the reference beyond float32's
rounding of its sums is a bug. Each graph that fails (a wrong output, a crash, a C that
does not build) is written to DIR as JSON with its options and target; a graph a target
refuses with a GraphError (a chip's scratchpad too small for a tile) is counted apart,
and the refusals are printed at the end by target, kind and reason (numbers masked).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

import polyc
from polyc.errors import GraphError
from polyc.graph.reference import run_reference


class Draw:
    """A graph's random choices, from one generator."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def pick(self, choices):
        return choices[self.int(0, len(choices) - 1)]

    def weights(self, b: polyc.GraphBuilder, name: str, shape: tuple, fan_in: int):
        """Weights scaled by their fan-in, as a constant or an input."""
        if self.int(0, 1):
            value = self.rng.uniform(-1, 1, shape) / np.sqrt(fan_in)
            return b.constant(name, shape, value.astype(np.float32).ravel().tolist())
        return b.input(name, shape)

    def epilogue(self, b: polyc.GraphBuilder, y: str, shape: tuple) -> str:
        for k in range(self.int(0, 2)):
            op = self.pick(["relu", "gelu", "silu", "tanh", "sigmoid", "bias", "residual"])
            if op == "bias":
                y = b.add(y, b.input(f"bias{k}", shape[-1:]))
            elif op == "residual":
                y = b.add(y, b.input(f"residual{k}", shape))
            else:
                y = b.op(op, y)
        return y


def matmul(d: Draw, b: polyc.GraphBuilder) -> tuple[list[str], dict]:
    batch = tuple(d.int(1, 3) for _ in range(d.int(0, 2)))
    m, n, k = d.int(1, 160), d.int(1, 160), d.int(1, 200)
    ta, tb = bool(d.int(0, 1)), bool(d.int(0, 1))
    a = b.input("a", batch + ((k, m) if ta else (m, k)))
    w = d.weights(b, "w", (n, k) if tb else (k, n), k)
    y = b.matmul(a, w, transpose_a=ta, transpose_b=tb)
    return [d.epilogue(b, y, batch + (m, n))], {}


def conv2d(d: Draw, b: polyc.GraphBuilder) -> tuple[list[str], dict]:
    n, c, o = d.int(1, 3), d.pick([1, 3, 8, 16, 32, 33, 48, 64]), d.pick([1, 4, 16, 32, 40, 64])
    k = d.pick([1, 3, 3, 3, 5])
    stride, dilation = d.pick([1, 1, 1, 2]), d.pick([1, 1, 1, 2]) if k > 1 else 1
    pads = [d.int(0, 2) for _ in range(4)] if d.int(0, 2) else [k // 2] * 4
    reach = dilation * (k - 1) + 1  # the window's extent: every image at least covers it
    h = d.int(max(1, reach - pads[0] - pads[2]), 30)
    w = d.int(max(1, reach - pads[1] - pads[3]), 30)
    args = [b.input("x", (n, c, h, w)), d.weights(b, "w", (o, c, k, k), c * k * k)]
    if d.int(0, 1):
        args.append(b.input("c", (o,)))
    y = b.conv2d(*args, pads=pads, strides=[stride] * 2, dilations=[dilation] * 2)
    oh = (h + pads[0] + pads[2] - reach) // stride + 1
    ow = (w + pads[1] + pads[3] - reach) // stride + 1
    options = d.pick([{}, {}, {"winograd_tile": 2}, {"winograd_tile": 4},
                      {"winograd_max_tile": 4}])
    return [d.epilogue(b, y, (n, o, oh, ow))], options


def row_op(d: Draw, b: polyc.GraphBuilder) -> tuple[list[str], dict]:
    shape = tuple(d.int(16 if i == 0 else 1, 300 if i == 0 else 90) for i in range(d.int(1, 3)))
    axis = d.int(-len(shape), len(shape) - 1)
    x = b.input("x", shape)
    op = d.pick(["softmax", "log_softmax", "layer_norm", "rms_norm", "logsumexp"])
    if op == "logsumexp":
        return [b.logsumexp(x, axes=[axis], keepdims=bool(d.int(0, 1)))], {}
    if op in ("layer_norm", "rms_norm") and shape[axis] < 16:
        axis = 0  # over a few values a norm's output is its rounding
    return [b.op(op, x, axis=axis)], {}


def attention(d: Draw, b: polyc.GraphBuilder) -> tuple[list[str], dict]:
    batch = tuple(d.int(1, 3) for _ in range(d.int(0, 2)))
    causal = bool(d.int(0, 1))
    lq, dk, dv = d.int(1, 130), d.pick([8, 16, 17, 32, 64]), d.pick([5, 8, 16, 32, 64])
    lk = lq if causal else d.int(1, 130)
    q, k, v = (b.input(name, batch + shape) for name, shape in
               (("q", (lq, dk)), ("k", (lk, dk)), ("v", (lk, dv))))
    scale = {} if d.int(0, 1) else {"scale": 0.3}
    return [d.epilogue(b, b.attention(q, k, v, causal=causal, **scale), batch + (lq, dv))], {}


def linear(d: Draw, b: polyc.GraphBuilder) -> tuple[list[str], dict]:
    lead = tuple(d.int(1, 40) for _ in range(d.int(1, 2)))
    fan_in, out = d.int(1, 200), d.int(16, 200)
    x = b.input("x", lead + (fan_in,))
    args = [x, d.weights(b, "w", (fan_in, out), fan_in)] + ([b.input("c", (out,))]
                                                           if d.int(0, 1) else [])
    y = b.gelu(b.linear(*args), approximate=d.pick(["none", "tanh"]))
    return [b.layer_norm(y) if d.int(0, 1) else y], {}


def reduction(d: Draw, b: polyc.GraphBuilder) -> tuple[list[str], dict]:
    shape = tuple(d.int(1, 70) for _ in range(d.int(1, 4)))
    x = b.input("x", shape)
    axes = sorted({d.int(0, len(shape) - 1) for _ in range(d.int(1, len(shape)))})
    source = b.op(d.pick(["abs", "tanh", "neg", "exp"]), x) if d.int(0, 1) else x
    op = d.pick(["reduce_sum", "reduce_max", "reduce_min", "reduce_mean"])
    outputs = [b.op(op, source, axes=axes, keepdims=bool(d.int(0, 1)))]
    if d.int(0, 1):  # a consumer of the input beside the reduction
        outputs.append(b.sub(x, b.reduce_max(x, axes=axes, keepdims=True)))
    return outputs, {}


KINDS = (matmul, conv2d, row_op, attention, linear, reduction)


def check(graph, target: str, options: dict, seed: int) -> str | None:
    """Why the compiled graph is wrong, or None; a GraphError (a refusal) is raised."""
    rng = np.random.default_rng(seed)
    values = {t.name: rng.uniform(-1.5, 1.5, t.type.shape).astype(np.float32)
              for t in graph.inputs}
    got = polyc.compile(graph, target, options=options)(**values)
    want = run_reference(graph, values)
    for name in graph.outputs:
        scale = 1.0 + float(np.max(np.abs(want[name]), initial=0.0))
        # Winograd's F(4x4, 3x3) rounds several times F(2x2, 3x3)'s (winograd.py)
        four = 4 in (options.get("winograd_tile"), options.get("winograd_max_tile"))
        tol = 1e-3 if four else 1e-4
        if not np.allclose(got[name], want[name], rtol=tol, atol=tol * scale):
            return f"{name}: max abs error {float(np.max(np.abs(got[name] - want[name]))):.3g}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--graphs", type=int, help="stop after N graphs (the same N for a seed)")
    parser.add_argument("--targets", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("random-graph-failures"))
    args = parser.parse_args(argv)
    targets = args.targets.split(",")
    d = Draw(np.random.default_rng(args.seed))
    deadline = time.monotonic() + args.seconds
    counts = {"ok": 0, "refused": 0, "failed": 0}
    refusals: Counter = Counter()
    while time.monotonic() < deadline and sum(counts.values()) != args.graphs:
        kind, target = d.pick(KINDS), d.pick(targets)
        b = polyc.GraphBuilder(kind.__name__)
        outputs, options = kind(d, b)
        graph = b.build(outputs)
        options = ({**options, "threads": d.pick([1, 2])} if target == "cpu" else {})
        try:
            why = check(graph, target, options, d.int(0, 2**31))
        except GraphError as e:
            counts["refused"] += 1
            refusals[target, kind.__name__, re.sub(r"\d+", "N", str(e))[:160]] += 1
            continue
        except Exception as e:  # noqa: BLE001 (any other failure is a finding)
            why = f"{type(e).__name__}: {str(e)[:300]}"
        if why is None:
            counts["ok"] += 1
            continue
        counts["failed"] += 1
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / f"{kind.__name__}-{args.seed}-{sum(counts.values())}.json"
        path.write_text(json.dumps({"graph": graph.to_json(), "target": target,
                                    "options": options, "why": why}))
        print(f"{target} {kind.__name__} {options}: {why} ({path})", flush=True)
    print(f"{sum(counts.values())} graphs: {counts['ok']} match, {counts['refused']} refused "
          f"by a GraphError, {counts['failed']} failed")
    for (target, kind, why), n in refusals.most_common():
        print(f"  refused {n:4} {target} {kind}: {why}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
