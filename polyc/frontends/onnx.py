"""ONNX in: `import_onnx(model_or_path) -> Graph` (DESIGN.md, "Front ends").

An ONNX graph (opset 13 or later, default domain) becomes polyc's subgraph format, then
goes through the same loader and validation as JSON. Values keep their ONNX names.
An input dim with a `dim_param` that is an identifier becomes a symbol of the same name
(DESIGN.md's symbolic dims; an op whose conversion needs that dim's value is refused,
naming the node); other shapes are polyc's own inference on the nodes the import writes (ONNX's shape inference checks the model first). What depends only on
constants (initializers, `Constant`, `Shape` of a static input and any computation on
those: the usual shape arithmetic in front of a Reshape) is evaluated at import by
ONNX's reference evaluator, so such values arrive as constants, and a shape input
(Reshape's shape, Slice's starts...) that is not one is refused. Each ONNX op maps onto
primitive or composite ops of the format (`onnx_ops.py`); an op, dtype or attribute the
format cannot express is a `GraphError` naming it and the node.
"""
from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..errors import GraphError, Problem
from ..graph.ir import Graph, TensorType
from ..graph.load import load_graph
from ..graph.ops import OpError
from ..graph.symbols import is_identifier, symbol
from . import onnx_ops
from .onnx_state import Importer, dtype_name, onnx_module

MIN_OPSET = 13


def _load_model(model_or_path):
    onnx = onnx_module()
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path
    try:
        if isinstance(model_or_path, (bytes, bytearray)):
            return onnx.load_from_string(bytes(model_or_path))
        if isinstance(model_or_path, (str, os.PathLike)):
            if not os.path.isfile(model_or_path):
                raise GraphError(f"no ONNX file at {os.fspath(model_or_path)!r}")
            return onnx.load(os.fspath(model_or_path), load_external_data=True)
    except GraphError:
        raise
    except Exception as e:  # protobuf's DecodeError and friends: a damaged file
        raise GraphError(f"not a readable ONNX model: {type(e).__name__}: {e}") from e
    raise GraphError(f"expected an onnx.ModelProto, a path or bytes, got "
                     f"{type(model_or_path).__name__}")


def _check_opset(model) -> None:
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            if o.version < MIN_OPSET:
                raise GraphError(f"opset {o.version} of the default domain: polyc imports "
                                 f"opset {MIN_OPSET} and later (convert the model with "
                                 "onnx.version_converter)")
            return
    raise GraphError("the model imports no opset of the default ONNX domain")


def _input_shape(t, where: str) -> tuple:
    if not t.HasField("shape"):
        raise GraphError(Problem("has no shape (ONNX shape inference could not find it)",
                                 field=where))
    dims = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            dims.append(d.dim_value)
        elif is_identifier(d.dim_param):
            dims.append(symbol(d.dim_param))
        else:
            sym = d.dim_param or "?"
            raise GraphError(Problem(f"dim '{sym}' is neither static nor a named symbol (an "
                                     "identifier): give the input a fixed shape or name the "
                                     "dim", field=where))
    return tuple(dims)


def import_onnx(model_or_path, *, constants: dict[str, Any] | None = None) -> Graph:
    """An ONNX model (a ModelProto, a path to a .onnx file, or its bytes) as a Graph.

    `constants` freezes graph inputs to the given values (as TVM's `freeze_params`
    does): a shape or axes fed as an input becomes known at import, and a weight fed as
    an input becomes a constant the compiler can fold."""
    onnx = onnx_module()
    model = _load_model(model_or_path)
    _check_opset(model)
    try:
        model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as e:  # inconsistent shapes or types: the model is wrong, say where
        raise GraphError(f"ONNX shape inference refuses the model: {e}") from e
    g = model.graph
    consts = {init.name: onnx.numpy_helper.to_array(init) for init in g.initializer}
    for init in g.initializer:
        dtype_name(init.data_type, f"initializer {init.name}")
    names = {v.name for v in g.input}
    for name, value in (constants or {}).items():
        if name not in names:
            raise GraphError(Problem(f"is not an input of the model (inputs: "
                                     f"{', '.join(sorted(names))})", field=f"constants.{name}"))
        consts[name] = np.asarray(value)
    imp = Importer({}, consts)
    for v in list(g.input) + list(g.output):
        if not v.type.HasField("tensor_type"):
            raise GraphError(Problem("is not a tensor (sequences, maps and optionals are "
                                     "not supported)", field=f"value {v.name}"))
        dtype_name(v.type.tensor_type.elem_type, f"value {v.name}")
    for v in g.input:
        if v.name not in consts:  # an input with an initializer is a constant
            tt = v.type.tensor_type
            shape = _input_shape(tt, f"input {v.name}")
            if 0 in shape:
                raise GraphError(Problem(
                    f"has no elements (shape {list(shape)}): polyc tensors have no zero-sized "
                    "dims; pass it in `constants` (it holds no data) to evaluate what depends "
                    "on it at import", field=f"input {v.name}"))
            dtype = dtype_name(tt.elem_type, f"input {v.name}")
            imp.types[v.name] = TensorType(shape, dtype)
            imp.inputs.append({"name": v.name, "shape": [d if type(d) is int else str(d)
                                                         for d in shape], "dtype": dtype})
    for n in g.node:
        imp.node = n
        try:
            onnx_ops.convert(imp, n)
        except (TypeError, OpError) as e:  # a conversion that needs a symbolic dim's value
            if not any(t.shape and not t.static for t in imp.types.values()):
                raise
            raise GraphError(Problem(f"its conversion needs the value of a symbolic dim "
                                     f"({e})", node=n.name or n.output[0], op=n.op_type)
                             ) from None
    imp.node = None
    outputs = []
    for v in g.output:
        src = imp.alias.pop(v.name, v.name)
        if src != v.name:  # an Identity's output: a copy under the ONNX name
            if src in imp.consts:
                imp.consts[v.name] = imp.consts[src]
            else:
                imp.op("reshape", imp.tensor(src), out=v.name, shape=list(imp.shape(src)))
        outputs.append(imp.tensor(v.name))
    doc = {"name": g.name or "onnx", "inputs": imp.inputs, "nodes": imp.nodes,
           "outputs": outputs}
    if imp.constants:
        doc["constants"] = list(imp.constants.values())
    return load_graph(doc)
