"""MindSpore / AKG composite kernels (the `.info` JSON MindSpore's graph-kernel fusion
hands to AKG) as polyc graphs: `import_akg(path | json_text | dict) -> Graph`.

A composite kernel lists its inputs (`input_desc`, lists of one tensor), its outputs
(`output_desc`) and its ops in order (`op_desc`); each op has a `name` (the MindSpore
primitive), `attr` (null or a list of {name, value, data_type}), `input_desc` and
`output_desc`. An op input with a `value` is a constant. Every op is mapped onto polyc
ops with MindSpore's semantics (`akg_ops.py`); the output of each keeps its AKG
`tensor_name`, and its declared shape and dtype are checked against what polyc infers.
`InplaceAssign(x, v, r)` and `Assign(x, v)` store `v` into the input `x`: polyc kernels
do not write their inputs, so the stored value is the extra graph output `x.assigned`.
FRACTAL_NZ tensors keep their blocked shapes as the kernel's inputs and outputs; inside,
ops compute on their plain matrices (`akg_layout.py`).

    Mul(input_0: float16[4,8], 0.5) -> output_0_0
    becomes  output_0_0 = mul(input_0, input_0.1)   with the constant input_0.1 = [0.5]

Every problem is a `GraphError` naming the AKG op (its output tensor and primitive) and
the field at fault (`attr.axis`, `input_desc[1]`, `output_desc`).
"""
from __future__ import annotations

import os

from ..graph.ir import Graph
from ..graph.load import Limits, read_document
from .akg_import import Importer
from .akg_ops import HANDLERS


def import_akg(src: str | bytes | os.PathLike | dict, *, limits: Limits = Limits()) -> Graph:
    """The polyc graph of a composite kernel given as a path, JSON text or a dict."""
    return Importer(read_document(src, "composite kernel"), HANDLERS).run(limits)
