"""benchmarks/random_graphs.py: a fixed seed's first graphs of medium size, on each
target, match the reference (the script runs longer by hand: see its docstring)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from polyc import targets

_path = Path(__file__).resolve().parent.parent / "benchmarks" / "random_graphs.py"
_spec = importlib.util.spec_from_file_location("random_graphs", _path)
random_graphs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(random_graphs)


@pytest.mark.parametrize("target", targets.names())
def test_a_seed_s_first_graphs_match_the_reference(target, tmp_path, capsys):
    assert random_graphs.main(["--graphs", "8", "--seconds", "600", "--targets", target,
                               "--seed", "1", "--out", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("8 graphs: ")
    assert not list(tmp_path.iterdir())
