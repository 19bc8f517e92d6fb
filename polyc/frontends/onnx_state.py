"""The state of one ONNX import (`onnx.py` drives it, `onnx_ops.py` converts each op on
it): what each ONNX value is, a polyc tensor typed as it is written or a constant known
at import, and the nodes of the subgraph being written."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import GraphError, Problem
from ..graph.ir import TensorType
from ..graph.ops import OPS, OpError, check_attrs, infer

# ONNX element type -> polyc dtype name; the loader refuses those polyc lacks, by name
DTYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64", 6: "int32",
          7: "int64", 9: "bool"}


def onnx_module():
    try:
        import onnx
    except ImportError as e:  # an optional dependency: say which
        raise GraphError("import_onnx needs the onnx package (pip install onnx)") from e
    return onnx


def dtype_name(elem_type: int, where: str) -> str:
    if elem_type in DTYPES:
        return DTYPES[elem_type]
    onnx = onnx_module()
    name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in \
        onnx.TensorProto.DataType.values() else str(elem_type)
    raise GraphError(Problem(f"element type {name.lower()} is not one of polyc's dtypes "
                             f"({', '.join(sorted(set(DTYPES.values())))})", field=where))


@dataclass
class Importer:
    """The state of one import: what each ONNX value is (a polyc tensor, or a constant
    known at import), and the polyc document being written."""
    types: dict[str, TensorType]  # of the polyc tensors written so far
    consts: dict[str, np.ndarray] = field(default_factory=dict)
    alias: dict[str, str] = field(default_factory=dict)
    inputs: list[dict] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    constants: dict[str, dict] = field(default_factory=dict)
    node: Any = None  # the ONNX node being converted, for error messages
    count: int = 0

    # --- what the converters use -------------------------------------------------------

    def fail(self, message: str, field: str | None = None) -> GraphError:
        n = self.node
        return GraphError(Problem(message, node=(n.name or n.output[0]) if n is not None else None,
                                  op=n.op_type if n is not None else None, field=field))

    def tensor(self, value: str) -> str:
        """The polyc tensor holding ONNX value `value` (a constant becomes one)."""
        value = self.alias.get(value, value)
        if value in self.consts and value not in self.constants:
            a = self.consts[value]
            dtype = _np_dtype_name(a.dtype, value)
            if 0 in a.shape:
                raise self.fail(f"constant '{value}' is empty (shape {list(a.shape)}): "
                                "polyc tensors have no zero-sized dims")
            if a.dtype.kind in "iub" or np.isfinite(a.astype(np.float64)).all():
                self._write_constant(value, a, dtype)
            else:
                self._write_nonfinite(value, a, dtype)
        return value

    def _write_constant(self, name: str, a: np.ndarray, dtype: str) -> None:
        self.constants[name] = {"name": name, "shape": list(a.shape), "dtype": dtype,
                                "data": a.reshape(-1).tolist()}
        self.types[name] = TensorType(tuple(a.shape), dtype)

    def _write_nonfinite(self, name: str, a: np.ndarray, dtype: str) -> None:
        """A constant holding infinities or NaNs, which JSON cannot: the quotient of two
        finite ones, exact in IEEE arithmetic (x / 1 = x, +-1 / 0 = +-inf, 0 / 0 = NaN)."""
        wide = a.astype(np.float64)
        finite = np.isfinite(wide)
        num = np.where(finite, wide, np.where(np.isnan(wide), 0.0, np.sign(wide)))
        self._write_constant(f"{name}/num", num.astype(dtype), dtype)
        self._write_constant(f"{name}/den", finite.astype(dtype), dtype)
        self.op("div", f"{name}/num", f"{name}/den", out=name)

    def const(self, value, dtype: str) -> str:
        """A new constant tensor holding `value` (a scalar or an array) as `dtype`."""
        self.count += 1
        name = f"{self._prefix()}const{self.count}"
        # a dtype name, bfloat16 too: graph.ir registers ml_dtypes' with numpy
        self.consts[name] = np.asarray(value, dtype=dtype)
        return self.tensor(name)

    def known(self, value: str, what: str) -> np.ndarray:
        """The constant value of an input that must be known at import (a shape, axes...)."""
        value = self.alias.get(value, value)
        if value not in self.consts:
            raise self.fail(f"{what} must be a constant (an initializer, a Constant, or "
                            f"computed from Shape of a static input); '{value}' is computed "
                            "from the graph's inputs", field=what)
        return self.consts[value]

    def defined(self, value: str) -> bool:
        value = self.alias.get(value, value)
        return value in self.consts or value in self.types

    def shape(self, value: str) -> tuple[int, ...]:
        value = self.alias.get(value, value)
        if value in self.consts:
            return tuple(self.consts[value].shape)
        return self.types[value].shape

    def dtype(self, value: str) -> str:
        value = self.alias.get(value, value)
        if value in self.consts:
            return _np_dtype_name(self.consts[value].dtype, value)
        return self.types[value].dtype

    def op(self, op: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """Emit a polyc node on polyc tensors; returns its output's name."""
        if out is None:
            self.count += 1
            out = f"{self._prefix()}{op}{self.count}"
        try:  # typed now: the next converter may need the shape
            spec = OPS[op]
            self.types[out] = infer(spec, check_attrs(spec, attrs),
                                    [self.types[i] for i in inputs])
        except OpError as e:
            raise self.fail(f"as polyc's {op}: {e}", field=e.field) from e
        node = {"op": op, "inputs": list(inputs), "outputs": [out]}
        if attrs:
            node["attrs"] = attrs
        self.nodes.append(node)
        return out

    def _prefix(self) -> str:
        # names the import makes up are scoped to the ONNX node they came from
        return f"{self.node.output[0]}/" if self.node is not None else "onnx/"

    # --- ONNX attributes ---------------------------------------------------------------

    def attrs(self) -> dict[str, Any]:
        onnx = onnx_module()
        out = {}
        for a in self.node.attribute:
            if a.ref_attr_name:
                raise self.fail("attributes referring to a function's attributes are not "
                                "supported", field=a.name)
            out[a.name] = onnx.helper.get_attribute_value(a)
            if isinstance(out[a.name], bytes):
                out[a.name] = out[a.name].decode()
        return out


def _np_dtype_name(dt: np.dtype, where: str) -> str:
    if dt.name in DTYPES.values():
        return dt.name
    raise GraphError(Problem(f"element type {dt.name} is not one of polyc's dtypes", field=where))
