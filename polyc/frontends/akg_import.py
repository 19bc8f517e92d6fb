"""The AKG importer's machinery: reading a composite kernel's tensors and ops in order,
checking each against its description, and emitting typed polyc nodes for the op table
(`akg_ops.py`) to use. `akg.import_akg` is the entry point."""
from __future__ import annotations

import math
from typing import Any

from ..errors import GraphError, Problem
from ..graph.ir import DTYPES, INT_BITS, Graph, TensorType
from ..graph.load import Limits, load_graph
from ..graph.ops import OPS, OpError, check_attrs, infer
from . import akg_layout
from .akg_layout import NZ

# Top-level fields: the kernel's tensors and ops, and bookkeeping about where it was
# cut and for which backend, which does not change what it computes.
_TOP_KEYS = {"op", "input_desc", "output_desc", "op_desc", "composite", "composite_graph",
             "id", "platform", "process", "op_full_name", "parallel_fusion",
             "compute_capability", "version", "node_name", "buffer_stitch", "target_info"}
_OP_KEYS = {"name", "attr", "input_desc", "output_desc", "impl_path", "process", "fusion"}
_TENSOR_KEYS = {"tensor_name", "shape", "data_type", "format", "name", "value"}
# Layouts that are the plain row-major array of their shape (for the ops here).
PLAIN_FORMATS = {None, "DefaultFormat", "NCHW", "NHWC", "ND"}


def plain_format(f: Any) -> bool:
    return f is None or (isinstance(f, str) and f in PLAIN_FORMATS)


class AkgError(Exception):
    """A problem in the op being imported; `field` names where."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class Importer:
    """Walks the ops in order, emitting polyc nodes (typed as they are emitted, so a
    problem is found at the AKG op that causes it)."""

    def __init__(self, doc: Any, handlers: dict):
        self.doc = doc
        self.handlers = handlers
        self.types: dict[str, TensorType] = {}
        self.inputs: list[dict] = []
        self.constants: list[dict] = []
        self.nodes: list[dict] = []
        self.assigned: dict[str, str] = {}  # input -> the tensor stored into it
        self.formats: dict[str, str | None] = {}  # tensor -> its layout as last declared
        # FRACTAL_NZ tensors by AKG name -> the polyc tensor of their ND matrix (akg_layout)
        self.nd_of: dict[str, str] = {}
        self.nz: set[str] = set()  # the polyc tensors that hold an NZ tensor's matrix
        self.declared_nz = False  # the AKG op being imported declares an NZ result
        self.used: set[str] = set()
        self.op = ""  # the AKG op being imported (its primitive, its output tensor)
        self.out = ""

    # -- top level --------------------------------------------------------------------
    def run(self, limits: Limits) -> Graph:
        doc = self.doc
        if not isinstance(doc, dict):
            raise GraphError(f"a composite kernel must be a JSON object, got "
                             f"{type(doc).__name__}")
        for key in sorted(set(doc) - _TOP_KEYS, key=str):
            raise GraphError(Problem("unknown field of a composite kernel", field=str(key)))
        for key in ("op_desc", "output_desc"):
            if not isinstance(doc.get(key), list):
                raise GraphError(Problem(f"must be a list, got {doc.get(key)!r}", field=key))
        in_desc = doc.get("input_desc") or []  # a kernel of constants only has null
        if not isinstance(in_desc, list):
            raise GraphError(Problem(f"must be a list, got {in_desc!r}", field="input_desc"))
        name = doc.get("op") if isinstance(doc.get("op"), str) and doc.get("op") else "akg"
        try:
            for i, group in enumerate(in_desc):
                where = f"input_desc[{i}]"
                for t in group if isinstance(group, list) else [group]:
                    self.define_input(t, where)
            for i, op in enumerate(doc["op_desc"]):
                self.import_op(op, i)
            self.op = ""
            outputs = self.outputs(doc["output_desc"])
        except AkgError as e:
            raise GraphError(Problem(str(e), self.out or None, self.op or None,
                                     e.field)) from None
        graph_doc = {"name": name, "inputs": self.inputs, "constants": self.constants,
                     "nodes": self.nodes, "outputs": outputs}
        return load_graph(graph_doc, limits=limits)

    def define_input(self, t: Any, where: str) -> None:
        name, ttype = self.tensor(t, where)
        self.out = name
        if "value" in t:
            raise AkgError("a kernel input cannot have a value", where)
        if name in self.types:
            raise AkgError(f"tensor {name!r} is listed twice", where)
        self.types[name] = ttype
        self.used.add(name)
        self.inputs.append({"name": name, "shape": list(ttype.shape), "dtype": ttype.dtype})
        if t.get("format") == NZ:
            self.hold_nd(name, akg_layout.to_nd(self, name, self.fresh(f"{name}.nd")))

    def outputs(self, descs: list) -> list[str]:
        names = []
        for i, t in enumerate(descs):
            where = f"output_desc[{i}]"
            name, ttype = self.tensor(t, where)
            self.out = name
            if name not in self.types and name not in self.nd_of:
                raise AkgError(f"output {name!r} is produced by no op and is not an input",
                               where)
            held = self.held(name, t, where)
            if self.akg_type(held) != ttype:
                raise AkgError(f"declared {ttype}, but the tensor is {self.akg_type(held)}",
                               where)
            if name in names:
                raise AkgError(f"output {name!r} is listed twice", where)
            if name not in self.types:  # an op's NZ result, so far held as its matrix
                akg_layout.to_nz(self, held, name)
            names.append(name)
        for target, value in self.assigned.items():
            stored = self.fresh(f"{target}.assigned")
            self.identity(value, stored)
            names.append(stored)
        return names

    # -- one op -----------------------------------------------------------------------
    def import_op(self, op: Any, index: int) -> None:
        where = f"op_desc[{index}]"
        self.op, self.out = "", where
        if not isinstance(op, dict) or not isinstance(op.get("name"), str):
            raise AkgError("must be an object with a 'name' (the MindSpore primitive)", where)
        self.op = op["name"]
        for key in sorted(set(op) - _OP_KEYS, key=str):
            raise AkgError("unknown field of an op", str(key))
        outs = op.get("output_desc")
        if not isinstance(outs, list) or len(outs) != 1:
            raise AkgError(f"expected a list of one tensor, got {outs!r}", "output_desc")
        self.out, declared = self.tensor(outs[0], "output_desc")
        if self.out in self.types or self.out in self.nd_of:
            raise AkgError(f"tensor {self.out!r} is already defined", "output_desc")
        handler = self.handlers.get(self.op)
        if handler is None:
            raise AkgError(f"unknown op {self.op!r}", "name")
        if handler.refusal:
            raise AkgError(f"{self.op} is not supported: {handler.refusal}", "name")
        ins = self.op_inputs(op.get("input_desc"))
        attrs = self.attrs(op.get("attr"), handler.attrs)
        out_nz = self.declared_nz = outs[0].get("format") == NZ
        if not handler.nz and (out_nz or any(x in self.nz for g in ins for x in g)):
            raise AkgError(f"{self.op} of {NZ} tensors is not supported (only elementwise "
                           "ops, reductions and MatMul)", "output_desc" if out_nz
                           else "input_desc")
        # the handler computes an NZ result as its ND matrix (akg_layout)
        result = akg_layout.nd_type(declared) if out_nz else declared
        handler.emit(self, ins, attrs, result)
        got = self.types.get(self.out)
        if got == TensorType((), declared.dtype) and declared.shape == (1,):
            self.as_declared_scalar(declared)
        elif got != result:
            layout = f" ({NZ} of the matrix {result})" if out_nz else ""
            raise AkgError(f"declared {declared}{layout}, but {self.op} of "
                           + ", ".join(str(self.akg_type(t)) for g in ins for t in g)
                           + f" gives {got}", "output_desc")
        if out_nz:
            nd = self.fresh(f"{self.out}.nd")
            self.rename_result(nd)
            self.hold_nd(self.out, nd)

    def op_inputs(self, descs: Any) -> list[list[str]]:
        if not isinstance(descs, list):
            raise AkgError(f"must be a list of lists of tensors, got {descs!r}", "input_desc")
        groups = []
        for i, group in enumerate(descs):
            where = f"input_desc[{i}]"
            if not isinstance(group, list) or not group:
                raise AkgError(f"must be a non-empty list of tensors, got {group!r}", where)
            groups.append([self.op_input(t, where) for t in group])
        return groups

    def op_input(self, t: Any, where: str) -> str:
        name, ttype = self.tensor(t, where)
        if "value" in t:
            if t.get("format") == NZ:
                raise AkgError(f"constant {name!r} in {NZ} is not supported", where)
            name = self.constant(name, ttype, t["value"], where)
            self.formats[name] = t.get("format")
            return name
        if name not in self.types and name not in self.nd_of:
            raise AkgError(f"tensor {name!r} is neither a kernel input nor the output of an "
                           "earlier op", where)
        held = self.held(name, t, where)
        if self.akg_type(held) != ttype:
            raise AkgError(f"declared {ttype}, but tensor {name!r} is {self.akg_type(held)}",
                           where)
        if name in self.assigned:
            raise AkgError(f"reads {name!r} after a value was stored into it (unsupported)",
                           where)
        self.formats[held] = t.get("format")
        return held

    def held(self, name: str, t: dict, where: str) -> str:
        """The polyc tensor that holds the AKG tensor `name` (described by `t`)."""
        if (t.get("format") == NZ) != (name in self.nd_of):
            raise AkgError(f"tensor {name!r} is described as {t.get('format')!r} here but "
                           f"is {NZ if name in self.nd_of else 'not ' + NZ}", where)
        return self.nd_of.get(name, name)

    def hold_nd(self, name: str, nd: str) -> None:
        self.nd_of[name] = nd
        self.nz.add(nd)

    def akg_type(self, held: str) -> TensorType:
        """The AKG type of the tensor a polyc tensor holds (NZ-shaped for an NZ one)."""
        t = self.types[held]
        return TensorType(akg_layout.nz_shape(t.shape), t.dtype) if held in self.nz else t

    def as_declared_scalar(self, declared: TensorType) -> None:
        """The op's result, a polyc scalar [], is computed under another name and
        reshaped to MindSpore's [1] under the AKG one."""
        inner = self.fresh(f"{self.out}.scalar")
        self.rename_result(inner)
        self.identity(inner, self.out, declared.shape)

    def rename_result(self, new: str) -> None:
        """The last node, the AKG op's result so far, writes `new` instead."""
        last = self.nodes[-1]
        last["outputs"] = [new]
        last["name"] = new
        self.types[new] = self.types.pop(self.out)

    def tensor(self, t: Any, where: str) -> tuple[str, TensorType]:
        """The name and type of a tensor description (validated)."""
        if not isinstance(t, dict):
            raise AkgError(f"a tensor must be an object, got {t!r}", where)
        for key in sorted(set(t) - _TENSOR_KEYS, key=str):
            raise AkgError(f"unknown field {key!r} of a tensor", where)
        name = t.get("tensor_name")
        if not isinstance(name, str) or not name:
            raise AkgError(f"tensor_name must be a non-empty string, got {name!r}", where)
        shape = t.get("shape")
        if not isinstance(shape, list) or not all(
                isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in shape):
            raise AkgError(f"tensor {name!r}: shape must be a list of integers >= 1, got "
                           f"{shape!r}", where)
        dtype = t.get("data_type")
        if dtype not in DTYPES:
            raise AkgError(f"tensor {name!r}: data_type {dtype!r} is not supported (polyc "
                           f"has {', '.join(DTYPES)})", where)
        if t.get("format") == NZ:
            if problem := akg_layout.nz_problem(tuple(shape)):
                raise AkgError(f"tensor {name!r}: {problem}", where)
        elif not plain_format(t.get("format")):
            raise AkgError(f"tensor {name!r}: format {t.get('format')!r} is not supported "
                           f"(only plain row-major layouts and {NZ})", where)
        # MindSpore writes a scalar's shape [] or [1], even for one tensor in one file;
        # polyc gives all of them [1] (the same bytes), so no reshape sits between the
        # scalar ops (and splits their kernels)
        return name, TensorType(tuple(shape) or (1,), dtype)

    def constant(self, name: str, ttype: TensorType, value: Any, where: str) -> str:
        data = value if isinstance(value, list) else [value]
        ok = all(isinstance(v, (int, float)) and math.isfinite(v) for v in data)
        if not ok or len(data) != ttype.size:
            raise AkgError(f"value of {name!r} must be {ttype.size} finite number(s) for "
                           f"{ttype}, got {value!r}", where)
        if ttype.dtype in INT_BITS or ttype.dtype == "bool":
            if any(v != int(v) for v in data):
                raise AkgError(f"value of {name!r} must be integers for {ttype}, got {value!r}",
                               where)
            data = [int(v) for v in data]
        if ttype.dtype == "bool" and any(v not in (0, 1) for v in data):
            raise AkgError(f"value of {name!r} must be 0 or 1 for bool, got {value!r}", where)
        const = self.fresh(name)  # the same tensor_name may carry another value elsewhere
        self.types[const] = ttype
        self.constants.append({"name": const, "shape": list(ttype.shape),
                               "dtype": ttype.dtype, "data": data})
        return const

    def attrs(self, raw: Any, known: dict) -> dict[str, Any]:
        """The op's attributes by name, each checked by its kind in `known`; the ones
        that only steer AKG's own scheduling are dropped."""
        if raw is None or raw == {}:
            return {}
        if not isinstance(raw, list):
            raise AkgError(f"must be null or a list of attributes, got {raw!r}", "attr")
        out = {}
        for a in raw:
            if not isinstance(a, dict) or not isinstance(a.get("name"), str) or "value" not in a:
                raise AkgError(f"an attribute must be an object with 'name' and 'value', got "
                               f"{a!r}", "attr")
            key = a["name"]
            if key in SCHEDULING_ATTRS:
                continue
            if key not in known:
                allowed = ", ".join(sorted(known)) or "none"
                raise AkgError(f"unknown attribute (allowed: {allowed})", f"attr.{key}")
            try:
                out[key] = known[key](a["value"])
            except (TypeError, ValueError) as e:
                raise AkgError(f"{e}, got {a['value']!r}", f"attr.{key}") from None
        return out

    # -- emitting polyc nodes ---------------------------------------------------------
    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used or name in self.types:
            k += 1
            name = f"{base}.{k}"
        self.used.add(name)
        return name

    def emit(self, op: str, *inputs: str, out: str | None = None, **attrs) -> str:
        """A polyc node; `out` None: an intermediate named after the AKG op's output.
        Its type is inferred now, so a mismatch is reported at this AKG op."""
        out = out or self.fresh(f"{self.out}.{op}")
        spec = OPS[op]
        try:
            checked = check_attrs(spec, attrs)
            self.types[out] = infer(spec, checked, [self.types[i] for i in inputs])
        except OpError as e:
            raise AkgError(f"as polyc's {op}: {e}",
                           "input_desc" if e.field == "inputs" else f"attr.{e.field}") from None
        self.used.add(out)
        self.nodes.append({"op": op, "inputs": list(inputs), "outputs": [out],
                           "attrs": attrs, "name": out})
        return out

    def scalar(self, value: float, dtype: str) -> str:
        """A polyc constant of shape [] (the emitted ops broadcast it)."""
        name = self.fresh(f"{self.out}.const")
        self.types[name] = TensorType((), dtype)
        self.constants.append({"name": name, "shape": [], "dtype": dtype, "data": [value]})
        return name

    def identity(self, x: str, out: str, shape: tuple[int, ...] | None = None) -> str:
        """`out`, a copy of `x` (a reshape to its own shape, or to `shape`)."""
        return self.emit("reshape", x, out=out, shape=list(self.types[x].shape
                                                           if shape is None else shape))


def same_type(a: TensorType, b: TensorType) -> bool:
    """Equal, where MindSpore's scalar shape [1] and polyc's [] count as the same."""
    scalar = ((), (1,))
    return a == b or (a.dtype == b.dtype and a.shape in scalar and b.shape in scalar)


# Attributes that steer only how AKG schedules, fuses or books a kernel (or repeat what
# the tensors already say); none changes the values computed.
SCHEDULING_ATTRS = {
    "pri_format", "visited", "stitch", "enable_atomic_add", "parallel_fusion_type",
    "is_backed_cast", "PROFILING_ITER_END", "is_AICPU_kernel", "keep_value_node_input",
    "side_effect_mem", "output_used_num", "Akg", "pack_b", "cross_batch",
}
