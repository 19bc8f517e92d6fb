"""What the benchmarks of the simulated chips share: the check of a simulated result
against the numpy reference executor, the tiles a compile chose, and the command line
(`--cases`, `--out`) around a table of one row per case, written with its plot by
report.py: per case, the share of the chip's compute peak and of its memory bound that
the simulated run reaches (100% is the roofline)."""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from polyc.graph.reference import run_reference

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import RESULTS, save_table  # noqa: E402


def check(name: str, graph, inputs: dict, got: dict) -> None:
    """Refuses a case whose simulated outputs differ from the reference executor's (at
    float16's tolerance for float16 outputs)."""
    want = run_reference(graph, inputs)
    for t in graph.outputs:
        a, r = got[t].astype(np.float64), want[t].astype(np.float64)
        err = float(np.abs(a - r).max() / max(np.abs(r).max(), 1e-30))
        if not err <= (4e-3 if got[t].dtype == np.float16 else 1e-4):
            raise SystemExit(f"{name}: the simulated result differs from the reference ({err:.1e})")


def tiles(compiled) -> list[str]:
    """The tile sizes each kernel's report names, one short line per tiled statement."""
    out = []
    for k in compiled.kernels:
        for line in k.fusion_report:
            if line.startswith("contraction "):
                line = re.split(r"[:;] the fewest", line.split(": ", 1)[1])[0]
                out.append(line.removeprefix("on the cube: "))
            elif line.startswith("tiles of "):
                out.append(line.split(" for the cores")[0])
    return out


def main(doc: str, cases: Callable[[], dict], run: Callable[..., dict],
         table: Callable[[list[dict]], str], *, name: str, bound: str) -> int:
    """`bound`: the key of a row's fraction of the memory bound (e.g. "dma_bound_fraction")."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--cases", default="", help="comma-separated substrings of case names")
    parser.add_argument("--out", type=Path, default=RESULTS,
                        help="where the table's JSON and plot go (default: %(default)s)")
    args = parser.parse_args()
    wanted = [w for w in args.cases.split(",") if w]
    rows = []
    for case_name, case in cases().items():
        if wanted and not any(w in case_name for w in wanted):
            continue
        rows.append(run(case_name, *case))
        print(f"  {case_name}: done", file=sys.stderr, flush=True)
    print(table(rows))
    label = bound.removesuffix("_fraction").replace("_", " ")
    path = save_table(name, f"{name}: simulated cycles against the roofline", [
        {**r, "unit": "% of the limit",
         "values": {"% of compute peak": 100 * r["peak_fraction"], f"% of {label}": 100 * r[bound]},
         "limit": {"label": "roofline", "value": 100.0}} for r in rows], out_dir=args.out)
    print(f"wrote {path} (and its plot)")
    return 0
