"""A layer with its weights as constants, through each way in: the Python API, the
compile service, the browser view.

    python benchmarks/bench_weights.py [--batch 8] [--channels 256] [--size 14]

The layer is conv2d(x, w, b) + relu, 3x3, pad 1, its weights a constant (590K floats at
256 channels: 13 MB of JSON). It prints, each the min and median of a few runs:

1. the compile of its JSON document through `polyc.compile`, the object cached after
   the first (what the weights add: the same layer with them as an input beside it);
2. through `polyc serve` (one worker, a fresh cache): a miss per run (each with weights
   of its own), then a hit;
3. the browser view (headless Chromium through Playwright, where both are installed):
   opening the result's page until its kernels are shown.

The compiled layer is checked against numpy before anything is timed. Times are wall
seconds on a shared machine: compare runs on one host, not across hosts.
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cpu import _conv_np  # noqa: E402

RUNS = 4


def layer(batch: int, channels: int, size: int, seed: int, weights_as_input: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    w = (rng.uniform(-1, 1, (channels, channels, 3, 3)) / np.sqrt(9 * channels)).astype(np.float32)
    inputs = [{"name": "x", "shape": [batch, channels, size, size]}, {"name": "b", "shape": [channels]}]
    doc = {"name": "conv_relu", "inputs": inputs,
           "nodes": [{"op": "conv2d", "inputs": ["x", "w", "b"], "outputs": ["c"],
                      "attrs": {"pads": [1, 1, 1, 1]}},
                     {"op": "relu", "inputs": ["c"], "outputs": ["y"]}],
           "outputs": ["y"]}
    if weights_as_input:
        inputs.append({"name": "w", "shape": list(w.shape)})
    else:
        doc["constants"] = [{"name": "w", "shape": list(w.shape), "data": w.ravel().tolist()}]
    return doc


def check(doc: dict, batch: int, channels: int, size: int) -> None:
    from polyc import compile

    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (batch, channels, size, size)).astype(np.float32)
    b = rng.uniform(-1, 1, channels).astype(np.float32)
    w = np.asarray(doc["constants"][0]["data"], np.float32).reshape(channels, channels, 3, 3)
    got = compile(doc)(x=x, b=b)["y"]
    want = np.maximum(_conv_np(x, w, b, 1, 1), 0)
    err = float(np.abs(got - want).max())
    if err > 1e-3:
        raise SystemExit(f"the compiled layer differs from numpy by {err}")


def timed(fn, runs: int = RUNS) -> tuple[float, float]:
    times = []
    for i in range(runs):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def in_process(args) -> list[tuple[str, tuple[float, float]]]:
    from polyc import compile

    rows = []
    for label, as_input in (("polyc.compile, weights a constant", False),
                            ("polyc.compile, weights an input", True)):
        text = json.dumps(layer(args.batch, args.channels, args.size, 0, as_input))
        compile(json.loads(text))  # the object cached: what follows is polyc's own time
        docs = [json.loads(text) for _ in range(RUNS)]
        rows.append((label, timed(lambda i: compile(docs[i]))))
    return rows


def service(args) -> tuple[list[tuple[str, tuple[float, float]]], str]:
    import httpx

    from polyc.server.testing import ServerProcess

    rows = []
    with tempfile.TemporaryDirectory(prefix="polyc-bench-") as tmp, \
            ServerProcess(f"sqlite:///{tmp}/cache.sqlite3", workers=1, log_dir=tmp) as server:
        bodies = [json.dumps({"graph": layer(args.batch, args.channels, args.size, seed)})
                  for seed in range(1, RUNS + 2)]

        def post(i: int) -> str:
            r = httpx.post(server.url + "/v1/compile", content=bodies[i],
                           headers={"content-type": "application/json"}, timeout=300)
            r.raise_for_status()
            return r.json()["key"]

        post(RUNS)  # the worker's first compile: imports and the gemm kernels' parts
        rows.append(("service, a miss", timed(post)))
        rows.append(("service, a hit", timed(lambda i: post(0))))
        key = post(0)
        browser = page_times(server.url, key)
        if isinstance(browser, str):
            return rows, browser
        rows.append(("browser view, the page shown", browser))
    return rows, ""


def page_times(url: str, key: str) -> tuple[float, float] | str:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright import sync_api
    except ImportError:
        return "browser view: skipped (playwright is not installed)"
    if chromium is None:
        return "browser view: skipped (no chromium)"
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
        page = browser.new_page()
        page.set_default_timeout(300_000)

        def show(i: int) -> None:
            page.goto(f"{url}/k/{key}")
            page.wait_for_selector("details.kernel")

        try:
            return timed(show)
        finally:
            browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--channels", type=int, default=256)
    parser.add_argument("--size", type=int, default=14)
    args = parser.parse_args()
    check(layer(args.batch, args.channels, args.size, 0), args.batch, args.channels, args.size)
    rows = in_process(args)
    more, skipped = service(args)
    rows += more
    n = args.channels * args.channels * 9
    print(f"{args.batch}x{args.channels}x{args.size}x{args.size} to {args.channels} 3x3 + relu, "
          f"{n:,} weights ({len(json.dumps(layer(args.batch, args.channels, args.size, 0))):,} "
          "bytes of JSON); seconds, min and median of "
          f"{RUNS}:")
    for label, (low, mid) in rows:
        print(f"  {label:38s} {low:7.3f} {mid:7.3f}")
    if skipped:
        print(f"  {skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
