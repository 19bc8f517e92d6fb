"""The `polyc` command line: compile, run (against the reference) and serve.

User errors print one line per problem and exit 2; no traceback reaches the user unless
POLYC_DEBUG is set.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from .errors import GraphError, PolycError


def _options(args):
    from .targets import backend
    given = {"parallel": not args.no_parallel}
    for item in args.option:
        name, _, text = item.partition("=")
        try:  # a JSON value (4, false, [["kc", 64]]), else the text itself
            given[name] = json.loads(text)
        except ValueError:
            given[name] = text
    if args.threads:  # an option of the targets with an OpenMP team
        given["threads"] = args.threads
    return backend(args.target).options(given)


def _graph(path: str, format: str = "polyc"):
    """A subgraph file: polyc's JSON, an AKG composite kernel, or an ONNX model (by its
    .onnx suffix)."""
    if format == "akg":
        from .frontends import import_akg
        return import_akg(path)
    if path.endswith(".onnx"):
        from .frontends.onnx import import_onnx
        return import_onnx(path)
    return path


def _compile(args, build: bool):
    from .compiler import compile
    echo = (lambda text: print(text, file=sys.stderr)) if args.print_after_all else None
    return compile(_graph(args.graph, args.format), args.target, options=_options(args),
                   build=build, print_after_all=echo, dump_dir=args.dump_dir)


def cmd_import_onnx(args) -> int:
    from .frontends.onnx import import_onnx
    graph = import_onnx(args.model)
    text = json.dumps(graph.to_json(), indent=1) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        print(f"wrote {args.output} ({len(graph.nodes)} nodes)")
    return 0


def cmd_compile(args) -> int:
    result = _compile(args, build=True)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels.c").write_text(result.c_source)
    trees = {k.name: k.to_json()["schedule_tree"] for k in result.kernels}
    (out / "schedule_trees.json").write_text(json.dumps(trees, indent=2) + "\n")
    (out / "schedule_trees.txt").write_text(
        "\n".join(f"# {k.name}\n{k.to_json()['schedule_text']}" for k in result.kernels))
    (out / "report.txt").write_text(report(result) + "\n")
    print(f"wrote {out}/kernels.c, schedule_trees.json, schedule_trees.txt, report.txt "
          f"({len(result.kernels)} kernels)")
    return 0


def report(result) -> str:
    lines = [f"graph {result.graph.name}: {len(result.graph.nodes)} nodes -> "
             f"{len(result.primitive.nodes)} primitive nodes -> {len(result.kernels)} kernels "
             f"(target {result.target})"]
    lines += [f"note: {n}" for n in result.graph.notes]
    lines += [f"budget: {f}" for f in result.fallbacks]  # the stages that fell back
    for k in result.kernels:
        lines.append(f"kernel {k.name}: {', '.join(k.kernel.nodes)}")
        if k.microkernels:
            lines.append(f"  microkernels: {', '.join(k.microkernels)}")
        lines += [f"  {line}" for line in k.to_json()["fusion_report"]]
    lines.append("pass times: " + ", ".join(f"{name} {s * 1e3:.1f} ms"
                                            for name, s in result.trace.timings.items()))
    return "\n".join(lines)


def cmd_run(args) -> int:
    from .graph.reference import random_inputs, run_reference
    from .graph.check import compare_outputs, warm_up
    result = _compile(args, build=True)
    inputs = random_inputs(result.graph, args.seed)
    got = result(**inputs)
    ref = run_reference(result.graph, inputs)
    rows = compare_outputs(result.graph, got, ref, rtol=args.rtol, atol=args.atol)
    for row in rows:
        print(f"output {row['name']}: {row['type']}  max abs err {row['max_abs_err']:.3g}  "
              f"max rel err {row['max_rel_err']:.3g}  {'OK' if row['ok'] else 'MISMATCH'}")
    ok = all(row["ok"] for row in rows)
    if result.program.simulated:  # host time measures the simulator, not the chip
        _print_profile(result.profile(**inputs), result.kernels)
        return 0 if ok else 1
    out = {k: np.empty_like(v) for k, v in got.items()}
    warm_up([lambda: result.program(inputs, out)])
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        result.program(inputs, out)
        times.append(time.perf_counter() - start)
    print(f"{len(result.kernels)} kernels, kernel time median {np.median(times) * 1e3:.3f} ms, "
          f"min {min(times) * 1e3:.3f} ms over {args.repeat} runs "
          + (f"({args.threads} threads)" if args.threads else
             f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'default')})"))
    _print_kernel_times(result, inputs, out, args.repeat)
    return 0 if ok else 1


def _print_kernel_times(result, inputs, out, repeat: int) -> None:
    """Where the time goes: each kernel timed alone, in order (its inputs are those the
    kernels before it wrote)."""
    from .graph.check import kernel_times
    _, calls = result.program.bind(inputs, out)
    medians = kernel_times(calls, repeat)
    total = sum(medians) or 1.0
    for k, median in zip(result.kernels, medians):
        used = ", ".join(k.microkernels) or "no microkernel"
        print(f"  {k.name}: median {median * 1e3:.3f} ms ({100 * median / total:.0f}%), "
              f"{len(k.kernel.nodes)} node(s), {used}")


def _print_profile(profile: dict, kernels) -> None:
    """The simulated chip's figures for the run, then each kernel's."""
    def line(p: dict) -> str:
        moved = ", ".join(f"{pair} {n / 2**20:.2f} MiB" for pair, n in p["bytes"].items() if n)
        return (f"{p['cycles']:,} cycles, {100 * p['peak_fraction']:.1f}% of peak, "
                f"{moved or 'nothing moved'} in {p['transfers']:,} transfers")
    print(f"{len(kernels)} kernels on the simulated chip: {line(profile)}; high-water "
          + ", ".join(f"{level} {n / 1024:.1f} KiB" for level, n in profile["high_water"].items()))
    for k, p in zip(kernels, profile["kernels"]):
        used = ", ".join(k.microkernels) or "no microkernel"
        print(f"  {k.name}: {line(p)}, {used}")


def cmd_serve(args) -> int:
    # imported here: the CLI's other commands need neither FastAPI nor uvicorn
    from .server import Settings, serve
    from .server.settings import default_cache_url, default_workers
    try:
        settings = Settings(cache_url=args.cache or default_cache_url(),
                            workers=default_workers() if args.workers is None else args.workers,
                            compile_timeout_s=args.compile_timeout, queue_size=args.queue_size,
                            max_body_bytes=args.max_body_bytes,
                            worker_memory_bytes=args.worker_memory_mb << 20,
                            cache_timeout_s=args.cache_timeout, cache_retry_s=args.cache_retry,
                            lock_ttl_s=args.lock_ttl, header_timeout_s=args.header_timeout,
                            body_timeout_s=args.body_timeout,
                            max_connections=args.max_connections,
                            workers_per_client=args.workers_per_client,
                            tuning_sync_s=args.tuning_sync)
        return serve(settings, host=args.host, port=args.port, log_level=args.log_level,
                     access_log=args.access_log)
    except ValueError as e:  # a bad flag value or cache URL
        print(f"polyc: {e}", file=sys.stderr)
        return 2


def cmd_tune(args) -> int:
    from .graph.load import load_graph
    from .tune import measure_here, shared, tune_graph

    def progress(done: int, total: int, text: str) -> None:
        bar = "#" * (20 * done // total)
        print(f"\r[{bar:<20}] {done}/{total} {text:<48}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)

    graph = load_graph(args.graph)
    cache = args.cache or os.environ.get("POLYC_CACHE_URL")
    if args.cache and not shared.is_shared(args.cache):
        raise PolycError(f"--cache {args.cache}: tunings are shared through a Redis cache "
                         "(redis://HOST:PORT/DB); without one they stay in this machine's "
                         "tuning file")
    kept: list[tuple[str, dict]] = []

    def tune(measure) -> list[str]:
        return tune_graph(graph, target=args.target, options=_options(args), budget=args.budget,
                          repeat=args.repeat, progress=progress, measure=measure, stored=kept)

    if args.cluster:
        from .tune.cluster import RayCluster
        with RayCluster(args.cluster) as cluster:
            lines = tune(cluster.measure)
        lines = cluster.notes + lines
    else:
        lines = tune(measure_here)
    if shared.is_shared(cache) and kept:
        shared.publish(cache, kept)
        lines.append(f"shared through {cache}: replicas of polyc serve on it pull them")
    print("\n".join(lines))
    return 0


def _at_least(low: int):
    """An argparse type: an integer >= `low` (argparse names the flag when it fails)."""
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {value}")
        return value
    parse.__name__ = f"integer >= {low}"  # argparse's "invalid <name> value" message
    return parse


def main(argv: list[str] | None = None) -> int:
    from . import targets
    parser = argparse.ArgumentParser(prog="polyc", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def threads(p):
        p.add_argument("--threads", type=int, default=0,
                       help="the OpenMP team of every parallel loop (default: OMP_NUM_THREADS)")
        p.add_argument("-O", "--option", action="append", default=[], metavar="NAME=VALUE",
                       help="a compile option, its value JSON or text (-O winograd_max_tile=4); "
                            "repeatable")

    def common(p):
        p.add_argument("graph", help="subgraph JSON file, or an ONNX model (.onnx)")
        p.add_argument("--format", default="polyc", choices=("polyc", "akg"),
                       help="the file's format: polyc's subgraph JSON (or ONNX, by the .onnx "
                            "suffix), or a MindSpore/AKG composite kernel (.info)")
        p.add_argument("--target", default="cpu", choices=targets.names())
        p.add_argument("--print-after-all", action="store_true",
                       help="print the IR after every pass to stderr")
        p.add_argument("--dump-dir", help="write one numbered file per pass here")
        p.add_argument("--no-parallel", action="store_true", help="no OpenMP threads")
        threads(p)

    p = sub.add_parser("compile", help="compile a subgraph to C")
    common(p)
    p.add_argument("-o", "--output", default="out", help="output directory")
    p.set_defaults(fn=cmd_compile)
    p = sub.add_parser("run", help="compile, run on random inputs, compare with the reference")
    common(p)
    p.add_argument("--seed", type=_at_least(0), default=0)
    p.add_argument("--repeat", type=_at_least(1), default=10)
    p.add_argument("--rtol", type=float, default=1e-4)
    p.add_argument("--atol", type=float, default=1e-5)
    p.set_defaults(fn=cmd_run)
    p = sub.add_parser("import-onnx", help="an ONNX model as a subgraph JSON file")
    p.add_argument("model", help="ONNX model (.onnx)")
    p.add_argument("-o", "--output", default="-", help="JSON file (default: standard output)")
    p.set_defaults(fn=cmd_import_onnx)
    p = sub.add_parser("tune", help="measure microkernels and their tile sizes, keep the "
                                    "fastest in the cache")
    p.add_argument("graph", help="subgraph JSON file")
    p.add_argument("--budget", type=_at_least(1), default=24,
                   help="(microkernel, tiles) candidates to measure per contraction")
    p.add_argument("--repeat", type=_at_least(1), default=5, help="timed runs per candidate")
    p.add_argument("--no-parallel", action="store_true", help="no OpenMP threads")
    p.add_argument("--target", default="cpu", choices=targets.tunable(),
                   help="a target whose kernels have tile sizes to measure")
    p.add_argument("--cluster", metavar="ADDRESS",
                   help="measure on the machines of this Ray cluster that have this "
                        "machine's CPU kind: ray://HOST:PORT, the head's HOST:PORT, or auto "
                        "(needs polyc[cluster])")
    p.add_argument("--cache", metavar="URL",
                   help="also keep the results in this Redis cache (redis://HOST:PORT/DB), "
                        "where the replicas of polyc serve on it find them (default: "
                        "POLYC_CACHE_URL when it is a Redis URL)")
    threads(p)
    p.set_defaults(fn=cmd_tune)
    # settings.py imports neither FastAPI nor uvicorn; its defaults are the flags'
    from .server.settings import Settings

    def serve_default(name: str):
        return Settings.__dataclass_fields__[name].default

    p = sub.add_parser("serve", help="run the HTTP compile service")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=None,
                   help="compile worker processes (default: one per CPU)")
    p.add_argument("--cache", default=None,
                   help="sqlite:///PATH (sqlite:////abs/path.db for an absolute path) or "
                        "redis://HOST:PORT/DB (default: POLYC_CACHE_URL, else a SQLite "
                        "file under the user's cache directory)")
    p.add_argument("--compile-timeout", type=float, default=serve_default("compile_timeout_s"),
                   help="seconds one compile may take (then 504)")
    p.add_argument("--queue-size", type=int, default=serve_default("queue_size"),
                   help="compiles that may wait for a worker (then 503)")
    p.add_argument("--max-body-bytes", type=int, default=serve_default("max_body_bytes"),
                   help="larger request bodies get 413")
    p.add_argument("--worker-memory-mb", type=int,
                   default=serve_default("worker_memory_bytes") >> 20,
                   help="address-space limit of each worker and its gcc")
    p.add_argument("--workers-per-client", type=int, default=None,
                   help="compile workers one client address may hold at once (default: all "
                        "but one, so one client's slow compiles never take every worker)")
    p.add_argument("--header-timeout", type=float, default=serve_default("header_timeout_s"),
                   help="seconds a request's headers may take to arrive (then 408)")
    p.add_argument("--body-timeout", type=float, default=serve_default("body_timeout_s"),
                   help="seconds a request's body may take to arrive (then 408)")
    p.add_argument("--max-connections", type=int, default=serve_default("max_connections"),
                   help="connections and requests at once; past it, requests get 503")
    p.add_argument("--cache-timeout", type=float, default=serve_default("cache_timeout_s"),
                   help="seconds a call to a Redis cache may take before Redis is taken as "
                        "down (the service then compiles locally)")
    p.add_argument("--cache-retry", type=float, default=serve_default("cache_retry_s"),
                   help="seconds a Redis cache that failed is left alone before it is tried "
                        "again")
    p.add_argument("--lock-ttl", type=float, default=serve_default("lock_ttl_s"),
                   help="seconds after which the compile lock of a replica that stopped "
                        "renewing it (it died) lapses")
    p.add_argument("--tuning-sync", type=float, default=serve_default("tuning_sync_s"),
                   help="with a Redis cache: seconds between two pulls of the tunings kept "
                        "there by polyc tune --cache")
    p.add_argument("--log-level", default="info",
                   choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true", help="log every request")
    p.set_defaults(fn=cmd_serve)
    args = parser.parse_args(argv)
    try:
        return args.fn(args)
    except GraphError as e:
        for problem in e.problems:
            print(f"polyc: error: {problem}", file=sys.stderr)
        return 2
    except PolycError as e:
        if os.environ.get("POLYC_DEBUG"):
            raise
        print(f"polyc: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
