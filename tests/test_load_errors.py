"""One test per user-facing error of the subgraph loader (DESIGN.md, "Format details").

Each error test checks three things, because each is something a user relies on: the
graph is refused with a `GraphError`, the problem points at the right node and field, and
the rendered message (what the CLI prints and the service returns) says both. Most tests
also insist that one mistake yields exactly one problem: a pile of follow-on complaints
hides the real one.
"""
from __future__ import annotations

import itertools
import json
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polyc
from polyc import GraphError, Limits, load_graph
from polyc.compiler import Options
from polyc.graph.ir import TensorType


# --- building documents ------------------------------------------------------------------

def inp(name, shape, dtype="float32"):
    return {"name": name, "shape": shape, "dtype": dtype}


def node(op, inputs, output, /, name=None, **attrs):
    d = {"op": op, "inputs": inputs, "outputs": [output]}
    if attrs:
        d["attrs"] = attrs
    if name is not None:
        d["name"] = name
    return d


def doc(inputs, nodes, outputs, constants=None):
    d = {"name": "t", "inputs": inputs, "nodes": nodes, "outputs": outputs}
    if constants is not None:
        d["constants"] = constants
    return d


def unary(op, xshape, dtype="float32", /, **attrs):
    """x -> op -> y: the smallest graph that exercises one op's checks."""
    return doc([inp("x", xshape, dtype)], [node(op, ["x"], "y", **attrs)], ["y"])


def binary(op, a, b, adtype="float32", bdtype="float32", /, **attrs):
    return doc([inp("a", a, adtype), inp("b", b, bdtype)],
               [node(op, ["a", "b"], "y", **attrs)], ["y"])


def refused(src, *, node=None, field=None, says=(), only=True, limits=Limits()):
    """Load `src`, expect a GraphError with a problem at (node, field) whose message
    contains every string of `says`; return that problem."""
    with pytest.raises(GraphError) as info:
        load_graph(src, limits=limits)
    err = info.value
    assert err.problems, "a GraphError must carry at least one problem"
    hits = [p for p in err.problems if p.node == node and p.field == field]
    assert hits, f"no problem at node={node!r} field={field!r}: {err.problems}"
    if only:
        assert len(err.problems) == 1, f"one mistake, several problems: {err.problems}"
    p = hits[0]
    for s in (says,) if isinstance(says, str) else says:
        assert s in p.message, f"{s!r} not in {p.message!r}"
    text = str(err)
    if node is not None:
        assert f"node '{node}'" in text
    if field is not None:
        assert f"field '{field}'" in text
    assert p.message in text
    return p


# --- the op and its attributes -----------------------------------------------------------

def test_unknown_op_is_named_and_a_close_match_suggested():
    p = refused(unary("gelu2", [4]), node="y", field="op", says=["unknown op 'gelu2'", "gelu"])
    assert p.op == "gelu2"


def test_op_that_is_not_a_string():
    # An unhashable op once crashed the registry lookup with a TypeError.
    refused(unary(["relu"], [4]), node="y", field="op", says="unknown op")


def test_missing_op():
    d = unary("relu", [4])
    del d["nodes"][0]["op"]
    refused(d, node="y", field="op", says="missing")


def test_unknown_attribute_lists_the_allowed_ones():
    p = refused(binary("matmul", [2, 3], [3, 4], transpose=True), node="y",
                field="attrs.transpose", says=["unknown attribute 'transpose'", "transpose_a"])
    assert p.op == "matmul"


def test_attribute_on_an_op_without_attributes():
    refused(unary("relu", [4], alpha=0.1), node="y", field="attrs.alpha",
            says=["unknown attribute 'alpha'", "allowed: none"])


@pytest.mark.parametrize("op, attrs, field, says", [
    ("softmax", {"axis": "1"}, "attrs.axis", "expected an integer, got '1'"),
    ("softmax", {"axis": True}, "attrs.axis", "expected an integer, got True"),
    ("softmax", {"axis": 1.0}, "attrs.axis", "expected an integer, got 1.0"),
    ("reduce_sum", {"axes": [0.5]}, "attrs.axes", "expected a list of integers"),
    ("reduce_sum", {"axes": 1}, "attrs.axes", "expected a list of integers"),
    ("reduce_sum", {"axes": [True]}, "attrs.axes", "expected a list of integers"),
    ("reduce_sum", {"keepdims": 1}, "attrs.keepdims", "expected true or false, got 1"),
    ("layer_norm", {"epsilon": "1e-5"}, "attrs.epsilon", "expected a finite number"),
    ("layer_norm", {"epsilon": True}, "attrs.epsilon", "expected a finite number"),
    ("layer_norm", {"epsilon": math.inf}, "attrs.epsilon", "expected a finite number"),
    ("gelu", {"approximate": "fast"}, "attrs.approximate", "'none', 'tanh', got 'fast'"),
    ("cast", {"to": "uint8"}, "attrs.to", "int64, float16, bfloat16, bool, got 'uint8'"),
    ("pad", {"pads": [1, 1]}, "attrs.pads", "[before, after] integer pairs"),
    ("pad", {"pads": [[0, 1], [2.0, 0]]}, "attrs.pads", "[before, after] integer pairs"),
    ("transpose", {"perm": [1.0, 0.0]}, "attrs.perm", "expected a list of integers"),
    ("reshape", {"shape": "8"}, "attrs.shape", "expected a list of integers"),
])
def test_attribute_of_the_wrong_type(op, attrs, field, says):
    refused(unary(op, [2, 4], **attrs), node="y", field=field, says=says)


@pytest.mark.parametrize("attrs", [[], "none", 0, False])
def test_attrs_must_be_an_object(attrs):
    # Falsy non-objects used to pass as "no attributes": silently ignored input.
    d = unary("relu", [4])
    d["nodes"][0]["attrs"] = attrs
    refused(d, node="y", field="attrs", says="expected an object")


def test_null_attrs_mean_none():
    d = unary("softmax", [4])
    d["nodes"][0]["attrs"] = None
    assert dict(load_graph(d).nodes[0].attrs) == {"axis": -1}


@pytest.mark.parametrize("op, attrs, missing", [
    ("reshape", {}, "shape"),
    ("cast", {}, "to"),
    ("slice", {"starts": [0]}, "ends"),
    ("pad", {"value": 1.0}, "pads"),
    ("broadcast_to", {}, "shape"),
])
def test_missing_required_attribute(op, attrs, missing):
    refused(unary(op, [2, 4], **attrs), node="y", field=f"attrs.{missing}",
            says="missing required attribute")


def test_concat_without_axis():
    refused(binary("concat", [2, 3], [2, 3]), node="y", field="attrs.axis",
            says="missing required attribute")


def test_wrong_number_of_inputs():
    refused(unary("add", [4]), node="y", field="inputs", says="expects 2 inputs, got 1")


# --- tensors, names and the graph's structure ------------------------------------------------

def test_dangling_input_names_the_missing_tensor():
    d = doc([inp("x", [4])], [node("add", ["x", "bias"], "y")], ["y"])
    refused(d, node="y", field="inputs", says=["'bias'", "not a graph input"])


def test_dangling_input_suggests_a_close_name():
    d = doc([inp("weight", [4])], [node("relu", ["weigth"], "y")], ["y"])
    refused(d, node="y", field="inputs", says=["'weigth'", "'weight'"])


def test_duplicate_input_names():
    d = doc([inp("x", [4]), inp("x", [5])], [node("relu", ["x"], "y")], ["y"])
    refused(d, node="x", field="name", says="duplicate tensor name 'x'")


def test_constant_named_like_an_input():
    d = doc([inp("x", [1])], [node("relu", ["x"], "y")], ["y"],
            constants=[{"name": "x", "shape": [1], "dtype": "float32", "data": [1.0]}])
    refused(d, node="x", field="name", says="duplicate tensor name 'x'")


def test_node_output_named_like_an_input():
    d = doc([inp("x", [4])], [node("relu", ["x"], "x", name="r")], ["x"])
    refused(d, node="r", field="outputs", says=["'x'", "graph input"])


def test_two_nodes_producing_the_same_tensor():
    d = doc([inp("x", [4])], [node("relu", ["x"], "y", name="a"),
                              node("neg", ["x"], "y", name="b")], ["y"])
    refused(d, node="b", field="outputs", says=["'y'", "'a'"])


def test_duplicate_node_names():
    d = doc([inp("x", [4])], [node("relu", ["x"], "y", name="n"),
                              node("neg", ["y"], "z", name="n")], ["z"])
    refused(d, node="n", field="name", says="duplicate node name 'n'")


def test_cycle_of_two_nodes():
    d = doc([inp("x", [4])], [node("add", ["x", "b"], "a"), node("relu", ["a"], "b"),
                              node("neg", ["b"], "z")], ["z"])
    p = refused(d, node="a", field="inputs", says="cycle: 'a' -> 'b' -> 'a'")
    # Only the nodes on the cycle are named: 'z' merely depends on it.
    assert "'z'" not in p.message


def test_cycle_is_printed_in_data_flow_order():
    # 'z' comes first in the file but is only downstream of the cycle a -> b -> c -> a.
    d = doc([inp("x", [4])], [node("neg", ["c"], "z"), node("add", ["x", "c"], "a"),
                              node("relu", ["a"], "b"), node("exp", ["b"], "c")], ["z"])
    refused(d, node="c", field="inputs", says="cycle: 'c' -> 'a' -> 'b' -> 'c'")


def test_long_cycle_message_stays_short():
    n = 50
    nodes = [node("neg", [f"t{(i - 1) % n}"], f"t{i}") for i in range(n)]
    d = doc([inp("x", [4])], nodes + [node("add", ["x", "t0"], "y")], ["y"])
    p = refused(d, node="t0", field="inputs", says=["cycle", "44 more"])
    assert len(p.message) < 200


def test_largest_allowed_graph_loads_quickly():
    # The nodes given last-to-first, and a typo in every one: the sort, the checks and
    # the suggestions must all stay linear within the node limit (once quadratic: 50 s).
    n = Limits().max_nodes
    chain = [node("neg", [f"t{i}"], f"t{i + 1}") for i in range(n)][::-1]
    start = time.perf_counter()
    g = load_graph(doc([inp("t0", [1])], chain, [f"t{n}"]))
    assert len(g.nodes) == n and g.nodes[0].output == "t1"
    typos = [node("neg", [f"s{i}"], f"t{i + 1}") for i in range(n)]
    with pytest.raises(GraphError) as info:
        load_graph(doc([inp("t0", [1])], typos, [f"t{n}"]))
    assert len(info.value.problems) == n
    assert time.perf_counter() - start < 3


def test_self_loop():
    d = doc([inp("x", [4])], [node("add", ["x", "y"], "y")], ["y"])
    refused(d, node="y", field="inputs", says=["cycle", "'y'"])


def test_node_with_two_outputs():
    d = doc([inp("x", [4])], [{"op": "relu", "inputs": ["x"], "outputs": ["a", "b"]}], ["a"])
    refused(d, node="a", field="outputs", says="exactly one output")


def test_node_with_no_outputs():
    d = doc([inp("x", [4])], [{"op": "relu", "inputs": ["x"], "outputs": [], "name": "r"}],
            ["x"])
    refused(d, node="r", field="outputs", says="exactly one output")


def test_unknown_node_field():
    d = unary("relu", [4])
    d["nodes"][0]["attr"] = {}
    refused(d, node="y", field="attr", says="unknown field")


def test_unknown_top_level_field():
    d = unary("relu", [4])
    d["version"] = 2
    p = refused(d, field="version", says=["unknown field", "outputs"])
    assert p.node is None


def test_unknown_input_field():
    d = unary("relu", [4])
    d["inputs"][0]["layout"] = "NCHW"
    refused(d, node="x", field="layout", says="unknown field")


def test_missing_input_shape_is_reported_once():
    d = unary("relu", [4])
    del d["inputs"][0]["shape"]
    refused(d, node="x", field="shape", says="missing required field")


def test_unknown_dtype():
    refused(unary("relu", [4], "uint8"), node="x", field="dtype",
            says="unknown dtype 'uint8'")


@pytest.mark.parametrize("shape", [[0], [4, -1], [2.0], ["3"], [True], [None], "4", 4])
def test_bad_dims(shape):
    refused(unary("relu", shape), node="x", field="shape", says=repr(shape))


def test_rank_limit():
    refused(unary("relu", [1] * 9), node="x", field="shape", says=["rank 9", "limit of 8"])


def test_rank_limit_applies_to_computed_tensors():
    d = unary("reshape", [1], shape=[1] * 9)
    refused(d, node="y", field="shape", says=["rank 9", "limit of 8"])


def test_scalar_shape_is_accepted_and_broadcasts():
    g = load_graph(binary("add", [3], []))
    assert g.type_of("b") == TensorType((), "float32")
    assert g.type_of("y") == TensorType((3,), "float32")


def test_outputs_never_produced():
    d = unary("relu", [4])
    d["outputs"] = ["y", "z"]
    p = refused(d, field="outputs", says="'z' is never produced")
    assert p.node is None


def test_empty_outputs():
    d = unary("relu", [4])
    d["outputs"] = []
    refused(d, field="outputs", says="at least one output")


def test_output_listed_twice():
    d = unary("relu", [4])
    d["outputs"] = ["y", "y"]
    refused(d, field="outputs", says="'y' is listed 2 times")


def test_output_that_is_not_a_name():
    # Not also reported as "listed twice", as it once was.
    d = unary("relu", [4])
    d["outputs"] = ["y", 3]
    refused(d, field="outputs", says="got 3")


@pytest.mark.parametrize("key", ["inputs", "nodes", "outputs"])
def test_missing_top_level_list(key):
    d = unary("relu", [4])
    del d[key]
    refused(d, field=key, says="missing required field")


# --- shapes and dtypes of op applications ----------------------------------------------------

def test_matmul_contraction_dims_differ():
    refused(binary("matmul", [3, 4], [5, 6]), node="y", field="inputs",
            says=["contraction dims differ", "[3, 4]", "[5, 6]"])


def test_matmul_batch_dims_do_not_broadcast():
    refused(binary("matmul", [2, 3, 4], [3, 4, 5]), node="y", field="inputs",
            says="cannot be broadcast")


def test_broadcast_mismatch():
    refused(binary("add", [3, 4], [5]), node="y", field="inputs",
            says=["[3, 4]", "[5]", "cannot be broadcast"])


def test_dtype_mismatch():
    refused(binary("add", [4], [4], "float32", "int32"), node="y", field="inputs",
            says=["dtype mismatch", "float32", "int32"])


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("op, n_inputs", [("exp", 1), ("log", 1), ("pow", 2), ("softmax", 1),
                                          ("sqrt", 1), ("gelu", 1), ("reduce_mean", 1)])
def test_integers_refused_by_transcendental_ops(op, n_inputs, dtype):
    if n_inputs == 1:
        d = unary(op, [4], dtype)
    else:
        d = binary(op, [4], [4], dtype, dtype)
    refused(d, node="y", field="inputs", says=f"'{op}' is not defined on {dtype}")


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("op", ["add", "div", "neg", "abs", "relu", "reduce_sum", "greater"])
def test_integers_accepted_where_they_make_sense(op, dtype):
    spec = polyc.graph.ops.OPS[op]
    d = binary(op, [4], [4], dtype, dtype) if spec.arity[0] == 2 else unary(op, [4], dtype)
    assert load_graph(d).type_of("y").dtype == dtype


def test_transpose_a_on_a_vector():
    refused(binary("matmul", [4], [4, 5], transpose_a=True), node="y",
            field="attrs.transpose_a", says="rank >= 2")


def test_transpose_b_on_a_vector():
    refused(binary("matmul", [3, 4], [4], transpose_b=True), node="y",
            field="attrs.transpose_b", says="rank >= 2")


def test_conv2d_channel_mismatch():
    refused(binary("conv2d", [1, 3, 8, 8], [4, 2, 3, 3]), node="y", field="inputs",
            says=["channels", "3", "2"])


def test_conv2d_bias_of_the_wrong_shape():
    d = doc([inp("x", [1, 3, 8, 8]), inp("w", [4, 3, 3, 3]), inp("b", [3])],
            [node("conv2d", ["x", "w", "b"], "y")], ["y"])
    refused(d, node="y", field="inputs", says=["bias", "[4]"])


def test_conv2d_pads_of_the_wrong_length():
    refused(binary("conv2d", [1, 3, 8, 8], [4, 3, 3, 3], pads=[1, 1]), node="y",
            field="attrs.pads", says="expected 4 integers")


def test_conv2d_negative_pads():
    refused(binary("conv2d", [1, 3, 8, 8], [4, 3, 3, 3], pads=[1, -1, 1, 1]), node="y",
            field="attrs.pads", says=">= 0")


def test_layer_norm_gamma_of_the_wrong_shape():
    d = doc([inp("x", [2, 8]), inp("g", [4]), inp("b", [8])],
            [node("layer_norm", ["x", "g", "b"], "y")], ["y"])
    refused(d, node="y", field="inputs", says=["gamma", "[8]", "[4]"])


def test_layer_norm_beta_of_the_wrong_shape():
    d = doc([inp("x", [2, 8]), inp("g", [8]), inp("b", [2, 8])],
            [node("layer_norm", ["x", "g", "b"], "y")], ["y"])
    refused(d, node="y", field="inputs", says=["beta", "[8]", "[2, 8]"])


def test_attention_k_v_lengths_differ():
    d = doc([inp("q", [2, 8, 16]), inp("k", [2, 10, 16]), inp("v", [2, 12, 16])],
            [node("attention", ["q", "k", "v"], "y")], ["y"])
    refused(d, node="y", field="inputs", says=["Lk", "10", "12"])


def test_attention_q_k_depths_differ():
    d = doc([inp("q", [2, 8, 16]), inp("k", [2, 10, 8]), inp("v", [2, 10, 16])],
            [node("attention", ["q", "k", "v"], "y")], ["y"])
    refused(d, node="y", field="inputs", says=["last dim", "16", "8"])


# --- axes and data-movement attributes -------------------------------------------------------

@pytest.mark.parametrize("op", ["reduce_sum", "reduce_max", "logsumexp", "reduce_mean",
                                "variance"])
def test_reduction_with_empty_axes(op):
    refused(unary(op, [2, 4], axes=[]), node="y", field="attrs.axes",
            says=["empty list of axes", "omit"])


@pytest.mark.parametrize("op, attrs, field", [
    ("reduce_sum", {"axes": [2]}, "attrs.axes"),
    ("reduce_sum", {"axes": [-3]}, "attrs.axes"),
    ("softmax", {"axis": 2}, "attrs.axis"),
    ("log_softmax", {"axis": -3}, "attrs.axis"),
    ("layer_norm", {"axis": 5}, "attrs.axis"),
    ("slice", {"starts": [0], "ends": [1], "axes": [7]}, "attrs.axes"),
])
def test_axis_out_of_range(op, attrs, field):
    refused(unary(op, [2, 4], **attrs), node="y", field=field,
            says=["out of range", "rank 2"])


def test_concat_axis_out_of_range():
    refused(binary("concat", [2, 3], [2, 3], axis=2), node="y", field="attrs.axis",
            says="out of range")


def test_axis_on_a_scalar_is_out_of_range():
    # A rank-0 tensor has no axis 0; numpy agrees (AxisError).
    refused(unary("reduce_sum", [], axes=[0]), node="y", field="attrs.axes",
            says=["out of range", "rank 0"])


def test_repeated_axes():
    refused(unary("reduce_sum", [2, 4], axes=[1, -1]), node="y", field="attrs.axes",
            says="repeated axis")


@pytest.mark.parametrize("perm", [[0, 0], [0, 1, 2], [1], [1, 2]])
def test_transpose_perm_not_a_permutation(perm):
    refused(unary("transpose", [2, 4], perm=perm), node="y", field="attrs.perm",
            says=[str(perm), "not a permutation"])


@pytest.mark.parametrize("shape, says", [
    ([0, 8], "dims must be >= 1"),
    ([-2, 4], "dims must be >= 1"),
    ([-1, -1], "at most one -1"),
    ([3, 3], "cannot reshape 8 elements"),
    ([-1, 3], "cannot reshape 8 elements"),
])
def test_bad_reshape(shape, says):
    refused(unary("reshape", [2, 4], shape=shape), node="y", field="attrs.shape", says=says)


@pytest.mark.parametrize("attrs", [
    {"starts": [2], "ends": [2]},
    {"starts": [3], "ends": [1]},
    {"starts": [5], "ends": [9]},
    {"starts": [0, 4], "ends": [2, 8]},
])
def test_slice_producing_an_empty_tensor(attrs):
    refused(unary("slice", [4, 4], **attrs), node="y", field="attrs.starts",
            says="would be empty")


@pytest.mark.parametrize("steps", [[0], [-1]])
def test_slice_steps_must_be_positive(steps):
    refused(unary("slice", [4, 4], starts=[3], ends=[0], steps=steps), node="y",
            field="attrs.steps", says="steps must be > 0")


def test_slice_lists_of_different_lengths():
    refused(unary("slice", [4, 4], starts=[0, 0], ends=[2]), node="y", field="attrs.ends",
            says="has 1 entries but 'starts' has 2")


def test_slice_without_axes_on_too_few_dims():
    # 'axes' defaults to the first len(starts) axes; the error names what the user wrote.
    refused(unary("slice", [4], starts=[0, 0], ends=[1, 1]), node="y", field="attrs.starts",
            says="has 2 entries but the tensor has rank 1")


def test_pad_negative():
    refused(unary("pad", [4, 4], pads=[[0, 0], [-1, 2]]), node="y", field="attrs.pads",
            says="negative pads")


def test_pad_one_pair_per_axis():
    refused(unary("pad", [4, 4], pads=[[1, 1]]), node="y", field="attrs.pads",
            says="one [before, after] pair per axis")


def test_broadcast_to_incompatible_shape():
    refused(unary("broadcast_to", [3], shape=[2, 4]), node="y", field="attrs.shape",
            says="cannot broadcast [3] to [2, 4]")


# --- constants ---------------------------------------------------------------------------

def const_doc(data, shape=(2, 2), dtype="float32"):
    return doc([], [node("neg", ["c"], "y")], ["y"],
               constants=[{"name": "c", "shape": list(shape), "dtype": dtype, "data": data}])


def test_constant_data_length_differs_from_shape():
    refused(const_doc([1, 2, 3]), node="c", field="data", says=["3 values", "[2, 2]", "4"])


def test_scalar_constant_is_a_list_of_one():
    g = load_graph(const_doc([2.5], shape=()))
    assert g.constants[0].data == (2.5,)
    refused(const_doc(2.5, shape=()), node="c", field="data", says="flat list")


def test_constant_data_must_be_flat():
    refused(const_doc([[1, 2], [3, 4]], shape=[2]), node="c", field="data", says="finite number")


@pytest.mark.parametrize("token", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_in_json_text(token):
    text = json.dumps(const_doc([1, 2, 3, 4])).replace("4]", f"{token}]")
    assert token in text
    with pytest.raises(GraphError, match=f"{token}.*not valid JSON"):
        load_graph(text)


@pytest.mark.parametrize("v", [math.nan, math.inf])
def test_nan_in_a_dict_is_refused_too(v):
    # A dict never went through the JSON parser, so the value check must catch it.
    refused(const_doc([1.0, 2.0, v, 4.0]), node="c", field="data", says="finite number")


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_integer_past_floats_range_in_float_data(dtype):
    # math.isfinite raised OverflowError on it: a crash, not a GraphError
    refused(const_doc([1.0, 2.0, 10**400, 4.0], dtype=dtype), node="c", field="data",
            says="finite number")
    text = json.dumps(const_doc([1, 2, 3, 4], dtype=dtype)).replace("4]", f"{10**400}]")
    refused(json.loads(text), node="c", field="data", says="finite number")


@pytest.mark.parametrize("dtype,big,largest", [("float32", 1e39, 3.4028234663852886e38),
                                               ("float16", 70000.0, 65504),
                                               ("bfloat16", 3.5e38, 3.3895313892515355e38)])
def test_float_constant_out_of_its_dtypes_range(dtype, big, largest):
    """A finite JSON number that is infinite in the constant's dtype was an Infinity
    JSON cannot write, made silently."""
    refused(const_doc([1.0, big, 2.0, 3.0], dtype=dtype), node="c", field="data",
            says=[f"does not fit in {dtype}", repr(big)])
    refused(const_doc([1.0, True, 2.0, big], dtype=dtype), node="c", field="data",
            says="got True")  # the loop's first complaint stands
    graph = load_graph(const_doc([1.0, largest, -largest, 3.0], dtype=dtype))
    assert graph.constants[0].data == (1.0, largest, -largest, 3.0)


def test_a_bad_value_deep_in_large_data_is_named():
    """Large data is checked in numpy; a bad value in it is still named by the loop."""
    n = 200_000
    good = [float(i % 7) - 3.0 for i in range(n - 1)] + [5]
    graph = load_graph(const_doc(good, shape=(n,)))
    assert graph.constants[0].data == tuple(good)
    for bad, says in ((math.nan, "got nan"), (True, "got True"), ("1.5", "got '1.5'"),
                      (None, "got None")):
        refused(const_doc(good[:-1] + [bad], shape=(n,)), node="c", field="data", says=says)
    ints = [i % 1000 for i in range(n - 1)]
    assert load_graph(const_doc(ints + [2**31 - 1], shape=(n,), dtype="int32")
                      ).constants[0].data[-1] == 2**31 - 1
    refused(const_doc(ints + [2**31], shape=(n,), dtype="int32"), node="c", field="data",
            says="does not fit in int32")
    refused(const_doc(ints + [0.5], shape=(n,), dtype="int32"), node="c", field="data",
            says="got 0.5")


def test_bool_in_constant_data():
    refused(const_doc([1.0, True, 0.0, 1.0]), node="c", field="data", says="got True")


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_fraction_in_integer_constant(dtype):
    refused(const_doc([1, 2, 3.5, 4], dtype=dtype), node="c", field="data",
            says=["an integer", "3.5"])


@pytest.mark.parametrize("dtype,big", [("int32", 2**31), ("int64", 2**63), ("int64", -2**63 - 1)])
def test_integer_constant_out_of_range(dtype, big):
    refused(const_doc([1, 2, big, 4], dtype=dtype), node="c", field="data",
            says=f"does not fit in {dtype}")


def test_int64_constant_keeps_values_past_int32():
    graph = load_graph(const_doc([1, -2**63, 2**40, 2**63 - 1], dtype="int64"))
    assert graph.constants[0].data == (1, -2**63, 2**40, 2**63 - 1)


def test_constant_without_data():
    d = const_doc([1, 2, 3, 4])
    del d["constants"][0]["data"]
    refused(d, node="c", field="data", says="missing required field")


# --- size limits -----------------------------------------------------------------------------

def test_huge_shape_is_refused_fast_with_the_limit_named():
    start = time.perf_counter()
    p = refused(unary("relu", [1_000_000_000, 1_000_000_000]), node="x", field="shape",
                says=[str(10**18), str(Limits().max_elements), "per tensor"])
    assert time.perf_counter() - start < 0.5
    assert "limit" in p.message


def test_huge_computed_tensor_is_refused_at_its_node():
    d = unary("broadcast_to", [1], shape=[1_000_000_000, 1_000_000_000])
    refused(d, node="y", field="shape", says=["per tensor", str(Limits().max_elements)])


def test_total_element_limit():
    d = doc([inp("a", [8, 8]), inp("b", [8, 8])], [node("add", ["a", "b"], "y")], ["y"])
    load_graph(d, limits=Limits(max_total_elements=192))
    refused(d, node="y", field="shape", says=["in total", "191"],
            limits=Limits(max_total_elements=191))
    refused(d, node="b", field="shape", says=["in total", "100"],
            limits=Limits(max_total_elements=100))


def test_per_tensor_limit_is_configurable():
    refused(unary("relu", [4, 4]), node="x", field="shape", says=["16 elements", "15"],
            limits=Limits(max_elements=15))


def test_node_count_limit():
    d = doc([inp("x", [1])], [node("neg", ["x"], f"y{i}") for i in range(5)], ["y0"])
    refused(d, field="nodes", says=["5 nodes", "limit of 4"], limits=Limits(max_nodes=4))


# --- sources: dicts, JSON text, files ----------------------------------------------------

@pytest.mark.parametrize("src", [[1, 2], 42, None])
def test_non_dict_source(src):
    with pytest.raises(GraphError, match="expected a path, a JSON string or a dict"):
        load_graph(src)


@pytest.mark.parametrize("text, kind", [("[1, 2]", "list"), ('  ["x"]', "list")])
def test_json_text_that_is_not_an_object(text, kind):
    with pytest.raises(GraphError, match=f"must be a JSON object, got {kind}"):
        load_graph(text)


@pytest.mark.parametrize("text", ['{"name": "x",', "{'name': 'x'}", "{} trailing"])
def test_invalid_json_text(text):
    with pytest.raises(GraphError, match="invalid JSON"):
        load_graph(text)


def test_invalid_json_in_a_file(tmp_path):
    f = tmp_path / "g.json"
    f.write_text('{"name": ')
    with pytest.raises(GraphError, match="invalid JSON"):
        load_graph(f)


def test_file_that_is_not_utf8(tmp_path):
    f = tmp_path / "g.json"
    f.write_bytes(b'{"name": "\xff"}')
    with pytest.raises(GraphError, match="UTF-8"):
        load_graph(f)


def test_path_that_does_not_exist(tmp_path):
    missing = tmp_path / "nope.json"
    for src in (missing, str(missing)):
        with pytest.raises(GraphError, match="cannot read graph file") as info:
            load_graph(src)
        assert "nope.json" in str(info.value)
        assert "No such file" in str(info.value)


def test_load_from_file_text_and_dict_agree(tmp_path):
    d = unary("softmax", [2, 4])
    f = tmp_path / "g.json"
    f.write_text(json.dumps(d))
    assert load_graph(f) == load_graph(str(f)) == load_graph(json.dumps(d)) == load_graph(d)


# --- every problem at once ---------------------------------------------------------------

def test_all_structural_problems_are_reported_together():
    d = doc([inp("x", [0])], [node("relu", ["x"], "y", alpha=1), node("gelu2", ["x"], "z")],
            ["y"])
    with pytest.raises(GraphError) as info:
        load_graph(d)
    where = {(p.node, p.field) for p in info.value.problems}
    assert where == {("x", "shape"), ("y", "attrs.alpha"), ("z", "op")}


# --- what the loader accepts and how it normalises -------------------------------------------

def test_nodes_in_any_order_are_sorted():
    nodes = [node("relu", ["c"], "d"), node("neg", ["b"], "c"), node("exp", ["x"], "b")]
    g = load_graph(doc([inp("x", [4])], nodes, ["d"]))
    assert [n.output for n in g.nodes] == ["b", "c", "d"]


def test_independent_nodes_sort_the_same_whatever_the_listing():
    # one order for every listing of the same graph: the same kernels, the same cache key
    nodes = [node("exp", ["x"], "p"), node("neg", ["x"], "a"), node("abs", ["x"], "m"),
             node("add", ["p", "a"], "s"), node("mul", ["m", "s"], "y")]
    orders = {tuple(n.output for n in load_graph(doc([inp("x", [4])], list(listing), ["y"])).nodes)
              for listing in itertools.permutations(nodes)}
    assert orders == {("a", "m", "p", "s", "y")}


def test_graph_output_may_be_an_input_or_a_constant():
    d = doc([inp("x", [4])], [], ["x", "c"],
            constants=[{"name": "c", "shape": [2], "dtype": "float32", "data": [1, 2]}])
    g = load_graph(d)
    assert g.outputs == ("x", "c") and g.nodes == ()
    assert g.type_of("c") == TensorType((2,), "float32")


def test_dead_nodes_are_dropped_with_a_note():
    nodes = [node("relu", ["x"], "y"), node("exp", ["x"], "unused", name="dead"),
             node("neg", ["unused"], "also_unused")]
    g = load_graph(doc([inp("x", [4])], nodes, ["y"]))
    assert [n.name for n in g.nodes] == ["y"]
    assert "unused" not in g.types
    assert any("'dead'" in note and "dropped" in note for note in g.notes)
    assert any("'also_unused'" in note for note in g.notes)


def test_dtype_defaults_to_float32():
    d = unary("relu", [4])
    del d["inputs"][0]["dtype"]
    assert load_graph(d).type_of("y") == TensorType((4,), "float32")


def test_node_name_defaults_to_its_output():
    g = load_graph(unary("relu", [4]))
    assert g.nodes[0].name == "y"


@pytest.mark.parametrize("op, attrs, shape", [
    ("reduce_sum", {"axes": [-1]}, (2,)),
    ("reduce_max", {"axes": [-2, 1], "keepdims": True}, (1, 1)),
    ("softmax", {"axis": -2}, (2, 4)),
    ("layer_norm", {"axis": -2}, (2, 4)),
    ("slice", {"starts": [-3], "ends": [-1], "axes": [-1]}, (2, 2)),
    ("slice", {"starts": [-4], "ends": [-1], "axes": [-1], "steps": [2]}, (2, 2)),
    ("transpose", {"perm": [1, 0]}, (4, 2)),
    ("transpose", {}, (4, 2)),
    ("reshape", {"shape": [-1, 2]}, (4, 2)),
])
def test_axes_and_negative_indices_accepted(op, attrs, shape):
    assert load_graph(unary(op, [2, 4], **attrs)).type_of("y").shape == shape


def test_concat_with_negative_axis():
    g = load_graph(binary("concat", [2, 3], [2, 5], axis=-1))
    assert g.type_of("y").shape == (2, 8)


def test_defaults_are_filled_in():
    d = doc([inp("x", [2, 4]), inp("w", [4, 4]), inp("k", [4, 4, 1, 1])],
            [node("reduce_sum", ["x"], "r", axes=[1]),
             node("layer_norm", ["x"], "ln"),
             node("matmul", ["x", "w"], "mm"),
             node("gelu", ["x"], "ge"),
             node("pad", ["x"], "pd", pads=[[1, 0], [0, 1]]),
             node("softmax", ["x"], "sm"),
             node("reshape", ["x"], "x4", shape=[1, 4, 2, 1]),
             node("conv2d", ["x4", "k"], "cv"),
             node("attention", ["x", "x", "x"], "at")],
            ["r", "ln", "mm", "ge", "pd", "sm", "cv", "at"])
    attrs = {n.output: dict(n.attrs) for n in load_graph(d).nodes}
    assert attrs["r"] == {"axes": (1,), "keepdims": False}
    assert attrs["ln"] == {"axis": -1, "epsilon": 1e-5}
    assert attrs["mm"] == {"transpose_a": False, "transpose_b": False}
    assert attrs["ge"] == {"approximate": "none"}
    assert attrs["pd"] == {"pads": ((1, 0), (0, 1)), "value": 0.0}
    assert attrs["sm"] == {"axis": -1}
    assert attrs["cv"] == {"strides": (1, 1), "pads": (0, 0, 0, 0), "dilations": (1, 1)}
    # scale's default, 1/sqrt(D), depends on the shape; absent means "the default".
    assert attrs["at"] == {"causal": False}


def test_shape_rules_of_composites_and_contractions():
    d = doc([inp("q", [2, 1, 5, 8]), inp("k", [3, 7, 8]), inp("v", [3, 7, 6]),
             inp("x", [2, 3, 4]), inp("w", [4, 6]), inp("img", [1, 3, 9, 9]),
             inp("f", [5, 3, 3, 3])],
            [node("attention", ["q", "k", "v"], "at", causal=True),
             node("linear", ["x", "w"], "li"),
             node("matmul", ["x", "w"], "mm", transpose_a=False),
             node("conv2d", ["img", "f"], "cv", strides=[2, 2], pads=[1, 1, 1, 1]),
             node("log_softmax", ["x"], "ls", axis=0)],
            ["at", "li", "mm", "cv", "ls"])
    g = load_graph(d)
    assert g.type_of("at").shape == (2, 3, 5, 6)
    assert g.type_of("li").shape == (2, 3, 6)
    assert g.type_of("mm").shape == (2, 3, 6)
    assert g.type_of("cv").shape == (1, 5, 5, 5)
    assert g.type_of("ls").shape == (2, 3, 4)


def test_canonical_json_loads_back_to_the_same_graph():
    d = doc([inp("x", [2, 4])],
            [node("pad", ["x"], "p", pads=[[1, 0], [0, 1]], value=2),
             node("reduce_max", ["p"], "y", axes=[-1])], ["y"])
    g = load_graph(d)
    assert load_graph(g.to_json()) == g
    assert load_graph(json.dumps(g.to_json())) == g


# --- robustness: whatever the document, only GraphError comes out ----------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True)
    | st.sampled_from(["", "x", "y", "add", "float32", "axes"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                               max_size=3),
    max_leaves=8)


def _paths(v, prefix=()):
    yield prefix
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, prefix + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v):
            yield from _paths(x, prefix + (i,))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_corruption_of_a_valid_graph_is_a_graph_error(data):
    """Replace one part of a valid document by arbitrary JSON: the loader must accept it
    or raise GraphError, never crash with another exception."""
    d = doc([inp("x", [2, 4]), inp("w", [4, 3])],
            [node("matmul", ["x", "w"], "h"), node("reduce_sum", ["h"], "y", axes=[1]),
             node("slice", ["x"], "s", starts=[0], ends=[1])], ["y", "s"],
            constants=[{"name": "c", "shape": [2], "dtype": "float32", "data": [1, 2]}])
    paths = [p for p in _paths(d) if p]
    path = data.draw(st.sampled_from(paths))
    target = d
    for k in path[:-1]:
        target = target[k]
    target[path[-1]] = data.draw(_json)
    try:
        load_graph(d)
    except GraphError as e:
        assert e.problems and all(p.message for p in e.problems)


def test_a_number_too_large_for_a_float_is_refused():
    text = ('{"inputs": [{"name": "x", "shape": [1]}], "nodes": [{"op": "pad", "inputs": ["x"], '
            '"outputs": ["y"], "attrs": {"pads": [[1, 1]], "value": 1e999}}], "outputs": ["y"]}')
    with pytest.raises(GraphError, match="1e999 is too large"):
        load_graph(text)


@pytest.mark.parametrize("options, field", [
    ({"threads": -1}, "threads"), ({"threads": 10**6}, "threads"),
    ({"max_operations": 0}, "max_operations"), ({"microkernel_isa": "sse9"}, "microkernel_isa"),
    ({"tile_sizes": (16, 0)}, "tile_sizes"), ({"microkernel_tiles": (("kc", -5),)},
                                              "microkernel_tiles"),
    ({"microkernel_tiles": (("kc",),)}, "microkernel_tiles"), ({"winograd_tile": 3}, "winograd_tile"),
])
def test_option_values_polyc_cannot_use_name_the_option(options, field):
    with pytest.raises(GraphError, match=rf"^field 'options\.{field}': "):
        Options(**options)
