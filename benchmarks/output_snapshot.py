"""Everything a compile decides, written to a folder, to check that a change meant only
to make the compiler faster changes none of it.

    python benchmarks/output_snapshot.py DIR     # before the change, then after:
    python benchmarks/output_snapshot.py DIR2 && diff -r DIR DIR2

Every graph of `examples/`, of `tests/test_differential.py` and of the vendored AKG
sample (tests/data/akg) is compiled for the cpu target without gcc; per graph,
`<name>.c` holds the generated C and `<name>.json` the fusion groups and report, the
fallbacks, and per kernel its dependences, every pass's tree and the final one (or the
error refusing the graph). Run both sides with one POLYC_CACHE_DIR: the gemm calibration
and tuning there decide microkernels and tiles.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import polyc  # noqa: E402
from bench_compile import example_graphs, test_graphs  # noqa: E402
from polyc.errors import GraphError  # noqa: E402
from polyc.graph.load import Limits  # noqa: E402

BIG = Limits(max_elements=1 << 34, max_total_elements=1 << 36)  # as akg_corpus.py

def graphs() -> dict:
    """name -> a function returning the graph (an AKG file may be refused on import)."""
    found = {name: (lambda g=g: g) for name, g in {**example_graphs(), **test_graphs()}.items()}
    for f in sorted((HERE.parent / "tests" / "data" / "akg").rglob("*.info")):
        found[f"akg {f.stem}"] = lambda f=f: polyc.import_akg(f, limits=BIG)
    return found

def snapshot(make) -> tuple[str, dict]:
    try:
        r = polyc.compile(make(), "cpu", build=False, limits=BIG)
    except GraphError as e:
        return "", {"error": str(e)}
    return r.c_source, {
        "fusion": [list(g) for g in r.fusion.groups], "report": list(r.fusion.report),
        "fallbacks": list(r.fallbacks),
        "kernels": [{"report": list(k.fusion_report), "dependences": str(k.model.dependences),
                     "trees": [[name, str(tree)] for name, tree in k.trees],
                     "final": str(k.schedule)} for k in r.kernels]}

def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, make in graphs().items():
        c, decisions = snapshot(make)
        stem = name.replace(" ", "_").replace("/", "_")
        (out / f"{stem}.c").write_text(c)
        (out / f"{stem}.json").write_text(json.dumps(decisions, indent=1, default=str))
    print(f"wrote {len(list(out.glob('*.c')))} graphs to {out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
