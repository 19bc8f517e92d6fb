"""The AKG composite-kernel corpus as conformance: import, compile, run, compare.

    python benchmarks/akg_corpus.py CORPUS [--sample N] [--timeout S] [--jobs J]
                                    [--results FILE.jsonl] [--run-limit MIB]
                                    [--target cpu|manycore|npu]
    python benchmarks/akg_corpus.py --report FILE.jsonl      # the tables of a past run

CORPUS is the folder of `.info` files (e.g. shared/corpus/akg-composite, or the sample
vendored in tests/data/akg); without it (or `POLYC_AKG_CORPUS`) the script says so and
exits. Each file is imported (`polyc.import_akg`), compiled for the target (the cpu
unless --target names a simulated chip: its runtime runs the kernels here), run on seeded
inputs and compared with the numpy reference executor, in a worker process with a time
limit (a file that hangs or kills its worker is recorded, and the next file gets a
fresh worker). Graphs whose tensors hold more than --run-limit MiB are compiled only.

Verdicts: match; refused (a GraphError: the reason is its message); wrong (outputs
differ beyond the tolerance of their dtype, and are less accurate than the reference
executor: see `ill_conditioned`); crashed (any other exception, or the
worker died); timeout; compiled (too large to run here). Compile times are cold: the run
builds into a cache of its own (POLYC_CACHE_DIR, made empty), where a first, untimed
compile measures the gemm kernels and builds the prebuilt parts and the precompiled
prelude, as a service does once per machine; a file whose C an earlier file of the run
produced reuses its object, as on a build server. The tables: by network and by
verdict, compile-time percentiles, the refusals by reason, and fusion quality: how many
compiled graphs are one kernel (AKG made one of each), and for the others the reasons
the fusion oracle gave for the proposals it rejected.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

VERDICTS = ("match", "refused", "wrong", "crashed", "timeout", "compiled")
# |got - ref| <= ATOL * max(1, max|ref|) + RTOL * |ref|, per output dtype
TOLERANCE = {"float32": (1e-4, 1e-5), "float64": (1e-9, 1e-12), "float16": (4e-3, 1e-3)}


def corpus_files(corpus: Path) -> list[Path]:
    return sorted(p for p in corpus.rglob("*.info") if p.is_file())


def sample(files: list[Path], n: int | None) -> list[Path]:
    """n files spread evenly over the sorted list (every network gets its share)."""
    if n is None or n >= len(files):
        return files
    return [files[(k * len(files)) // n] for k in range(n)]


def network_of(path: Path, corpus: Path) -> str:
    """networks/<backend>/<network>/... -> <network>; composite/<x>/... -> composite/<x>."""
    parts = path.relative_to(corpus).parts
    if parts[0] == "networks" and len(parts) > 3:
        return parts[2]
    return "/".join(parts[:2]) if len(parts) > 2 else parts[0]


def compare(got: np.ndarray, ref: np.ndarray) -> float | None:
    """None when `got` matches `ref` within its dtype's tolerance, else the worst
    error relative to the tolerance (> 1)."""
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return float("inf")
    if ref.dtype.kind not in "f":
        return None if np.array_equal(got, ref) else float("inf")
    rtol, atol = TOLERANCE[str(ref.dtype)]
    g, r = got.astype(np.float64), ref.astype(np.float64)
    same = (g == r) | (np.isnan(g) & np.isnan(r))
    scale = max(1.0, float(np.max(np.abs(r[np.isfinite(r)]), initial=0.0)))
    err = np.where(same, 0.0, np.abs(g - r) / (atol * scale + rtol * np.abs(r)))
    worst = float(np.nan_to_num(err, nan=np.inf).max(initial=0.0))
    return None if worst <= 1.0 else worst


def _in_float64(doc):
    """A graph document with every float type (tensors, `cast` targets) float64."""
    if isinstance(doc, dict):
        return {k: _in_float64(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_in_float64(v) for v in doc]
    return "float64" if doc in ("float32", "float16") else doc


def ill_conditioned(graph, inputs, got, ref, errors) -> str:
    """Why outputs off by more than the tolerance are no worse than float32 allows (''
    if they are worse). The reference rounds every op's result to float32; the cpu
    target also reassociates sums and contracts multiply-adds. On a graph whose outputs
    are ill-conditioned in its inputs (near-cancelling denominators) both orders are far
    from the exact value, so each is measured against the graph evaluated in float64.
    polyc's worst error there is float32's own accuracy, not a wrong answer, when it is
    within twice the reference's, or within how far the float64 value itself moves when
    the inputs move by one float32 rounding (an ulp, up or down at random, three draws):
    no float32 evaluation, whose every intermediate is rounded so, can be expected
    nearer."""
    import polyc
    from polyc.graph.reference import run_reference
    exact_graph = polyc.load_graph(_in_float64(graph.to_json()))
    wide = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in inputs.items()}
    exact = run_reference(exact_graph, wide)
    rng = np.random.default_rng(0)
    moved = [run_reference(exact_graph, {
        k: v * (1 + rng.choice([-1.0, 1.0], v.shape) * 2.0 ** -24) if v.dtype.kind == "f"
        else v for k, v in wide.items()}) for _ in range(3)]
    notes = []
    for name in errors:
        if ref[name].dtype.kind != "f":
            return ""
        truth = exact[name]
        ours = float(np.nanmax(np.abs(got[name].astype(np.float64) - truth)))
        theirs = float(np.nanmax(np.abs(ref[name].astype(np.float64) - truth)))
        spread = max(float(np.nanmax(np.abs(m[name] - truth))) for m in moved)
        if not (ours <= 2 * theirs or ours <= spread):
            return ""
        notes.append(f"{name}: off by {ours:.3g} from float64, the reference by {theirs:.3g}; "
                     f"an ulp on the inputs moves float64's by {spread:.3g}")
    return "ill-conditioned: " + "; ".join(notes)


def oracle_rejections(compiled) -> list[str]:
    """The reasons of the fusion proposals the oracle rejected, with names and numbers
    taken out so that like reasons count together."""
    out = []
    for line in compiled.fusion.report:
        if ": rejected: " in line:
            reason = line.split(": rejected: ", 1)[1]
            reason = re.sub(r"'[^']*'|\{[^}]*\}|\b[\w.]+\.\w+\b", "X", reason)
            out.append(re.sub(r"\d+(\.\d+)?", "N", reason))
    return out


def check_file(path: Path, *, seed: int = 0, run_limit_mib: float = 3072,
               target: str = "cpu") -> dict:
    """The verdict on one file (see the module docstring), with its details."""
    import polyc
    from polyc.errors import GraphError
    from polyc.graph.load import Limits
    from polyc.graph.reference import random_inputs, run_reference
    big = Limits(max_elements=1 << 34, max_total_elements=1 << 36)
    result: dict = {"file": str(path)}
    try:
        graph = polyc.import_akg(path, limits=big)
    except GraphError as e:
        return {**result, "verdict": "refused", "reason": str(e.problems[0])[:300]}
    try:
        start = time.perf_counter()
        compiled = polyc.compile(graph, target, limits=big)
        result["compile_s"] = time.perf_counter() - start
        result["kernels"] = len(compiled.kernels)
        result["rejections"] = oracle_rejections(compiled)
        mib = sum(t.nbytes for t in compiled.primitive.types.values()) / (1 << 20)
        if mib > run_limit_mib:
            return {**result, "verdict": "compiled", "reason": f"{mib:.0f} MiB of tensors"}
        inputs = random_inputs(graph, seed)
        got = compiled(**inputs)
        ref = run_reference(graph, inputs)
    except GraphError as e:
        return {**result, "verdict": "refused", "reason": str(e.problems[0])[:300]}
    except Exception as e:  # noqa: BLE001 (every other failure is the verdict itself)
        where = traceback.extract_tb(e.__traceback__)[-1]
        return {**result, "verdict": "crashed",
                "reason": f"{type(e).__name__}: {str(e)[:200]} "
                          f"({Path(where.filename).name}:{where.lineno})"}
    errors = {name: err for name in ref if (err := compare(got[name], ref[name])) is not None}
    if errors and (why := ill_conditioned(graph, inputs, got, ref, errors)):
        return {**result, "verdict": "match", "note": why}
    if errors:
        return {**result, "verdict": "wrong", "reason": ", ".join(
            f"{k}: {v:.3g}x the tolerance" for k, v in sorted(errors.items()))}
    return {**result, "verdict": "match"}


# --- running files in workers with a time limit -------------------------------------------

def _worker(conn, run_limit_mib: float, target: str) -> None:
    while True:
        path = conn.recv()
        if path is None:
            return
        conn.send(check_file(Path(path), run_limit_mib=run_limit_mib, target=target))


class Worker:
    """A process that checks files one at a time; replaced when one hangs or kills it."""

    def __init__(self, run_limit_mib: float, target: str):
        self.run_limit_mib, self.target = run_limit_mib, target
        self._start()

    def _start(self) -> None:
        self.conn, child = mp.Pipe()
        self.proc = mp.get_context("fork").Process(target=_worker,
                                                   args=(child, self.run_limit_mib,
                                                         self.target),
                                                   daemon=True)
        self.proc.start()

    def check(self, path: Path, timeout: float) -> dict:
        self.conn.send(str(path))
        try:
            if self.conn.poll(timeout):
                return self.conn.recv()
            verdict, reason = "timeout", f"no answer within {timeout:.0f} s"
        except (EOFError, OSError):
            self.proc.join(5)
            verdict, reason = "crashed", f"the worker died (exit code {self.proc.exitcode})"
        self.close()
        self._start()
        return {"file": str(path), "verdict": verdict, "reason": reason}

    def close(self) -> None:
        self.proc.kill()
        self.proc.join()


def run_files(files: list[Path], *, timeout: float, jobs: int, run_limit_mib: float,
              on_result, target: str = "cpu") -> None:
    """Check every file, `jobs` at a time; `on_result(result)` as each one finishes."""
    workers = [Worker(run_limit_mib, target) for _ in range(jobs)]
    try:
        if jobs == 1:
            for path in files:
                on_result(workers[0].check(path, timeout))
            return
        from concurrent.futures import ThreadPoolExecutor
        free = list(workers)
        with ThreadPoolExecutor(jobs) as pool:
            def one(path):
                w = free.pop()
                try:
                    return w.check(path, timeout)
                finally:
                    free.append(w)
            for result in pool.map(one, files):
                on_result(result)
    finally:
        for w in workers:
            w.close()


# --- the report ---------------------------------------------------------------------------

def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    p = np.percentile(values, [50, 90, 99, 100])
    return " / ".join(f"{v:.2f}" for v in p) + " s"


def report(results: list[dict], corpus: Path | None) -> str:
    lines = []
    by_net: dict[str, Counter] = defaultdict(Counter)
    for r in results:
        net = network_of(Path(r["file"]), corpus) if corpus else Path(r["file"]).parent.name
        by_net[net][r["verdict"]] += 1
    total = Counter(r["verdict"] for r in results)
    n = len(results)
    head = f"{'network':34} {'files':>6} " + " ".join(f"{v:>8}" for v in VERDICTS)
    lines += [head, "-" * len(head)]
    for net in sorted(by_net):
        c = by_net[net]
        lines.append(f"{net:34} {sum(c.values()):6} " + " ".join(f"{c[v]:8}" for v in VERDICTS))
    lines.append("-" * len(head))
    lines.append(f"{'all':34} {n:6} " + " ".join(f"{total[v]:8}" for v in VERDICTS))
    lines.append("")
    for v in VERDICTS:
        lines.append(f"{v:9} {total[v]:5}  {100 * total[v] / max(n, 1):5.1f} %")
    if ill := sum(1 for r in results if r.get("note", "").startswith("ill-conditioned")):
        lines.append(f"(of the matches, {ill} differ from the reference beyond the tolerance "
                     "on ill-conditioned outputs, no further from the float64 value than it or "
                     "than an ulp on the inputs moves that value)")
    times = [r["compile_s"] for r in results if "compile_s" in r]
    lines.append(f"\ncompile time p50 / p90 / p99 / max: {percentiles(times)} "
                 f"(over {len(times)} compiled graphs)")
    for v in ("refused", "wrong", "crashed", "timeout", "compiled"):
        reasons = Counter(_reason_kind(r["reason"]) for r in results if r["verdict"] == v)
        if reasons:
            lines.append(f"\n{v}, by reason:")
            lines += [f"  {c:5}  {why}" for why, c in reasons.most_common(15)]
    compiled = [r for r in results if "kernels" in r]
    one = sum(1 for r in compiled if r["kernels"] == 1)
    none = sum(1 for r in compiled if r["kernels"] == 0)
    lines.append(f"\nfusion: {one} of {len(compiled)} compiled graphs are one kernel and "
                 f"{none} need none (every output folds to a constant or is an input): "
                 f"{100 * (one + none) / max(len(compiled), 1):.1f} % in at most one kernel; "
                 "kernels per graph: " + ", ".join(f"{k}: {c}" for k, c in sorted(
                     Counter(r["kernels"] for r in compiled).items())))
    why = Counter(reason for r in compiled if r["kernels"] > 1 for reason in set(r["rejections"]))
    if why:
        lines.append("oracle's reasons in graphs of several kernels (graphs with each):")
        lines += [f"  {c:5}  {reason[:150]}" for reason, c in why.most_common(12)]
    return "\n".join(lines)


def _reason_kind(reason: str) -> str:
    """A reason with its tensor names and numbers taken out, to count like ones."""
    reason = re.sub(r"'[^']*'", "'X'", reason)
    return re.sub(r"\d+", "N", reason)[:160]


def _warm_up(target: str) -> None:
    """What a machine's first compile does once (`main`: not in any file's time)."""
    import polyc
    b = polyc.GraphBuilder("warm_up")
    polyc.compile(b.build([b.relu(b.matmul(b.input("a", (64, 64)), b.input("b", (64, 64))))]),
                  target)


def main(argv: list[str] | None = None) -> int:
    from polyc import targets

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("corpus", nargs="?", default=os.environ.get("POLYC_AKG_CORPUS"))
    ap.add_argument("--sample", type=int, help="check N files spread over the corpus")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per file")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--run-limit", type=float, default=3072,
                    help="MiB of tensors above which a graph is compiled only")
    ap.add_argument("--target", default="cpu", choices=targets.names())
    ap.add_argument("--results", type=Path, help="append each file's result here (JSONL); "
                    "files already in it are not checked again")
    ap.add_argument("--report", type=Path, help="print the tables of a results file")
    args = ap.parse_args(argv)
    corpus = Path(args.corpus) if args.corpus else None
    if args.report:
        results = [json.loads(line) for line in args.report.read_text().splitlines() if line]
        print(report(results, corpus))
        return 0
    if corpus is None or not corpus.is_dir():
        print("no corpus: pass its folder or set POLYC_AKG_CORPUS; nothing checked")
        return 0
    files = sample(corpus_files(corpus), args.sample)
    results = []
    if args.results and args.results.exists():
        results = [json.loads(line) for line in args.results.read_text().splitlines() if line]
        done = {r["file"] for r in results}
        files = [f for f in files if str(f) not in done]
    print(f"checking {len(files)} files of {corpus}", file=sys.stderr)
    out = args.results.open("a") if args.results else None

    def on_result(r: dict) -> None:
        results.append(r)
        print(f"{len(results):5} {r['verdict']:8} {r.get('compile_s', 0):6.2f}s "
              f"{Path(r['file']).name[:80]}", file=sys.stderr, flush=True)
        if out:
            out.write(json.dumps(r) + "\n")
            out.flush()

    given = os.environ.get("POLYC_CACHE_DIR")
    cache = os.environ["POLYC_CACHE_DIR"] = tempfile.mkdtemp(prefix="polyc-akg-corpus-")
    try:  # the workers fork with it
        _warm_up(args.target)
        run_files(files, timeout=args.timeout, jobs=args.jobs, run_limit_mib=args.run_limit,
                  on_result=on_result, target=args.target)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        if given is None:
            del os.environ["POLYC_CACHE_DIR"]
        else:
            os.environ["POLYC_CACHE_DIR"] = given
    print(report(results, corpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
