"""polyc on the ONNX node tests: the cases the onnx package generates for its backends.

    python benchmarks/onnx_conformance.py [--ops Add,Softmax] [--verbose] [--target npu]

Every case (those of `onnx.backend.test.case.node.collect_testcases`) whose ops all have an
importer in polyc and whose tensors all have dtypes the importer maps is imported,
compiled for the cpu and run on each of its data sets, and its outputs compared with the
case's expected ones at the case's tolerances. A case is a match, refused (a GraphError:
polyc says what it cannot express), wrong (outputs differ) or crashed (anything else).
Prints one row per ONNX op (a case counts under every op it uses) and the totals.
`tests/test_onnx_conformance.py` runs the same cases and fails on any wrong or crashed one.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from collections import Counter, defaultdict
from typing import NamedTuple

import numpy as np


class Verdict(NamedTuple):
    kind: str  # match | refused | wrong | crashed
    detail: str = ""


def eligible_cases(ops: set[str] | None = None) -> list:
    """The node cases polyc's importer takes on: ops it converts, dtypes it maps."""
    from polyc.frontends.onnx_state import DTYPES
    from polyc.frontends.onnx_ops import CONVERTERS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the generators' own overflow warnings
        cases = _generated_cases(set(CONVERTERS))
    out = []
    for case in cases:
        g = case.model.graph
        used = {n.op_type for n in g.node}
        values = list(g.input) + list(g.output)
        if (case.kind == "node" and used <= set(CONVERTERS) and (ops is None or used & ops)
                and all(v.type.HasField("tensor_type")
                        and v.type.tensor_type.elem_type in DTYPES for v in values)):
            out.append(case)
    return out


def _generated_cases(converted: set[str]) -> list:
    """What `collect_testcases` returns, less the modules that cannot give an eligible
    case: each module's classes make their cases as they are defined, and a module named
    for an op the importer lacks, an op no function body expands into others, makes only
    cases of that op (the pools' modules alone took 9 of the 12 s the cases cost)."""
    import importlib
    import pkgutil

    import onnx.backend.test.case.node as node
    import onnx.defs

    schemas = {s.name.lower(): s for s in onnx.defs.get_all_schemas()}

    def useless(module: str) -> bool:
        s = schemas.get(module.replace("_", ""))
        return (s is not None and s.name not in converted and not s.has_function
                and not s.has_context_dependent_function)

    for _, name, ispkg in pkgutil.iter_modules(node.__path__):
        if not ispkg and not useless(name):  # packages: ai.onnx.ml's ops, none converted
            importlib.import_module(f"{node.__name__}.{name}")
    return node._NodeTestCases


def _array(a) -> np.ndarray:
    """A data set's value: an array, or a TensorProto (some generators keep those)."""
    import onnx

    return onnx.numpy_helper.to_array(a) if isinstance(a, onnx.TensorProto) else np.asarray(a)


def _frozen(case, inputs: dict) -> dict:
    """The inputs a case feeds where polyc needs a constant (a shape, axes, bounds),
    directly or through the arithmetic that computes one (CenterCropPad's expansion
    computes Pad's pads from its `shape` input): the data set's values, frozen into the
    model at import (polyc compiles for one shape). A `Shape` reads only its input's
    static shape, so what it reads is not frozen. An input with no elements holds no
    data, only its static shape: frozen too, as `import_onnx`'s message for it asks."""
    from polyc.frontends.onnx_ops import SHAPE_INPUTS

    nodes = case.model.graph.node
    needed = {n.input[pos] for n in nodes for pos in SHAPE_INPUTS.get(n.op_type, ())
              if pos < len(n.input) and n.input[pos]}
    for n in reversed(nodes):  # topological order: a value's producer comes before it
        if n.op_type != "Shape" and needed & set(n.output):
            needed |= {v for v in n.input if v}
    out = {k: v for k, v in inputs.items() if v.size == 0 or k in needed}
    return out


def run_case(case, target: str = "cpu") -> Verdict:
    import onnx

    import polyc

    g = case.model.graph
    declared = {v.name: onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)
                for v in g.input}
    outputs = [v.name for v in g.output]
    compiled = frozen = None
    for inputs, expected in case.data_sets:
        feeds = {v.name: _array(a).astype(declared[v.name], copy=False)
                 for v, a in zip(g.input, inputs)}
        try:
            if compiled is None:
                frozen = _frozen(case, feeds)
                compiled = polyc.compile(polyc.import_onnx(case.model, constants=frozen),
                                         target)
            elif any(not np.array_equal(feeds[k], v) for k, v in frozen.items()):
                return Verdict("refused", "data sets with different shape inputs")
            got = compiled(**{k: v for k, v in feeds.items() if k not in frozen})
        except polyc.GraphError as e:
            return Verdict("refused", str(e))
        except Exception as e:
            return Verdict("crashed", f"{type(e).__name__}: {e}")
        for name, want in zip(outputs, expected):
            have, want = got[name], _array(want)
            if have.shape != want.shape or have.dtype != want.dtype:
                return Verdict("wrong", f"{name}: {have.dtype}{list(have.shape)}, expected "
                                        f"{want.dtype}{list(want.shape)}")
            try:
                np.testing.assert_allclose(have.astype(np.float64), want.astype(np.float64),
                                           rtol=case.rtol, atol=max(case.atol, 1e-6))
            except AssertionError as e:
                return Verdict("wrong", f"{name}: {str(e).strip().splitlines()[2:4]}")
    return Verdict("match")


def table(results: dict[str, Verdict], cases: list) -> str:
    by_op: dict[str, Counter] = defaultdict(Counter)
    for case in cases:
        for op in {n.op_type for n in case.model.graph.node}:
            by_op[op][results[case.name].kind] += 1
    kinds = ("match", "refused", "wrong", "crashed")
    head = f"{'op':24} " + " ".join(f"{k:>8}" for k in kinds)
    lines = [head, "-" * len(head)]
    for op in sorted(by_op):
        lines.append(f"{op:24} " + " ".join(f"{by_op[op][k]:>8}" for k in kinds))
    total = Counter(v.kind for v in results.values())
    lines.append("-" * len(head))
    lines.append(f"{'cases':24} " + " ".join(f"{total[k]:>8}" for k in kinds))
    n = max(1, len(results))
    lines.append(f"{total['match']} of {len(results)} cases match ({total['match'] / n:.1%}); "
                 f"{total['refused']} refused, {total['wrong']} wrong, "
                 f"{total['crashed']} crashed")
    return "\n".join(lines)


def main() -> int:
    from polyc import targets

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default="", help="comma-separated ONNX ops (default: all)")
    parser.add_argument("--verbose", action="store_true", help="print every case not matched")
    parser.add_argument("--target", default="cpu", choices=targets.names())
    args = parser.parse_args()
    cases = eligible_cases(set(args.ops.split(",")) if args.ops else None)
    results = {}
    for case in cases:
        results[case.name] = run_case(case, args.target)
        if args.verbose and results[case.name].kind != "match":
            print(f"{case.name}: {results[case.name].kind}: {results[case.name].detail}",
                  file=sys.stderr, flush=True)
    print(table(results, cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())
