"""The `polyc` command line, called in-process through `polyc.cli.main`.

What a user sees: exit codes, the files `compile` writes, the IR after every pass, one
line per user error (naming node and field, never a traceback), and that hostile tensor
names reach the generated C only in their sanitised form.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from polyc.cli import main
from polyc.targets.cpu.prelude import PRELUDE
from polyc.compiler import compile

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

# A small graph with a reduction, so that every pass has something to print.
SMALL = {
    "name": "small",
    "inputs": [{"name": "x", "shape": [5, 7], "dtype": "float32"}],
    "nodes": [{"op": "softmax", "inputs": ["x"], "outputs": ["y"]}],
    "outputs": ["y"],
}

# Names that would break out of a C comment, add a preprocessor line or a call if any
# part of them reached the C source unsanitised.
HOSTILE_IN = "x*/ #include <stdio.h>"
HOSTILE_BIAS = 'a"b;system("rm")'
HOSTILE_OUT = "*/ y\n#define f 1 /*"
HOSTILE_NODE = "n*/ o\\"
HOSTILE = {
    "name": "hostile",
    "inputs": [{"name": HOSTILE_IN, "shape": [4, 3], "dtype": "float32"},
               {"name": HOSTILE_BIAS, "shape": [3], "dtype": "float32"}],
    "nodes": [{"op": "add", "inputs": [HOSTILE_IN, HOSTILE_BIAS], "outputs": [HOSTILE_OUT],
               "name": HOSTILE_NODE}],
    "outputs": [HOSTILE_OUT],
}


def _write(tmp_path: Path, doc: dict, name: str = "graph.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return str(path)


def test_run_an_example(capsys):
    assert main(["run", str(EXAMPLES / "softmax.json"), "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"output y: float32\[512,1000\] .* OK$", out, re.M), out
    assert "MISMATCH" not in out


def test_run_times_each_kernel(tmp_path, capsys):
    # two matmuls in a chain: two kernels, each on its microkernel
    doc = {"name": "chain", "inputs": [{"name": n, "shape": [256, 256]} for n in ("a", "w", "u")],
           "nodes": [{"op": "matmul", "inputs": ["a", "w"], "outputs": ["h"]},
                     {"op": "matmul", "inputs": ["h", "u"], "outputs": ["y"]}],
           "outputs": ["y"]}
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(doc))
    assert main(["run", str(path), "--repeat", "2"]) == 0
    lines = re.findall(r"^  (polyc_k\d+_\w+): median ([\d.]+) ms \((\d+)%\), \d+ node\(s\), (.*)$",
                       capsys.readouterr().out, re.M)
    assert len(lines) == 2 and sum(int(share) for *_, share, _ in lines) in range(98, 103)
    assert [used.startswith("sgemm_") for *_, used in lines] == [True, True]


def test_run_on_the_simulated_chip_reports_its_cycles_not_host_time(capsys):
    assert main(["run", str(EXAMPLES / "linear_gelu.json"), "--target", "manycore"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^1 kernels on the simulated chip: [\d,]+ cycles, [\d.]+% of peak, .*"
                     r"high-water LDM [\d.]+ KiB$", out, re.M), out
    assert re.search(r"^  polyc_k0_\w+: .*, mc_sgemm_64x64x32$", out, re.M), out
    assert "median" not in out


def test_threads_fix_the_team_and_bad_counts_name_the_option(tmp_path, capsys):
    assert main(["run", str(EXAMPLES / "softmax.json"), "--repeat", "1", "--threads", "3"]) == 0
    assert "(3 threads)" in capsys.readouterr().out
    assert main(["compile", str(EXAMPLES / "softmax.json"), "-o", str(tmp_path),
                 "--threads", "3"]) == 0
    assert "num_threads(3)" in next(tmp_path.glob("*.c")).read_text()
    assert main(["run", str(EXAMPLES / "softmax.json"), "--threads", "-4"]) == 2
    assert "field 'options.threads': must be 0" in capsys.readouterr().err


def test_any_option_is_given_with_dash_o_and_a_bad_one_is_named(tmp_path, capsys):
    conv = str(EXAMPLES / "conv2d.json")
    assert main(["compile", conv, "-o", str(tmp_path), "-O", "winograd_tile=4",
                 "-O", "winograd=true", "--threads", "1"]) == 0
    assert "polyc_winograd_f4x3_input(" in (tmp_path / "kernels.c").read_text()
    assert main(["compile", conv, "-o", str(tmp_path), "-O", "winograd=false"]) == 0
    assert "polyc_winograd_f" not in (tmp_path / "kernels.c").read_text()
    for bad, says in (("winograd_tile=3", "field 'options.winograd_tile': must be 0"),
                      ("bogus=1", "field 'options.bogus': is not an option of target 'cpu'")):
        assert main(["compile", conv, "-o", str(tmp_path), "-O", bad]) == 2
        assert says in capsys.readouterr().err


@pytest.mark.parametrize("argv,flag", [(["run", "--repeat", "0"], "--repeat"),
                                       (["run", "--seed", "-1"], "--seed"),
                                       (["tune", "--budget", "0"], "--budget"),
                                       (["tune", "--repeat", "-2"], "--repeat")])
def test_counts_below_their_minimum_are_usage_errors(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([argv[0], str(EXAMPLES / "softmax.json"), *argv[1:]])
    assert exit_.value.code == 2
    assert f"argument {flag}: must be at least" in capsys.readouterr().err


def test_compile_writes_its_files(tmp_path, capsys):
    out_dir = tmp_path / "out"
    assert main(["compile", _write(tmp_path, SMALL), "-o", str(out_dir)]) == 0
    assert "kernels.c" in capsys.readouterr().out
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "kernels.c", "report.txt", "schedule_trees.json", "schedule_trees.txt"]
    source = (out_dir / "kernels.c").read_text()
    trees = json.loads((out_dir / "schedule_trees.json").read_text())
    # one schedule tree per C kernel function, under the function's name
    assert trees and all(f"void {name}(" in source for name in trees)
    assert all(tree["kind"] == "domain" for tree in trees.values())
    text = (out_dir / "schedule_trees.txt").read_text()
    assert all(f"# {name}\n" in text for name in trees)
    assert "YOU ARE HERE" not in text
    assert "graph small" in (out_dir / "report.txt").read_text()


STAGES = ("load", "widen", "decompose", "simplify", "unshare", "fuse", "kernels", "model", "dependences",
          "schedule", "microkernels", "tile", "contract", "recompute", "lower-cpu", "codegen",
          "build")


def test_print_after_all_shows_every_pass(tmp_path, capsys):
    path = _write(tmp_path, SMALL)
    assert main(["run", path, "--repeat", "1", "--print-after-all"]) == 0
    err = capsys.readouterr().err
    printed = re.findall(r"^// ----- IR after (\S+(?: \S+)?) \(", err, re.M)
    assert {p.split(" ")[0] for p in printed} == set(STAGES)
    # every per-kernel pass, for every kernel
    kernels = [k.name for k in compile(path, build=False).kernels]
    for stage in STAGES[STAGES.index("model"):STAGES.index("codegen") + 1]:
        assert [p for p in printed if p.startswith(stage + " ")] == [
            f"{stage} {k}" for k in kernels]


def test_dump_dir_has_one_numbered_file_per_pass(tmp_path, capsys):
    dump = tmp_path / "dump"
    assert main(["compile", _write(tmp_path, SMALL), "-o", str(tmp_path / "out"),
                 "--dump-dir", str(dump)]) == 0
    names = sorted(p.name for p in dump.iterdir())
    assert names[0] == "01_load.txt" and names[-1].endswith("_build.txt")
    assert [int(n[:2]) for n in names] == list(range(1, len(names) + 1))


def test_a_bad_graph_exits_2_naming_node_and_field(tmp_path, capsys):
    bad = dict(SMALL, nodes=[{"op": "reduce_sum", "inputs": ["x"], "outputs": ["y"],
                              "name": "my_sum", "attrs": {"axes": [5]}}])
    assert main(["run", _write(tmp_path, bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith("polyc: error: ")
    assert "'my_sum'" in line and "reduce_sum" in line and "axes" in line
    assert "Traceback" not in captured.err


def test_every_problem_is_reported_on_its_own_line(tmp_path, capsys):
    bad = dict(SMALL, nodes=[
        {"op": "softmax", "inputs": ["x"], "outputs": ["y"], "attrs": {"axiss": 1}},
        {"op": "bogus", "inputs": ["x"], "outputs": ["z"]}], outputs=["y", "z"])
    assert main(["compile", _write(tmp_path, bad), "-o", str(tmp_path / "out")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith("polyc: error: node '") for line in lines)
    assert not (tmp_path / "out").exists()


def test_a_missing_file_exits_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.json")]) == 2
    assert "nope.json" in capsys.readouterr().err


def test_a_missing_c_compiler_is_an_error_not_a_traceback(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("POLYC_CC", str(tmp_path / "no-such-cc"))
    assert main(["run", _write(tmp_path, SMALL)]) == 3
    assert "no-such-cc" in capsys.readouterr().err


def _code_outside_comments(source: str) -> str:
    return re.sub(r"/\*.*?\*/", "", source, flags=re.S)


def test_hostile_names_compile_run_and_stay_out_of_the_code(tmp_path, capsys):
    path = _write(tmp_path, HOSTILE)
    assert main(["run", path, "--repeat", "1"]) == 0
    assert "OK" in capsys.readouterr().out
    assert main(["compile", path, "-o", str(tmp_path / "out")]) == 0
    source = (tmp_path / "out" / "kernels.c").read_text()
    code = _code_outside_comments(source)
    for raw in (HOSTILE_IN, HOSTILE_BIAS, HOSTILE_OUT, HOSTILE_NODE):
        assert raw not in code
    # no string literal, no call the compiler did not write, no preprocessor line but the
    # compiler's own prelude and the pragmas
    assert '"' not in code and not re.search(r"\bsystem\s*\(", code)
    assert source.startswith(PRELUDE)
    generated = _code_outside_comments(source[len(PRELUDE):])
    directives = {" ".join(line.split()[:2]) for line in generated.splitlines()
                  if line.lstrip().startswith("#")}
    assert directives <= {"#pragma omp"}
    # the sanitised names: [A-Za-z0-9_] behind the compiler's prefix
    assert "t0_x____include__stdio_h" in code
    assert "t1_a_b_system__rm" in code
    assert re.search(r"void polyc_k0_n___o\(", code)
    # comments keep the names readable, with every comment terminator defused
    assert source.count("/*") == source.count("*/")
