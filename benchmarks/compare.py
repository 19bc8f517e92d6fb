"""Two runs of one benchmark table side by side.

    python benchmarks/compare.py A.json B.json

For every row both runs have (same case and thread count), and every library measured
in both: its value in A, in B, and B's change over A as a factor (> 1: B is better,
whether the unit is GFLOP/s or seconds); then polyc's advantage over each peer in A and
in B, the number that survives a change of machine or of its load. The two machines'
descriptions are printed first where they differ.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import load_table, ratio  # noqa: E402


def _key(row: dict) -> tuple:
    return row["case"], row.get("threads")


def compare(a: dict, b: dict) -> list[str]:
    if a["name"] != b["name"]:
        raise ValueError(f"different tables: {a['name']!r} and {b['name']!r}")
    better = a["better"]
    lines = [f"table {a['name']} ({'higher' if better == 'higher' else 'lower'} is better)"]
    for field in sorted(set(a.get("machine", {})) | set(b.get("machine", {}))):
        va, vb = a.get("machine", {}).get(field), b.get("machine", {}).get(field)
        if va != vb:
            lines.append(f"  machine {field}: A {va}  B {vb}")
    rows_b = {_key(r): r for r in b["rows"]}
    head = f"{'case':44} {'thr':>3} {'library':>19} {'A':>10} {'B':>10} {'B vs A':>8}"
    lines += [head, "-" * len(head)]
    only = []
    for ra in a["rows"]:
        rb = rows_b.get(_key(ra))
        if rb is None:
            only.append(f"only in A: {ra['case']}")
            continue
        thr = "" if ra.get("threads") is None else str(ra["threads"])
        for lib, va in ra["values"].items():
            vb = rb["values"].get(lib)
            if not va or not vb:
                continue
            change = vb / va if better == "higher" else va / vb
            lines.append(f"{ra['case'][:44]:44} {thr:>3} {lib:>19} {va:10.4g} {vb:10.4g} "
                         f"{change:7.2f}x")
        for peer in ra["values"]:
            if peer == "polyc":
                continue
            pa, pb = ratio(ra, peer, better), ratio(rb, peer, better)
            if pa and pb:
                lines.append(f"{'':44} {thr:>3} {'polyc/' + peer:>19} {pa:9.2f}x {pb:9.2f}x")
    keys_a = {_key(r) for r in a["rows"]}
    only += [f"only in B: {r['case']}" for r in b["rows"] if _key(r) not in keys_a]
    return lines + only


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    try:
        print("\n".join(compare(load_table(args.a), load_table(args.b))))
    except (OSError, ValueError, KeyError) as e:
        print(f"compare: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
