"""torch.compile with polyc's backend against eager PyTorch and Inductor, in one run.

    python benchmarks/bench_torch_backend.py [--threads 1] [--no-inductor]

Cases: the transformer block of `examples/torch_block.py` (batch 2, 64 tokens, width
128), and the fused ops alone: softmax, layer_norm and linear + gelu, and a softmax so
small that its time is the call's cost in each backend; then the block over
a dynamic length (one image, `mark_dynamic` on the tokens), compiled at 64 tokens and
timed at 200, which neither compile saw (polyc's one symbolic compile, Inductor's dynamic
one). Each is compiled
with `backend=polyc.torch_backend` and with Inductor (`torch.compile`'s default), checked
against eager, then timed in turns (`machine.best_times`) under `torch.no_grad()`. The
ratios are eager's or Inductor's time over polyc's (above 1: polyc is faster); the
polyc column is the whole call through torch.compile's guards, AOTAutograd's wrapper and
the partition's Python, not the kernels alone. Compile time is the first call's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from machine import best_times, set_threads  # noqa: E402


def cases(torch):
    import torch.nn.functional as F
    from torch_block import Block

    torch.manual_seed(0)
    block = Block().eval()
    linear = torch.nn.Linear(1024, 1024)
    dynamic = torch.randn(1, 64, 128)
    torch._dynamo.mark_dynamic(dynamic, 1)
    return {
        "transformer block 2x64x128": (block, (torch.randn(2, 64, 128),)),
        "softmax 1024x1024": (lambda x: torch.softmax(x, -1), (torch.randn(1024, 1024),)),
        "layer_norm 1024x1024": (lambda x, g, b: F.layer_norm(x, (1024,), g, b),
                                 (torch.randn(1024, 1024), torch.randn(1024),
                                  torch.randn(1024))),
        "linear+gelu 256x1024x1024": (lambda x: F.gelu(linear(x)), (torch.randn(256, 1024),)),
        # microseconds of kernel: the rest is each backend's cost per call
        "softmax 8x64 (a call's cost)": (lambda x: torch.softmax(x, -1), (torch.randn(8, 64),)),
        "block 1xTx128, T=200 dyn.": (block, (dynamic,), (torch.randn(1, 200, 128),)),
    }


def _compiled(torch, fn, args, **kw):
    start = time.perf_counter()
    compiled = torch.compile(fn, **kw)
    compiled(*args)
    return compiled, time.perf_counter() - start


def main() -> int:
    import torch

    import polyc

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--no-inductor", action="store_true")
    args = parser.parse_args()
    set_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s)")
    head = (f"{'case':30} {'compile s':>9} {'eager ms':>9} {'inductor':>9} {'polyc ms':>9} "
            f"{'eager/polyc':>11} {'ind./polyc':>10}")
    print(head)
    print("-" * len(head))
    with torch.no_grad():
        for name, (fn, inputs, *timed) in cases(torch).items():
            torch._dynamo.reset()  # a dynamic case's compiles start from its own inputs
            polyc_fn, seconds = _compiled(torch, fn, inputs, backend=polyc.torch_backend)
            inductor = None if args.no_inductor else _compiled(torch, fn, inputs)[0]
            inputs = timed[0] if timed else inputs  # a dynamic case: sizes not compiled for
            fns = {"eager": lambda: fn(*inputs), "polyc": lambda: polyc_fn(*inputs)}
            if inductor is not None:
                fns["inductor"] = lambda: inductor(*inputs)
            expected = fn(*inputs)
            err = (polyc_fn(*inputs) - expected).abs().max().item()
            if not torch.allclose(polyc_fn(*inputs), expected, rtol=1e-4, atol=1e-4):
                print(f"{name}: polyc differs from eager by {err:.3g}")
                return 1
            t = best_times(fns)
            ind = t.get("inductor")
            print(f"{name:30} {seconds:9.2f} {t['eager'] * 1e3:9.3f} "
                  f"{ind * 1e3 if ind else float('nan'):9.3f} {t['polyc'] * 1e3:9.3f} "
                  f"{t['eager'] / t['polyc']:11.2f} "
                  f"{ind / t['polyc'] if ind else float('nan'):10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
