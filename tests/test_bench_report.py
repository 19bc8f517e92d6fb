"""The benchmarks' result files (benchmarks/report.py) and their comparison
(benchmarks/compare.py): what a reader of two runs relies on."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCH))  # compare.py imports report as a sibling
report = importlib.import_module("report")
_spec = importlib.util.spec_from_file_location("bench_compare", BENCH / "compare.py")
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)


def _rows(polyc_1, torch_1, polyc_2):
    return [{"case": "conv", "threads": 1, "unit": "GFLOP/s",
             "values": {"polyc": polyc_1, "torch": torch_1},
             "limit": {"label": "FMA peak", "value": 200.0}, "goals": {"torch": 1.05}},
            {"case": "conv", "threads": 2, "unit": "GFLOP/s", "values": {"polyc": polyc_2}},
            {"case": "sum", "unit": "GB/s", "values": {"polyc": 10.0, "numpy": 12.5},
             "limit": {"label": "read bandwidth", "value": 14.0}}]


def test_a_table_round_trips_with_the_machine_described(tmp_path):
    path = report.save_table("t", "a title", _rows(100.0, 80.0, 150.0), out_dir=tmp_path)
    table = report.load_table(path)
    assert table["rows"] == _rows(100.0, 80.0, 150.0)
    machine = table["machine"]
    assert machine["cores"] >= 1 and machine["commit"] and "numpy" in machine["versions"]
    assert len(machine["load_average"]) == 3


def test_the_plot_is_written_as_png_and_svg(tmp_path):
    pytest.importorskip("matplotlib")
    report.save_table("t", "a title", _rows(100.0, 80.0, 150.0), out_dir=tmp_path)
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "t.svg").read_text()[:2000]


def test_a_long_table_is_drawn_in_panels_of_a_readable_width(tmp_path):
    """ResNet-50's 64 cases in one row of bars were 60 inches wide: each unit's cases
    go in panels of at most PANEL_CASES."""
    pytest.importorskip("matplotlib")
    rows = [{"case": f"conv{i}", "threads": 1, "unit": "GFLOP/s",
             "values": {"polyc": 50.0 + i, "torch": 60.0}} for i in range(2 * report.PANEL_CASES + 1)]
    rows.append({"case": "sum", "unit": "GB/s", "values": {"polyc": 10.0}})
    report.save_table("long", "a long table", rows, out_dir=tmp_path)
    svg = (tmp_path / "long.svg").read_text()
    assert [f'id="axes_{k}"' in svg for k in (1, 2, 3, 4, 5)] == [True] * 4 + [False]
    assert "conv32" in svg and "sum" in svg


def test_goals_are_reported_met_or_not():
    table = {"better": "higher", "rows": _rows(100.0, 80.0, 150.0)}
    assert report.goal_lines(table) == ["  conv (1 thr): vs torch: 1.25x, goal 1.05x: met"]
    table = {"better": "higher", "rows": _rows(100.0, 100.0, 150.0)}
    assert report.goal_lines(table)[0].endswith("goal 1.05x: NOT met")
    # seconds: lower is better, so the advantage is the peer's time over polyc's
    row = {"case": "c", "values": {"polyc": 0.2, "torch.compile": 3.0},
           "goals": {"torch.compile": 5.0}}
    assert report.goal_lines({"better": "lower", "rows": [row]}) == [
        "  c: vs torch.compile: 15.00x, goal 5.00x: met"]


def test_compare_prints_each_change_and_each_advantage(tmp_path):
    a = report.save_table("t", "x", _rows(100.0, 80.0, 150.0), out_dir=tmp_path / "a")
    b = report.save_table("t", "x", _rows(120.0, 80.0, 75.0), out_dir=tmp_path / "b")
    lines = compare.compare(report.load_table(a), report.load_table(b))
    polyc_1 = next(li for li in lines if li.startswith("conv") and " 1 " in li and "polyc " in li)
    assert polyc_1.split()[-3:] == ["100", "120", "1.20x"]
    polyc_2 = next(li for li in lines if li.startswith("conv") and " 2 " in li)
    assert polyc_2.endswith("0.50x")
    advantage = next(li for li in lines if "polyc/torch" in li)
    assert advantage.split()[-2:] == ["1.25x", "1.50x"]
    assert any("polyc/numpy" in li and li.split()[-2:] == ["0.80x", "0.80x"] for li in lines)


def test_compare_names_rows_only_one_run_has(tmp_path):
    a = report.save_table("t", "x", _rows(1.0, 1.0, 1.0), out_dir=tmp_path / "a")
    rows = _rows(1.0, 1.0, 1.0)[:2] + [{"case": "new", "unit": "s", "values": {"polyc": 1.0}}]
    b = report.save_table("t", "x", rows, out_dir=tmp_path / "b")
    lines = compare.compare(report.load_table(a), report.load_table(b))
    assert "only in A: sum" in lines and "only in B: new" in lines


def test_compare_refuses_what_is_not_a_table(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"limits": {}, "results": {}}))
    good = report.save_table("t", "x", _rows(1.0, 1.0, 1.0), out_dir=tmp_path)
    assert compare.main([str(bad), str(good)]) == 2
    assert "not a benchmark table" in capsys.readouterr().err
    other = report.save_table("u", "x", _rows(1.0, 1.0, 1.0), out_dir=tmp_path)
    assert compare.main([str(other), str(good)]) == 2
    assert "different tables" in capsys.readouterr().err


def test_each_case_has_its_rounds_spread_over_the_run(monkeypatch):
    machine = importlib.import_module("machine")
    monkeypatch.setattr(machine.time, "sleep", lambda s: None)
    calls = []

    def fn(case, name):
        return lambda: calls.append((case, name))

    cases = {c: {n: fn(c, n) for n in ("polyc", "torch")} for c in ("conv", "matmul")}
    best = machine.spread_best_times(cases, rounds=2)
    turns = [call for k, call in enumerate(calls) if k == 0 or call != calls[k - 1]]
    one_round = [(c, n) for c in ("conv", "matmul") for n in ("polyc", "torch")]
    assert turns == one_round * 2  # every case's round 1 before any case's round 2
    assert set(best) == {"conv", "matmul"} and all(
        0 < t < float("inf") for times in best.values() for t in times.values())


def test_a_paired_ratio_holds_through_slow_spells():
    """Both calls of a pair see the same spell: a 2% difference survives a machine that
    runs half again slower every other few pairs, and neither function always goes first."""
    machine = importlib.import_module("machine")
    now, calls = [0.0], []

    def fn(name, cost):
        def call():
            spell = 1.5 if (len(calls) // 10) % 2 else 1.0
            calls.append(name)
            now[0] += cost * spell
        return call

    median, q1, q3 = machine.paired_ratio(fn("a", 1.02), fn("b", 1.0), pairs=20,
                                          clock=lambda: now[0])
    assert median == pytest.approx(1.02) and q1 <= median <= q3
    timed = calls[2:]
    firsts = {timed[k] for k in range(0, len(timed), 2)}
    assert firsts == {"a", "b"}


def test_cases_are_counted_against_their_goal_in_pairs_of_calls():
    bench_cpu = importlib.import_module("bench_cpu")
    rows = [{"case": f"conv{k}", "threads": t, "goals": {"torch": 1.05},
             "paired": {"peer": "torch", "pairs": 40, "ratio": ratio, "quartiles": [0.9, 1.2]}}
            for k, (t, ratio) in enumerate([(1, 1.04), (1, 1.06), (2, 1.10), (2, 1.20)])]
    rows.append({"case": "no torch", "threads": 1, "goals": {"torch": 1.05}})
    lines = bench_cpu.paired_lines(rows)
    assert "conv1 (1 thr): in pairs of calls 1.06x torch (median of 40" in "\n".join(lines)
    assert lines[-2:] == [
        "  in pairs of calls, 1 of 2 cases at 1 thread(s) meet their goal against torch",
        "  in pairs of calls, 2 of 2 cases at 2 thread(s) meet their goal against torch"]
    # bench_fusion's rows: against torch.compile, each case's goal for that peer
    fused = [{"case": c, "threads": 1, "goals": {"torch.compile": 2.0, "sdpa": 1.5},
              "paired": {"peer": "torch.compile", "pairs": 10, "ratio": r, "quartiles": [r, r]}}
             for c, r in (("attention", 1.8), ("softmax", 6.0))]
    assert bench_cpu.paired_lines(fused)[-1] == (
        "  in pairs of calls, 1 of 2 cases at 1 thread(s) meet their goal against torch.compile")
