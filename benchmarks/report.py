"""Benchmark tables as files: the raw numbers with the machine's description (JSON) and a
plot of each table (PNG and SVG), shared by every bench script.

A table is a dict, written as `NAME.json` beside `NAME.png` and `NAME.svg`:

    {"name": "bench_cpu", "title": "...", "better": "higher" | "lower",
     "machine": {...describe_machine()...},
     "rows": [{"case": "conv2d 1x64x56x56, 64 3x3", "threads": 1, "unit": "GFLOP/s",
               "values": {"polyc": 88.5, "numpy": 42.2, "torch": 112.1},
               "limit": {"label": "FMA peak", "value": 160.0},      # optional
               "goals": {"torch": 1.05}}]}                          # optional

`goals` maps a peer to the least ratio polyc must reach against it (polyc / peer for
"higher" tables such as GFLOP/s, peer / polyc for "lower" ones such as seconds).
The plot draws, per unit, one group of bars per row (polyc and each peer) and the row's
limit (the machine's FMA peak or bandwidth) as a horizontal line over its group.
matplotlib is optional (`pip install polyc[bench]`): without it only the JSON is written.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _first_line(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown"


def _cpu_model_and_flags() -> tuple[str, set[str]]:
    model, flags = platform.processor() or "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
                break
    except OSError:
        pass
    return model, flags


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def describe_machine() -> dict:
    """What a reader needs to compare two runs: CPU, ISA, cores, versions, commit, and the
    load on the machine (other tenants slow every library; read ratios within a run)."""
    model, flags = _cpu_model_and_flags()
    isa = [f for f in ("avx512f", "avx512_bf16", "amx_tile", "avx2", "fma") if f in flags]
    repo = Path(__file__).resolve().parent.parent
    commit = _first_line(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"])
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return {
        "cpu": model, "isa": isa, "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "python": platform.python_version(), "gcc": _first_line([os.environ.get("POLYC_CC", "gcc"),
                                                                "--version"]),
        "versions": {p: _version(p) for p in ("numpy", "torch", "islpy", "matplotlib")},
        "commit": commit + ("+changes" if dirty else ""),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def ratio(row: dict, peer: str, better: str = "higher") -> float | None:
    """polyc's advantage over `peer` in one row (> 1: polyc is better)."""
    mine, theirs = row["values"].get("polyc"), row["values"].get(peer)
    if not mine or not theirs:
        return None
    return mine / theirs if better == "higher" else theirs / mine


def goal_lines(table: dict) -> list[str]:
    """One line per (row, goal): the measured ratio, the goal, met or not."""
    lines = []
    for row in table["rows"]:
        for peer, goal in row.get("goals", {}).items():
            r = ratio(row, peer, table["better"])
            where = f"{row['case']} ({row['threads']} thr)" if "threads" in row else row["case"]
            if r is None:
                lines.append(f"  {where}: vs {peer}: not measured (goal {goal:.2f}x)")
            else:
                lines.append(f"  {where}: vs {peer}: {r:.2f}x, goal {goal:.2f}x: "
                             + ("met" if r >= goal else "NOT met"))
    return lines


def save_table(name: str, title: str, rows: list[dict], *, better: str = "higher",
               out_dir: Path | None = None, machine: dict | None = None) -> Path:
    """Write NAME.json (and NAME.png / NAME.svg when matplotlib is there); returns the
    JSON's path."""
    out_dir = Path(out_dir or RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    table = {"name": name, "title": title, "better": better,
             "machine": machine or describe_machine(), "rows": rows}
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps(table, indent=1) + "\n")
    try:
        plot_table(table, out_dir / name)
    except ImportError:
        print(f"matplotlib is not installed: wrote {path} without its plot")
    return path


def load_table(path: str | Path) -> dict:
    table = json.loads(Path(path).read_text())
    missing = {"name", "better", "rows"} - set(table)
    if missing:
        raise ValueError(f"{path}: not a benchmark table (no {', '.join(sorted(missing))})")
    return table


PANEL_CASES = 16


def _label(row: dict) -> str:
    return f"{row['case']}\n{row['threads']} thr" if "threads" in row else row["case"]


def plot_table(table: dict, stem: Path) -> None:
    """stem.png and stem.svg: grouped bars, one panel per unit and per PANEL_CASES of
    its cases (ResNet-50's 64 stay readable on a page)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    units = list(dict.fromkeys(r["unit"] for r in table["rows"]))
    libs = list(dict.fromkeys(lib for r in table["rows"] for lib in r["values"]))
    panels = []
    for unit in units:
        rows = [r for r in table["rows"] if r["unit"] == unit]
        panels += [(unit, rows[i:i + PANEL_CASES]) for i in range(0, len(rows), PANEL_CASES)]
    width_in = max(6.0, 0.3 * len(libs) * max(len(rows) for _, rows in panels) + 2)
    fig, axes = plt.subplots(len(panels), 1, figsize=(width_in, 3.6 * len(panels)), squeeze=False)
    colors = {lib: f"C{i}" for i, lib in enumerate(libs)}
    for ax, (unit, rows) in zip(axes[:, 0], panels):
        here = [lib for lib in libs if any(r["values"].get(lib) for r in rows)]
        bar = 0.8 / len(here)
        for i, lib in enumerate(here):
            xs = [g + (i - (len(here) - 1) / 2) * bar for g, r in enumerate(rows)
                  if r["values"].get(lib)]
            ys = [r["values"][lib] for r in rows if r["values"].get(lib)]
            ax.bar(xs, ys, bar, label=lib, color=colors[lib])
        limit_labels = set()
        for g, r in enumerate(rows):
            if r.get("limit"):
                label = r["limit"]["label"]
                ax.hlines(r["limit"]["value"], g - 0.45, g + 0.45, colors="k", linestyles="--",
                          label=None if label in limit_labels else label)
                limit_labels.add(label)
        ax.set_xticks(range(len(rows)), [_label(r) for r in rows], fontsize=7, rotation=30,
                      ha="right")
        ax.set_ylabel(unit + (" (lower is better)" if table["better"] == "lower" else ""))
        if table["better"] == "lower":
            ax.set_yscale("log")
        else:  # headroom for the legend above the tallest bar or line
            top = max([v for r in rows for v in r["values"].values() if v]
                      + [r["limit"]["value"] for r in rows if r.get("limit")])
            ax.set_ylim(0, top * 1.3)
        ax.legend(fontsize=7, ncol=min(len(here) + len(limit_labels), 7), loc="upper center")
        ax.grid(axis="y", alpha=0.3)
    m = table["machine"]
    fig.suptitle(f"{table['title']}\n{m.get('cpu')}, {m.get('cores')} cores, polyc "
                 f"{m.get('commit')}, {m.get('date')}, load {m.get('load_average')}", fontsize=8)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(f"{stem}.{ext}", dpi=90)
    plt.close(fig)
