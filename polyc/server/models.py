"""Pydantic models of every request and response; they are what /openapi.json shows.

The graph itself is a free-form object here, checked by polyc's loader, so that a bad
graph gets polyc's messages (naming node, op and field) rather than pydantic's; its JSON
schema still describes the subgraph format so that clients and fuzzers see its shape.
`CompileOptions` is the union of every target's options type field by field, so an
option added to a target is accepted here (and enters the cache key through
`Options.to_json()`); the target's own type then refuses a field it lacks, naming it. An
option whose default differs between targets (`cores`) shows None: left out, it takes
the target's.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, StrictInt, StrictStr, create_model,
                      model_validator)

from .. import targets
from ..graph.ir import DTYPES
from ..graph.ops import OPS
from ..options import MAX_STAGE_SECONDS, STAGES

KEY_PATTERN = r"^[0-9a-f]{64}$"

_TENSOR_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "shape": {"type": "array", "items": {"anyOf": [
            {"type": "integer", "minimum": 1},
            {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
             "description": "a symbol: a dim bound per call (DESIGN.md, symbolic dims)"}]}},
        "dtype": {"type": "string", "enum": list(DTYPES)},
    },
    "required": ["name", "shape"],
}
GRAPH_SCHEMA = {
    "type": "object",
    "description": "A subgraph in polyc's format (DESIGN.md, 'The subgraph format'); "
                   "validated by polyc's loader, whose messages name node, op and field.",
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "inputs": {"type": "array", "items": _TENSOR_SCHEMA},
        "nodes": {"type": "array", "items": {
            "type": "object",
            "properties": {
                "op": {"type": "string", "enum": sorted(OPS)},
                "inputs": {"type": "array", "items": {"type": "string"}},
                "outputs": {"type": "array", "items": {"type": "string"},
                            "minItems": 1, "maxItems": 1},
                "attrs": {"type": "object"},
                "name": {"type": "string"},
            },
            "required": ["op", "inputs", "outputs"],
        }},
        "outputs": {"type": "array", "items": {"type": "string"}, "minItems": 1},
        "constants": {"type": "array", "items": {
            **_TENSOR_SCHEMA,
            "properties": {**_TENSOR_SCHEMA["properties"],
                           "data": {"type": "array", "items": {"type": "number"}}},
            "required": ["name", "shape", "data"],
        }},
        "symbols": {"type": "object", "description": "ranges of the symbolic dims",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {"min": {"type": "integer", "minimum": 1},
                                       "max": {"type": "integer", "minimum": 1}}}},
    },
    "required": ["inputs", "nodes", "outputs"],
    "example": {
        "name": "scaled_exp",
        "inputs": [{"name": "x", "shape": [4, 8], "dtype": "float32"}],
        "nodes": [{"op": "exp", "inputs": ["x"], "outputs": ["y"]}],
        "outputs": ["y"],
    },
}

# bounds and descriptions for known options; any other option gets its type only
_OPTION_FIELDS: dict[str, dict] = {
    "parallel": {"description": "OpenMP threads over outer parallel loops"},
    "max_operations": {"ge": 1, "le": 10**12,
                       "description": "isl's operation budget per question (a fusion "
                                      "proposal, a kernel's scheduler, a band's tile "
                                      "sizes); past it that stage falls back (no merge, "
                                      "the original order, default tiles) and the "
                                      "answer's 'fallbacks' say so"},
    **{f"{stage}_seconds": {"ge": 0, "le": MAX_STAGE_SECONDS,
                            "description": f"wall seconds the {stage} stage may spend per "
                                           "compile, read between isl questions; past them "
                                           "it falls back (see max_operations)"}
       for stage in STAGES},
    "verify": {"description": "check every schedule against every dependence"},
    "kernel_tile_sizes": {"description": "[kernel, [sizes]] pairs: tile that kernel's "
                                         "permutable bands with these sizes (a band isl "
                                         "cannot prove permutable is refused, 422)"},
    "fuse_force": {"description": "[node, node] pairs of primitive nodes to fuse whatever "
                                  "the cost; 422 naming the dependence when no shared loop "
                                  "is legal"},
    "fuse_forbid": {"description": "[node, node] pairs of primitive nodes never to fuse"},
    "kernel_gemm": {"description": "[kernel, gemm kernel] pairs: that kernel's contraction "
                                   "on that registry kernel, over gemm_kernel (cpu); 422 "
                                   "naming a kernel that does not exist"},
    "portable_kernels": {"description": "kernels, by name, compiled without microkernels "
                                        "(the portable loops); 422 naming one that does "
                                        "not exist"},
    "threads": {"ge": 0, "le": 1024,
                "description": "the OpenMP team of every parallel loop (0: OMP_NUM_THREADS)"},
    "winograd": {"description": "3x3 convolutions of stride 1 by Winograd's F(2x2, 3x3) "
                                "or F(4x4, 3x3) where it pays (cpu; the kernel's report says "
                                "when); false: the direct convolution"},
    "winograd_max_tile": {"description": "the largest Winograd tile the plan may choose "
                                         "where it pays: 2, F(2x2, 3x3), rounding about "
                                         "as a reordered sum; 4, F(4x4, 3x3) too, faster "
                                         "on 28x28 images and larger, about seven times the "
                                         "rounding"},
    "winograd_tile": {"description": "2 or 4: F(2x2, 3x3) or F(4x4, 3x3) wherever a "
                                     "convolution is one, paying or not; 0: the plan "
                                     "chooses"},
}


# JSON has no tuples: the tuple options arrive as arrays (strict items all the same)
_OPTION_TYPES: dict[str, Any] = {
    "tile_sizes": list[StrictInt] | None,
    "microkernel_tiles": list[tuple[StrictStr, StrictInt]],
    "kernel_tile_sizes": list[tuple[StrictStr, list[StrictInt]]],
    "fuse_force": list[tuple[StrictStr, StrictStr]],
    "fuse_forbid": list[tuple[StrictStr, StrictStr]],
    "portable_kernels": list[StrictStr],
    "kernel_gemm": list[tuple[StrictStr, StrictStr]],
}


def _options_model() -> type[BaseModel]:
    defaults: dict[str, dict[str, Any]] = {}  # option -> target -> its default
    types: dict[str, Any] = {}
    for name in targets.names():
        kind = targets.backend(name).options_type
        hints = typing.get_type_hints(kind)
        for f in dataclasses.fields(kind):
            defaults.setdefault(f.name, {})[name] = (list(f.default) if isinstance(f.default, tuple)
                                                     else f.default)
            types.setdefault(f.name, _OPTION_TYPES.get(f.name, hints[f.name]))
    fields = {}
    for option, by_target in defaults.items():
        extra = dict(_OPTION_FIELDS.get(option, {}))
        values = list(by_target.values())
        default = values[0]
        if any(v != default for v in values):  # the target's own when left out
            default = None
            extra["description"] = ("default: " + ", ".join(f"{t} {v}" for t, v in by_target.items())
                                    + (f"; {extra['description']}" if "description" in extra else ""))
        fields[option] = (types[option] | None if default is None else types[option],
                          Field(default, strict=option not in _OPTION_TYPES, **extra))
    return create_model("CompileOptions", __config__=ConfigDict(extra="forbid"), **fields)


CompileOptions = _options_model()
Target = Literal[targets.names()]  # type: ignore[valid-type]


class CompileRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # required (null only beside 'akg'), so a request without either is told 'graph'
    graph: dict[str, Any] | None = Field(json_schema_extra=GRAPH_SCHEMA)
    akg: dict[str, Any] | None = Field(None, description="instead of 'graph': a MindSpore/AKG "
                                       "composite kernel (the .info JSON), see polyc.import_akg")
    target: Target = Field("cpu", description="the target to compile for")
    options: CompileOptions = Field(default_factory=CompileOptions)  # type: ignore[valid-type]

    @model_validator(mode="before")
    @classmethod
    def _akg_instead_of_graph(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("akg") is not None and "graph" not in data:
            return {**data, "graph": None}
        return data

    @model_validator(mode="after")
    def _one_source(self):
        if (self.graph is None) == (self.akg is None):
            raise ValueError("give exactly one of 'graph' and 'akg'")
        return self


class KernelSummary(BaseModel):
    name: str = Field(description="the C function")
    nodes: list[str] = Field(description="primitive nodes the kernel computes")
    schedule_tree: dict[str, Any] = Field(description="the final isl schedule tree, as JSON")
    fusion_report: list[str] = Field(description="the fusion oracle's decisions and reasons")


class CompileResponse(BaseModel):
    key: str = Field(pattern=KEY_PATTERN, description="content key (sha256, hex)")
    cache_hit: bool = Field(description="answered from the cache, nothing compiled")
    coalesced: bool = Field(description="a miss answered by an identical compile already "
                                        "under way (in this server or another replica)")
    target: str
    options: dict[str, Any] = Field(description="every option, defaults filled in")
    graph_name: str
    c_source: str
    kernels: list[KernelSummary]
    timings: dict[str, float] = Field(description="seconds per pipeline stage of the "
                                                   "compile that produced this result")
    notes: list[str] = Field(description="the loader's warnings about this request's graph, "
                                         "e.g. nodes that reach no output (dropped)")
    fallbacks: list[str] = Field(description="each budget that ran out while compiling this "
                                             "result and what was done instead (the result "
                                             "is correct; a larger budget is another key)")


class ArrayInfo(BaseModel):
    tensor: str
    c_name: str
    role: str
    shape: list[int | str] = Field(description="a symbolic dim is its expression (64*N)")
    dtype: str


class PromotedBuffer(BaseModel):
    buffer: str = Field(description="the buffer's C name; its copies are the statements "
                                    "copy_in_<buffer> and copy_out_<buffer> in the tree")
    array: str = Field(description="what is copied: an array's C name or an operand")
    level: str = Field(description="the memory level it lives in (LDM, L1, L0A, UB, ...)")
    direction: Literal["in", "out", "inout", "local"]
    shape: list[int]
    bytes: int
    layout: str = Field(description="box | panels <width> <dim> | fractal <edge>")
    at: str = Field(description="the mark whose subtree is one tile ('tile LDM block'): "
                                "its copies run there; '' when copied once before everything")


class KernelDetail(KernelSummary):
    statements: list[str]
    arrays: list[ArrayInfo]
    dependences: str
    schedule_text: str = Field(description="isl's block form of the final tree (readable back)")
    trees: dict[str, dict[str, Any]] = Field(
        description="the tree after each pass that changed it, by that pass's name, in "
                    "pipeline order (schedule, microkernels, tile, lower-cpu, ...)")
    microkernels: list[str] = Field(default=[], description="the hand-written kernels it calls")
    promoted: list[PromotedBuffer] = Field(
        default=[], description="buffers in faster memory levels and their copies (DMA on "
                                "manycore, copies between levels on npu)")
    timings: dict[str, float] = Field(default={}, description="seconds per pipeline stage "
                                                              "of this kernel's passes")


class MicrokernelChoice(BaseModel):
    name: str = Field(description="registry name (the value of options.gemm_kernel)")
    kind: str
    target: str
    features: list[str] = Field(description="target features it needs")
    tile: list[int] = Field(description="rows x columns of C per call")
    isa: str = Field(description="the microkernel_isa it belongs to ('' none)")
    offered: bool = Field(description="this service's target has its features")


class BundlePart(BaseModel):
    name: str
    size: int
    sha256: str


class KernelRecord(BaseModel):
    key: str = Field(pattern=KEY_PATTERN)
    created: float = Field(description="when the result was compiled (Unix time)")
    target: str
    options: dict[str, Any]
    graph: dict[str, Any] = Field(description="the canonical graph the key was computed from")
    graph_name: str
    c_source: str
    kernels: list[KernelDetail]
    timings: dict[str, float]
    notes: list[str]
    fallbacks: list[str] = []
    toolchain: dict[str, str] = Field(description="versions and flags covered by the key")
    parts: list[BundlePart] = Field(description="the stored bundle's manifest")


class KernelSchedule(BaseModel):
    name: str
    schedule_tree: dict[str, Any]
    trees: dict[str, dict[str, Any]]
    schedule_text: str


class ScheduleTrees(BaseModel):
    key: str = Field(pattern=KEY_PATTERN)
    kernels: list[KernelSchedule]


class Health(BaseModel):
    status: Literal["ok"]
    version: str


class CacheHealth(BaseModel):
    location: str = Field(description="the SQLite file or the Redis URL")
    shared: bool = Field(description="seen by several replicas (Redis)")
    ok: bool
    writable: bool = Field(description="false: new results are kept in memory only")
    problem: str | None
    memory_entries: int


class WorkerHealth(BaseModel):
    size: int
    busy: int
    waiting: int


class HealthDetail(BaseModel):
    status: Literal["ok", "degraded"] = Field(
        description="'degraded': the service answers, but something needs attention")
    version: str
    cache: CacheHealth
    workers: WorkerHealth


class ProblemItem(BaseModel):
    pointer: str = Field(description="JSON pointer into the request body")
    message: str
    node: str | None = None
    op: str | None = None
    field: str | None = None


class ProblemDetails(BaseModel):
    """RFC 9457 problem details."""

    type: str
    title: str
    status: int
    detail: str
    instance: str | None = None
    errors: list[ProblemItem] | None = None


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    seed: int = Field(0, ge=0, le=2**32 - 1, strict=True,
                      description="seed of the random inputs (graph.reference.random_inputs)")
    repeat: int = Field(5, ge=1, le=100, strict=True,
                        description="runs per kernel; the median time is reported")
    symbols: dict[StrictStr, StrictInt] | None = Field(
        None, description="a symbolic graph's symbols for this run (each one left out: "
                          "16, or the end of its range nearer to it)")


class OutputCheck(BaseModel):
    name: str
    type: str
    max_abs_err: float
    max_rel_err: float
    ok: bool = Field(description="numpy allclose(rtol=1e-4, atol=1e-5) against the reference")


class KernelRun(BaseModel):
    name: str
    seconds: float | None = Field(description="median time of the kernel alone (host "
                                              "targets; None on a simulated chip)")
    profile: dict[str, Any] | None = Field(description="the simulated chip's figures for "
                                                       "this kernel (None on the host)")


class RunResult(BaseModel):
    key: str = Field(pattern=KEY_PATTERN)
    target: str
    seed: int
    outputs: list[OutputCheck]
    kernels: list[KernelRun]
    profile: dict[str, Any] | None = Field(description="the simulated chip's whole-run "
                                                       "figures (None on the host)")
